"""Memory saved and time paid by ``drafter.activation_checkpointing``, side by side in one run, on CPU.

Run: ``PYTHONPATH=. python bench/activation_checkpointing.py [--rows 4096 --anchors 32 --width-factor 4
--projection-hidden 1024 --projection-rows 8192 --projection-chunk 1024 --parts drafters projection]``

Two measurements, each configuration in a fresh subprocess (one after the other, so they do not share memory):

- the drafters of ``qwen3-8b-32k`` (DSpark) and ``qwen3-8b-eagle3-32k`` (EAGLE-3) at the Qwen3-8B scale copy's
  shape (``models.scale_targets``: 32 / 8 heads, vocabulary 151,936) with its widths times ``--width-factor``
  (4: head_dim 16, hidden 512), one forward + backward on one sequence of ``--rows`` context rows with
  ``--anchors`` blocks at its end, with checkpointing off and on: of the drafter alone (``backbone``: the
  states at the supervised slots into a squared sum, where checkpointing acts) and of the whole training loss
  (``step``: the vocabulary-sized chunked loss comes on top, the same in both modes);
- the context projection alone (``fc``, ``5 d -> d``, then ``hidden_norm``, Qwen3-8B's five taps) over
  ``--projection-rows`` rows of bf16 features, plain, checkpointed in one piece, and checkpointed in chunks of
  ``--projection-chunk`` rows (what the drafters do). What matters is two ratios, rows / d and chunk / d: the
  one-piece recompute re-materialises the ``[rows, 5d]`` fp32 copy in backward, the chunked one a
  ``[chunk, 5d]`` copy but one ``[d, 5d]`` weight gradient per chunk. The defaults (d 1,024, 8,192 rows, chunks
  of 1,024) have the ratios of 32K rows in chunks of ``CONTEXT_CHUNK_ROWS`` = 4,096 at d 4,096, in CPU time.

Peak memory is the resident set's high-water mark (``VmHWM``) over the forward + backward minus the resident
size just before it, after the high-water mark was reset (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0):
building the model and the batch peaks higher than the step itself for the vocabulary-sized heads, so a
high-water mark since the process started (``ru_maxrss``) would hide the step's peak. Resident memory counts
what the CPU allocator really holds, autograd's saved tensors and transient buffers alike. Time is the best of
two further forward + backward calls after the measured one (one for the projection).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models import activation_checkpointing
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.qwen3_layers import RMSNorm
from deepspec_train.models.scale_targets import scale_target_config
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.kinds.recipe_validation import load_recipe

MIB = 1024**2
RECIPES = ("qwen3-8b-32k", "qwen3-8b-eagle3-32k")
# Qwen3-8B's taps of the context projection.
PROJECTION_TAPS = 5
# Positions between the anchors at the sequence's end.
ANCHOR_STRIDE = 97


def long_context_batch(cfg, geometry, rows: int, anchors: int, seed: int = 0) -> PackedBatch:
    """One sequence of ``rows`` tokens (a 32-token prompt, the rest supervised) with random bf16 target
    features, packed with ``anchors`` blocks near its end so that they see nearly all rows as context."""
    g = torch.Generator().manual_seed(seed)
    taps, d = len(cfg.target.layer_ids), geometry.hidden_size
    loss_mask = torch.ones(rows, dtype=torch.bool)
    loss_mask[:32] = False
    item = SequenceItem(input_ids=torch.randint(0, 151643, (rows,), generator=g), loss_mask=loss_mask,
                        ctx_features=torch.randn(rows, taps * d, generator=g).bfloat16(),
                        final_hidden=torch.randn(rows, d, generator=g), sample_id=0)
    positions = torch.arange(rows - 8 - anchors * ANCHOR_STRIDE, rows - 8, ANCHOR_STRIDE)
    (batch,) = pack_sequences([item], [positions], cfg.drafter.block_size, max(cfg.anchors.token_budget, 2 * rows),
                              cfg.drafter.mask_token_id)
    return batch


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(step, timed: int = 2) -> tuple[float, float]:
    """Peak MiB above the resident size of the first ``step()``, and the best time of ``timed`` more."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    step()
    peak = (_status_kib("VmHWM") - before) / 1024
    times = []
    for _ in range(timed):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return peak, min(times)


def _widened(factor: int):
    scale = geometry_from_target_config(scale_target_config("Qwen3-8B"))
    return dataclasses.replace(scale, hidden_size=scale.hidden_size * factor, head_dim=scale.head_dim * factor,
                               intermediate_size=scale.intermediate_size * factor)


