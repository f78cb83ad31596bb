"""DFlash2's validation E[L] against brute force: under its z-lab labels slot 0 is never supervised, so the full
blocks are those whose drafted slots 1..B-1 are all supervised, and each slot's c* is the overlap of the target's
distribution with the selector's teacher-forced proposal q (what the walk drafts from and verification accepts
against), not with the plain slot distribution."""

from __future__ import annotations

import math

import pytest
import torch

from deepspec_train.config.schema import RecipeConfig, TargetConfig
from deepspec_train.metrics.acceptance import BlockLengthStats
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from tests.helpers.dflash2_drafters import LAYER_IDS, dflash2_config, tiny_dflash2
from tests.helpers.tiny_drafter import random_item
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, VOCAB

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOP_K = 16


def _brute_c_star(module, hidden: torch.Tensor, previous: int, target_probs: torch.Tensor) -> float:
    """``sum_v min(q[v], p_t[v])`` with ``q`` the softmax over the top-K tokens of the head's logits of
    ``logit + <A[previous] * W_h h, B[c]>`` (zero elsewhere), written out token by token."""
    selector = module.candidate_selector
    with torch.no_grad():
        logits = module.lm_head.weight.double() @ hidden.double()
        gate = selector.hidden_projection.weight.double() @ hidden.double()
        candidates = logits.topk(TOP_K).indices.tolist()
        scores = {c: float(logits[c] + (selector.predecessor_codebook[previous].double() * gate
                                        * selector.successor_codebook[c].double()).sum()) for c in candidates}
    norm = sum(math.exp(s) for s in scores.values())
    return sum(min(math.exp(scores[v]) / norm if v in scores else 0.0, float(target_probs[v])) for v in range(VOCAB))


def test_dflash2_validation_expected_length_is_the_selector_proposals_brute_force():
    module = tiny_dflash2(21, selector_top_k=TOP_K).eval()
    cfg = RecipeConfig(drafter=dflash2_config(selector_top_k=TOP_K), target=TargetConfig(layer_ids=LAYER_IDS))
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(22))
    generator = torch.Generator().manual_seed(23)
    items = [random_item(40, i, generator) for i in range(2)]
    anchors = [sample_anchors(item.loss_mask, 8, generator) for item in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID, "zlab")

    with torch.no_grad():
        out = DrafterLoss.for_recipe(cfg, head, "sdpa")(module, batch, 1.0).loss
        hidden = module(batch).hidden.detach()
    # What ``DrafterTrainer.validate`` builds for z-lab labels.
    lengths = BlockLengthStats(BLOCK, first_slot=1)
    lengths.update(out.c_star, batch.supervised_mask)
    summary = lengths.summary("val")

    target_probs = torch.softmax(batch.target_hidden.double() @ head.double().T, dim=-1)
    supervised = batch.supervised_mask
    row_of = torch.full(supervised.shape, -1, dtype=torch.long)
    row_of[supervised] = torch.arange(int(supervised.sum()))
    block_lengths = []
    for b in range(supervised.shape[0]):
        if not bool(supervised[b, 1:].all()):
            continue
        survival, total = 1.0, 0.0
        for j in range(1, BLOCK):
            # The true predecessor of slot j: the anchor for slot 1, else the label of slot j - 1.
            previous = int(batch.block_input[b, 0]) if j == 1 else int(batch.labels[b, j - 1])
            row = int(row_of[b, j])
            survival *= _brute_c_star(module, hidden[row], previous, target_probs[row])
            total += survival
        block_lengths.append(total)

    assert len(block_lengths) > 0 and summary["val/full_blocks"] == len(block_lengths)
    assert math.isfinite(summary["val/expected_len"])
    assert summary["val/expected_len"] == pytest.approx(sum(block_lengths) / len(block_lengths), rel=1e-4)
