"""Step-time overhead of DSpark's Markov and confidence heads over DFlash with the same backbone.

Both drafters run the same training step (packed forward, chunked selected-logit loss, backward, the trainer's
fused AdamW) on the same synthetic packed micro-batch, interleaved in one process so that machine noise hits both
alike; the script prints the median step times and their ratio (goal: DSpark / DFlash <= 1.05).

    python bench/head_overhead.py                       # tiny-world widths
    python bench/head_overhead.py --shape qwen3-8b-slim  # Qwen3-8B vocabulary and head ratio, fewer layers

Shapes: ``tiny`` has the tiny world's widths (d 128, V 4096) with a 2-layer, rank-32 drafter.
``qwen3-8b-slim`` keeps what decides the heads' share of the step at Qwen3-8B scale -- V = 151,936 and
r / d = 256 / 4096 -- at d = 1024 (r = 64) and 2 layers so that it fits a 2-core CPU; on a GPU use
``--shape qwen3-8b`` (d 4096, 5 layers, r 256).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from deepspec_train.config.schema import DrafterConfig, RecipeConfig
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.trainer import drafter_optimizer


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    layers: int
    rank: int
    taps: int
    sequences: int
    seq_len: int
    anchors: int


SHAPES = {
    "tiny": Shape(128, 2, 1, 64, 384, 4096, 2, 32, 2, 8, 512, 32),
    "qwen3-8b-slim": Shape(1024, 8, 2, 128, 3072, 151936, 2, 64, 5, 2, 512, 32),
    "qwen3-8b": Shape(4096, 32, 8, 128, 12288, 151936, 5, 256, 5, 4, 2048, 128),
}


def geometry(shape: Shape) -> DrafterGeometry:
    return DrafterGeometry(
        hidden_size=shape.hidden, intermediate_size=shape.mlp, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rms_norm_eps=1e-6, rope_theta=1e6,
        vocab_size=shape.vocab, num_target_layers=36, max_position_embeddings=40960,
    )


def synthetic_batch(shape: Shape, block: int, device: torch.device, seed: int = 0) -> PackedBatch:
    """Random sequences whose second half is 'assistant' text, packed exactly as training packs them."""
    gen = torch.Generator().manual_seed(seed)
    items, anchors = [], []
    for sample in range(shape.sequences):
        mask = torch.zeros(shape.seq_len, dtype=torch.bool)
        mask[shape.seq_len // 4 :] = True
        items.append(SequenceItem(
            input_ids=torch.randint(0, shape.vocab - 1, (shape.seq_len,), generator=gen),
            loss_mask=mask,
            ctx_features=torch.randn(shape.seq_len, shape.taps * shape.hidden, generator=gen),
            final_hidden=torch.randn(shape.seq_len, shape.hidden, generator=gen),
            sample_id=sample,
        ))
        anchors.append(sample_anchors(mask, shape.anchors, gen))
    budget = shape.sequences * (shape.seq_len + shape.anchors * block)
    (batch,) = pack_sequences(items, anchors, block, budget, shape.vocab - 1)
    return batch.to(device)


def make_drafter(kind: str, shape: Shape, block: int, device: torch.device) -> tuple[ParallelDrafter, RecipeConfig]:
    cfg = RecipeConfig()
    cfg.drafter = DrafterConfig(
        kind=kind, num_layers=shape.layers, block_size=block, mask_token_id=shape.vocab - 1,
        markov_rank=shape.rank if kind == "dspark" else 0, confidence_head=kind == "dspark",
    )
    cfg.loss.chunk_size = 512
    torch.manual_seed(0)
    drafter = ParallelDrafter(geometry(shape), cfg.drafter, list(range(shape.taps))).to(device)
    head = torch.randn(shape.vocab, shape.hidden, device=device) * shape.hidden**-0.5
    drafter.load_target_heads(head, head)
    return drafter, cfg


def time_steps(kinds: list[str], shape: Shape, block: int, steps: int, device: torch.device) -> dict[str, list[float]]:
    batch = synthetic_batch(shape, block, device)
    runs = {}
    attention = "flex" if device.type == "cuda" else "sdpa"
    for kind in kinds:
        drafter, cfg = make_drafter(kind, shape, block, device)
        params = [p for p in drafter.parameters() if p.requires_grad]
        loss = DrafterLoss.for_recipe(cfg, drafter.lm_head.weight, attention)
        runs[kind] = (drafter, loss, drafter_optimizer(params, cfg), [])
    for step in range(steps + 1):
        for kind in kinds:
            drafter, loss, optimizer, times = runs[kind]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = loss(drafter, batch, float(batch.num_supervised))
            result.loss.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step > 0:  # the first step pays for allocation and warm-up
                times.append(time.perf_counter() - start)
    return {kind: runs[kind][3] for kind in kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--block", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    device = torch.device(args.device)
    times = time_steps(["dflash", "dspark"], shape, args.block, args.steps, device)
    dflash, dspark = statistics.median(times["dflash"]), statistics.median(times["dspark"])
    print(f"shape {args.shape}: d {shape.hidden}, V {shape.vocab}, r {shape.rank}, {shape.layers} layers, "
          f"block {args.block}, device {device}, {args.steps} timed steps each (interleaved)")
    print(f"{'drafter':<8} {'median step (s)':>16} {'min (s)':>10}")
    for kind, median in (("dflash", dflash), ("dspark", dspark)):
        print(f"{kind:<8} {median:>16.4f} {min(times[kind]):>10.4f}")
    print(f"DSpark / DFlash step time: {dspark / dflash:.3f} (overhead {100 * (dspark / dflash - 1):+.1f}%, goal <= +5%)")


if __name__ == "__main__":
    main()
