"""The drafter training loop: gradient accumulation over packed micro-batches, clipping, warmup + cosine LR,
periodic validation and checkpoints, per-position metrics.

The trainer only sees a feature source (``training.feature_source.FeatureSource``: per step, the counts of its
``PackedBatch`` micro-batches, then the micro-batches one at a time), a drafter module and the run's loss
(``training.batch_loss.DrafterLoss``, which holds the frozen target LM-head weight); it does not know whether
features were computed in-process or streamed, and logs whatever the source reports of itself
(``FeatureSource.pop_metrics``) beside its own metrics. Each micro-batch's loss is divided, before its backward,
by the step's supervised slots over all drafter ranks (``loss.normalizer=token``)
or row by row by its sequence's weight over the step (``sequence``; ``training.loss_normalizers``), so the
step's gradient is the same however the step's micro-batches are split over ranks or messages. How gradients
meet is the engine's business (``training.local_engine``: torch DDP, bucketed all-reduce overlapped with backward,
for ``train.distributed=ddp``; ``training.deepspeed_engine``: ZeRO-2 over the drafter ranks); the optimizer, the
LR curve and the checkpoint files are the same for both.

Nothing on the hot path reads a device value into Python: the step's loss parts and the per-position statistics
accumulate on the device and are reduced over the ranks in one collective on logging steps only, and the one
host read per step is the verdict of ``training.step_guard`` (non-finite loss or gradient norm: skip the update on
every rank; a preemption request: stop after this step). ``train.profile`` traces a few steps
(``training.step_profiler``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from deepspec_train.config.schema import ZLAB_LABELS, RecipeConfig
from deepspec_train.common.console import get_logger
from deepspec_train.metrics.sinks import MetricsSink
from deepspec_train.training.progress import TrainProgress
from deepspec_train.metrics.acceptance import BlockLengthStats, PositionStats
from deepspec_train.metrics.calibration import auroc_soft, ece
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training import preemption
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.checkpoint import load_checkpoint, load_run_state, save_checkpoint
from deepspec_train.training.distributed import DistContext, all_reduce_sum
from deepspec_train.training.feature_source import FeatureSource, StepBatches
from deepspec_train.training.local_engine import DrafterEngine, LocalEngine, make_engine
from deepspec_train.training.loss_normalizers import step_normalizers
from deepspec_train.training.lr_schedule import warmup_cosine
from deepspec_train.training.step_guard import BadSteps, agree_on_step
from deepspec_train.training.step_profiler import StepProfiler

log = get_logger("deepspec_train.trainer")


def drafter_optimizer(params: list[nn.Parameter], cfg: RecipeConfig) -> torch.optim.AdamW:
    """The drafter's AdamW. The fused kernel (one pass over every tensor, CPU and CUDA) is ~8x faster than the
    per-tensor loop on CPU: it keeps the optimizer step of DSpark's vocabulary-sized Markov factors from adding
    to the step time (``bench/head_overhead.py``). Its state dict is the plain AdamW one."""
    t = cfg.train
    return torch.optim.AdamW(
        params, lr=t.lr, weight_decay=t.weight_decay, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, fused=True
    )


# The loss parts a step accumulates on the device, in this order (``StepParts``).
PART_NAMES = ("loss", "ce", "tv", "conf", "padding_calls")


@dataclass
class StepParts:
    """One step's loss parts on this rank, still on the device: ``sums`` in ``PART_NAMES`` order (the loss and
    CE / TV / confidence over the step's normaliser, padding calls), ``tokens`` the step's supervised slots over all
    drafter ranks (a 0-dim float64 tensor)."""

    sums: torch.Tensor
    tokens: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        """This rank's share of the step loss (the step loss is its sum over the drafter ranks)."""
        return self.sums[0]

    def reduced(self, ctx: DistContext) -> dict[str, float]:
        """The parts summed over the drafter ranks, as ``train/...`` metrics: one collective and one read."""
        values = torch.cat([self.sums, self.tokens.reshape(1)])
        if ctx.distributed:
            # The token count is the same on every rank already: reduce only the sums.
            dist.all_reduce(values[:-1], group=ctx.group)
        numbers = values.tolist()
        return {f"train/{name}": value for name, value in zip(PART_NAMES, numbers)} | {
            "train/supervised_tokens": numbers[-1]
        }


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
        loss: DrafterLoss,
        train_source: FeatureSource,
        val_batches: Optional[Callable[[], Iterable[PackedBatch]]],
        sink: MetricsSink,
        ctx: DistContext,
        total_steps: int,
    ):
        self.cfg = cfg
        self.model = model
        # Resolved once for the run (kind record, loss settings, frozen target head), used by every micro-batch.
        self.loss = loss
        self.train_source = train_source
        self.val_batches = val_batches
        self.sink = sink
        self.ctx = ctx
        self.total_steps = total_steps
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = drafter_optimizer(self.params, cfg)
        self.scheduler = warmup_cosine(self.optimizer, total_steps, cfg.train.warmup_frac)
        self.step = 0
        # Replaced by the recipe's engine in ``_synchronise_replicas`` (DDP's and DeepSpeed's initialisations are
        # collective); until then forwards are never reduced.
        self.engine: DrafterEngine = LocalEngine(cfg, model, self.optimizer, ctx, wrap=False)
        self._padding_batch: Optional[PackedBatch] = None
        self.bad_steps = BadSteps(cfg.train.max_bad_steps, log.warning if ctx.is_main else None)

    def _synchronise_replicas(self) -> None:
        """The trainer's first collectives over the drafter ranks: rank 0's initial weights everywhere (ranks seed
        differently, so their random inits differ), then the DeepSpeed engine when selected.

        Runs once every rank holds its first step's micro-batches: a streamed drafter receives its plan only after
        the drafters before it have started iterating, so a drafter-group collective any earlier would deadlock.
        """
        broadcast_parameters(self.params, self.ctx)
        self.engine = make_engine(self.cfg, self.model, self.optimizer, self.ctx, Path(self.cfg.run.output_dir))

    def _resume_position(self, path: Optional[Path]) -> Optional[tuple[Path, dict]]:
        """Step, data position and RNG of the checkpoint ``path`` to resume from (no collectives); None for a fresh
        run."""
        if path is None:
            return None
        state = load_run_state(self.ctx, path)
        self.step = int(state["step"])
        self.train_source.load_state_dict(state["data"])
        return path, state

    def _restore(self, path: Path, state: dict) -> None:
        """Weights, optimizer and scheduler of the checkpoint (after ``_synchronise_replicas``)."""
        load_checkpoint(self.ctx, path, self.model, self.engine.train_state(), self.scheduler, state)
        log.info("resumed from %s at step %d", path, self.step)

    def _accumulate(self, step: StepBatches, stats: PositionStats) -> tuple[torch.Tensor, StepParts]:
        """Forward/backward every micro-batch of one optimizer step, each as it comes (a streamed step's batches
        arrive one by one); returns this rank's share of the step loss and the step's parts, on the device."""
        normalizers = step_normalizers(step, self.loss, self.engine.forward_module, self.ctx)
        tokens = normalizers.tokens
        padding = self.engine.plan_step(step.num_active)
        # float64 like the Python numbers they replace, summed in the same order: logged values are unchanged.
        sums = torch.zeros(len(PART_NAMES), dtype=torch.float64, device=self.ctx.device)
        # Backward calls spent on padding: the cost of uneven micro-batch counts across drafter ranks.
        sums[-1] = padding
        first: Optional[PackedBatch] = None
        for batch in step.batches:
            first = batch if first is None else first
            # ``target_hidden`` has one row per supervised slot: its shape answers without reading the labels.
            if batch.target_hidden.shape[0] == 0:
                continue
            with self.engine.micro_batch():
                result = self._forward_loss(batch, normalizers.rows(batch))
                self.engine.backward(result.loss.loss)
            out = result.loss
            parts = torch.stack([out.loss.detach().double(), out.ce_sum.double() / tokens,
                                 out.tv_sum.double() / tokens, out.conf_sum.double() / tokens])
            sums[:-1] += parts
            stats.update(result.slot_index, out.c_star, out.draft_correct, out.conf_prob)
            # Kept for padding calls of later steps on which this rank may have no micro-batch of its own.
            self._padding_batch = batch
        for _ in range(padding):
            with self.engine.micro_batch():
                self._padding_backward(first)
        step_parts = StepParts(sums, tokens)
        return step_parts.loss, step_parts

    def _forward_loss(self, batch: PackedBatch, normalizer: float | torch.Tensor):
        """The engine's forward module on ``batch`` and its loss, under autocast when the engine asks for it."""
        engine = self.engine
        with torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=engine.autocast_bf16):
            return self.loss(engine.forward_module, batch, normalizer)

    def _padding_backward(self, first: Optional[PackedBatch]) -> None:
        """One backward that changes nothing, for an engine that needs equal backward counts on every rank: a
        real forward with the loss times zero, so gradient hooks fire exactly as on the ranks that still have
        data (see ``deepspeed_engine``). ``first`` is this step's first micro-batch, if any."""
        batch = self._padding_batch
        if batch is None:
            if first is None:
                raise RuntimeError("drafter rank got no micro-batch in its first step: nothing to pad the step with")
            batch = first
        self.engine.backward(self._forward_loss(batch, 1.0).loss.loss * 0.0)

    def _update(self, local_loss: torch.Tensor) -> tuple[torch.Tensor | float, bool]:
        """Clip the reduced gradients, agree with the other ranks on the step (``training.step_guard``) and apply it
        unless its loss or gradient norm is not finite; returns the pre-clip gradient norm and whether a
        preemption request stops the run after this step. A skipped step still moves the LR schedule, so the
        learning rate stays a function of the step number."""
        verdict = agree_on_step(local_loss, self.engine.clip(), self.ctx)
        grad_norm, applied = self.engine.step(skip=verdict.bad)
        self.scheduler.step()
        self.bad_steps.record(self.step + 1, not applied)
        return grad_norm, verdict.stop

    def fit(self, resume_from: Optional[Path] = None) -> TrainSummary:
        """Train to ``total_steps``, continuing from the verified checkpoint ``resume_from``
        (``checkpoint.resolve_resume``) when given."""
        steps = self.steps(resume_from)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def save_now(self) -> Path:
        """Checkpoint the step just trained: a colocated group run (``jobs.colocated``) stops every group after the
        step at which one of them was preempted, the ones that had already trained it included."""
        return save_checkpoint(
            self.ctx, self.cfg.run.output_dir, self.step, self.engine.train_state(), self.scheduler,
            self.train_source.state_dict(), self.cfg.train.keep_last,
        )

    def steps(self, resume_from: Optional[Path] = None) -> Generator[int, None, TrainSummary]:
        """``fit`` one optimizer step at a time: yields the step number after each step (its metrics, validation
        and checkpoint done) and returns the summary, so one process can interleave several trainers step by
        step (drafter groups) exactly as each would run alone."""
        resume = self._resume_position(resume_from)
        iterator: Iterator[StepBatches] = iter(self.train_source)
        pending = next(iterator) if self.step < self.total_steps else None
        self._synchronise_replicas()
        if resume is not None:
            self._restore(*resume)
        cfg = self.cfg
        progress = TrainProgress(self.total_steps, enabled=self.ctx.is_main and cfg.logging.progress, initial_step=self.step)
        profiler = StepProfiler(cfg.train.profile, Path(cfg.run.output_dir), self.ctx.rank, self.ctx.device)
        stats = PositionStats(cfg.drafter.block_size, device=self.ctx.device)
        window = _Window(self.ctx.device)
        start = time.time()
        val_metrics: dict[str, float] = {}
        # The global loss of the last logged step, and of the step it belongs to.
        logged_loss, logged_step = math.nan, -1
        parts: Optional[StepParts] = None
        self.engine.forward_module.train()
        try:
            while self.step < self.total_steps:
                step_batches = pending if pending is not None else next(iterator)
                pending = None
                local_loss, parts = self._accumulate(step_batches, stats)
                grad_norm, stop_requested = self._update(local_loss)
                self.step += 1
                window.add(cfg.train.global_batch_sequences, parts.tokens)
                if self.step % cfg.logging.log_every == 0 or self.step == self.total_steps:
                    metrics = self._log_metrics(parts, stats, grad_norm, window)
                    logged_loss, logged_step = metrics["train/loss"], self.step
                    progress.update(self.step, metrics["train/samples_per_s"],
                                    metrics["train/supervised_tokens_per_s"], logged_loss)
                else:
                    progress.advance(self.step)
                last = self.step == self.total_steps
                if self.val_batches is not None and (self.step % cfg.train.eval_every == 0 or last):
                    val_metrics = self.validate()
                    self.sink.log(val_metrics, self.step)
                    if self.ctx.is_main:
                        tqdm.write(_format_val(self.step, val_metrics))
                profiler.step()
                stopping = cfg.train.stop_at_step is not None and self.step >= cfg.train.stop_at_step
                # A preemption signal on any rank: every rank stops after this same step (``training.preemption``).
                preempted = self.step < self.total_steps and not stopping and stop_requested
                if self.step % cfg.train.checkpoint_every == 0 or last or stopping or preempted:
                    checkpoint = self.save_now()
                if preempted:
                    progress.close()
                    if self.ctx.is_main:
                        preemption.announce(self.step, checkpoint, log.warning)
                    raise preemption.Preempted(self.step, checkpoint)
                if stopping:
                    break
                yield self.step
        finally:
            profiler.close()
            progress.close()
        self.engine.finish()
        if parts is not None and logged_step != self.step:
            # The run ended on a step it did not log (``train.stop_at_step``): one more reduction, on every rank.
            logged_loss = parts.reduced(self.ctx)["train/loss"]
        return TrainSummary(self.step, logged_loss, val_metrics, time.time() - start)

    def _log_metrics(
        self, parts: StepParts, stats: PositionStats, grad_norm: torch.Tensor | float, window: "_Window"
    ) -> dict[str, float]:
        """Reduce the last step's parts and the window's statistics over the drafter ranks (one collective), log
        them and start a new window; returns the logged metrics."""
        if self.ctx.distributed:
            sums = stats.all_reduce_with(parts.sums, self.ctx.group)
        else:
            sums = parts.sums
        norm = grad_norm if isinstance(grad_norm, torch.Tensor) else torch.tensor(grad_norm)
        reads = torch.cat([sums, parts.tokens.reshape(1), window.tokens.reshape(1),
                           norm.detach().to(device=sums.device, dtype=torch.float64).reshape(1)]).tolist()
        elapsed = max(time.time() - window.start, 1e-9)
        metrics = {f"train/{name}": value for name, value in zip(PART_NAMES, reads)} | {
            "train/supervised_tokens": reads[len(PART_NAMES)],
        } | stats.summary("train") | {
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": reads[-1],
            "train/samples_per_s": window.samples / elapsed,
            "train/supervised_tokens_per_s": reads[len(PART_NAMES) + 1] / elapsed,
            "train/skipped_steps": float(self.bad_steps.total),
        } | self.train_source.pop_metrics()
        self.sink.log(metrics, self.step)
        stats.reset()
        window.restart()
        return metrics

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Per-position accuracy and c*, E[L] over full blocks, and the confidence head's ECE / AUROC vs c*."""
        cfg = self.cfg
        self.engine.forward_module.eval()
        stats = PositionStats(cfg.drafter.block_size, device=self.ctx.device)
        lengths = BlockLengthStats(cfg.drafter.block_size, device=self.ctx.device,
                                   first_slot=1 if cfg.drafter.labels == ZLAB_LABELS else 0)
        conf, target = [], []
        total_loss, total_rows = 0.0, 0.0
        for batch in self.val_batches():
            if batch.num_supervised == 0:
                continue
            result = self._forward_loss(batch, 1.0)
            out = result.loss
            total_loss += float(out.loss)
            total_rows += batch.num_supervised
            stats.update(result.slot_index, out.c_star, out.draft_correct, out.conf_prob)
            lengths.update(out.c_star, result.supervised_mask)
            if out.conf_prob is not None:
                conf.append(out.conf_prob.float().cpu())
                target.append(out.c_star.float().cpu())
        self.engine.forward_module.train()
        total_loss = all_reduce_sum(total_loss, self.ctx)
        total_rows = all_reduce_sum(total_rows, self.ctx)
        if self.ctx.distributed:
            stats.all_reduce(self.ctx.group)
            lengths.all_reduce(self.ctx.group)
        metrics = {"val/loss": total_loss / max(total_rows, 1.0)} | stats.summary("val") | lengths.summary("val")
        if self.ctx.distributed:
            # ECE and AUROC are not sums: gather every rank's (confidence, c*) pairs before scoring them.
            gathered: list = [None] * self.ctx.world_size
            torch.distributed.all_gather_object(gathered, (conf, target), group=self.ctx.group)
            conf = [t for rank_conf, _ in gathered for t in rank_conf]
            target = [t for _, rank_target in gathered for t in rank_target]
        if conf:
            probs, c_star = torch.cat(conf), torch.cat(target)
            metrics["val/conf_ece"] = float(ece(probs, c_star, n_bins=10))
            metrics["val/conf_auroc"] = float(auroc_soft(probs, c_star))
        return metrics


