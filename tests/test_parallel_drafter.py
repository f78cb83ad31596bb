"""Parallel drafter (DSpark / DFlash): shapes, the DFlash switch, and numerics against brute-force references."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.qwen3_layers import RotaryEmbedding, apply_rotary
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY, VOCAB
from tests.helpers.tiny_drafter import LAYER_IDS, drafter_config, random_item, tiny_drafter
from tests.helpers.slot_logits import slot_logits


def _batch(seed: int = 0, lengths=(23, 31, 17)):
    g = torch.Generator().manual_seed(seed)
    items = [random_item(n, i, g) for i, n in enumerate(lengths)]
    anchors = [sample_anchors(it.loss_mask, 5, g) for it in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    return batch


def _rms(x, weight, eps=1e-6):
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, positions, theta):
    """Naive rotary: pair (i, i + h/2) rotated by angle pos * theta^(-2i/h). x [T, heads, h]."""
    half = x.shape[-1] // 2
    out = x.clone()
    for i in range(half):
        angle = positions.double() * theta ** (-2.0 * i / x.shape[-1])
        c, s = angle.cos().float()[:, None], angle.sin().float()[:, None]
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * c - b * s
        out[..., i + half] = b * c + a * s
    return out


def _reference_block(model, batch, b):
    """One block's final-normed states, computed alone from its own context rows (no mask, per-head loops)."""
    geo = model.geometry
    seq, anchor = int(batch.block_seq[b]), int(batch.block_anchor[b])
    rows = (batch.ctx_seq == seq) & (batch.ctx_pos < anchor)
    ctx = _rms(batch.ctx_features[rows] @ model.fc.weight.T, model.hidden_norm.weight)
    slot_pos = anchor + torch.arange(batch.block_size)
    key_pos = torch.cat([batch.ctx_pos[rows], slot_pos])
    x = model.embed_tokens.weight[batch.block_input[b]]
    group = geo.num_attention_heads // geo.num_key_value_heads
    for layer in model.layers:
        att = layer.self_attn
        h = _rms(x, layer.input_layernorm.weight)
        keys_in = torch.cat([ctx, h])
        q = _rms((h @ att.q_proj.weight.T).view(len(h), -1, geo.head_dim), att.q_norm.weight)
        k = _rms((keys_in @ att.k_proj.weight.T).view(len(keys_in), -1, geo.head_dim), att.k_norm.weight)
        v = (keys_in @ att.v_proj.weight.T).view(len(keys_in), -1, geo.head_dim)
        q, k = _rope(q, slot_pos, geo.rope_theta), _rope(k, key_pos, geo.rope_theta)
        heads = []
        for head in range(geo.num_attention_heads):
            scores = q[:, head] @ k[:, head // group].T / math.sqrt(geo.head_dim)
            heads.append(torch.softmax(scores, dim=-1) @ v[:, head // group])
        x = x + torch.cat(heads, dim=-1) @ att.o_proj.weight.T
        h = _rms(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        gated = torch.nn.functional.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)
        x = x + gated @ mlp.down_proj.weight.T
    return _rms(x, model.norm.weight)


def test_rotary_matches_transformers_qwen3():
    config = Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16)
    theta = config.rope_parameters["rope_theta"]
    positions = torch.tensor([[0, 3, 7, 100, 4095]])
    x = torch.randn(1, 4, 5, 16)
    hf_cos, hf_sin = Qwen3RotaryEmbedding(config)(x, positions)
    cos, sin = RotaryEmbedding(16, theta).cos_sin(positions)
    torch.testing.assert_close(apply_rotary(x, cos, sin), apply_rotary_pos_emb(x, x, hf_cos, hf_sin)[0])


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_backbone_matches_brute_force(kind):
    model = tiny_drafter(kind)
    batch = _batch()
    with torch.no_grad():
        hidden = model.backbone(batch)
        for b in range(batch.num_blocks):
            torch.testing.assert_close(hidden[b], _reference_block(model, batch, b), atol=1e-5, rtol=1e-5)


def test_forward_shapes_and_rows():
    model = tiny_drafter("dspark")
    batch = _batch()
    with torch.no_grad():
        out = model(batch)
        full = model.backbone(batch)
    ns = batch.num_supervised
    assert out.hidden.shape == (ns, HIDDEN)
    assert out.markov_rows.shape == (ns, 8)
    assert out.conf_logits.shape == (ns,)
    rows, slots = torch.nonzero(batch.supervised_mask, as_tuple=True)
    assert torch.equal(out.slot_index, slots)
    torch.testing.assert_close(out.hidden, full[rows, slots])
    torch.testing.assert_close(out.markov_rows, model.markov_head.markov_w1.weight[batch.block_prev[rows, slots]])
    proj = model.confidence_head.proj
    expected_conf = torch.cat([out.hidden, out.markov_rows], -1) @ proj.weight[0] + proj.bias[0]
    torch.testing.assert_close(out.conf_logits, expected_conf)


def test_dflash_switch_has_no_markov_or_confidence():
    model = tiny_drafter("dflash")
    names = set(model.state_dict())
    assert not any(n.startswith(("markov_head", "confidence_head")) for n in names)
    assert model.markov_rows(torch.tensor([1, 2])) is None
    out = model(_batch())
    assert out.markov_rows is None and out.conf_logits is None
    dspark_names = set(tiny_drafter("dspark").state_dict())
    assert dspark_names - names == {
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    }


def test_confidence_head_without_markov_uses_hidden_only():
    model = tiny_drafter("dflash", confidence_head=True)
    assert model.confidence_head.proj.weight.shape == (1, HIDDEN)
    out = model(_batch())
    assert out.conf_logits.shape == (out.hidden.shape[0],)


def test_slot_logits_equal_lm_head_plus_markov_bias():
    model = tiny_drafter("dspark")
    batch = _batch(seed=3)
    prev = torch.randint(0, VOCAB, batch.block_prev.shape)
    with torch.no_grad():
        logits = slot_logits(model, batch, prev)
        hidden = model.backbone(batch)
    w1 = model.markov_head.markov_w1.weight
    w2 = model.markov_head.markov_w2.weight
    expected = torch.empty(batch.num_blocks, batch.block_size, VOCAB)
    for b in range(batch.num_blocks):
        for k in range(batch.block_size):
            expected[b, k] = model.lm_head.weight @ hidden[b, k] + w2 @ w1[prev[b, k]]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    # DFlash: logits are the LM head alone.
    dflash = tiny_drafter("dflash")
    with torch.no_grad():
        torch.testing.assert_close(slot_logits(dflash, batch), dflash.lm_head(dflash.backbone(batch)))


def test_target_heads_are_frozen_copies():
    model = tiny_drafter("dspark")
    embed = torch.randn(VOCAB, HIDDEN)
    model.load_target_heads(embed, embed)
    assert torch.equal(model.embed_tokens.weight, embed) and torch.equal(model.lm_head.weight, embed)
    assert model.embed_tokens.weight.data_ptr() != model.lm_head.weight.data_ptr()
    assert not model.embed_tokens.weight.requires_grad and not model.lm_head.weight.requires_grad
    model.train()
    out = model(_batch())
    # The confidence head is a probe on detached drafting features: its loss trains only its own projection.
    out.conf_logits.sum().backward(retain_graph=True)
    assert model.confidence_head.proj.weight.grad is not None
    assert model.fc.weight.grad is None and model.markov_head.markov_w1.weight.grad is None
    out.hidden.sum().backward()
    assert model.embed_tokens.weight.grad is None and model.lm_head.weight.grad is None
    assert model.fc.weight.grad is not None


def test_fresh_markov_bias_is_zero():
    model = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark"), LAYER_IDS)
    rows = model.markov_rows(torch.tensor([0, 5, MASK_ID]))
    assert torch.count_nonzero(model.markov_bias(rows)) == 0


def test_block_size_mismatch_is_rejected():
    model = tiny_drafter("dspark", block_size=BLOCK + 1)
    with pytest.raises(ValueError, match="block size"):
        model.backbone(_batch())


@torch.no_grad()
def test_fused_context_kv_equals_each_layers_projection():
    """Decode time projects every layer's context keys / values in one product; equal to each layer's own."""
    model = tiny_drafter("dspark", num_layers=3)
    g = torch.Generator().manual_seed(5)
    features = torch.randn(9, len(LAYER_IDS) * HIDDEN, generator=g)
    positions = torch.arange(4, 13)
    fused = model.context_kv(features, positions)
    ctx = model.hidden_norm(model.fc(features)).unsqueeze(0)
    cos, sin = model.rotary.cos_sin(positions.reshape(1, -1))
    assert len(fused) == 3
    for layer, (k, v) in zip(model.layers, fused):
        want_k, want_v = layer.self_attn.keys_values(ctx, cos, sin)
        torch.testing.assert_close(k, want_k, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, want_v, rtol=1e-5, atol=1e-6)
