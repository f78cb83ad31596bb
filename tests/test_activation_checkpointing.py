"""``drafter.activation_checkpointing``: every drafter kind gives the same loss and gradients with it on and off
(the context projection cut into several row chunks), keeps only the inputs of what it recomputes, and is the plain
forward without gradients."""

from __future__ import annotations

import pytest
import torch

from deepspec_train.config.schema import DrafterConfig, LossConfig, RecipeConfig, TargetConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models import activation_checkpointing
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from tests.helpers.tiny_drafter import drafter_config, random_loss_mask
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY, VOCAB
from tests.helpers.slot_logits import slot_logits

LENGTHS = (70, 45, 90)
# Every kind's taps: two for the parallel drafters' tiny config, three for EAGLE-3's low / mid / high.
KINDS = {
    "dspark": (drafter_config("dspark"), [0, 2]),
    "dspark-rnn": (drafter_config("dspark", markov_head_type="rnn", confidence_gradient="joint"), [0, 2]),
    "dflash": (drafter_config("dflash"), [0, 2]),
    "eagle3": (DrafterConfig(kind="eagle3", num_layers=1, block_size=BLOCK, ttt_steps=BLOCK, markov_rank=0,
                             confidence_head=False, mask_token_id=MASK_ID, draft_vocab_size=40), [0, 1, 2]),
}


def _batch(taps: int):
    g = torch.Generator().manual_seed(5)
    items = [
        SequenceItem(input_ids=torch.randint(0, MASK_ID, (n,), generator=g), loss_mask=random_loss_mask(n, g),
                     ctx_features=torch.randn(n, taps * HIDDEN, generator=g),
                     final_hidden=torch.randn(n, HIDDEN, generator=g), sample_id=i)
        for i, n in enumerate(LENGTHS)
    ]
    anchors = [sample_anchors(item.loss_mask, 8, g) for item in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    return batch


def _run(name: str, checkpointing: bool) -> tuple[float, dict[str, torch.Tensor], int]:
    """Loss, gradients and the bytes autograd saved outside any checkpoint, of one forward / backward."""
    drafter_cfg, layer_ids = KINDS[name]
    drafter_cfg = DrafterConfig(**{**vars(drafter_cfg), "activation_checkpointing": checkpointing})
    cfg = RecipeConfig(drafter=drafter_cfg, target=TargetConfig(layer_ids=layer_ids), loss=LossConfig(chunk_size=16))
    torch.manual_seed(0)
    counts = torch.randint(1, 50, (VOCAB,), generator=torch.Generator().manual_seed(1))
    model = kind_spec(drafter_cfg.kind).build(drafter_cfg, TINY_GEOMETRY, layer_ids, counts).train()
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2))
    batch = _batch(len(layer_ids))
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = DrafterLoss.for_recipe(cfg, head, "sdpa")(model, batch, float(batch.num_supervised)).loss.loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads, sum(saved)


@pytest.mark.parametrize("name", list(KINDS))
def test_checkpointing_keeps_losses_and_gradients(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Chunks of 32 rows: the ~200 context rows go through the context projection in 7 checkpointed pieces.
    monkeypatch.setattr(activation_checkpointing, "CONTEXT_CHUNK_ROWS", 32)
    plain_loss, plain_grads, plain_saved = _run(name, False)
    loss, grads, saved = _run(name, True)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain_grads.keys()
    for key, grad in plain_grads.items():
        assert grad is not None and grads[key] is not None, key
        # Only the summation order of the chunked context projection's weight gradient differs.
        torch.testing.assert_close(grads[key], grad, rtol=1e-5, atol=1e-7, msg=key)
    # The layers' attention weights, projections and norms are recomputed: what autograd keeps outside the
    # checkpoints is the loss head's share, a fraction of the plain forward's.
    assert saved < 0.25 * plain_saved


@pytest.mark.parametrize("name", ["dspark", "eagle3"])
def test_checkpointing_is_the_plain_forward_without_gradients(name: str) -> None:
    drafter_cfg, layer_ids = KINDS[name]
    batch = _batch(len(layer_ids))
    counts = torch.ones(VOCAB, dtype=torch.long)
    outputs = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        cfg = DrafterConfig(**{**vars(drafter_cfg), "activation_checkpointing": checkpointing})
        model = kind_spec(cfg.kind).build(cfg, TINY_GEOMETRY, layer_ids, counts).eval()
        with torch.no_grad():
            outputs.append(slot_logits(model, batch))
    assert torch.equal(outputs[0], outputs[1])
