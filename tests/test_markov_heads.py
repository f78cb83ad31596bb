"""The DSpark Markov head types (vanilla / gated / rnn), the Markov init and the confidence-gradient switch.

Latents are checked against formulas written out slot by slot (SGLang's ``models/dspark.py`` semantics), the
training loss's gradients through the gated / RNN latents against autograd through the brute-force full-logit
reference, and decode-time drafting against teacher-forced slot logits on the drafted tokens.
"""

from __future__ import annotations

import pytest
import torch

from deepspec_train.config.schema import MARKOV_HEAD_TYPES, RecipeConfig, TargetConfig
from deepspec_train.models.block_drafting import DraftContext, ParallelBlockDrafter
from deepspec_train.losses.position_weights import decay_weights
from deepspec_train.losses.selected_logit_loss import LossSettings, SupervisedRows, selected_logit_loss
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.markov_forms import MARKOV_FORMS
from deepspec_train.models.parallel_drafter import MarkovHead, ParallelDrafter
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY, VOCAB
from tests.helpers.tiny_drafter import (
    LAYER_IDS, anchor_batch, drafter_config, random_item, tiny_drafter, use_dynamic_rope,
)
from tests.helpers.reference_loss import reference_loss
from tests.helpers.slot_logits import slot_logits

RANK = 8


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    items = [random_item(n, i, g) for i, n in enumerate((23, 31, 17))]
    anchors = [sample_anchors(it.loss_mask, 5, g) for it in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    return batch


def _expected_latents(model: ParallelDrafter, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Slot-by-slot latents from the written-out formulas (one block row at a time)."""
    head = model.markov_head
    out = torch.zeros(*prev.shape, RANK)
    for b in range(prev.shape[0]):
        state = torch.zeros(RANK)
        for k in range(prev.shape[1]):
            e = head.markov_w1.weight[prev[b, k]]
            h = hidden[b, k]
            if head.head_type == "vanilla":
                out[b, k] = e
            elif head.head_type == "gated":
                w, bias = head.gate_proj.weight, head.gate_proj.bias
                out[b, k] = torch.sigmoid(w @ torch.cat([h, e]) + bias) * e
            else:
                z = head.joint_proj.weight @ torch.cat([state, e, h]) + head.joint_proj.bias
                gate, cand, output = z[:RANK], z[RANK:2 * RANK], z[2 * RANK:]
                out[b, k] = torch.tanh(output)
                state = torch.sigmoid(gate) * state + (1 - torch.sigmoid(gate)) * torch.tanh(cand)
    return out


def _random_heads(model: ParallelDrafter) -> ParallelDrafter:
    with torch.no_grad():
        for name, p in model.markov_head.named_parameters():
            if "proj" in name:
                p.normal_(std=0.5)
    return model


@pytest.mark.parametrize("head_type", MARKOV_HEAD_TYPES)
def test_latents_follow_the_written_out_formulas(head_type: str) -> None:
    model = _random_heads(tiny_drafter("dspark", markov_head_type=head_type))
    batch = _batch()
    with torch.no_grad():
        hidden = model.backbone(batch)
        latents = model.markov_latents(batch.block_prev, hidden)
        out = model(batch)
    expected = _expected_latents(model, batch.block_prev, hidden)
    # fp32 both sides, summed in another order (batched matmuls whose split follows the thread count, against the
    # reference's matrix-vector products), and the RNN compounds the rounding over the block's slots: latents of
    # order 1 then differ by up to ~2e-6, while a wrong formula moves them by ~0.1.
    torch.testing.assert_close(latents, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.markov_rows, expected[batch.supervised_mask], rtol=1e-5, atol=1e-5)
    # The confidence head reads W1[x_prev] whatever the head type (SGLang's markov_embed_stack).
    rows = model.markov_head.markov_w1.weight[batch.block_prev[batch.supervised_mask]]
    proj = model.confidence_head.proj
    torch.testing.assert_close(out.conf_logits, torch.cat([out.hidden, rows], -1) @ proj.weight[0] + proj.bias[0])


def test_parameter_names_and_shapes_are_sglangs() -> None:
    gated = tiny_drafter("dspark", markov_head_type="gated").state_dict()
    rnn = tiny_drafter("dspark", markov_head_type="rnn").state_dict()
    assert gated["markov_head.gate_proj.weight"].shape == (RANK, HIDDEN + RANK)
    assert gated["markov_head.gate_proj.bias"].shape == (RANK,)
    assert rnn["markov_head.joint_proj.weight"].shape == (3 * RANK, 2 * RANK + HIDDEN)
    assert rnn["markov_head.joint_proj.bias"].shape == (3 * RANK,)
    assert {n for n in gated if n.startswith("markov_head.")} == {
        "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.gate_proj.weight",
        "markov_head.gate_proj.bias"}
    assert {n for n in rnn if n.startswith("markov_head.")} == {
        "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.joint_proj.weight",
        "markov_head.joint_proj.bias"}


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_loss_gradients_through_the_latents_match_the_brute_force_reference(head_type: str) -> None:
    """The chunked loss hands ``d loss / d latents`` to autograd, which chains it into the head's weights and the
    backbone; the same chain through the full-logit reference must give the same gradients."""
    batch = _batch(seed=1)
    g = torch.Generator().manual_seed(2)
    target_head = torch.randn(VOCAB, HIDDEN, generator=g)
    grads = []
    for loss_fn in (selected_logit_loss, reference_loss):
        model = _random_heads(tiny_drafter("dspark", markov_head_type=head_type, confidence_gradient="joint")).train()
        out = model(batch)
        weights = decay_weights(out.slot_index, 4.0)
        kwargs = dict(markov_rows=out.markov_rows, markov_w2=model.markov_head.markov_w2.weight,
                      conf_logits=out.conf_logits, distance="l1", normalizer=float(batch.num_supervised))
        labels = batch.labels[batch.supervised_mask]
        if loss_fn is selected_logit_loss:
            rows = SupervisedRows(out.hidden, model.lm_head.weight, batch.target_hidden, target_head, labels, weights,
                                  markov_rows=out.markov_rows, markov_w2=model.markov_head.markov_w2.weight,
                                  conf_logits=out.conf_logits)
            loss = loss_fn(rows, LossSettings(distance="l1", chunk_size=7), float(batch.num_supervised)).loss
        else:
            loss = loss_fn(out.hidden, model.lm_head.weight, batch.target_hidden, target_head, labels, weights,
                           **kwargs)["loss"]
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    mine, ref = grads
    assert mine.keys() == ref.keys()
    assert any("proj" in n for n in mine) and "fc.weight" in mine
    for name, grad in ref.items():
        torch.testing.assert_close(mine[name], grad, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("head_type,rope", [("vanilla", None), ("gated", None), ("rnn", None),
                                            ("rnn", {"rope_type": "dynamic", "factor": 2.0})])
def test_drafting_equals_teacher_forced_logits_on_the_drafted_tokens(head_type: str, rope) -> None:
    """Decode-time drafting (cached context keys, ``decode_states``) equals the training backbone on the drafted
    tokens; with dynamic RoPE scaling too, past the trained positions (keys rotated for the round's length)."""
    model = _random_heads(tiny_drafter("dspark", markov_head_type=head_type))
    if rope is not None:
        use_dynamic_rope(model, TINY_GEOMETRY, rope)
    g = torch.Generator().manual_seed(4)
    length = 12
    context = DraftContext(torch.randn(length, len(LAYER_IDS) * HIDDEN, generator=g),
                           torch.randint(0, MASK_ID, (length,), generator=g))
    anchors = torch.tensor([5, 5, 9])
    draft = ParallelBlockDrafter(model).draft(context, anchors, BLOCK, 1.0, torch.Generator().manual_seed(0))
    batch = anchor_batch(context, anchors, BLOCK, MASK_ID)
    prev = torch.cat([anchors[:, None], draft.tokens[:, :-1]], dim=1)
    with torch.no_grad():
        logits = slot_logits(model, batch, prev)
        conf = model.confidence_logits(model.backbone(batch), model.markov_rows(prev))
    torch.testing.assert_close(draft.probs, torch.softmax(logits, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(draft.confidence_logits, conf, rtol=1e-5, atol=1e-5)


def test_markov_init_switch() -> None:
    zero = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark"), LAYER_IDS)
    assert torch.count_nonzero(zero.markov_head.markov_w2.weight) == 0
    torch.manual_seed(0)
    normal = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark", markov_rank=64, markov_init="normal"), LAYER_IDS)
    w2 = normal.markov_head.markov_w2.weight.detach()
    assert abs(float(w2.std()) - 0.02) < 0.002 and abs(float(w2.mean())) < 0.002
    rnn = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark", markov_head_type="rnn"), LAYER_IDS)
    assert torch.count_nonzero(rnn.markov_head.joint_proj.bias) == 0


@pytest.mark.parametrize("switch", ["detached", "joint"])
def test_confidence_gradient_switch(switch: str) -> None:
    model = tiny_drafter("dspark", confidence_gradient=switch).train()
    out = model(_batch())
    out.conf_logits.sum().backward()
    assert model.confidence_head.proj.weight.grad is not None
    reached = model.fc.weight.grad is not None and model.markov_head.markov_w1.weight.grad is not None
    assert reached == (switch == "joint")


def test_head_type_needs_a_markov_head() -> None:
    for kind, rank in (("dflash", 0), ("eagle3", 0)):
        cfg = RecipeConfig(drafter=drafter_config(kind, markov_head_type="rnn", markov_rank=rank),
                           target=TargetConfig(layer_ids=LAYER_IDS))
        problems = kind_spec(kind).recipe_problems(cfg)
        assert any(f"drafter.markov_head_type = 'rnn' is not used by drafter.kind={kind}" in p for p in problems)
    with pytest.raises(ValueError, match="markov_head_type"):
        ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark", markov_head_type="lstm"), LAYER_IDS)


@pytest.mark.parametrize("head_type", MARKOV_HEAD_TYPES)
def test_a_form_record_lists_the_tensors_its_head_holds(head_type: str) -> None:
    """The shapes the export layout and the serving-cost model read from the form's record are the head's own."""
    head = MarkovHead(VOCAB, RANK, HIDDEN, head_type)
    own = {name: tuple(p.shape) for name, p in head.named_parameters() if not name.startswith("markov_w")}
    assert own == MARKOV_FORMS[head_type].parameter_shapes(RANK, HIDDEN)
    assert head.form.recurrent == (head.initial_state(torch.zeros(2, HIDDEN)) is not None)
