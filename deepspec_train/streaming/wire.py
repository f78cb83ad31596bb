"""How packed micro-batches cross the wire between a target worker and a drafter worker.

A training step (or a validation pass) of one drafter travels as one *outline* message followed by one message
per packed micro-batch, so the bytes in flight are bounded by micro-batches, not by the global batch:

- the outline (``KIND_TRAIN`` / ``KIND_VALIDATION``) carries no micro-batch: how many micro-batch messages
  follow and, for a training step, their supervised slots, how many have any, and a table of the step's
  supervised rows per sequence and block slot (what the trainer needs before its first backward);
- each micro-batch message (``KIND_BATCH``) carries one ``PackedBatch`` and its index in the step.

Every message is:

1. a fixed header, ``int64[HEADER_LEN]``: magic, kind, step, epoch, step in epoch, number of batches, index,
   count, supervised slots, active micro-batches, the sender's peak bytes in flight so far, and the slot-count
   table's rows and columns (0 and 0 without a table);
2. an outline's slot-count table, ``int64[rows, columns]``: per sequence its dataset index, then its
   supervised rows per block slot;
3. a layout, ``int64[num_batches * NUM_FIELDS * 4]``: per batch and per ``PackedBatch`` field (in its wire
   order), the dtype code, the number of dimensions and two dimension sizes;
4. the payload: every non-empty field tensor of every batch, in that order, received straight into buffers of
   the announced shape and dtype (empty tensors are not sent at all).

Transfers use ``torch.distributed`` point-to-point ops (gloo on CPU, NCCL on GPU, so buffers live on the
process's device) and wait with a deadline (``watchdog.wait_for``) so that a dead peer is an error, not a hang.
``planned_message_bytes`` gives a micro-batch message's bytes from its packing plan alone (before any target runs;
equal to ``message_bytes`` of the built message, tested), for sizing the wire at long sequences. The same module
carries the start-up exchange: the ``StreamPlan`` a target worker announces to each drafter it
feeds (``send_plan`` / ``recv_plan``) and the small control vectors around it (``send_ints`` / ``recv_ints``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import BlockGroup
from deepspec_train.steps.chunk_plan import ChunkPlan
from deepspec_train.streaming.watchdog import PeerFailure, wait_for

MAGIC = 0x5D5B_A7C4
HEADER_LEN = 13
FIELD_NAMES = [f.name for f in fields(PackedBatch)]
NUM_FIELDS = len(FIELD_NAMES)
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int64: 3, torch.int32: 4, torch.bool: 5}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

KIND_TRAIN = 1
KIND_VALIDATION = 2
KIND_BATCH = 3


@dataclass
class StreamPlan:
    """What a target worker tells each drafter it feeds before streaming: the schedule both sides follow, and for
    a drafter kind that needs them the supervised-token counts of the training data (drafters never see it)."""

    total_steps: int
    # Where this run ends: ``total_steps``, or earlier with ``train.stop_at_step`` (same plan, shorter run).
    last_step: int
    steps_per_epoch: int
    eval_every: int
    has_validation: bool
    token_counts: Optional[torch.Tensor] = None

    def to_ints(self) -> list[int]:
        counts = 0 if self.token_counts is None else int(self.token_counts.numel())
        return [self.total_steps, self.last_step, self.steps_per_epoch, self.eval_every, int(self.has_validation), counts]

    def validates_after(self, step: int) -> bool:
        """Whether the drafter validates after finishing 0-based step ``step`` (the trainer's schedule)."""
        done = step + 1
        return self.has_validation and (done % self.eval_every == 0 or done == self.total_steps)


@dataclass
class StreamMessage:
    """One message: an outline (``batches`` empty, ``count`` micro-batch messages follow) or one micro-batch
    (``index`` in its step). ``peak_in_flight`` is the sender's peak bytes queued or being sent so far;
    ``slot_table`` (outlines of training steps) the ``[sequences, 1 + block_size]`` slot-count table."""

    kind: int
    step: int
    epoch: int = 0
    step_in_epoch: int = 0
    batches: list[PackedBatch] = field(default_factory=list)
    index: int = 0
    count: int = 0
    supervised: int = 0
    active: int = 0
    peak_in_flight: int = 0
    wire_bytes: int = 0
    slot_table: Optional[torch.Tensor] = None

    def header(self) -> list[int]:
        rows, columns = (0, 0) if self.slot_table is None else tuple(self.slot_table.shape)
        return [
            MAGIC, self.kind, self.step, self.epoch, self.step_in_epoch, len(self.batches), self.index, self.count,
            self.supervised, self.active, self.peak_in_flight, rows, columns,
        ]

    def slot_counts(self) -> dict[int, torch.Tensor]:
        """The slot-count table as ``{dataset index: [block_size] supervised rows per slot}`` (empty without)."""
        if self.slot_table is None:
            return {}
        table = self.slot_table.cpu()
        return {int(row[0]): row[1:].clone() for row in table}


def outline(kind: int, step: int, epoch: int, step_in_epoch: int, supervised: list[int],
            slot_counts: Optional[dict[int, torch.Tensor]] = None) -> StreamMessage:
    """The outline of a step whose micro-batches have ``supervised`` slots each and whose sequences have
    ``slot_counts`` supervised rows per block slot."""
    table = None
    if slot_counts:
        table = torch.stack([torch.cat([torch.tensor([key]), counts.long().cpu()]) for key, counts in slot_counts.items()])
    return StreamMessage(kind, step, epoch, step_in_epoch, count=len(supervised), supervised=sum(supervised),
                         active=sum(1 for n in supervised if n > 0), slot_table=table)


def _layout(batches: list[PackedBatch]) -> list[int]:
    layout = []
    for batch in batches:
        for name in FIELD_NAMES:
            t = getattr(batch, name)
            if t.dim() > 2:
                raise ValueError(f"PackedBatch.{name} has {t.dim()} dimensions; the wire format carries at most 2")
            shape = list(t.shape) + [0] * (2 - t.dim())
            layout.extend([DTYPE_CODES[t.dtype], t.dim(), *shape])
    return layout


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _parts(message: StreamMessage, device: torch.device) -> list[torch.Tensor]:
    parts = [torch.tensor(message.header(), dtype=torch.int64, device=device)]
    if message.slot_table is not None:
        parts.append(message.slot_table.to(device=device, dtype=torch.int64).contiguous())
    if message.batches:
        parts.append(torch.tensor(_layout(message.batches), dtype=torch.int64, device=device))
    for batch in message.batches:
        parts.extend(t.contiguous() for t in batch.tensors().values() if t.numel() > 0)
    return parts


def message_bytes(message: StreamMessage) -> int:
    """Bytes ``send_message`` puts on the wire for ``message``."""
    layout = len(message.batches) * NUM_FIELDS * 4 if message.batches else 0
    table = 0 if message.slot_table is None else message.slot_table.numel()
    tensors = sum(_nbytes(t) for batch in message.batches for t in batch.tensors().values())
    return INT64_BYTES * (HEADER_LEN + table + layout) + tensors


INT64_BYTES = 8


@dataclass(frozen=True)
class FeatureLayout:
    """What sizes a batch's features: ``ctx_features [Nc, taps * hidden]`` at ``ctx_bytes`` per value and
    ``target_hidden [Ns, hidden]`` at ``hidden_bytes`` per value (the dtypes they cross the wire in)."""

    taps: int
    hidden: int
    ctx_bytes: int
    hidden_bytes: int


def planned_message_bytes(groups: Sequence[BlockGroup], supervised: int, block_size: int,
                          layout: FeatureLayout) -> int:
    """Bytes of the ``KIND_BATCH`` message of one planned micro-batch (its block ``groups`` and ``supervised``
    slots): header, layout, and per ``PackedBatch`` field its rows times its width (``packing.batch``)."""
    rows = sum(int(group.anchors.max()) for group in groups)
    blocks = sum(int(group.anchors.numel()) for group in groups)
    features = rows * layout.taps * layout.hidden * layout.ctx_bytes + supervised * layout.hidden * layout.hidden_bytes
    # ctx_tokens, ctx_seq, ctx_pos per row; block_input, block_prev, labels per slot; block_seq, block_anchor per
    # block; sample_ids per packed sequence.
    integers = 3 * rows + 3 * blocks * block_size + 2 * blocks + len(groups)
    return INT64_BYTES * (HEADER_LEN + NUM_FIELDS * 4 + integers) + features


def planned_wire_bytes(chunks: Iterable[ChunkPlan], block_size: int, layout: FeatureLayout) -> int:
    """Bytes of every micro-batch message of ``chunks`` (outlines, a few hundred bytes per step, left out)."""
    return sum(
        planned_message_bytes(groups, supervised, block_size, layout)
        for chunk in chunks
        for groups, supervised in zip(chunk.groups, chunk.supervised)
    )


def send_message(message: StreamMessage, dst: int, device: torch.device, timeout_s: float, peer: str) -> int:
    """Send one message to rank ``dst``; returns the bytes put on the wire."""
    parts = _parts(message, device)
    # All sends are posted before waiting on any: the receiver posts its receives in the same order.
    works = [dist.isend(t, dst) for t in parts]
    for work in works:
        wait_for(work, timeout_s, peer, "receive a stream message")
    return sum(_nbytes(t) for t in parts)


def _recv(buffer: torch.Tensor, src: int, timeout_s: float, peer: str) -> torch.Tensor:
    wait_for(dist.irecv(buffer, src), timeout_s, peer, "send a stream message")
    return buffer


def recv_message(src: int, device: torch.device, timeout_s: float, peer: str) -> StreamMessage:
    """Receive one message from rank ``src`` into freshly allocated buffers on ``device``."""
    header = _recv(torch.empty(HEADER_LEN, dtype=torch.int64, device=device), src, timeout_s, peer).tolist()
    if header[0] != MAGIC:
        raise PeerFailure(f"{peer} sent a malformed stream header {header} (mismatched protocol or ranks)")
    kind, step, epoch, step_in_epoch, num_batches, index, count, supervised, active, peak, rows, columns = header[1:]
    wire_bytes = 8 * HEADER_LEN
    table = None
    if rows:
        table = _recv(torch.empty(rows, columns, dtype=torch.int64, device=device), src, timeout_s, peer)
        wire_bytes += 8 * rows * columns
    batches = []
    if num_batches:
        layout = torch.empty(num_batches * NUM_FIELDS * 4, dtype=torch.int64, device=device)
        layout = _recv(layout, src, timeout_s, peer).view(num_batches, NUM_FIELDS, 4).tolist()
        wire_bytes += num_batches * NUM_FIELDS * 4 * 8
        # Post every receive first, then wait: matches the sender's order and keeps the pipe full.
        pending = []
        for batch_layout in layout:
            tensors = {}
            for name, (code, ndim, d0, d1) in zip(FIELD_NAMES, batch_layout):
                buffer = torch.empty([d0, d1][:ndim], dtype=CODE_DTYPES[code], device=device)
                if buffer.numel() > 0:
                    pending.append(dist.irecv(buffer, src))
                    wire_bytes += _nbytes(buffer)
                tensors[name] = buffer
            batches.append(PackedBatch(**tensors))
        for work in pending:
            wait_for(work, timeout_s, peer, "send a stream message")
    return StreamMessage(kind, step, epoch, step_in_epoch, batches, index, count, supervised, active, peak, wire_bytes,
                         table)


def send_ints(values: list[int], dst: int, device: torch.device, timeout_s: float, peer: str) -> None:
    t = torch.tensor([MAGIC, len(values), *values], dtype=torch.int64, device=device)
    wait_for(dist.isend(torch.tensor([t.numel()], dtype=torch.int64, device=device), dst), timeout_s, peer, "receive")
    wait_for(dist.isend(t, dst), timeout_s, peer, "receive a control message")


def recv_ints(src: int, device: torch.device, timeout_s: float, peer: str) -> list[int]:
    size = int(_recv(torch.empty(1, dtype=torch.int64, device=device), src, timeout_s, peer).item())
    values = _recv(torch.empty(size, dtype=torch.int64, device=device), src, timeout_s, peer).tolist()
    if values[0] != MAGIC or values[1] != size - 2:
        raise PeerFailure(f"{peer} sent a malformed control message (mismatched protocol or ranks)")
    return values[2:]


def send_plan(plan: StreamPlan, dst: int, device: torch.device, timeout_s: float, peer: str) -> None:
    send_ints(plan.to_ints(), dst, device, timeout_s, peer)
    if plan.token_counts is not None:
        send_ints(plan.token_counts.tolist(), dst, device, timeout_s, peer)


def recv_plan(src: int, device: torch.device, timeout_s: float, peer: str) -> StreamPlan:
    total, last, per_epoch, eval_every, has_val, num_counts = recv_ints(src, device, timeout_s, peer)
    counts = None
    if num_counts:
        counts = torch.tensor(recv_ints(src, device, timeout_s, peer), dtype=torch.long)
    return StreamPlan(total, last, per_epoch, eval_every, bool(has_val), counts)
