"""The drafter worker's feature source: packed micro-batches received from target groups.

It implements the ``training.feature_source.FeatureSource`` protocol like ``InProcessFeatureSource`` (per-step
``StepBatches``; ``state_dict`` / ``load_state_dict`` with the data position of ``steps.plan``), so the trainer
does not know where its features come from. A step arrives as an outline (counts) and then one message per
micro-batch, received only when the trainer asks for the next micro-batch, so the drafter holds one micro-batch of
features at a time; with ``train.feature_reuse`` R > 1 (``replay``), a target pass arrives at its first step only
(or at the step the run resumes from) and the drafter keeps its micro-batches for the pass's other steps
(``training.feature_source.PassReplay``), as a colocated drafter does. Its metrics are the stream's own measurements, reduced over the drafter ranks:
``stream/target_wait_frac`` (the share of time spent waiting on the stream, mean over ranks),
``stream/wire_bytes_per_supervised_token`` and ``stream/peak_bytes_in_flight_group{g}`` (the peak bytes each
feeding group's send queue held so far).
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

from deepspec_train.packing.batch import PackedBatch
from deepspec_train.steps.plan import data_state, next_step_of
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.watchdog import PeerFailure
from deepspec_train.streaming.wire import (
    KIND_BATCH, KIND_TRAIN, KIND_VALIDATION, StreamMessage, StreamPlan, recv_message, recv_plan, send_ints,
)
from deepspec_train.training.distributed import DistContext, all_reduce_max, all_reduce_sum
from deepspec_train.training.feature_source import PassReplay, StepBatches


class StreamedFeatureSource:
    """Drafter rank ``ctx.rank``'s steps, received from the target groups that feed it (``ctx``: the drafter
    role's context, over which the metrics are reduced)."""

    def __init__(self, topology: Topology, ctx: DistContext, timeout_s: float, replay: Optional[PassReplay] = None):
        self.topology = topology
        self.replay = replay
        self.reuse = 1 if replay is None else replay.reuse
        self.ctx = ctx
        self.drafter = ctx.rank
        self.device = ctx.device
        self.timeout_s = timeout_s
        self.feeders = [topology.target_rank(route.target) for route in topology.routes_to(self.drafter)]
        self.plan = self._receive_plans()
        self.next_step = 0
        self.wait_seconds = 0.0
        self.bytes_received = 0
        self.supervised = 0
        self.peak_in_flight = [0.0] * topology.num_targets
        self._window_start = time.monotonic()

    def _receive_plans(self) -> StreamPlan:
        plans = [
            recv_plan(target, self.device, self.timeout_s, self.topology.describe(target)) for target in self.feeders
        ]
        first = plans[0]
        for plan in plans[1:]:
            if plan.to_ints() != first.to_ints():
                raise PeerFailure(f"target workers {self.feeders} disagree on the plan: {[p.to_ints() for p in plans]}")
        return first

    def state_dict(self) -> dict:
        return data_state(self.next_step, self.plan.steps_per_epoch)

    def load_state_dict(self, state: dict) -> None:
        self.next_step = next_step_of(state, self.plan.steps_per_epoch)

    def _receive(self, src: int, kind: int, step: int, index: int = 0) -> StreamMessage:
        started = time.monotonic()
        message = recv_message(src, self.device, self.timeout_s, self.topology.describe(src))
        self.wait_seconds += time.monotonic() - started
        self.bytes_received += message.wire_bytes
        group = self.topology.group_of(src)
        self.peak_in_flight[group] = max(self.peak_in_flight[group], float(message.peak_in_flight))
        if (message.kind, message.step, message.index) != (kind, step, index):
            raise PeerFailure(
                f"{self.topology.describe(src)} sent (kind {message.kind}, step {message.step}, micro-batch "
                f"{message.index}) where (kind {kind}, step {step}, micro-batch {index}) was expected: target and "
                f"drafter disagree on the schedule"
            )
        return message

    def _batches(self, src: int, step: int, count: int) -> Iterator[PackedBatch]:
        for index in range(count):
            yield self._receive(src, KIND_BATCH, step, index).batches[0]

    def __iter__(self) -> Iterator[StepBatches]:
        for target in self.feeders:
            send_ints([self.next_step], target, self.device, self.timeout_s, self.topology.describe(target))
        self._window_start = time.monotonic()
        while self.next_step < self.plan.last_step:
            step = self.next_step
            self.next_step = step + 1
            kept = None if self.replay is None else self.replay.kept(step // self.reuse)
            if kept is not None:
                yield kept
                continue
            src = self.topology.target_rank(self.topology.feeder_of(self.drafter, step))
            head = self._receive(src, KIND_TRAIN, step)
            self.supervised += head.supervised
            received = StepBatches(head.count, head.active, head.supervised, self._batches(src, step, head.count),
                                   head.slot_counts())
            yield received if self.replay is None else self.replay.keep(step // self.reuse, received)

    def validation_batches(self) -> Iterator[PackedBatch]:
        """The validation micro-batches that follow the last training step received, one at a time."""
        step = self.next_step - 1
        src = self.topology.target_rank(self.topology.feeder_of(self.drafter, step))
        head = self._receive(src, KIND_VALIDATION, step)
        return self._batches(src, step, head.count)

    def pop_metrics(self) -> dict[str, float]:
        """The stream's measurements since the last call over all drafter ranks (collective): the mean share of
        time spent waiting, the wire bytes per supervised token, and per target group its peak bytes in flight so
        far (0 for a group that feeds no drafter)."""
        now = time.monotonic()
        wait_frac = self.wait_seconds / max(now - self._window_start, 1e-9)
        bytes_received, supervised = float(self.bytes_received), float(self.supervised)
        self.wait_seconds, self.bytes_received, self.supervised, self._window_start = 0.0, 0, 0, now
        peaks = all_reduce_max(self.peak_in_flight, self.ctx)
        return {
            "stream/target_wait_frac": all_reduce_sum(wait_frac, self.ctx) / self.ctx.world_size,
            "stream/wire_bytes_per_supervised_token":
                all_reduce_sum(bytes_received, self.ctx) / max(all_reduce_sum(supervised, self.ctx), 1.0),
            "stream/peak_bytes_in_flight": max(peaks),
        } | {f"stream/peak_bytes_in_flight_group{g}": peak for g, peak in enumerate(peaks)}
