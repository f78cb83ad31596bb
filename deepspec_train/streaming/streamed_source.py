"""The drafter worker's feature source: packed micro-batches received from target workers.

It implements the ``training.feature_source.FeatureSource`` protocol like ``InProcessFeatureSource`` (per-step
lists of ``PackedBatch``; ``state_dict`` / ``load_state_dict`` with the data position), so the trainer does not
know where its features come from. It also keeps the stream's own measurements: seconds spent waiting on the stream and bytes received, reported as
``stream/target_wait_frac`` and wire bytes per supervised token.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from deepspec_train.packing.batch import PackedBatch
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.watchdog import PeerFailure
from deepspec_train.streaming.wire import (
    KIND_TRAIN, KIND_VALIDATION, StreamMessage, StreamPlan, recv_message, recv_plan, send_ints,
)
from deepspec_train.training.feature_source import StreamWindow


class StreamedFeatureSource:
    def __init__(self, topology: Topology, drafter: int, device: torch.device, timeout_s: float):
        self.topology = topology
        self.drafter = drafter
        self.device = device
        self.timeout_s = timeout_s
        self.feeders = [route.target for route in topology.routes_to(drafter)]
        self.plan = self._receive_plans()
        self.next_step = 0
        self.wait_seconds = 0.0
        self.bytes_received = 0
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
        # The same lazy epoch rollover as InProcessFeatureSource: after the last step of epoch e the position
        # reads (e, steps_per_epoch), not (e + 1, 0).
        if self.next_step == 0:
            return {"epoch": 0, "step_in_epoch": 0}
        epoch, last_in_epoch = divmod(self.next_step - 1, self.plan.steps_per_epoch)
        return {"epoch": epoch, "step_in_epoch": last_in_epoch + 1}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["epoch"]) * self.plan.steps_per_epoch + int(state["step_in_epoch"])

    def _receive(self, src: int, kind: int, step: int) -> StreamMessage:
        started = time.monotonic()
        message = recv_message(src, self.device, self.timeout_s, self.topology.describe(src))
        self.wait_seconds += time.monotonic() - started
        self.bytes_received += message.wire_bytes
        if message.kind != kind or message.step != step:
            raise PeerFailure(
                f"{self.topology.describe(src)} sent (kind {message.kind}, step {message.step}) where "
                f"(kind {kind}, step {step}) was expected: target and drafter disagree on the schedule"
            )
        return message

    def __iter__(self) -> Iterator[list[PackedBatch]]:
        for target in self.feeders:
            send_ints([self.next_step], target, self.device, self.timeout_s, self.topology.describe(target))
        self._window_start = time.monotonic()
        while self.next_step < self.plan.last_step:
            step = self.next_step
            message = self._receive(self.topology.feeder_of(self.drafter, step), KIND_TRAIN, step)
            self.next_step = step + 1
            yield message.batches

    def validation_batches(self) -> list[PackedBatch]:
        """The validation micro-batches that follow the last training step received."""
        step = self.next_step - 1
        return self._receive(self.topology.feeder_of(self.drafter, step), KIND_VALIDATION, step).batches

    def pop_stream_metrics(self) -> StreamWindow:
        """Seconds waiting on the stream, wall seconds and bytes received since the last call."""
        now = time.monotonic()
        window = StreamWindow(self.wait_seconds, now - self._window_start, float(self.bytes_received))
        self.wait_seconds, self.bytes_received, self._window_start = 0.0, 0, now
        return window
