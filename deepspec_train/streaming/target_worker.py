"""The target worker's loop: run the frozen target over the data of the drafters it feeds and stream their
packed micro-batches to them.

For each drafter it serves, the worker follows exactly the plan that drafter would follow colocated
(``InProcessFeatureSource`` with the drafter's index among drafter ranks as its rank): same sequences, same
anchors, same packing, so the streamed features are bit-identical to colocated ones. Computation and sending
are decoupled by a bounded queue (``stream.depth`` messages): the target forward for the next steps overlaps the
drafter's training, and when the drafter falls behind the full queue blocks the forward (backpressure, bounded
memory). A background thread does the sends; if a drafter dies, that thread ends the process with a message
naming it.

Start-up exchange, per served drafter: the target sends the plan (``total_steps``, ``steps_per_epoch``,
whether validation is streamed, and for EAGLE-3 the supervised-token counts that size the draft vocabulary);
the drafter answers with the global step it starts at (0, or the step of the checkpoint it resumed from).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from deepspec_train.streaming.roles import Route, Topology
from deepspec_train.streaming.watchdog import PeerFailure, abort
from deepspec_train.streaming.wire import (
    KIND_TRAIN, KIND_VALIDATION, StreamMessage, StreamPlan, recv_ints, send_message, send_plan,
)
from deepspec_train.training.feature_source import InProcessFeatureSource, ValidationShare


@dataclass
class DrafterFeed:
    """What one target worker computes for one drafter: its training plan and its validation share."""

    route: Route
    train: InProcessFeatureSource
    validation: Optional[ValidationShare]


class _Sender:
    """Background sends through a bounded queue; the queue's bound is the target's lead over its drafters."""

    def __init__(self, depth: int, device: torch.device, timeout_s: float, topology: Topology):
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.device = device
        self.timeout_s = timeout_s
        self.topology = topology
        self.bytes_sent = 0
        self.thread = threading.Thread(target=self._run, name="deepspec-stream-sender", daemon=True)
        self.thread.start()

    def put(self, dst: int, message: StreamMessage) -> None:
        self.queue.put((dst, message))

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while True:
            item = self.queue.get()
            if item is None:
                return
            dst, message = item
            try:
                self.bytes_sent += send_message(message, dst, self.device, self.timeout_s, self.topology.describe(dst))
            except PeerFailure as exc:
                abort(f"target worker stream to {self.topology.describe(dst)} failed: {exc}")


def exchange_plan(feeds: Sequence[DrafterFeed], plan: StreamPlan, topology: Topology, device: torch.device,
                  timeout_s: float) -> dict[int, int]:
    """Send the plan to every served drafter and collect the global step each one starts at."""
    starts = {}
    for feed in feeds:
        dst = topology.drafter_rank(feed.route.drafter)
        peer = topology.describe(dst)
        send_plan(plan, dst, device, timeout_s, peer)
        starts[feed.route.drafter] = recv_ints(dst, device, timeout_s, peer)[0]
    return starts


def run_target_loop(feeds: Sequence[DrafterFeed], plan: StreamPlan, topology: Topology, device: torch.device,
                    depth: int, timeout_s: float) -> int:
    """Stream every served drafter's steps from its start step to the end; returns the bytes sent."""
    starts = exchange_plan(feeds, plan, topology, device, timeout_s)
    sender = _Sender(depth, device, timeout_s, topology)
    first = min(starts.values(), default=plan.last_step)
    for step in range(first, plan.last_step):
        epoch, step_in_epoch = divmod(step, plan.steps_per_epoch)
        served = [f for f in feeds if step >= starts[f.route.drafter] and f.route.carries(step)]
        for feed in served:
            indices = feed.train.step_sample_indices(epoch, step_in_epoch)
            batches = feed.train.batches_for(indices, epoch)
            sender.put(topology.drafter_rank(feed.route.drafter), StreamMessage(KIND_TRAIN, step, epoch, step_in_epoch, batches))
        # Validation goes out only after every served drafter has its training message: a drafter reads its
        # validation payload after the step's gradient all-reduce, which needs all drafters to have trained, and
        # sends are blocking, so interleaving (train d0, val d0, train d1) would deadlock with two drafters.
        if plan.validates_after(step):
            for feed in served:
                if feed.validation is not None:
                    message = StreamMessage(KIND_VALIDATION, step, 0, 0, feed.validation.batches())
                    sender.put(topology.drafter_rank(feed.route.drafter), message)
    sender.close()
    return sender.bytes_sent
