"""A step streamed per micro-batch: the trainer's gradient accumulation and the target's bounded send queue.

- A step's micro-batches reach the trainer one by one (streamed) or as a list (colocated); either way it
  accumulates them as the whole-step design always did (the reference below): each micro-batch's loss divided
  by the step's supervised slots over all micro-batches, one backward per micro-batch, so losses and gradients
  are identical, bit for bit. A streamed micro-batch is asked for only after the previous one's backward.
- The send queue holds at most ``stream.depth`` micro-batch messages while one more is on the wire, blocks the
  producer beyond that, and reports the peak bytes it held. The transport is a fake here (a send that waits
  for the test's signal): what is tested is the queue, the real transfers are in the multi-process tests.
"""

from __future__ import annotations

import threading
import time

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.metrics.acceptance import PositionStats
from deepspec_train.metrics.sinks import NoOpSink
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.streaming import target_worker
from deepspec_train.streaming.roles import Topology
from deepspec_train.streaming.wire import KIND_BATCH, KIND_TRAIN, StreamMessage, message_bytes, outline
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.feature_source import StepBatches
from deepspec_train.training.trainer import DrafterTrainer
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, VOCAB
from tests.helpers.step_trainers import SINGLE, tiny_recipe
from tests.helpers.tiny_drafter import random_item, tiny_drafter


def _micro_batches() -> list:
    generator = torch.Generator().manual_seed(0)
    items = [random_item(40, i, generator) for i in range(5)]
    anchors = [sample_anchors(item.loss_mask, 6, generator) for item in items]
    batches = pack_sequences(items, anchors, BLOCK, 64, MASK_ID)
    assert len(batches) >= 3
    return batches


def _trainer(cfg: RecipeConfig, head: torch.Tensor) -> DrafterTrainer:
    loss = DrafterLoss.for_recipe(cfg, head, "sdpa")
    return DrafterTrainer(cfg, tiny_drafter("dspark").train(), loss, None, None, NoOpSink(), SINGLE, 1)


def _grads(model: torch.nn.Module) -> list:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_streamed_micro_batches_accumulate_exactly_like_the_whole_step() -> None:
    cfg, batches = tiny_recipe(), _micro_batches()
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    listed = _trainer(cfg, head)
    loss_listed, _ = listed._accumulate(StepBatches.of(batches), PositionStats(BLOCK))

    streamed = _trainer(cfg, head)
    backward_done = []

    def arriving():
        for i, batch in enumerate(batches):
            if i:
                backward_done.append(all(p.grad is not None for p in streamed.params))
            yield batch

    counts = StepBatches.of(batches)
    step = StepBatches(counts.num_batches, counts.num_active, counts.num_supervised, arriving())
    loss_streamed, _ = streamed._accumulate(step, PositionStats(BLOCK))
    assert backward_done == [True] * (len(batches) - 1)

    reference = tiny_drafter("dspark").train()
    normalizer = float(sum(b.num_supervised for b in batches))
    reference_loss = DrafterLoss.for_recipe(cfg, head, "sdpa")
    loss_reference = 0.0
    for batch in batches:
        loss = reference_loss(reference, batch, normalizer).loss.loss
        loss.backward()
        loss_reference += float(loss.detach())
    assert loss_listed == loss_streamed == loss_reference
    for a, b, c in zip(_grads(listed.model), _grads(streamed.model), _grads(reference)):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_send_queue_holds_depth_micro_batches_and_measures_their_bytes(monkeypatch) -> None:
    batch = _micro_batches()[0]
    gate = threading.Semaphore(0)
    sent = []

    def fake_send(message: StreamMessage, dst: int, device, timeout_s: float, peer: str) -> int:
        gate.acquire()  # one send completes per release
        sent.append((message.kind, message.index))
        return message_bytes(message)

    monkeypatch.setattr(target_worker, "send_message", fake_send)
    depth, count = 2, 6
    sender = target_worker._Sender(depth, torch.device("cpu"), 5.0, Topology(1, 1))
    head = outline(KIND_TRAIN, 0, 0, 0, [batch.num_supervised] * count)
    messages = [StreamMessage(KIND_BATCH, 0, batches=[batch], index=i) for i in range(count)]
    producer = threading.Thread(target=lambda: [sender.put(1, m) for m in [head, *messages]])
    producer.start()
    size, head_size = message_bytes(messages[0]), message_bytes(head)
    time.sleep(0.3)
    # The outline is on the wire and two micro-batches wait: the third put blocks.
    assert producer.is_alive() and sender._queued_batches == depth and sender.in_flight == head_size + depth * size
    gate.release()
    time.sleep(0.3)
    # The outline went; micro-batch 0 is on the wire, 1 and 2 wait, 3 is blocked: depth + 1 in flight.
    assert producer.is_alive() and sender.in_flight == (depth + 1) * size
    for _ in range(count + 1):
        gate.release()
    producer.join(timeout=10)
    report = sender.close()
    assert sent == [(KIND_TRAIN, 0)] + [(KIND_BATCH, i) for i in range(count)]
    assert report.peak_in_flight == (depth + 1) * size
    assert report.bytes_sent == head_size + count * size
    assert messages[-1].peak_in_flight == report.peak_in_flight
