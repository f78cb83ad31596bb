"""The prepared GPU check (issue 36): one run, one JSON and a summary, within 8 minutes on one H100.

    python bench/gpu_check.py --out DIR [--device cuda|cpu]     # bench/gpu_check.sh wraps it

Phases, each on random weights and random data made in this process (nothing is downloaded):

1. ``tiny``: the DSpark trainer of ``bench/step_time.py`` (d 128, vocabulary 2,048) trained 4 steps on the device,
   in bf16 with flex attention and ``drafter.compile`` (CUDA), against the same steps in fp32 with SDPA on the CPU:
   both step-1 losses and their difference.
2. ``deepspeed``: the same trainer under DeepSpeed ZeRO-2 on one rank: its step-1 loss (bf16 on CUDA).
3. ``width``: a Qwen3-8B-width copy (d 4,096, 32/8 heads, MLP 12,288, vocabulary 151,936) with ``--layers``
   target layers and a 2-layer DSpark: tokens/s of the target forward alone, of the drafter step alone and of the
   whole step (target forward + drafter step), peak GPU memory, and the ``python -m deepspec_train.costs`` tables
   to read it against.
4. ``syncs``: host syncs per step, from the profiler (``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` /
   blocking ``cudaMemcpy`` calls over 3 profiled steps) and from ``bench/host_syncs.py``.

``--device cpu`` runs every phase at tiny shapes (no DeepSpeed bf16, no compile): the test suite runs it
(``tests/test_gpu_check.py``) so the script cannot rot between GPU sessions. Writes ``DIR/gpu_check.json`` and
``DIR/gpu_check.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_time  # noqa: E402  (a sibling script, run as a file)
from host_syncs import HostSyncCounter  # noqa: E402

# Qwen3-8B's widths (config.json of Qwen/Qwen3-8B) and a tiny stand-in for the CPU mode.
WIDTHS = {
    "cuda": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=12288, vocab=151936, length=4096),
    "cpu": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=96, vocab=512, length=128),
}
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")


def _trainer(device: torch.device, out_dir: str, steps: int, bf16: bool, distributed: str = "ddp"):
    """``bench/step_time.py``'s trainer on ``device`` with its step source; the caller runs ``fit``."""
    from deepspec_train.metrics.sinks import NoOpSink
    from deepspec_train.models.block_compile import compile_blocks
    from deepspec_train.models.geometry import DrafterGeometry
    from deepspec_train.models.parallel_drafter import ParallelDrafter
    from deepspec_train.training.batch_loss import DrafterLoss
    from deepspec_train.training.distributed import DistContext
    from deepspec_train.training.trainer import DrafterTrainer

    torch.manual_seed(0)
    cfg = step_time._recipe(out_dir, steps)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, mixed_precision="bf16" if bf16 else "no", distributed=distributed))
    geometry = DrafterGeometry(step_time.HIDDEN, 256, 4, 2, 32, 1e-6, 10000.0, step_time.VOCAB, 4, 4096)
    model = ParallelDrafter(geometry, cfg.drafter, [0, 2]).to(device).train()
    compile_blocks(model, None, device)
    head = torch.randn(step_time.VOCAB, step_time.HIDDEN, generator=torch.Generator().manual_seed(1)).to(device)
    attention = "flex" if device.type == "cuda" else "sdpa"
    loss = DrafterLoss.for_recipe(cfg, head, attention)
    counter = HostSyncCounter()
    source = step_time._TimedSource(step_time._step_batches(device), counter, device)
    return DrafterTrainer(cfg, model, loss, source, None, NoOpSink(), DistContext(0, 1, 0, device, None), steps)


def _first_loss(device: torch.device, bf16: bool, distributed: str = "ddp") -> float:
    """The step-1 loss the trainer logs."""
    losses: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(device, out, 2, bf16, distributed)
        trainer.sink.log = lambda metrics, step: losses.setdefault(step, metrics.get("train/loss"))
        trainer.cfg = dataclasses.replace(trainer.cfg, logging=dataclasses.replace(trainer.cfg.logging, log_every=1))
        trainer.fit()
    return float(losses[1])


def phase_tiny(device: torch.device) -> dict:
    reference = _first_loss(torch.device("cpu"), bf16=False)
    got = _first_loss(device, bf16=device.type == "cuda")
    return {"cpu_fp32_step1_loss": reference, "device_step1_loss": got, "abs_diff": abs(got - reference)}


