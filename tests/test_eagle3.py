"""Tests of the EAGLE-3 drafter and its draft vocabulary, against brute-force references.

Run: ``PYTHONPATH=. python -m pytest tests/test_eagle3.py``. Tiny fp32 sizes on CPU; the Qwen3 sizes are only
instantiated on the meta device.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from deepspec_train.config.loader import ConfigError
from deepspec_train.config.schema import DrafterConfig, RecipeConfig, TargetConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.draft_vocab import DraftVocab, build_draft_vocab, count_supervised_tokens
from deepspec_train.models.eagle3_drafter import Eagle3Drafter, eagle3_target_layer_ids
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.packing.batch import IGNORE_INDEX, PackedBatch
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_geometry import TINY_GEOMETRY
from tests.helpers.slot_logits import slot_logits

MASK_ID = 1
# The tiny geometry with a smaller vocabulary and head, and taps from 8 target layers (layer ids up to 4).
TINY = dataclasses.replace(TINY_GEOMETRY, head_dim=8, vocab_size=40, num_target_layers=8, max_position_embeddings=256)


# ---------------------------------------------------------------- draft vocabulary


def _brute_force_top(counts: list[int], size: int) -> list[int]:
    ranked = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    return sorted(ranked[:size])


def test_draft_vocab_matches_brute_force() -> None:
    gen = torch.Generator().manual_seed(0)
    # Few distinct count values so that ties are frequent.
    counts = torch.randint(0, 5, (200,), generator=gen)
    vocab = build_draft_vocab(counts, 37)
    top = _brute_force_top(counts.tolist(), 37)

    assert vocab.size == 37 and vocab.target_vocab_size == 200
    assert vocab.d2t.dtype == torch.long and vocab.t2d.dtype == torch.bool
    assert vocab.d2t.tolist() == [tok - i for i, tok in enumerate(top)]
    assert vocab.t2d.nonzero().squeeze(1).tolist() == top
    assert vocab.target_ids().tolist() == top

    draft_ids = torch.arange(37)
    assert vocab.draft_to_target(draft_ids).tolist() == top
    assert torch.equal(vocab.target_to_draft(vocab.draft_to_target(draft_ids)), draft_ids)
    position = {tok: i for i, tok in enumerate(top)}
    all_ids = torch.arange(200).view(10, 20)
    expected = torch.tensor([position.get(t, -1) for t in range(200)]).view(10, 20)
    assert torch.equal(vocab.target_to_draft(all_ids), expected)
    assert not vocab.is_full


@pytest.mark.parametrize("size", [None, 50, 80])
def test_full_draft_vocab_is_identity(size: int | None) -> None:
    vocab = build_draft_vocab(torch.randint(0, 9, (50,)), size)
    ids = torch.arange(50)
    assert vocab.is_full and vocab.size == 50
    assert torch.equal(vocab.draft_to_target(ids), ids)
    assert torch.equal(vocab.target_to_draft(ids), ids)


def test_count_supervised_tokens_counts_only_masked_labels() -> None:
    gen = torch.Generator().manual_seed(1)
    examples = []
    expected = Counter()
    for length in (5, 17, 1, 30):
        ids = torch.randint(0, 12, (length,), generator=gen)
        mask = torch.rand(length, generator=gen) < 0.5
        examples.append({"input_ids": ids.tolist(), "loss_mask": mask})
        expected.update(t for t, m in zip(ids.tolist(), mask.tolist()) if m)
    counts = count_supervised_tokens(iter(examples), 12)
    assert counts.tolist() == [expected[t] for t in range(12)]
    with pytest.raises(ValueError):
        count_supervised_tokens([{"input_ids": [12], "loss_mask": [True]}], 12)


# ---------------------------------------------------------------- packed batches of anchor blocks


@dataclass
class RawSequence:
    tokens: torch.Tensor  # [L]
    features: torch.Tensor  # [L, 3d]: target features g_p
    anchors: list[int]
    supervised: list[int]  # supervised prefix length of each block


def _random_sequence(gen: torch.Generator, length: int, anchors: list[int], block: int) -> RawSequence:
    tokens = torch.randint(2, TINY.vocab_size, (length,), generator=gen)
    features = torch.randn(length, 3 * TINY.hidden_size, generator=gen)
    supervised = [min(block, length - 1 - a) for a in anchors]
    return RawSequence(tokens, features, anchors, supervised)


def pack(sequences: list[RawSequence], block: int) -> PackedBatch:
    """Pack blocks and their context (every position before the sequence's last anchor) into one batch."""
    d = TINY.hidden_size
    ctx = {"features": [], "tokens": [], "seq": [], "pos": []}
    blocks = {"input": [], "seq": [], "anchor": [], "prev": [], "labels": []}
    for s, seq in enumerate(sequences):
        last = max(seq.anchors)
        ctx["features"].append(seq.features[:last])
        ctx["tokens"].append(seq.tokens[:last])
        ctx["seq"].append(torch.full((last,), s))
        ctx["pos"].append(torch.arange(last))
        padded = torch.cat([seq.tokens, torch.full((block + 1,), MASK_ID)])
        for a, n in zip(seq.anchors, seq.supervised):
            blocks["input"].append(torch.tensor([int(seq.tokens[a])] + [MASK_ID] * (block - 1)))
            blocks["seq"].append(s)
            blocks["anchor"].append(a)
            blocks["prev"].append(padded[a : a + block])
            labels = padded[a + 1 : a + 1 + block].clone()
            labels[n:] = IGNORE_INDEX
            blocks["labels"].append(labels)
    labels = torch.stack(blocks["labels"])
    return PackedBatch(
        ctx_features=torch.cat(ctx["features"]),
        ctx_tokens=torch.cat(ctx["tokens"]),
        ctx_seq=torch.cat(ctx["seq"]),
        ctx_pos=torch.cat(ctx["pos"]),
        block_input=torch.stack(blocks["input"]),
        block_seq=torch.tensor(blocks["seq"]),
        block_anchor=torch.tensor(blocks["anchor"]),
        block_prev=torch.stack(blocks["prev"]),
        labels=labels,
        target_hidden=torch.randn(int((labels != IGNORE_INDEX).sum()), d),
        sample_ids=torch.arange(len(sequences)),
    )


def make_drafter(block: int = 4, draft_size: int | None = 25, seed: int = 0) -> Eagle3Drafter:
    torch.manual_seed(seed)
    cfg = DrafterConfig(kind="eagle3", num_layers=1, block_size=block, ttt_steps=block, mask_token_id=MASK_ID)
    counts = torch.randint(0, 100, (TINY.vocab_size,))
    drafter = Eagle3Drafter(TINY, cfg, [1, 3, 4], build_draft_vocab(counts, draft_size))
    drafter.load_target_embedding(torch.randn(TINY.vocab_size, TINY.hidden_size))
    # Non-trivial norm scales, so a swapped norm would show.
    with torch.no_grad():
        for module in drafter.modules():
            if module.__class__.__name__ == "RMSNorm":
                module.weight.uniform_(0.5, 1.5)
    return drafter.eval()


# ---------------------------------------------------------------- brute-force reference


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * x / torch.sqrt((x * x).mean() + TINY.rms_norm_eps)


def _rotate(vec: torch.Tensor, position: int) -> torch.Tensor:
    """Rotate one head vector by pairing dimension i with i + h/2 (Qwen3's convention), written out."""
    h = vec.shape[0]
    out = vec.clone()
    for i in range(h // 2):
        angle = position * TINY.rope_theta ** (-2.0 * i / h)
        c, s = math.cos(angle), math.sin(angle)
        out[i] = vec[i] * c - vec[i + h // 2] * s
        out[i + h // 2] = vec[i + h // 2] * c + vec[i] * s
    return out


def _project(weight: torch.Tensor, x: torch.Tensor, heads: int, position: int) -> list[torch.Tensor]:
    y = weight @ x
    return [_rotate(y[i * TINY.head_dim : (i + 1) * TINY.head_dim], position) for i in range(heads)]


def reference_block(drafter: Eagle3Drafter, seq: RawSequence, anchor: int, steps: int) -> torch.Tensor:
    """One block alone, step by step, explicit causal attention: pre-norm hiddens ``[steps, d]``."""
    p = dict(drafter.named_parameters())
    emb = drafter.embed_tokens.weight
    H, G, h = TINY.num_attention_heads, TINY.num_key_value_heads, TINY.head_dim

    def fused(token: int, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [_rms(emb[token], p["midlayer.input_layernorm.weight"]), _rms(hidden, p["midlayer.hidden_norm.weight"])]
        )

    def fc(g: torch.Tensor) -> torch.Tensor:
        return p["fc.weight"] @ g

    keys: list[list[torch.Tensor]] = []
    values: list[torch.Tensor] = []
    for t in range(1, anchor):
        x = fused(int(seq.tokens[t]), fc(seq.features[t - 1]))
        keys.append(_project(p["midlayer.self_attn.k_proj.weight"], x, G, t))
        values.append((p["midlayer.self_attn.v_proj.weight"] @ x).view(G, h))
    hidden = fc(seq.features[anchor - 1])
    outputs = []
    for k in range(steps):
        position = anchor + k
        x = fused(int(seq.tokens[position]), hidden)
        queries = _project(p["midlayer.self_attn.q_proj.weight"], x, H, position)
        keys.append(_project(p["midlayer.self_attn.k_proj.weight"], x, G, position))
        values.append((p["midlayer.self_attn.v_proj.weight"] @ x).view(G, h))
        heads = []
        for i in range(H):
            g = i // (H // G)
            scores = torch.stack([queries[i] @ key[g] for key in keys]) / math.sqrt(h)
            weights = torch.softmax(scores, dim=0)
            heads.append(sum(w * v[g] for w, v in zip(weights, values)))
        h_mid = hidden + p["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
        z = _rms(h_mid, p["midlayer.post_attention_layernorm.weight"])
        gate = p["midlayer.mlp.gate_proj.weight"] @ z
        up = p["midlayer.mlp.up_proj.weight"] @ z
        hidden = h_mid + p["midlayer.mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up)
        outputs.append(hidden)
    return torch.stack(outputs)


def _two_sequences(block: int) -> list[RawSequence]:
    gen = torch.Generator().manual_seed(3)
    return [
        _random_sequence(gen, 30, [2, 9, 15, 26], block),
        _random_sequence(gen, 21, [1, 5, 12, 17], block),
    ]


# ---------------------------------------------------------------- drafter tests


@torch.no_grad()
def test_ttt_unroll_matches_brute_force_per_block() -> None:
    block = 4
    drafter = make_drafter(block)
    sequences = _two_sequences(block)
    batch = pack(sequences, block)
    got = drafter.unroll(batch, block)
    i = 0
    for seq in sequences:
        for a in seq.anchors:
            torch.testing.assert_close(got[i], reference_block(drafter, seq, a, block), rtol=1e-5, atol=1e-5)
            i += 1

    out = drafter(batch)
    mask = batch.supervised_mask
    torch.testing.assert_close(out.hidden, drafter.norm(got[mask]), rtol=0, atol=0)
    assert out.hidden.shape == (batch.num_supervised, TINY.hidden_size)
    assert torch.equal(out.slot_index, torch.arange(block).expand_as(mask)[mask])
    logits = slot_logits(drafter, batch)
    assert logits.shape == (batch.num_blocks, block, drafter.draft_vocab.size)
    torch.testing.assert_close(logits[mask], drafter.lm_head(out.hidden), rtol=1e-6, atol=1e-6)


@torch.no_grad()
def test_packing_invariance() -> None:
    block = 4
    drafter = make_drafter(block)
    sequences = _two_sequences(block)
    packed = drafter(pack(sequences, block))
    alone = [drafter(pack([seq], block)) for seq in sequences]
    torch.testing.assert_close(packed.hidden, torch.cat([o.hidden for o in alone]), rtol=1e-5, atol=1e-5)
    assert torch.equal(packed.slot_index, torch.cat([o.slot_index for o in alone]))


@torch.no_grad()
def test_no_leak_of_features_at_or_after_anchor() -> None:
    block = 4
    drafter = make_drafter(block)
    sequences = _two_sequences(block)
    batch = pack(sequences, block)
    base = drafter.unroll(batch, block)
    for b in range(batch.num_blocks):
        leaky = pack(sequences, block)
        own_seq, anchor = batch.block_seq[b], batch.block_anchor[b]
        future = (batch.ctx_seq == own_seq) & (batch.ctx_pos >= anchor)
        leaky.ctx_features[future] += 100.0
        leaky.ctx_features[batch.ctx_seq != own_seq] *= -3.0
        leaky.target_hidden += 7.0
        assert torch.equal(drafter.unroll(leaky, block)[b], base[b])


def test_gradients_reach_trainable_weights_only() -> None:
    block = 3
    drafter = make_drafter(block).train()
    batch = pack(_two_sequences(block), block)
    out = drafter(batch)
    (drafter.lm_head(out.hidden).logsumexp(-1) * drafter.step_weights(block)[out.slot_index]).sum().backward()
    assert drafter.embed_tokens.weight.grad is None
    for name, param in drafter.named_parameters():
        if name != "embed_tokens.weight":
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_step_weights_decay() -> None:
    drafter = make_drafter(block=7)
    torch.testing.assert_close(drafter.step_weights(7), torch.tensor([0.8**k for k in range(7)]))


def test_flex_backend_matches_sdpa() -> None:
    block = 3
    drafter = make_drafter(block)
    batch = pack(_two_sequences(block)[1:], block)
    with torch.no_grad():
        torch.testing.assert_close(
            drafter.unroll(batch, block, "flex"), drafter.unroll(batch, block, "sdpa"), rtol=1e-5, atol=1e-5
        )


def test_rejects_inconsistent_recipes() -> None:
    # Checked once, when the recipe loads: the module trusts a loaded recipe.
    for override, message in (
        ("drafter.num_layers=5", "drafter.num_layers must be 1, got 5"),
        ("drafter.ttt_steps=5", "drafter.ttt_steps (5) must equal drafter.block_size (7)"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_recipe("tiny-eagle3", [override], check_target=False)
    two_taps = RecipeConfig(
        drafter=DrafterConfig(kind="eagle3", num_layers=1, markov_rank=0, confidence_head=False),
        target=TargetConfig(layer_ids=[1, 3]),
    )
    assert kind_spec("eagle3").recipe_problems(two_taps) == [
        "drafter.kind=eagle3 fuses exactly 3 target layers: target.layer_ids has 2 ([1, 3])"
    ]


# ---------------------------------------------------------------- Qwen3 sizes on the meta device


def test_qwen3_shapes_on_meta_device() -> None:
    from deepspec_train.models.reference_configs import qwen3_reference_configs

    configs = qwen3_reference_configs()
    expected_layers = {"Qwen3-4B": [1, 17, 32], "Qwen3-8B": [1, 17, 32], "Qwen3-14B": [1, 19, 36]}
    for name, hf_config in configs.items():
        layers = eagle3_target_layer_ids(hf_config.num_hidden_layers)
        if name in expected_layers:
            assert layers == expected_layers[name]
        geometry = geometry_from_target_config(hf_config)
        V, d = geometry.vocab_size, geometry.hidden_size
        H, G, h, inter = (
            geometry.num_attention_heads,
            geometry.num_key_value_heads,
            geometry.head_dim,
            geometry.intermediate_size,
        )
        vocab = DraftVocab(d2t=torch.zeros(32000, dtype=torch.long), t2d=torch.zeros(V, dtype=torch.bool))
        with torch.device("meta"):
            drafter = Eagle3Drafter(geometry, DrafterConfig(kind="eagle3", num_layers=1), layers, vocab)
        shapes = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
        assert shapes == {
            "embed_tokens.weight": (V, d),
            "fc.weight": (d, 3 * d),
            "midlayer.input_layernorm.weight": (d,),
            "midlayer.hidden_norm.weight": (d,),
            "midlayer.self_attn.q_proj.weight": (H * h, 2 * d),
            "midlayer.self_attn.k_proj.weight": (G * h, 2 * d),
            "midlayer.self_attn.v_proj.weight": (G * h, 2 * d),
            "midlayer.self_attn.o_proj.weight": (d, H * h),
            "midlayer.post_attention_layernorm.weight": (d,),
            "midlayer.mlp.gate_proj.weight": (inter, d),
            "midlayer.mlp.up_proj.weight": (inter, d),
            "midlayer.mlp.down_proj.weight": (d, inter),
            "norm.weight": (d,),
            "lm_head.weight": (32000, d),
            "d2t": (32000,),
            "t2d": (V,),
        }, name
        assert drafter.d2t.dtype == torch.long and drafter.t2d.dtype == torch.bool
    assert {"Qwen3-4B", "Qwen3-8B", "Qwen3-14B"} <= set(configs)


@torch.no_grad()
@pytest.mark.parametrize("rope", [None, {"rope_type": "dynamic", "factor": 2.0}])
def test_kv_cached_drafting_equals_the_unroll(rope) -> None:
    """Decode-time drafting steps through a KV cache; its per-step states and draft distributions equal the
    training unroll run on the drafted tokens (teacher forcing with the drafts), for several rows at once; with
    dynamic RoPE scaling too (every step rotates at the length the unroll uses), past the trained positions."""
    from deepspec_train.models.block_drafting import DraftContext, Eagle3BlockDrafter
    from tests.helpers.tiny_drafter import anchor_batch, use_dynamic_rope

    block = 5
    drafter = make_drafter(block)
    if rope is not None:
        use_dynamic_rope(drafter, TINY, rope)
    gen = torch.Generator().manual_seed(7)
    length = 13
    context = DraftContext(torch.randn(length, 3 * TINY.hidden_size, generator=gen),
                           torch.randint(2, TINY.vocab_size, (length,), generator=gen))
    anchors = torch.tensor([4, 4, 9, 17])
    draft = Eagle3BlockDrafter(drafter).draft(context, anchors, block, 1.0, torch.Generator().manual_seed(1))
    batch = anchor_batch(context, anchors, block, fill_token=0)
    batch.block_prev = torch.cat([anchors[:, None], draft.tokens[:, :-1]], dim=1)
    hidden = drafter.unroll(batch, block)
    probs = torch.softmax(drafter.lm_head(drafter.norm(hidden)), dim=-1)
    expected = probs.new_zeros(len(anchors), block, TINY.vocab_size)
    expected[:, :, drafter.draft_vocab.target_ids()] = probs
    torch.testing.assert_close(draft.probs, expected, rtol=1e-5, atol=1e-6)
    seq_len = length + block if rope is not None else 0
    kv = drafter.entry_kv(context.tokens[1:], context.features[:-1], torch.arange(1, length), seq_len)
    steps = drafter.start_draft(kv, context.features[-1], len(anchors), length, seq_len)
    for k in range(block):
        torch.testing.assert_close(steps.step(batch.block_prev[:, k]), hidden[:, k], rtol=1e-5, atol=1e-6)
