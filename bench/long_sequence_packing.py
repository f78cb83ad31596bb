"""Packing long sequences: micro-batches per step and how full they are, in order against first fit, and the wire
bytes of one 32K-token sequence at Qwen3-8B's geometry.

    python bench/long_sequence_packing.py [--sequences 64] [--chunk 8] [--budget 65536] [--rate 128] [--floor 512]

A step of ``--sequences`` synthetic sequences with lengths log-uniform in 1K..32K tokens, each supervised after
a prompt of 10-50% of its length, is planned by the step plan's own code (``steps.chunk_plan.plan_chunks``:
anchors from ``--rate`` per 1K valid positions over the floor ``--floor``, chunks of ``--chunk`` sequences,
``--budget`` tokens per micro-batch) once per packing order. Per order it prints the micro-batches, the share of
their summed budget holding block slots (the tokens that train) and the share holding anything (slots plus
context rows). No model runs: the plan is what decides both.

The wire table is ``streaming.wire.planned_wire_bytes`` of one fully supervised 32,768-token sequence (5 tapped
layers, d 4,096, block 7) with the features in fp32 (an fp32 target before the feature-dtype rule) and in bf16
(after it, with ``train.mixed_precision: bf16``; a bf16 target always sent bf16).
"""

from __future__ import annotations

import argparse

import torch

from deepspec_train.packing.plans import PACKING_ORDERS
from deepspec_train.steps.chunk_plan import PackingSpec, plan_chunks
from deepspec_train.streaming.wire import FeatureLayout, planned_wire_bytes

BLOCK = 7
QWEN3_8B_TAPS, QWEN3_8B_HIDDEN = 5, 4096


def length_mix(count: int, seed: int) -> list[dict]:
    """Rows of log-uniform length in 1K..32K tokens, supervised after a 10-50% prompt."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        length = int(round(2 ** (10 + 5 * float(torch.rand(1, generator=g)))))
        prompt = int(length * (0.1 + 0.4 * float(torch.rand(1, generator=g))))
        rows.append({"input_ids": [0] * length, "loss_mask": [0] * prompt + [1] * (length - prompt), "sample_id": i})
    return rows


def packing_table(rows: list[dict], chunk: int, budget: int, rate: float, floor: int) -> list[str]:
    lines = [f"{'order':<10} {'micro-batches':>13} {'block slots / budget':>21} {'used / budget':>14}"]
    for order in PACKING_ORDERS.values():
        spec = PackingSpec(BLOCK, floor, budget, 0, chunk, anchors_per_1k_tokens=rate, order=order)
        micro_batches = [groups for plan in plan_chunks(rows, spec, seed=0, epoch=0) for groups in plan.groups]
        slots = sum(BLOCK * int(g.anchors.numel()) for groups in micro_batches for g in groups)
        context = sum(int(g.anchors.max()) for groups in micro_batches for g in groups)
        capacity = len(micro_batches) * budget
        lines.append(f"{order.name:<10} {len(micro_batches):>13} {slots / capacity:>21.3f} "
                     f"{(slots + context) / capacity:>14.3f}")
    return lines


def wire_table(rate: float, floor: int, budget: int) -> list[str]:
    length = 32768
    row = {"input_ids": [0] * length, "loss_mask": [1] * length, "sample_id": 0}
    spec = PackingSpec(BLOCK, floor, budget, 0, 1, anchors_per_1k_tokens=rate)
    chunks = plan_chunks([row], spec, seed=0, epoch=0)
    anchors = sum(int(a.numel()) for chunk in chunks for a in chunk.anchors)
    lines = [f"one {length}-token sequence, {anchors} anchors, qwen3-8b geometry ({QWEN3_8B_TAPS} taps, d "
             f"{QWEN3_8B_HIDDEN}):"]
    for name, value_bytes in (("fp32 features", 4), ("bf16 features", 2)):
        layout = FeatureLayout(QWEN3_8B_TAPS, QWEN3_8B_HIDDEN, value_bytes, value_bytes)
        total = planned_wire_bytes(chunks, BLOCK, layout)
        lines.append(f"  {name}: {total:,} bytes ({total / 2**30:.2f} GiB) per sequence")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--budget", type=int, default=65536)
    parser.add_argument("--rate", type=float, default=128.0)
    parser.add_argument("--floor", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = length_mix(args.sequences, args.seed)
    tokens = sum(len(row["input_ids"]) for row in rows)
    print(f"{args.sequences} sequences, {tokens:,} tokens (1K..32K log-uniform), chunks of {args.chunk}, "
          f"budget {args.budget}, {args.rate:g} anchors per 1K valid positions over a floor of {args.floor}")
    print("\n".join(packing_table(rows, args.chunk, args.budget, args.rate, args.floor)))
    print("\n".join(wire_table(args.rate, args.floor, args.budget)))


if __name__ == "__main__":
    main()
