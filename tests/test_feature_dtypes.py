"""Target features packed in the drafter's compute dtype: under bf16 autocast the drafter's loss and gradients are
bit for bit those of fp32 inputs; with DeepSpeed's bf16 module (no autocast) casting the context features changes
nothing but casting the final-norm states would change the target logits, so the run's rule casts only what is
unchanged; a cast never widens; and the wire bytes computed from a plan are the bytes of the built messages."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.steps.chunk_builder import ChunkBuilder, FeatureDtypes
from deepspec_train.steps.chunk_plan import PackingSpec, plan_chunks
from deepspec_train.streaming.wire import (
    KIND_BATCH, FeatureLayout, StreamMessage, message_bytes, planned_message_bytes, planned_wire_bytes,
)
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.feature_dtypes import feature_dtypes
from tests.helpers.fake_tap import FakeTap
from tests.helpers.step_trainers import target_head, tiny_recipe
from tests.helpers.tiny_drafter import drafter_config, random_item, tiny_drafter
from tests.helpers.tiny_geometry import BLOCK, MASK_ID

BF16 = FeatureDtypes(ctx_features=torch.bfloat16, target_hidden=torch.bfloat16)


def _batches() -> list:
    g = torch.Generator().manual_seed(0)
    items = [random_item(length, i, g) for i, length in enumerate((48, 30, 61))]
    anchors = [sample_anchors(item.loss_mask, 7, g) for item in items]
    return pack_sequences(items, anchors, BLOCK, 150, MASK_ID)


def _loss_and_grads(kind: str, batches: list, autocast: bool, module_dtype: torch.dtype = torch.float32):
    cfg = dataclasses.replace(tiny_recipe(), drafter=drafter_config(kind))
    model = tiny_drafter(kind).train().to(module_dtype)
    loss = DrafterLoss.for_recipe(cfg, target_head(), "sdpa")
    normalizer = float(sum(b.num_supervised for b in batches))
    total = []
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            value = loss(model, batch, normalizer).loss.loss
        value.backward()
        total.append(value.detach())
    return torch.stack(total), [p.grad for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_bf16_features_give_the_same_loss_and_gradients_under_bf16_autocast(kind: str) -> None:
    batches = _batches()
    cast = [BF16.apply(b) for b in batches]
    assert all(c.ctx_features.dtype == c.target_hidden.dtype == torch.bfloat16 for c in cast)
    # The cast rounds: the drafter is handed different numbers, which autocast rounds the same way.
    assert not torch.equal(cast[0].ctx_features.float(), batches[0].ctx_features)
    loss_fp32, grads_fp32 = _loss_and_grads(kind, batches, autocast=True)
    loss_bf16, grads_bf16 = _loss_and_grads(kind, cast, autocast=True)
    assert torch.equal(loss_fp32, loss_bf16)
    assert all(torch.equal(a, b) for a, b in zip(grads_fp32, grads_bf16))


def test_a_bf16_module_without_autocast_is_unchanged_by_cast_context_features_only() -> None:
    """DeepSpeed's bf16: ``fc`` rounds its input to its bf16 weights, but the target logits are computed from
    ``target_hidden`` in the target head's dtype (fp32 here), so rounding ``target_hidden`` would change them."""
    batches = _batches()
    context_only = FeatureDtypes(ctx_features=torch.bfloat16)
    loss_fp32, grads_fp32 = _loss_and_grads("dspark", batches, autocast=False, module_dtype=torch.bfloat16)
    loss_cast, grads_cast = _loss_and_grads("dspark", [context_only.apply(b) for b in batches], autocast=False,
                                            module_dtype=torch.bfloat16)
    assert torch.equal(loss_fp32, loss_cast)
    assert all(torch.equal(a, b) for a, b in zip(grads_fp32, grads_cast))
    hidden, head = batches[0].target_hidden, target_head()
    assert not torch.equal(hidden.to(torch.bfloat16).float() @ head.T, hidden @ head.T)


def test_the_runs_rule_casts_only_what_is_unchanged() -> None:
    cfg = tiny_recipe()
    bf16 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, mixed_precision="bf16"))
    deepspeed = dataclasses.replace(bf16, train=dataclasses.replace(bf16.train, distributed="deepspeed"))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert feature_dtypes(bf16, cuda) == BF16
    assert feature_dtypes(deepspeed, cuda) == FeatureDtypes(ctx_features=torch.bfloat16)
    # The drafter computes in fp32 on CPU and without mixed precision: nothing is cast.
    assert feature_dtypes(bf16, cpu) == feature_dtypes(cfg, cuda) == FeatureDtypes()


def test_a_cast_only_ever_narrows() -> None:
    batch = _batches()[0]
    half = dataclasses.replace(batch, ctx_features=batch.ctx_features.half(), target_hidden=batch.target_hidden.half())
    assert BF16.apply(half) is half
    assert FeatureDtypes(ctx_features=torch.float32).apply(BF16.apply(batch)).ctx_features.dtype == torch.bfloat16
    assert FeatureDtypes().apply(batch) is batch


@pytest.mark.parametrize("dtypes,value_bytes", [(FeatureDtypes(), 4), (BF16, 2)])
def test_wire_bytes_from_the_plan_are_the_built_messages_bytes(dtypes: FeatureDtypes, value_bytes: int) -> None:
    g = torch.Generator().manual_seed(1)
    rows = []
    for i in range(7):
        length = int(torch.randint(8, 60, (1,), generator=g))
        rows.append({"input_ids": torch.randint(0, 90, (length,), generator=g).tolist(),
                     "loss_mask": [0] * (length // 3) + [1] * (length - length // 3), "sample_id": i})
    spec = PackingSpec(block_size=4, num_anchors=5, token_budget=70, mask_token_id=99, chunk_sequences=3)
    chunks = plan_chunks(rows, spec, seed=0, epoch=0)
    builder = ChunkBuilder(FakeTap(), spec, "cpu", dtypes)
    # FakeTap: two "taps" of width 3 (ctx_features [L, 6]) and final states of width 3.
    layout = FeatureLayout(taps=2, hidden=3, ctx_bytes=value_bytes, hidden_bytes=value_bytes)
    sent = []
    for chunk in chunks:
        for groups, supervised, batch in zip(chunk.groups, chunk.supervised, builder.build(chunk)):
            size = message_bytes(StreamMessage(KIND_BATCH, 0, batches=[batch]))
            assert planned_message_bytes(groups, supervised, 4, layout) == size
            sent.append(size)
    assert len(sent) > len(chunks)
    assert planned_wire_bytes(chunks, 4, layout) == sum(sent)
