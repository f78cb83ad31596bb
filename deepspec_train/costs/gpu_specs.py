"""Published GPU facts the serving-cost model (``deepspec_train.costs.serving_cost``) runs its roofline on: HBM
bandwidth and dense bf16 tensor-core peak per GPU, by name. Vendor figures, not measurements; datasheets quote bf16 with
2:4 structured sparsity, so the dense peak is half the quoted number.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    hbm_bytes_per_s: float
    bf16_dense_flops_per_s: float
    source: str


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: GPU memory bandwidth 3.35 TB/s; BF16 Tensor
        # Core 1,979 TFLOPS with sparsity.
        GpuSpec("H100", 3.35e12, 989e12, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: 4.8 TB/s; BF16 Tensor Core 1,979 TFLOPS with
        # sparsity (the H100's compute, more and faster memory).
        GpuSpec("H200", 4.8e12, 989e12, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
        # NVIDIA HGX B200 specifications (per GPU of the 8-GPU board, 1,000 W): 8 TB/s; FP16 / BF16 Tensor Core
        # 4.5 PFLOPS with sparsity.
        GpuSpec("B200", 8e12, 2.25e15, "NVIDIA HGX B200 specifications (per GPU)"),
    )
}


def gpu_spec(name: str) -> GpuSpec:
    """The facts of GPU ``name``; a one-line error naming the known GPUs otherwise."""
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[name]
