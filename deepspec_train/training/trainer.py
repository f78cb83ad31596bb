"""The drafter training loop: gradient accumulation over packed micro-batches, clipping, warmup + cosine LR,
periodic validation and checkpoints, per-position metrics.

The trainer only sees a feature source (an iterator of per-step lists of ``PackedBatch``), a drafter module and
the frozen target LM-head weight; it does not know whether features were computed in-process or streamed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.logging_utils.metrics_sink import MetricsSink, get_logger
from deepspec_train.logging_utils.progress import TrainProgress
from deepspec_train.metrics.acceptance import BlockLengthStats, PositionStats
from deepspec_train.metrics.calibration import auroc_soft, ece
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from deepspec_train.training.distributed import DistContext, all_reduce_gradients, all_reduce_sum
from deepspec_train.training.drafter_step import drafter_loss
from deepspec_train.training.lr_schedule import warmup_cosine

log = get_logger("deepspec_train.trainer")


@dataclass
class TrainSummary:
    steps: int
    final_loss: float
    val_metrics: dict[str, float]
    seconds: float


class DrafterTrainer:
    def __init__(
        self,
        cfg: RecipeConfig,
        model: nn.Module,
        target_head_weight: torch.Tensor,
        train_source: Iterable[list[PackedBatch]],
        val_batches: Optional[callable],
        sink: MetricsSink,
        ctx: DistContext,
        total_steps: int,
        attention: str,
    ):
        self.cfg = cfg
        self.model = model
        self.target_head_weight = target_head_weight
        self.train_source = train_source
        self.val_batches = val_batches
        self.sink = sink
        self.ctx = ctx
        self.total_steps = total_steps
        self.attention = attention
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=(0.9, 0.95)
        )
        self.scheduler = warmup_cosine(self.optimizer, total_steps, cfg.train.warmup_frac)
        self.step = 0
        self.loss_history: list[float] = []
        self._autocast = cfg.train.mixed_precision == "bf16" and ctx.device.type == "cuda"

    def maybe_resume(self) -> None:
        path = resolve_resume(self.cfg.train.resume, self.cfg.run.output_dir)
        if path is None:
            return
        state = load_checkpoint(self.ctx, path, self.model, self.optimizer, self.scheduler)
        self.step = int(state["step"])
        self.train_source.load_state_dict(state["data"])
        log.info("resumed from %s at step %d", path, self.step)

    def _accumulate(self, micro_batches: list[PackedBatch], stats: PositionStats) -> tuple[float, dict[str, float]]:
        """Forward/backward every micro-batch of one optimizer step; returns the step loss and loss parts."""
        local_supervised = float(sum(b.num_supervised for b in micro_batches))
        normalizer = max(all_reduce_sum(local_supervised, self.ctx), 1.0)
        total = {"loss": 0.0, "ce": 0.0, "tv": 0.0, "conf": 0.0}
        for batch in micro_batches:
            if batch.num_supervised == 0:
                continue
            with torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self._autocast):
                result = drafter_loss(self.model, batch, self.cfg, self.target_head_weight, normalizer, self.attention)
            result.loss.loss.backward()
            out = result.loss
            total["loss"] += float(out.loss.detach())
            total["ce"] += float(out.ce_sum) / normalizer
            total["tv"] += float(out.tv_sum) / normalizer
            total["conf"] += float(out.conf_sum) / normalizer
            stats.update(result.slot_index, out.c_star, out.draft_correct, out.conf_prob)
        for key in total:
            total[key] = all_reduce_sum(total[key], self.ctx)
        return total["loss"], {f"train/{k}": v for k, v in total.items()} | {"train/supervised_tokens": normalizer}

    def fit(self) -> TrainSummary:
        self.maybe_resume()
        cfg = self.cfg
        progress = TrainProgress(self.total_steps, enabled=self.ctx.is_main and cfg.logging.progress, initial_step=self.step)
        stats = PositionStats(cfg.drafter.block_size, device=self.ctx.device)
        iterator: Iterator[list[PackedBatch]] = iter(self.train_source)
        start = time.time()
        window_start, window_samples, window_tokens = time.time(), 0, 0.0
        val_metrics: dict[str, float] = {}
        self.model.train()
        while self.step < self.total_steps:
            micro_batches = next(iterator)
            loss, parts = self._accumulate(micro_batches, stats)
            all_reduce_gradients(self.params, self.ctx)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.train.grad_clip))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            self.loss_history.append(loss)
            window_samples += cfg.train.global_batch_sequences
            window_tokens += parts["train/supervised_tokens"]
            elapsed = max(time.time() - window_start, 1e-9)
            progress.update(self.step, window_samples / elapsed, window_tokens / elapsed, loss)
            if self.step % cfg.logging.log_every == 0 or self.step == self.total_steps:
                if self.ctx.distributed:
                    stats.all_reduce(self.ctx.drafter_group)
                metrics = parts | stats.summary("train") | {
                    "train/lr": self.scheduler.get_last_lr()[0],
                    "train/grad_norm": grad_norm,
                    "train/samples_per_s": window_samples / elapsed,
                    "train/supervised_tokens_per_s": window_tokens / elapsed,
                } | self._stream_metrics(window_tokens)
                self.sink.log(metrics, self.step)
                stats.reset()
                window_start, window_samples, window_tokens = time.time(), 0, 0.0
            if self.val_batches is not None and (self.step % cfg.train.eval_every == 0 or self.step == self.total_steps):
                val_metrics = self.validate()
                self.sink.log(val_metrics, self.step)
                if self.ctx.is_main:
                    tqdm.write(_format_val(self.step, val_metrics))
            stopping = cfg.train.stop_at_step is not None and self.step >= cfg.train.stop_at_step
            if self.step % cfg.train.checkpoint_every == 0 or self.step == self.total_steps or stopping:
                save_checkpoint(
                    self.ctx, cfg.run.output_dir, self.step, self.model, self.optimizer, self.scheduler,
                    self.train_source.state_dict(), cfg.train.keep_last,
                )
            if stopping:
                break
        progress.close()
        final = self.loss_history[-1] if self.loss_history else math.nan
        return TrainSummary(self.step, final, val_metrics, time.time() - start)

    def _stream_metrics(self, supervised_tokens: float) -> dict[str, float]:
        """Streamed sources only: the share of drafter time spent waiting on the stream (mean over drafter
        ranks) and the bytes received per supervised token (all drafter ranks together)."""
        pop = getattr(self.train_source, "pop_stream_metrics", None)
        if pop is None:
            return {}
        wait_s, wall_s, wire_bytes = pop()
        ranks = self.ctx.world_size
        return {
            "stream/target_wait_frac": all_reduce_sum(wait_s / max(wall_s, 1e-9), self.ctx) / ranks,
            "stream/wire_bytes_per_supervised_token": all_reduce_sum(wire_bytes, self.ctx) / max(supervised_tokens, 1.0),
        }

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Per-position accuracy and c*, E[L] over full blocks, and the confidence head's ECE / AUROC vs c*."""
        cfg = self.cfg
        self.model.eval()
        stats = PositionStats(cfg.drafter.block_size, device=self.ctx.device)
        lengths = BlockLengthStats(cfg.drafter.block_size, device=self.ctx.device)
        conf, target = [], []
        total_loss, total_rows = 0.0, 0.0
        for batch in self.val_batches():
            if batch.num_supervised == 0:
                continue
            with torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self._autocast):
                result = drafter_loss(self.model, batch, cfg, self.target_head_weight, 1.0, self.attention)
            out = result.loss
            total_loss += float(out.loss)
            total_rows += batch.num_supervised
            stats.update(result.slot_index, out.c_star, out.draft_correct, out.conf_prob)
            lengths.update(out.c_star, result.supervised_mask)
            if out.conf_prob is not None:
                conf.append(out.conf_prob.float().cpu())
                target.append(out.c_star.float().cpu())
        self.model.train()
        total_loss = all_reduce_sum(total_loss, self.ctx)
        total_rows = all_reduce_sum(total_rows, self.ctx)
        if self.ctx.distributed:
            stats.all_reduce(self.ctx.drafter_group)
            lengths.all_reduce(self.ctx.drafter_group)
        metrics = {"val/loss": total_loss / max(total_rows, 1.0)} | stats.summary("val") | lengths.summary("val")
        if self.ctx.distributed:
            # ECE and AUROC are not sums: gather every rank's (confidence, c*) pairs before scoring them.
            gathered: list = [None] * self.ctx.world_size
            torch.distributed.all_gather_object(gathered, (conf, target), group=self.ctx.drafter_group)
            conf = [t for rank_conf, _ in gathered for t in rank_conf]
            target = [t for _, rank_target in gathered for t in rank_target]
        if conf:
            probs, c_star = torch.cat(conf), torch.cat(target)
            metrics["val/conf_ece"] = float(ece(probs, c_star, n_bins=10))
            metrics["val/conf_auroc"] = float(auroc_soft(probs, c_star))
        return metrics


def _format_val(step: int, metrics: dict[str, float]) -> str:
    accept = [metrics.get(f"val/accept_{k}") for k in range(1, 33)]
    curve = " ".join(f"{a:.2f}" for a in accept if a is not None)
    text = f"step {step}: val loss {metrics.get('val/loss', math.nan):.4f}  E[L] {metrics.get('val/expected_len', math.nan):.3f}  c*_k [{curve}]"
    if "val/conf_ece" in metrics:
        text += f"  conf ECE {metrics['val/conf_ece']:.3f} AUROC {metrics['val/conf_auroc']:.3f}"
    return text
