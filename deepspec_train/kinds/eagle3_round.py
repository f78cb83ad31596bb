"""The serving round of the EAGLE-3 drafter kind (``kinds.eagle3``), kernel group by kernel group, from the building
blocks of ``kinds.serving_kernels`` (its docstring has the accounting)."""

from __future__ import annotations

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.kinds.serving_kernels import (
    LOGIT_BYTES, GroupBuilder, LayerPass, RoundShape, ServingRound, decoder_layer,
)
from deepspec_train.models.geometry import DrafterGeometry


def eagle3_round(cfg: DrafterConfig, geometry: DrafterGeometry, taps: int, shape: RoundShape) -> ServingRound:
    """EAGLE-3: the taps projection of the new context entries (``fc``, plus step 0's input row ``fc(g_{a-1})``)
    and their keys / values through the layer's 2d-wide input, then ``ttt_steps`` sequential steps, each one pass
    of the layer for one token per request over its KV cache, the final norm, the draft-vocabulary LM head and
    sampling."""
    d, vocab, b = geometry.hidden_size, geometry.vocab_size, shape.batch
    draft_vocab = cfg.draft_vocab_size or vocab
    drafts = cfg.ttt_steps
    new = b * shape.rows_added(drafts)
    kv_width = geometry.num_key_value_heads * geometry.head_dim

    taps_group = GroupBuilder("taps projection")
    taps_group.matmul("fc.weight", new + b, taps * d, d)
    groups = [taps_group.done()]
    context = GroupBuilder("context keys / values")
    context.gather("embed_tokens.weight", vocab, d, new)
    context.norm("midlayer.input_layernorm.weight", new, d)
    context.norm("midlayer.hidden_norm.weight", new, d)
    context.matmul("midlayer.self_attn.k_proj.weight", new, 2 * d, kv_width)
    context.matmul("midlayer.self_attn.v_proj.weight", new, 2 * d, kv_width)
    groups.append(context.done())
    # Entries 1..a-1 are cached; step k's own key joins them, so it attends to (a - 1) + (k + 1) keys.
    for k in range(drafts):
        step = GroupBuilder("layer step")
        step.gather("embed_tokens.weight", vocab, d, b)
        decoder_layer(step, "midlayer.", geometry, LayerPass(b, 1, shape.context_len + k), 2 * d, False,
                       ("input_layernorm", "hidden_norm"))
        step.norm("norm.weight", b, d)
        step.matmul("lm_head.weight", b, d, draft_vocab, out_bytes=LOGIT_BYTES)
        step.sample(b, draft_vocab)
        groups.append(step.done())
    return ServingRound(drafts, tuple(groups))
