"""The target group's loop: run the frozen target over the data of the drafters it feeds and stream their packed
micro-batches to them.

For each drafter it serves, the group follows exactly the plan that drafter would follow colocated (the
``steps.plan.StepPlan`` with the drafter's index among drafter ranks as its rank, built by the same
``steps.chunk_builder.ChunkBuilder``): same sequences, same anchors, same packing, so the streamed features are
the colocated ones. Every rank of a tensor-parallel group
runs the same forwards in the same order (they are collective); only the group's first rank sends.

A step goes out as an outline per served drafter (its micro-batch count, supervised slots and per-sequence slot
counts, known from the packing plan before the target runs) and then one message per micro-batch as soon as it is built. Computation
and sending are decoupled by a send queue bounded in micro-batches (``stream.depth``): the forward of the next
micro-batches overlaps the drafter's training, and when the drafter falls behind the full queue blocks the
forward (backpressure), so at most ``depth`` micro-batches wait while one is on the wire, whatever the global
batch. The queue measures its bytes in flight (queued or being sent) and every message carries the peak so far.
A background thread does the sends; if a drafter dies, that thread ends the process with a message naming it.

Start-up exchange, per served drafter: the sender sends the plan (``total_steps``, ``steps_per_epoch``, whether
validation is streamed, and for EAGLE-3 the supervised-token counts that size the draft vocabulary); the
drafter answers with the global step it starts at (0, or the step of the checkpoint it resumed from), which the
sender shares with the rest of its group.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from deepspec_train.config.schema import StreamConfig
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import ChunkPlan, chunks_slot_counts, chunks_supervised
from deepspec_train.steps.plan import StepPlan, StepPosition, step_position
from deepspec_train.streaming.roles import Route, Topology
from deepspec_train.streaming.watchdog import PeerFailure, abort
from deepspec_train.streaming.wire import (
    KIND_BATCH, KIND_TRAIN, KIND_VALIDATION, StreamMessage, StreamPlan, message_bytes, outline, recv_ints,
    send_message, send_plan,
)
from deepspec_train.training import preemption


@dataclass
class DrafterFeed:
    """What one target group computes for one drafter: its training plan and its validation pass (the one step
    of a validation plan), None without validation data."""

    route: Route
    train: StepPlan
    validation: Optional[StepPlan]


@dataclass
class StreamReport:
    """What a target group's sender measured: bytes sent and the peak bytes queued or being sent."""

    bytes_sent: int
    peak_in_flight: int


class _Sender:
    """Background sends through a queue that holds at most ``depth`` micro-batch messages (outlines, a few dozen
    bytes, do not count), with one more being sent; measures the bytes in flight."""

    def __init__(self, depth: int, device: torch.device, timeout_s: float, topology: Topology):
        self.depth = max(1, depth)
        self.device = device
        self.timeout_s = timeout_s
        self.topology = topology
        self.bytes_sent = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._items: collections.deque = collections.deque()
        self._queued_batches = 0
        self._cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="deepspec-stream-sender", daemon=True)
        self.thread.start()

    def put(self, dst: int, message: StreamMessage) -> None:
        size = message_bytes(message)
        with self._cond:
            if message.batches:
                self._cond.wait_for(lambda: self._queued_batches < self.depth)
                self._queued_batches += 1
            self.in_flight += size
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            message.peak_in_flight = self.peak_in_flight
            self._items.append((dst, message, size))
            self._cond.notify_all()

    def close(self) -> StreamReport:
        with self._cond:
            self._items.append(None)
            self._cond.notify_all()
        self.thread.join()
        return StreamReport(self.bytes_sent, self.peak_in_flight)

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._items))
                item = self._items.popleft()
                if item is not None and item[1].batches:
                    self._queued_batches -= 1
                    self._cond.notify_all()
            if item is None:
                return
            dst, message, size = item
            try:
                self.bytes_sent += send_message(message, dst, self.device, self.timeout_s, self.topology.describe(dst))
            except PeerFailure as exc:
                if preemption.drafters_stopped.is_set():
                    return  # the drafters checkpointed and left after a preemption signal
                abort(f"target worker stream to {self.topology.describe(dst)} failed: {exc}")
            with self._cond:
                self.in_flight -= size