def _drafter_worker(recipe: str, part: str, checkpointing: bool, shape: list[int]) -> tuple[float, float]:
    rows, anchors, factor = shape
    cfg = load_recipe(recipe, [f"drafter.activation_checkpointing={str(checkpointing).lower()}"], check_target=False)
    geometry = _widened(factor)
    batch = long_context_batch(cfg, geometry, rows, anchors)
    torch.manual_seed(0)
    counts = torch.ones(geometry.vocab_size, dtype=torch.long)
    model = kind_spec(cfg.drafter.kind).build(cfg.drafter, geometry, cfg.target.layer_ids, counts).train()
    loss_of = DrafterLoss.for_recipe(cfg, torch.randn(geometry.vocab_size, geometry.hidden_size) * 0.1, "sdpa")

    def step() -> None:
        model.zero_grad(set_to_none=False)
        if part == "backbone":
            model(batch).hidden.float().pow(2).sum().backward()
        else:
            loss_of(model, batch, float(batch.num_supervised)).loss.loss.backward()

    step()  # Gradient buffers and kernels exist before the measured call, in both modes alike.
    return _measure(step)


def _projection_worker(mode: str, shape: list[int]) -> tuple[float, float]:
    hidden, rows, chunk = shape
    torch.manual_seed(0)
    fc = torch.nn.Linear(PROJECTION_TAPS * hidden, hidden, bias=False)
    norm = RMSNorm(hidden)
    features = torch.randn(rows, PROJECTION_TAPS * hidden).bfloat16()

    def project(x: torch.Tensor) -> tuple[torch.Tensor]:
        # As the drafter's ``_context_states`` under bf16 autocast: fc reads the bf16 features in place.
        return (norm(fc(x)),)

    activation_checkpointing.CONTEXT_CHUNK_ROWS = rows if mode == "one-piece" else chunk

    def step() -> None:
        fc.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = activation_checkpointing.row_chunked(project, [features], 0, mode != "plain")[0]
        out.float().sum().backward()

    step()
    return _measure(step, timed=1)


def _subprocess(args: list[str]) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(args)], check=True,
                         capture_output=True, text=True).stdout
    peak, seconds = json.loads(out.strip().splitlines()[-1])
    return peak, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--width-factor", type=int, default=4)
    parser.add_argument("--projection-hidden", type=int, default=1024)
    parser.add_argument("--projection-rows", type=int, default=8192)
    parser.add_argument("--projection-chunk", type=int, default=1024)
    parser.add_argument("--parts", nargs="+", choices=("drafters", "projection"), default=["drafters", "projection"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        spec = json.loads(args.worker)
        result = _drafter_worker(*spec[1:]) if spec[0] == "drafter" else _projection_worker(*spec[1:])
        print(json.dumps(result))
        return
    if "drafters" in args.parts:
        _print_drafters(args)
    if "projection" in args.parts:
        _print_projection(args)


def _print_drafters(args: argparse.Namespace) -> None:
    shape = [args.rows, args.anchors, args.width_factor]
    print(f"drafters at {args.width_factor} x the Qwen3-8B scale widths (hidden "
          f"{_widened(args.width_factor).hidden_size}), {args.rows} context rows, {args.anchors} blocks")
    print("| recipe | part | peak off MiB | peak on MiB | on / off | time off s | time on s | on / off |")
    print("|---|---|---|---|---|---|---|---|")
    for recipe in RECIPES:
        for part in ("backbone", "step"):
            off = _subprocess(["drafter", recipe, part, False, shape])
            on = _subprocess(["drafter", recipe, part, True, shape])
            print(f"| {recipe} | {part} | {off[0]:.0f} | {on[0]:.0f} | {on[0] / off[0]:.3f} | {off[1]:.2f} "
                  f"| {on[1]:.2f} | {on[1] / off[1]:.2f} |")


def _print_projection(args: argparse.Namespace) -> None:
    shape = [args.projection_hidden, args.projection_rows, args.projection_chunk]
    print(f"context projection {PROJECTION_TAPS} x {args.projection_hidden} -> {args.projection_hidden}, "
          f"{args.projection_rows} rows, chunks of {args.projection_chunk}")
    print("| mode | peak MiB | / plain | step s | / plain |")
    print("|---|---|---|---|---|")
    plain = _subprocess(["projection", "plain", shape])
    for mode in ("plain", "one-piece", "chunked"):
        peak, seconds = plain if mode == "plain" else _subprocess(["projection", mode, shape])
        print(f"| {mode} | {peak:.0f} | {peak / plain[0]:.3f} | {seconds:.2f} | {seconds / plain[1]:.2f} |")

if __name__ == "__main__":
    main()
