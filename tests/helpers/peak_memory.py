"""Measured peak memory of the real code paths behind ``deepspec_train.costs.long_context_memory``, on CPU, at
scale-copy widths: ``measure_cases(names)`` runs ``python -m tests.helpers.peak_memory NAME ...`` in a fresh process and
returns, per case, the measured peak and the model's prediction (bytes).

How a peak is measured: in that process glibc's ``malloc`` is told to serve every allocation of 64 KiB or more with
its own ``mmap`` and to give it back on ``free`` (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``; torch's
CPU allocator keeps no cache of its own), so resident memory rises and falls with the tensors alive. After the
setup and one warm-up call (libraries, lazy kernels, autograd state), ``/proc/self/clear_refs`` is written ``5``,
which resets the kernel's high-water mark ``VmHWM`` to the current ``VmRSS``; the measured peak is ``VmHWM`` after
the call minus ``VmRSS`` before it: the most memory the call held at once beyond what existed already. Resident
memory counts only pages written, which every op's output is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable

import torch

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
TARGET = "Qwen3-8B"
RECIPE = "qwen3-8b"
# Scale-copy target layers for the target cases: the taps 1..5 need 7 decoder layers (never the last one).
TARGET_LAYERS = 7
SCALE_TAPS = [1, 2, 3, 4, 5]


def _status_bytes(key: str) -> int:
    text = open("/proc/self/status").read()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def measured_peak(call: Callable[[], object], warm_up: Callable[[], object]) -> int:
    """Bytes ``call`` held at once beyond what was resident before it (see the module docstring)."""
    warm_up()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    result = call()
    peak = _status_bytes("VmHWM") - before
    del result
    return peak


def _setup(seq_len: int, drafter_layers: int = 5, checkpointing: bool = False):
    """The recipe at ``seq_len`` (``costs.worker_memory.long_context_recipe``) on the scale copy with 7 layers, its
    drafter and the model's terms for it (the production function, at the small geometry)."""
    from deepspec_train.kinds.builder import build_drafter_for_geometry
    from deepspec_train.models.geometry import geometry_from_target_config
    from deepspec_train.models.scale_targets import scale_target_config
    from deepspec_train.costs.worker_memory import long_context_memory, long_context_recipe

    cfg = long_context_recipe(RECIPE, seq_len)
    cfg = dataclasses.replace(
        cfg, target=dataclasses.replace(cfg.target, layer_ids=SCALE_TAPS),
        drafter=dataclasses.replace(cfg.drafter, num_layers=drafter_layers, activation_checkpointing=checkpointing))
    scale = scale_target_config(TARGET)
    hf_config = type(scale).from_dict({**scale.to_dict(), "num_hidden_layers": TARGET_LAYERS,
                                       "layer_types": scale.layer_types[:TARGET_LAYERS]})
    torch.manual_seed(0)
    drafter = build_drafter_for_geometry(cfg, geometry_from_target_config(hf_config, cfg.drafter.intermediate_size))
    target, drafter_memory = long_context_memory(cfg, hf_config, seq_len, drafter)
    return cfg, hf_config, drafter, target, drafter_memory


def _sequence(cfg, seq_len: int, hf_config, features: bool):
    from deepspec_train.packing.packer import SequenceItem
    from deepspec_train.costs.stream_payload import nominal_anchor_count, nominal_anchors

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (seq_len,), generator=gen)
    taps, d = len(cfg.target.layer_ids), hf_config.hidden_size
    ctx = torch.randn(seq_len, taps * d, generator=gen).bfloat16() if features else None
    final = torch.randn(seq_len, d, generator=gen).bfloat16() if features else None
    item = SequenceItem(ids, torch.ones(seq_len, dtype=torch.bool), ctx, final, 0)
    return item, torch.tensor(nominal_anchors(seq_len, nominal_anchor_count(cfg, seq_len)))


def target_case(seq_len: int, eager: bool) -> dict:
    """``run_target`` (``TargetTap`` over one sequence, bf16) and ``build_packed_batch`` on its states."""
    from transformers import AutoModelForCausalLM

    from deepspec_train.packing.packer import build_packed_batch, plan_micro_batches
    from deepspec_train.steps.chunk_builder import run_target
    from deepspec_train.target.hidden_states import TargetTap

    cfg, hf_config, _, target, _ = _setup(seq_len)
    hf_config._attn_implementation = "eager" if eager else "sdpa"
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).eval().requires_grad_(False)
    tap = TargetTap(model, cfg.target.layer_ids)
    item, anchors = _sequence(cfg, seq_len, hf_config, features=False)
    groups = plan_micro_batches([anchors], cfg.drafter.block_size, cfg.anchors.token_budget)[0]

    def build(ids: torch.Tensor):
        ctx, final = run_target(tap, [ids], torch.device("cpu"))[0]
        if ids.numel() < seq_len:
            # The warm-up: the target only (the planned groups are the full sequence's).
            return None
        items = [dataclasses.replace(item, input_ids=ids, ctx_features=ctx, final_hidden=final)]
        return build_packed_batch(items, groups, cfg.drafter.block_size, cfg.drafter.mask_token_id)

    peak = measured_peak(lambda: build(item.input_ids), lambda: build(item.input_ids[:64]))
    return {"measured": peak, "predicted": target.activation_peak_bytes(eager=eager)}


