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

With feature reuse (``train.feature_reuse``: ``StepPlan.starts_pass``) a drafter trains several steps on one
target pass: the loop builds and sends a drafter's training micro-batches only at the first step of each pass (and
at the step that drafter starts from); validation still follows every step that validates.

Start-up exchange, per served drafter: the sender sends the plan (``total_steps``, ``steps_per_epoch``, whether
validation is streamed, and for EAGLE-3 the supervised-token counts that size the draft vocabulary); the
drafter answers with the global step it starts at (0, or the step of the checkpoint it resumed from), which the
sender shares with the rest of its group.

Drafter groups (``jobs.drafter_groups``): the loop serves one ``FeedGroup`` per drafter group, each with the
chunk builder and plan of its recipe. The groups' micro-batches that share a target forward are built one after
the other (micro-batch ``j`` of drafter ``i`` in every group, then ``j + 1``), their builders' taps being views of
one ``target.shared_pass.SharedTargetPass`` that ``after_forward`` clears, so one forward serves every group and
at most one is kept. A group is served from the step it starts at until its own last step; one that stopped
after a preemption signal gets nothing more (the sender drops its messages; the forwards still run, so every rank
of a tensor-parallel group keeps running the same ones) while the others go on.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from itertools import zip_longest
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from deepspec_train.config.schema import StreamConfig
from deepspec_train.steps.chunk_builder import ChunkBuilder
from deepspec_train.steps.chunk_plan import ChunkPlan, chunks_slot_counts, chunks_supervised
from deepspec_train.steps.plan import StepPlan, StepPosition, step_position
from deepspec_train.streaming.roles import Route, Topology
from deepspec_train.streaming.watchdog import PeerFailure, abort, first_line
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
class FeedGroup:
    """One drafter group as a target group serves it: the drafters it feeds (``feeds``), the chunk builder of the
    group's recipe, the plan announced to them, and the drafter group's index (0 for a single run)."""

    feeds: Sequence[DrafterFeed]
    builder: ChunkBuilder
    plan: StreamPlan
    index: int = 0


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
        if preemption.drafter_group_stopped(self.topology.drafter_group_of(dst)):
            return  # its drafters checkpointed and left after a preemption signal
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
            except (PeerFailure, RuntimeError) as exc:
                # A drafter group that checkpointed and left after a preemption signal (posting a send to its
                # closed connection raises at once): the others go on.
                if not preemption.drafter_group_stopped(self.topology.drafter_group_of(dst)):
                    abort(f"target worker stream to {self.topology.describe(dst)} failed: {first_line(exc)}")
            with self._cond:
                self.in_flight -= size


class _NoSends:
    """The sink of a group rank that does not send: it computes every micro-batch (the forwards are collective)
    and drops it."""

    def put(self, dst: int, message: StreamMessage) -> None:
        return None

    def close(self) -> StreamReport:
        return StreamReport(0, 0)


def exchange_plan(groups: Sequence[FeedGroup], topology: Topology, device: torch.device,
                  timeout_s: float) -> dict[tuple[int, int], int]:
    """Send its group's plan to every served drafter and collect the global step each one starts at, by
    (drafter group, drafter)."""
    starts = {}
    for group in groups:
        for feed in group.feeds:
            dst = topology.drafter_rank(feed.route.drafter, group.index)
            peer = topology.describe(dst)
            send_plan(group.plan, dst, device, timeout_s, peer)
            starts[group.index, feed.route.drafter] = recv_ints(dst, device, timeout_s, peer)[0]
    return starts


def _share_starts(starts: dict[tuple[int, int], int], groups: Sequence[FeedGroup], device: torch.device,
                  tp_group: Optional[dist.ProcessGroup]) -> dict[tuple[int, int], int]:
    """The sender's start steps on every rank of its tensor-parallel group (``tp_group``; None: no group)."""
    if tp_group is None:
        return starts
    keys = [(g.index, f.route.drafter) for g in groups for f in g.feeds]
    values = torch.tensor([starts.get(key, 0) for key in keys], dtype=torch.int64, device=device)
    dist.broadcast(values, group=tp_group, group_src=0)
    return dict(zip(keys, values.tolist()))


