"""The pieces every training job is assembled from, whether the target runs colocated or on target workers.

- data: the tokenised, cached ``train`` / ``validation`` datasets (``load_token_datasets``), refused in one line
  when they cannot fill one step or one validation pass (``data.usable_rows``);
- the plan: steps (``total_steps_for``), packing (``packing_spec``), the attention backend;
- a drafter rank's data: its training step plan and its fixed validation pass (``train_plan``,
  ``validation_plan``, pure ``steps.plan.StepPlan`` records) and the chunk builder over a tapped target
  (``chunk_builder``), made the same way by a colocated rank for itself and by a target worker for each drafter
  it feeds, so both modes see the same batches;
- the end of every job: ``start_job`` (metrics sink -> trainer), then ``train_and_finish`` (fit -> trained-drafter
  files -> summary), run by the drafter workers; the colocated job, which steps its groups' trainers in turn
  (``jobs.colocated``), takes ``start_job`` alone and finishes each with ``TrainingJob.finish``.

Order matters for failing fast: the output directory and resolved config come first (``jobs.run``), then data
(tokenised and cached), then the target and the drafter, then the loop.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from deepspec_train.config.loader import config_to_dict
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.data.chat_templates import with_chat_template
from deepspec_train.data.row_shapes import field_map
from deepspec_train.data.token_shards import ConversationRenderer, build_token_dataset
from deepspec_train.data.usable_rows import require_usable_rows
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.common.console import get_logger
from deepspec_train.metrics.sinks import MetricsSink, make_sink
from deepspec_train.models.block_compile import compile_blocks
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.plans import packing_order
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import PackingSpec
from deepspec_train.steps.plan import StepPlan
from deepspec_train.target.fingerprint import target_fingerprint
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_tokenizer
from deepspec_train.jobs.run_directory import set_aside_metrics_after
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.checkpoint import checkpoint_step, resolve_resume
from deepspec_train.training.distributed import DistContext, barrier
from deepspec_train.training.feature_dtypes import feature_dtypes
from deepspec_train.training.feature_source import FeatureSource, PassReplay
from deepspec_train.training.preemption import Preempted
from deepspec_train.training.trainer import DrafterTrainer, TrainSummary

log = get_logger("deepspec_train.run")


def resolve_attention(ctx: DistContext) -> str:
    """flex attention (BlockMask, never a dense [Q, KV] mask) on GPU; the dense-mask SDPA path on CPU."""
    return "flex" if ctx.device.type == "cuda" else "sdpa"


def total_steps_for(cfg: RecipeConfig, num_sequences: int) -> int:
    """Optimizer steps of the run: ``train.max_steps``, or ``train.epochs`` of the data (each target pass feeding
    ``train.feature_reuse`` steps)."""
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    steps_per_epoch = num_sequences // cfg.train.global_batch_sequences * cfg.train.feature_reuse
    return max(1, int(math.floor(steps_per_epoch * cfg.train.epochs)))


def packing_spec(cfg: RecipeConfig) -> PackingSpec:
    return PackingSpec(
        block_size=cfg.drafter.block_size,
        num_anchors=cfg.anchors.num_per_sequence,
        token_budget=cfg.anchors.token_budget,
        mask_token_id=cfg.drafter.mask_token_id,
        chunk_sequences=cfg.train.micro_batch_sequences,
        label_convention=cfg.drafter.labels,
        anchors_per_1k_tokens=cfg.anchors.per_1k_tokens,
        order=packing_order(cfg.anchors.packing),
    )


def conversation_renderer(cfg: RecipeConfig) -> ConversationRenderer:
    """How the recipe's rows become samples (the target's tokenizer with ``data.chat_template`` applied, the row
    format and fields); training, ``data/tokenize_shards.py`` and ``deepspec data check`` all use it, so they
    name the same cache entry."""
    return ConversationRenderer(
        with_chat_template(load_tokenizer(cfg.target), cfg.data.chat_template), cfg.data.max_length,
        {"enable_thinking": cfg.data.enable_thinking}, cfg.data.supervise_reasoning, cfg.data.format,
        field_map(cfg.data.fields),
    )


def load_token_datasets(cfg: RecipeConfig, ctx: DistContext) -> dict:
    """Tokenised ``train`` and (when named) ``validation`` datasets, cached on disk (``data.train`` is never empty:
    ``config.rules`` refuses that recipe); ``UnusableDataError`` (one line) when one cannot be trained on."""
    renderer = conversation_renderer(cfg)
    drafter_ranks = ctx.world_size - cfg.topology.target_workers
    needs = {
        "train": (cfg.train.global_batch_sequences,
                  f"one step's {cfg.train.global_batch_sequences} (train.global_batch_sequences)"),
        "validation": (drafter_ranks, f"one validation pass's {drafter_ranks} (a row per drafter rank)"),
    }
    datasets = {}
    for split, sources in (("train", cfg.data.train), ("validation", cfg.data.validation)):
        if not sources:
            continue
        # Rank 0 tokenises and fills the cache first; the other ranks then read the cache instead of redoing it.
        for building in (True, False):
            if building == ctx.is_main:
                dataset, summary = build_token_dataset(
                    sources, renderer, cfg.data.cache_dir, strict=cfg.data.strict, split=cfg.data.split,
                    progress=ctx.is_main, num_workers=cfg.data.num_workers,
                )
            barrier(ctx)
        for line in summary.shapes():
            log.info("%s data: %s", split, line)
        log.info("%s data: %s", split, summary.format())
        require_usable_rows(summary, split, *needs[split], cfg.data.max_skipped_fraction)
        datasets[split] = dataset
    return datasets


def chunk_builder(cfg: RecipeConfig, tap: TargetTap, device: torch.device) -> ChunkBuilder:
    """The builder of ``cfg``'s micro-batches on ``device``, features in the drafter's compute dtype where that
    changes nothing (``training.feature_dtypes``)."""
    return ChunkBuilder(tap, packing_spec(cfg), device, feature_dtypes(cfg, device))


def train_plan(cfg: RecipeConfig, rows, rank: int, world_size: int) -> StepPlan:
    """The training steps of drafter ``rank`` of ``world_size``: its strided share of every step."""
    return StepPlan(rows, cfg.train.global_batch_sequences, cfg.run.seed, packing_spec(cfg), rank, world_size,
                    order_seed=cfg.run.data_seed, reuse=cfg.train.feature_reuse)


def pass_replay(cfg: RecipeConfig) -> Optional[PassReplay]:
    """The drafter side's kept target pass when ``train.feature_reuse`` > 1 (None: every step runs the target)."""
    if cfg.train.feature_reuse == 1:
        return None
    return PassReplay(cfg.train.feature_reuse_bytes, cfg.train.feature_reuse)


