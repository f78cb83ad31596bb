"""Throughput of the streamed pipeline against its two halves, in one run with one target and one drafter process.

    torchrun --nproc_per_node 2 bench/stream_throughput.py recipe=tiny-dspark [dotted.key=value ...] [--steps N]

Rank 0 is the target worker, rank 1 the drafter worker (``topology.target_workers=1`` is forced). Three timed
phases over the same ``N`` optimizer steps:

1. target only: rank 0 computes the packed features of N steps (forward + anchors + packing), nothing sent;
2. pipeline: rank 0 streams N steps (``run_target_loop``), rank 1 trains on them (``StreamedFeatureSource`` +
   ``DrafterTrainer``); rank 1 keeps the received batches;
3. drafter only: rank 1 trains a fresh drafter on those pre-made features.

It prints steps/s of each, pipeline / min(target only, drafter only) (goal >= 0.85), and the wire bytes per
supervised token against what full-vocabulary logits would need (V values per supervised token), measured on
this world and extrapolated to Qwen3-8B dimensions (d 4096, V 151936, 5 tapped layers, bf16) from the measured
context rows and blocks per supervised token.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.assembly import chunk_builder, load_token_datasets, resolve_attention, train_plan
from deepspec_train.metrics.sinks import NoOpSink
from deepspec_train.kinds.builder import build_drafter_from_files
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.streamed_source import StreamedFeatureSource
from deepspec_train.streaming.target_worker import DrafterFeed, run_target_loop
from deepspec_train.streaming.wire import StreamPlan
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import init_distributed, role_context
from deepspec_train.training.feature_source import InProcessFeatureSource, StepBatches
from deepspec_train.training.trainer import DrafterTrainer

QWEN3_8B = {"d": 4096, "vocab": 151936, "layers": 5, "bytes": 2}
INT_FIELDS_PER_CTX_ROW = 3  # ctx_tokens, ctx_seq, ctx_pos (int64)
INT_FIELDS_PER_BLOCK_SLOT = 3  # block_input, block_prev, labels (int64); plus block_seq, block_anchor


def _config(argv: list[str]):
    recipe = next(a.split("=", 1)[1] for a in argv if a.startswith("recipe="))
    overrides = [a for a in argv if not a.startswith("recipe=")] + ["topology.target_workers=1"]
    cfg = load_recipe(recipe, overrides)
    train = replace(cfg.train, eval_every=10**9, checkpoint_every=10**9, resume="none")
    return replace(cfg, train=train, logging=replace(cfg.logging, wandb=False, progress=False))


def _keeping(batches, kept: list):
    for batch in batches:
        kept.append(batch)
        yield batch


class _Recording:
    """Wraps a source to keep what it yields (the pre-made features of phase 3); micro-batches still reach the
    trainer one at a time, as they arrive."""

    def __init__(self, source):
        self.source, self.kept = source, []

    def __iter__(self):
        for step in self.source:
            kept: list = []
            self.kept.append(kept)
            yield StepBatches(step.num_batches, step.num_active, step.num_supervised, _keeping(step.batches, kept),
                              step.slot_counts)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def pop_metrics(self) -> dict[str, float]:
        # Left to the benchmark, which reads the wrapped source's metrics once after the run.
        return {}


class _Premade:
    """Replays recorded steps: the drafter-only phase trains on features that are already in memory."""

    def __init__(self, steps: list):
        self.steps = steps

    def __iter__(self):
        return (StepBatches.of(batches) for batches in self.steps)

    def state_dict(self) -> dict:
        return {"epoch": 0, "step_in_epoch": len(self.steps)}

    def pop_metrics(self) -> dict[str, float]:
        return {}


def _train(cfg, ctx, source, steps: int, out: Path) -> float:
    torch.manual_seed(cfg.run.seed)
    drafter, head = build_drafter_from_files(cfg, None, ctx.device)
    cfg = replace(cfg, run=replace(cfg.run, output_dir=str(out)))
    loss = DrafterLoss.for_recipe(cfg, head, resolve_attention(ctx))
    trainer = DrafterTrainer(cfg, drafter, loss, source, None, NoOpSink(), ctx, steps)
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 20
    argv = [a for i, a in enumerate(argv) if a != "--steps" and (i == 0 or argv[i - 1] != "--steps")]
    cfg = _config(argv)
    world = init_distributed(cfg.stream.timeout_s)
    if world.world_size != 2:
        raise SystemExit("run with exactly 2 processes: torchrun --nproc_per_node 2 bench/stream_throughput.py ...")
    topology = Topology(1, 1)
    ctx = role_context(world, 1)
    out = Path(cfg.run.output_dir) / "bench_stream"
    if world.rank == 0:
        data = load_token_datasets(cfg, ctx)
        tap = TargetTap(load_target_model(cfg.target, ctx.device), cfg.target.layer_ids)
        builder, plan = chunk_builder(cfg, tap, ctx.device), train_plan(cfg, data["train"], 0, 1)
        start = time.perf_counter()
        for _, _step in zip(range(steps), InProcessFeatureSource(plan, builder)):
            pass
        target_s = time.perf_counter() - start
        dist.barrier()
        stream_plan = StreamPlan(steps, steps, plan.steps_per_epoch, 10**9, False)
        run_target_loop([DrafterFeed(topology.routes()[0], plan, None)], builder, stream_plan, topology, cfg.stream,
                        ctx.device)
        dist.barrier()
        dist.barrier()
        values = torch.tensor([target_s, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    else:
        dist.barrier()
        stream = _Recording(StreamedFeatureSource(topology, ctx, cfg.stream.timeout_s))
        pipeline_s = _train(cfg, ctx, stream, steps, out / "pipeline")
        measured = stream.source.pop_metrics()
        dist.barrier()
        drafter_s = _train(cfg, ctx, _Premade(stream.kept), steps, out / "drafter_only")
        dist.barrier()
        batches = [b for step in stream.kept for b in step]
        supervised = sum(b.num_supervised for b in batches)
        ctx_rows = sum(int(b.ctx_tokens.numel()) for b in batches)
        blocks = sum(b.num_blocks for b in batches)
        values = torch.tensor([0, pipeline_s, drafter_s, measured["stream/target_wait_frac"],
                               measured["stream/wire_bytes_per_supervised_token"], ctx_rows / supervised,
                               blocks / supervised], dtype=torch.float64)
    dist.all_reduce(values)
    if world.rank == 0:
        _report(values.tolist(), steps, cfg)
    dist.destroy_process_group()


def qwen3_8b_bytes_per_token(rows_per_token: float, blocks_per_token: float, block_size: int) -> float:
    """Wire bytes per supervised token at Qwen3-8B dims, for the same packing density as measured here."""
    d, layers, width = QWEN3_8B["d"], QWEN3_8B["layers"], QWEN3_8B["bytes"]
    per_row = layers * d * width + INT_FIELDS_PER_CTX_ROW * 8
    per_block = (INT_FIELDS_PER_BLOCK_SLOT * block_size + 2) * 8
    return rows_per_token * per_row + blocks_per_token * per_block + d * width


def _report(values: list[float], steps: int, cfg) -> None:
    target_s, pipeline_s, drafter_s, wait_frac, bytes_per_token, rows_per_token, blocks_per_token = values
    rates = {"target only": steps / target_s, "drafter only": steps / drafter_s, "pipeline": steps / pipeline_s}
    for name, rate in rates.items():
        print(f"{name:>13}: {rate:8.2f} steps/s")
    ratio = rates["pipeline"] / min(rates["target only"], rates["drafter only"])
    print(f"pipeline / min(target only, drafter only) = {ratio:.3f} (goal >= 0.85); "
          f"drafter waited on the stream {wait_frac:.1%} of the pipeline time")
    tiny_logits = _vocab_size(cfg) * 4
    print(f"tiny world: {bytes_per_token:,.0f} wire bytes per supervised token vs {tiny_logits:,} for fp32 "
          f"full-vocabulary logits ({bytes_per_token / tiny_logits:.2f}x); {rows_per_token:.2f} context rows and "
          f"{blocks_per_token:.2f} blocks per supervised token")
    big = qwen3_8b_bytes_per_token(rows_per_token, blocks_per_token, cfg.drafter.block_size)
    big_logits = QWEN3_8B["vocab"] * QWEN3_8B["bytes"]
    print(f"Qwen3-8B dims (bf16, 5 tapped layers, same packing density): {big:,.0f} bytes per supervised token vs "
          f"{big_logits:,} for bf16 full-vocabulary logits ({big / big_logits:.3f}x)")


def _vocab_size(cfg) -> int:
    from deepspec_train.target.loading import load_target_config

    return int(load_target_config(cfg.target).vocab_size)


if __name__ == "__main__":
    main(sys.argv[1:])