def _stream_bundle(sink, topology: Topology, kind: int, step: int, position: StepPosition,
                   work: list[tuple[FeedGroup, DrafterFeed, list[ChunkPlan]]],
                   after_forward: Callable[[], None]) -> None:
    """Every drafter's outline first, then their micro-batches, drafter after drafter; the drafter groups' micro-
    batches of one drafter index interleaved (micro-batch ``j`` of every group, then ``j + 1``: one target forward
    each, ``after_forward`` called after each).

    Outlines go first because a drafter all-reduces its step's supervised count before its first backward:
    with blocking sends, drafter 1's outline queued behind drafter 0's micro-batches would deadlock against
    drafter 0 waiting in that all-reduce for drafter 1.
    """
    epoch, step_in_epoch = position.epoch, position.step_in_epoch
    for group, feed, chunks in work:
        counts = chunks_slot_counts(chunks) if kind == KIND_TRAIN else None
        sink.put(topology.drafter_rank(feed.route.drafter, group.index),
                 outline(kind, step, epoch, step_in_epoch, chunks_supervised(chunks), counts))
    for drafter in dict.fromkeys(feed.route.drafter for _, feed, _ in work):
        mine = [(group, chunks) for group, feed, chunks in work if feed.route.drafter == drafter]
        indices = {group.index: 0 for group, _ in mine}
        for row in zip_longest(*(chunks for _, chunks in mine)):
            for (group, _), chunk in zip(mine, row):
                if chunk is None:
                    continue
                dst = topology.drafter_rank(drafter, group.index)
                for batch in group.builder.build(chunk):
                    sink.put(dst, StreamMessage(KIND_BATCH, step, epoch, step_in_epoch, [batch],
                                                index=indices[group.index]))
                    indices[group.index] += 1
            after_forward()


def run_target_loop(feeds: Sequence[DrafterFeed], builder: ChunkBuilder, plan: StreamPlan, topology: Topology,
                    stream: StreamConfig, device: torch.device, tp_group: Optional[dist.ProcessGroup] = None,
                    sends: bool = True) -> StreamReport:
    """Stream every served drafter's steps from its start step to the end, building them with ``builder``.

    ``stream``: the send queue's depth and the timeout; ``tp_group``: the rank's tensor-parallel group (None for
    a group of one); ``sends``: whether this rank is the group's sender (the others run the same forwards and
    send nothing).
    """
    return run_groups_loop([FeedGroup(feeds, builder, plan)], topology, stream, device, tp_group, sends)


def run_groups_loop(groups: Sequence[FeedGroup], topology: Topology, stream: StreamConfig, device: torch.device,
                    tp_group: Optional[dist.ProcessGroup] = None, sends: bool = True,
                    after_forward: Callable[[], None] = lambda: None) -> StreamReport:
    """``run_target_loop`` for several drafter groups, each from its drafters' start steps to its own last step;
    ``after_forward``: called once the micro-batches that share a target forward are built (the grouped run clears
    its shared pass there)."""
    starts = exchange_plan(groups, topology, device, stream.timeout_s) if sends else {}
    starts = _share_starts(starts, groups, device, tp_group)
    sink = _Sender(stream.depth, device, stream.timeout_s, topology) if sends else _NoSends()
    first = min(starts.values(), default=0)
    last = max((group.plan.last_step for group in groups), default=0)
    for step in range(first, last):
        served = [
            (group, feed) for group in groups for feed in group.feeds
            if starts[group.index, feed.route.drafter] <= step < group.plan.last_step and feed.route.carries(step)
        ]
        # With feature reuse a drafter keeps each pass for its later steps: it gets a pass at the pass's first
        # step, or at the step it starts from (a resume in the middle of a pass builds that pass again).
        work = [(group, feed, feed.train.chunks(step)) for group, feed in served
                if feed.train.starts_pass(step) or step == starts[group.index, feed.route.drafter]]
        position = step_position(step, served[0][0].plan.steps_per_epoch) if served else StepPosition(0, 0)
        _stream_bundle(sink, topology, KIND_TRAIN, step, position, work, after_forward)
        # Validation goes out only after every served drafter has its training step: a drafter reads its
        # validation payload after the step's gradient all-reduce, which needs all drafters to have trained, and
        # sends are blocking, so interleaving (train d0, val d0, train d1) would deadlock with two drafters.
        # The validation pass is its plan's only step.
        work = [(group, feed, feed.validation.chunks(0)) for group, feed in served
                if group.plan.validates_after(step) and feed.validation is not None]
        _stream_bundle(sink, topology, KIND_VALIDATION, step, StepPosition(0, 0), work, after_forward)
    return sink.close()