class _NoSends:
    """The sink of a group rank that does not send: it computes every micro-batch (the forwards are collective)
    and drops it."""

    def put(self, dst: int, message: StreamMessage) -> None:
        return None

    def close(self) -> StreamReport:
        return StreamReport(0, 0)


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


def _share_starts(starts: dict[int, int], feeds: Sequence[DrafterFeed], device: torch.device,
                  group: Optional[dist.ProcessGroup]) -> dict[int, int]:
    """The sender's start steps on every rank of its tensor-parallel group (``group``; None: no group)."""
    if group is None:
        return starts
    values = torch.tensor([starts.get(f.route.drafter, 0) for f in feeds], dtype=torch.int64, device=device)
    dist.broadcast(values, group=group, group_src=0)
    return {f.route.drafter: int(v) for f, v in zip(feeds, values.tolist())}


def _stream_bundle(sink, builder: ChunkBuilder, topology: Topology, kind: int, step: int, position: StepPosition,
                   work: list[tuple[DrafterFeed, list[ChunkPlan]]]) -> None:
    """Every drafter's outline first, then their micro-batches, drafter after drafter.

    Outlines go first because a drafter all-reduces its step's supervised count before its first backward:
    with blocking sends, drafter 1's outline queued behind drafter 0's micro-batches would deadlock against
    drafter 0 waiting in that all-reduce for drafter 1.
    """
    epoch, step_in_epoch = position.epoch, position.step_in_epoch
    for feed, chunks in work:
        counts = chunks_slot_counts(chunks) if kind == KIND_TRAIN else None
        sink.put(topology.drafter_rank(feed.route.drafter),
                 outline(kind, step, epoch, step_in_epoch, chunks_supervised(chunks), counts))
    for feed, chunks in work:
        dst = topology.drafter_rank(feed.route.drafter)
        index = 0
        for chunk in chunks:
            for batch in builder.build(chunk):
                sink.put(dst, StreamMessage(KIND_BATCH, step, epoch, step_in_epoch, [batch], index=index))
                index += 1


def run_target_loop(feeds: Sequence[DrafterFeed], builder: ChunkBuilder, plan: StreamPlan, topology: Topology,
                    stream: StreamConfig, device: torch.device, tp_group: Optional[dist.ProcessGroup] = None,
                    sends: bool = True) -> StreamReport:
    """Stream every served drafter's steps from its start step to the end, building them with ``builder``.

    ``stream``: the send queue's depth and the timeout; ``tp_group``: the rank's tensor-parallel group (None for
    a group of one); ``sends``: whether this rank is the group's sender (the others run the same forwards and
    send nothing).
    """
    starts = exchange_plan(feeds, plan, topology, device, stream.timeout_s) if sends else {}
    starts = _share_starts(starts, feeds, device, tp_group)
    sink = _Sender(stream.depth, device, stream.timeout_s, topology) if sends else _NoSends()
    first = min(starts.values(), default=plan.last_step)
    for step in range(first, plan.last_step):
        served = [f for f in feeds if step >= starts[f.route.drafter] and f.route.carries(step)]
        work = [(f, f.train.chunks(step)) for f in served]
        _stream_bundle(sink, builder, topology, KIND_TRAIN, step, step_position(step, plan.steps_per_epoch), work)
        # Validation goes out only after every served drafter has its training step: a drafter reads its
        # validation payload after the step's gradient all-reduce, which needs all drafters to have trained, and
        # sends are blocking, so interleaving (train d0, val d0, train d1) would deadlock with two drafters.
        if plan.validates_after(step):
            # The validation pass is its plan's only step.
            work = [(f, f.validation.chunks(0)) for f in served if f.validation is not None]
            _stream_bundle(sink, builder, topology, KIND_VALIDATION, step, StepPosition(0, 0), work)
    return sink.close()
