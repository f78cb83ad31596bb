"""Assemble and run one training job from a validated recipe.

Colocated mode (``topology.target_workers=0``): each process runs the target itself. Streamed mode hands over to
``deepspec_train.streaming.streamed_run`` after the process group is up.

Order matters for failing fast: output directory and resolved config first, then data (tokenised and cached),
then the target and the drafter, then the loop. At the end the trained drafter is written to
``<output_dir>/drafter/`` (safetensors + config) and a one-line summary is printed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from deepspec_train.config.loader import config_to_dict, save_resolved
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.data.token_shards import build_token_dataset
from deepspec_train.logging_utils.metrics_sink import get_logger, make_sink
from deepspec_train.models.factory import build_drafter, drafter_metadata
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model, load_tokenizer
from deepspec_train.training.checkpoint import trainable_state
from deepspec_train.training.distributed import DistContext, barrier, init_distributed, shutdown
from deepspec_train.training.feature_source import InProcessFeatureSource, PackingSpec
from deepspec_train.training.trainer import DrafterTrainer, TrainSummary

log = get_logger("deepspec_train.run")


def resolve_attention(ctx: DistContext) -> str:
    """flex attention (BlockMask, never a dense [Q, KV] mask) on GPU; the dense-mask SDPA path on CPU."""
    return "flex" if ctx.device.type == "cuda" else "sdpa"


def total_steps_for(cfg: RecipeConfig, num_sequences: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    steps_per_epoch = num_sequences // cfg.train.global_batch_sequences
    return max(1, int(math.floor(steps_per_epoch * cfg.train.epochs)))


def packing_spec(cfg: RecipeConfig) -> PackingSpec:
    return PackingSpec(
        block_size=cfg.drafter.block_size,
        num_anchors=cfg.anchors.num_per_sequence,
        token_budget=cfg.anchors.token_budget,
        mask_token_id=cfg.drafter.mask_token_id,
        label_convention=cfg.drafter.labels,
    )


def run_training(cfg: RecipeConfig) -> Optional[TrainSummary]:
    """Train as this process's role; returns the summary on drafter ranks (None on target workers)."""
    ctx = init_distributed(cfg.stream.timeout_s)
    torch.manual_seed(cfg.run.seed + ctx.rank)
    out_dir = Path(cfg.run.output_dir)
    if ctx.is_main:
        save_resolved(cfg, out_dir / "resolved_config.yaml")
    try:
        if cfg.topology.target_workers > 0:
            from deepspec_train.streaming.streamed_run import run_streamed

            return run_streamed(cfg, ctx, out_dir)
        return _train(cfg, ctx, out_dir)
    finally:
        shutdown(ctx)
        if dist.is_initialized() and not ctx.distributed:
            # The one-rank group a single-process DeepSpeed run set up for itself.
            dist.destroy_process_group()


def load_token_datasets(cfg: RecipeConfig, ctx: DistContext) -> dict:
    """Tokenised ``train`` (required) and ``validation`` (optional) datasets, cached on disk."""
    tokenizer = load_tokenizer(cfg.target)
    datasets = {}
    for split, sources in (("train", cfg.data.train), ("validation", cfg.data.validation)):
        if not sources:
            continue
        # Rank 0 tokenises and fills the cache first; the other ranks then read the cache instead of redoing it.
        for building in (True, False):
            if building == ctx.is_main:
                dataset, summary = build_token_dataset(
                    sources, tokenizer, cfg.data.max_length, cfg.data.cache_dir, strict=cfg.data.strict,
                    split=cfg.data.split, progress=ctx.is_main,
                    chat_template_kwargs={"enable_thinking": cfg.data.enable_thinking},
                    num_workers=cfg.data.num_workers,
                )
            barrier(ctx)
        log.info("%s data: %s", split, summary.format())
        datasets[split] = dataset
    if "train" not in datasets:
        raise SystemExit("error: data.train names no data")
    return datasets