def drafter_case(seq_len: int, layers: int, checkpointing: bool) -> dict:
    """The drafter backbone's forward and backward (CPU: ``sdpa`` with the dense mask) on a real ``PackedBatch``
    under bf16 autocast; predicted: its saved activations and the dense mask."""
    from deepspec_train.packing.packer import pack_sequences

    cfg, hf_config, drafter, _, memory = _setup(seq_len, layers, checkpointing)
    item, anchors = _sequence(cfg, seq_len, hf_config, features=True)
    batch = pack_sequences([item], [anchors], cfg.drafter.block_size, cfg.anchors.token_budget,
                           cfg.drafter.mask_token_id)[0]
    small = pack_sequences([item], [anchors[:4]], cfg.drafter.block_size, cfg.anchors.token_budget,
                           cfg.drafter.mask_token_id)[0]

    def step(packed):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            states = drafter.backbone(packed, "sdpa")
        states.float().sum().backward()

    peak = measured_peak(lambda: step(batch), lambda: step(small))
    saved = memory.saved_activations_checkpointed if checkpointing else memory.saved_activations
    mask = memory.dense_mask_checkpointed if checkpointing else memory.dense_mask
    return {"measured": peak, "predicted": saved + mask}


def context_projection_case(seq_len: int) -> dict:
    """The context projection alone (the drafter's own ``fc`` over the taps, then ``hidden_norm``) under autocast
    with gradients."""
    cfg, hf_config, drafter, _, memory = _setup(seq_len)
    item, _ = _sequence(cfg, seq_len, hf_config, features=True)

    def project(features):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return drafter._context_states(features)

    peak = measured_peak(lambda: project(item.ctx_features), lambda: project(item.ctx_features[:64]))
    return {"measured": peak, "predicted": memory.context_projection}


def loss_case(chunk_rows: int) -> dict:
    """``selected_logit_loss`` over one chunk of ``chunk_rows`` rows (Markov head, confidence head) under autocast,
    gradients included; predicted: the loss-chunk term for that chunk size."""
    from deepspec_train.losses.selected_logit_loss import LossSettings, SupervisedRows, selected_logit_loss
    from deepspec_train.costs.worker_memory import long_context_memory

    cfg, hf_config, drafter, _, _ = _setup(1024)
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, chunk_size=chunk_rows))
    memory = long_context_memory(cfg, hf_config, 1024, drafter)[1]
    gen = torch.Generator().manual_seed(0)
    d, vocab, rank = hf_config.hidden_size, hf_config.vocab_size, cfg.drafter.markov_rank
    target_head = torch.randn(vocab, d, generator=gen).bfloat16()

    def loss(rows: int):
        hidden = torch.randn(rows, d, generator=gen, requires_grad=True)
        markov = torch.randn(rows, rank, generator=gen, requires_grad=True)
        conf = torch.randn(rows, generator=gen, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = selected_logit_loss(SupervisedRows(
                hidden, drafter.lm_head.weight, torch.randn(rows, d, generator=gen).bfloat16(), target_head,
                torch.randint(0, vocab, (rows,), generator=gen), torch.ones(rows), markov_rows=markov,
                markov_w2=drafter.markov_head.markov_w2.weight, conf_logits=conf), LossSettings.of(cfg.loss))
        out.loss.backward()
        drafter.zero_grad(set_to_none=True)

    peak = measured_peak(lambda: loss(chunk_rows), lambda: loss(2))
    return {"measured": peak, "predicted": memory.loss_chunk}


def block_mask_case(seq_len: int) -> dict:
    """The flex ``BlockMask`` of a real ``PackedBatch`` (the GPU path's mask, built on CPU): its tensors' bytes."""
    from deepspec_train.packing.attention_mask import flex_block_mask
    from deepspec_train.packing.packer import pack_sequences

    cfg, hf_config, _, _, memory = _setup(seq_len, 1)
    item, anchors = _sequence(cfg, seq_len, hf_config, features=True)
    batch = pack_sequences([item], [anchors], cfg.drafter.block_size, cfg.anchors.token_budget,
                           cfg.drafter.mask_token_id)[0]
    mask = flex_block_mask(batch)
    tables = [t for t in mask.as_tuple() if isinstance(t, torch.Tensor)]
    return {"measured": sum(t.numel() * t.element_size() for t in tables), "predicted": memory.block_mask}


CASES: dict[str, Callable[[], dict]] = {
    "target sdpa 6144": lambda: target_case(6144, eager=False),
    "block mask 2048": lambda: block_mask_case(2048),
    "target eager 1024": lambda: target_case(1024, eager=True),
    "drafter 1 layer 1024": lambda: drafter_case(1024, 1, False),
    "drafter 2 layers 1024 checkpointed": lambda: drafter_case(1024, 2, True),
    "context projection 16384": lambda: context_projection_case(16384),
    "loss chunk 128": lambda: loss_case(128),
}


def measure_cases(names: list[str]) -> dict[str, dict]:
    """Run each named case in one fresh process (the malloc settings must be there at its start)."""
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.peak_memory", *names], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps({name: CASES[name]() for name in sys.argv[1:]}))