def validation_plan(cfg: RecipeConfig, rows, rank: int, world_size: int) -> StepPlan:
    """Drafter ``rank``'s share of the first ``train.eval_sequences`` validation rows: a plan of one step (step
    0, the validation pass) over all of them, in order, with anchors of its own seed, so every evaluation sees
    the same blocks."""
    val_rows = rows.select(range(min(cfg.train.eval_sequences, len(rows))))
    if len(val_rows) < world_size:
        raise ValueError(f"validation has {len(val_rows)} sequences, fewer than the {world_size} drafter ranks")
    return StepPlan(val_rows, len(val_rows), cfg.run.seed + 1, packing_spec(cfg), rank, world_size, shuffle=False)


def validation_pass(plan: StepPlan, builder: ChunkBuilder) -> Callable[[], list[PackedBatch]]:
    """The trainer's validation batches: the micro-batches of ``plan``'s only step, built anew at each call."""
    return lambda: builder.build_all(plan.chunks(0))


@dataclass
class TrainingJob:
    """One drafter's training, set up and not yet run: its trainer, the checkpoint it resumes from (None: a fresh
    run), its metrics sink and where its files go."""

    cfg: RecipeConfig
    ctx: DistContext
    trainer: DrafterTrainer
    resume_from: Optional[Path]
    sink: MetricsSink
    out_dir: Path

    def finish(self, summary: TrainSummary) -> TrainSummary:
        """Write the trained drafter and the summary (main rank) and close the metrics sink."""
        cfg = self.cfg
        if self.ctx.is_main:
            write_trained_drafter(self.trainer.model, cfg, self.out_dir / "drafter",
                                  target_fingerprint(cfg.target.path).to_dict())
            (self.out_dir / "summary.json").write_text(json.dumps(dataclasses.asdict(summary), indent=2))
            expected_len = summary.val_metrics.get("val/expected_len")
            # A recipe without validation data (the laptop one) has no E[L] to report; "nan" would read as a fault.
            validation = "no validation data" if expected_len is None else f"val E[L] {expected_len:.3f}"
            log.info("done: %d steps in %.0f s, final loss %.4f, %s", summary.steps, summary.seconds,
                     summary.final_loss, validation)
        self.sink.finish()
        return summary


def start_job(
    cfg: RecipeConfig,
    ctx: DistContext,
    drafter: nn.Module,
    target_head_weight: torch.Tensor,
    source: FeatureSource,
    validation,
    total_steps: int,
    out_dir: Path,
) -> TrainingJob:
    """The training of ``drafter`` on ``source`` (``validation``: a callable giving this rank's validation batches,
    or None), ready to run.

    A resumed run continues from the checkpoint ``train.resume`` resolves to; the records it is about to log again
    (steps after that checkpoint, e.g. after a fall-back past a damaged newest one) are moved out of
    ``metrics.jsonl`` first, so the log holds each step once."""
    resume_from = resolve_resume(cfg.train.resume, cfg.run.output_dir)
    if resume_from is not None and ctx.is_main:
        set_aside_metrics_after(out_dir, checkpoint_step(resume_from))
    sink = make_sink(out_dir, cfg.logging, cfg.run.name, config_to_dict(cfg), ctx.is_main)
    if ctx.is_main:
        n_train = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
        log.info("drafter %s: %.2fM trainable parameters; %d steps", cfg.drafter.kind, n_train / 1e6, total_steps)
    loss = DrafterLoss.for_recipe(cfg, target_head_weight, resolve_attention(ctx))
    if compile_blocks(drafter, cfg.drafter.compile, ctx.device) and ctx.is_main:
        log.info("drafter.compile: drafter blocks compiled with torch.compile")
    trainer = DrafterTrainer(cfg, drafter, loss, source, validation, sink, ctx, total_steps)
    return TrainingJob(cfg, ctx, trainer, resume_from, sink, out_dir)


def train_and_finish(job: TrainingJob) -> TrainSummary:
    """Train a job set up by ``start_job``, then write the trained drafter and the summary (main rank) and close
    the metrics sink."""
    try:
        summary = job.trainer.fit(job.resume_from)
    except Preempted:
        job.sink.finish()
        raise
    return job.finish(summary)