class _Window:
    """Samples (host) and supervised tokens (device) since the last logged step, for the throughput metrics."""

    def __init__(self, device: torch.device) -> None:
        self.tokens = torch.zeros((), dtype=torch.float64, device=device)
        self.restart()

    def restart(self) -> None:
        self.start, self.samples = time.time(), 0
        self.tokens.zero_()

    def add(self, samples: int, tokens: torch.Tensor) -> None:
        self.samples += samples
        self.tokens += tokens


def broadcast_parameters(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
    """Copy drafter rank 0's values of ``params`` to every drafter rank, in place, one tensor at a time (no
    flat copy of the whole drafter)."""
    if not ctx.distributed:
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, group=ctx.group, group_src=0)


def _format_val(step: int, metrics: dict[str, float]) -> str:
    accept = [metrics.get(f"val/accept_{k}") for k in range(1, 33)]
    curve = " ".join(f"{a:.2f}" for a in accept if a is not None)
    text = f"step {step}: val loss {metrics.get('val/loss', math.nan):.4f}  E[L] {metrics.get('val/expected_len', math.nan):.3f}  c*_k [{curve}]"
    if "val/conf_ece" in metrics:
        text += f"  conf ECE {metrics['val/conf_ece']:.3f} AUROC {metrics['val/conf_auroc']:.3f}"
    return text