def validation_source(
    cfg: RecipeConfig, rows, tap: TargetTap, rank: int, world_size: int, device: torch.device
) -> tuple[InProcessFeatureSource, list[int]]:
    """The validation plan of drafter ``rank`` of ``world_size``: a fixed subset, fixed anchors, fixed order."""
    val_rows = rows.select(range(min(cfg.train.eval_sequences, len(rows))))
    # Validation anchors use their own seed and a fixed order, so every evaluation sees the same blocks.
    source = InProcessFeatureSource(
        val_rows, tap, packing_spec(cfg), world_size, cfg.train.micro_batch_sequences, cfg.run.seed + 1,
        rank, world_size, device, shuffle=False,
    )
    return source, list(range(len(val_rows)))[rank::world_size]


def _train(cfg: RecipeConfig, ctx: DistContext, out_dir: Path) -> TrainSummary:
    datasets = load_token_datasets(cfg, ctx)
    target = load_target_model(cfg.target, ctx.device)
    tap = TargetTap(target, cfg.target.layer_ids)
    drafter = build_drafter(cfg, target, datasets["train"]).to(ctx.device)
    target_head_weight = target.get_output_embeddings().weight.detach()
    total_steps = total_steps_for(cfg, len(datasets["train"]))
    spec = packing_spec(cfg)
    train_source = InProcessFeatureSource(
        datasets["train"], tap, spec, cfg.train.global_batch_sequences, cfg.train.micro_batch_sequences,
        cfg.run.seed, ctx.rank, ctx.world_size, ctx.device,
    )
    val_batches = None
    if "validation" in datasets:
        val_source, rank_rows = validation_source(cfg, datasets["validation"], tap, ctx.rank, ctx.world_size, ctx.device)

        def val_batches():
            return val_source.batches_for(rank_rows, epoch=0)

    sink = make_sink(out_dir, cfg.logging, cfg.run.name, config_to_dict(cfg), ctx.is_main)
    if ctx.is_main:
        n_train = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
        log.info("drafter %s: %.2fM trainable parameters; %d steps", cfg.drafter.kind, n_train / 1e6, total_steps)
    trainer = DrafterTrainer(
        cfg, drafter, target_head_weight, train_source, val_batches, sink, ctx, total_steps, resolve_attention(ctx)
    )
    summary = trainer.fit()
    finish_run(cfg, ctx, drafter, summary, sink, out_dir)
    return summary


def finish_run(
    cfg: RecipeConfig, ctx: DistContext, drafter: torch.nn.Module, summary: TrainSummary, sink, out_dir: Path
) -> None:
    """Write the trained drafter and the summary (main drafter rank), close the metrics sink."""
    if ctx.is_main:
        save_trained_drafter(drafter, cfg, out_dir / "drafter")
        (out_dir / "summary.json").write_text(json.dumps(dataclasses.asdict(summary), indent=2))
        log.info(
            "done: %d steps in %.0f s, final loss %.4f, val E[L] %s", summary.steps, summary.seconds,
            summary.final_loss, f"{summary.val_metrics.get('val/expected_len', float('nan')):.3f}",
        )
    sink.finish()


def save_trained_drafter(drafter: torch.nn.Module, cfg: RecipeConfig, path: Path) -> None:
    """The project's own drafter checkpoint: trainable weights + what is needed to rebuild the module."""
    path.mkdir(parents=True, exist_ok=True)
    # EAGLE-3's draft-vocabulary maps are buffers, not trainable weights, but a serving export needs them.
    maps = {name: buf.detach().contiguous() for name, buf in drafter.named_buffers() if name in ("d2t", "t2d")}
    save_file(trainable_state(drafter) | maps, str(path / "drafter.safetensors"))
    (path / "drafter_config.json").write_text(json.dumps(drafter_metadata(drafter, cfg), indent=2))