def phase_deepspeed(device: torch.device) -> dict:
    return {"zero2_step1_loss": _first_loss(device, bf16=device.type == "cuda", distributed="deepspeed")}


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def phase_width(device: torch.device, layers: int, repeats: int) -> dict:
    """Target forward, drafter step and whole step at Qwen3-8B's widths (``layers`` target layers)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from deepspec_train.config.schema import DrafterConfig
    from deepspec_train.losses.selected_logit_loss import LossSettings, SupervisedRows, selected_logit_loss
    from deepspec_train.models.block_compile import compile_blocks
    from deepspec_train.models.geometry import DrafterGeometry
    from deepspec_train.models.parallel_drafter import ParallelDrafter
    from deepspec_train.packing.anchors import sample_anchors
    from deepspec_train.packing.packer import SequenceItem, pack_sequences

    w = WIDTHS[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    config = Qwen3Config(vocab_size=w["vocab"], hidden_size=w["hidden"], intermediate_size=w["mlp"],
                         num_hidden_layers=layers, num_attention_heads=w["heads"], num_key_value_heads=w["kv_heads"],
                         head_dim=w["head_dim"], max_position_embeddings=2 * w["length"])
    target = Qwen3ForCausalLM(config).to(device=device, dtype=dtype).eval()
    taps = [0, layers - 1]
    features: dict[int, torch.Tensor] = {}
    def keep(index: int):
        def hook(module, args, out) -> None:
            features[index] = out[0] if isinstance(out, tuple) else out
        return hook

    for index in taps:
        target.model.layers[index].register_forward_hook(keep(index))
    ids = torch.randint(0, w["vocab"] - 1, (1, w["length"]), device=device)

    def target_forward() -> torch.Tensor:
        with torch.no_grad():
            return target.model(input_ids=ids).last_hidden_state

    target_s = _timed(target_forward, device, repeats)
    final = target_forward()[0]
    geometry = DrafterGeometry(w["hidden"], w["mlp"], w["heads"], w["kv_heads"], w["head_dim"], 1e-6, 1e6,
                               w["vocab"], layers, 2 * w["length"])
    drafter_cfg = DrafterConfig(kind="dspark", num_layers=2, block_size=7, markov_rank=256,
                                mask_token_id=w["vocab"] - 1)
    drafter = ParallelDrafter(geometry, drafter_cfg, taps).to(device).train()
    compile_blocks(drafter, None, device)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4, fused=True)
    head = target.lm_head.weight.detach()
    mask = torch.ones(w["length"], dtype=torch.bool)
    item = SequenceItem(ids[0].cpu(), mask, torch.cat([features[i][0] for i in taps], -1).float().cpu(),
                        final.float().cpu(), 0)
    anchors = [sample_anchors(mask, 64, torch.Generator().manual_seed(0))]
    batch = pack_sequences([item], anchors, 7, w["length"] + 7 * 64, w["vocab"] - 1)[0].to(device, dtype)
    attention = "flex" if device.type == "cuda" else "sdpa"

    def drafter_step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = drafter(batch, attention=attention)
            weights = torch.ones_like(out.slot_index, dtype=torch.float)
            rows = SupervisedRows(out.hidden, drafter.lm_head.weight, batch.target_hidden, head,
                                  batch.labels[batch.supervised_mask], weights,
                                  markov_rows=out.markov_rows, markov_w2=drafter.markov_head.markov_w2.weight,
                                  conf_logits=out.conf_logits)
            selected_logit_loss(rows, LossSettings(chunk_size=1024)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    drafter_s = _timed(drafter_step, device, repeats)
    whole_s = _timed(lambda: (target_forward(), drafter_step()), device, repeats)
    supervised = int(batch.target_hidden.shape[0])
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    sizing = subprocess.run([sys.executable, "-m", "deepspec_train.costs"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    return {
        "target_layers": layers, "tokens": w["length"], "supervised_slots": supervised,
        "target_forward_tokens_per_s": w["length"] / target_s,
        "drafter_step_supervised_per_s": supervised / drafter_s,
        "whole_step_tokens_per_s": w["length"] / whole_s,
        "peak_memory_bytes": peak,
        "sizing_tables": sizing.stdout[-4000:] if sizing.returncode == 0 else f"failed: {sizing.stderr[-500:]}",
    }


def phase_syncs(device: torch.device) -> dict:
    """Host syncs per step: Python-level reads (``bench/host_syncs.py``) and, on CUDA, the profiler's sync calls."""
    counted = step_time.measure(6, device)
    result = {"python_reads_per_step": counted["syncs_per_step"],
              "python_reads_per_log_step": counted["syncs_per_log_step"]}
    if device.type == "cuda":
        with tempfile.TemporaryDirectory() as out:
            trainer = _trainer(device, out, 6, bf16=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                trainer.fit()
        calls = sum(e.count for e in prof.key_averages() if e.key in SYNC_CALLS)
        result["profiler_sync_calls_per_step"] = calls / 6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=4, help="target layers of the Qwen3-8B-width copy")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__}
    phases = {"tiny": lambda: phase_tiny(device), "deepspeed": lambda: phase_deepspeed(device),
              "width": lambda: phase_width(device, args.layers, args.repeats), "syncs": lambda: phase_syncs(device)}
    for name, phase in phases.items():
        start = time.perf_counter()
        try:
            report[name] = phase() | {"seconds": time.perf_counter() - start}
        except Exception as error:  # one failed phase must not cost the others' figures on a lent machine
            failure = f"{type(error).__name__}: {error}"[:2000]
            report[name] = {"error": failure, "seconds": time.perf_counter() - start}
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    lines = [f"{name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in values.items() if k != "sizing_tables")
             for name, values in report.items() if isinstance(values, dict)]
    (args.out / "gpu_check.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
