"""The serving round of the parallel drafter kinds (DSpark, DFlash; ``kinds.parallel``), kernel group by kernel
group, from the building blocks of ``kinds.serving_kernels`` (its docstring has the accounting)."""

from __future__ import annotations

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.kinds.serving_kernels import (
    INDEX_BYTES, LOGIT_BYTES, GroupBuilder, GroupRole, KernelGroup, LayerPass, RoundShape, ServingRound, Weight,
    decoder_layer,
)
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.markov_forms import markov_form


def parallel_round(cfg: DrafterConfig, geometry: DrafterGeometry, taps: int, shape: RoundShape) -> ServingRound:
    """DSpark / DFlash: the taps projection of the new context rows (``fc``, ``hidden_norm``), every layer's
    keys / values of them in one product, the ``N`` layers over the block, the LM head over the drafted slots, for
    a Markov head its slot-state projection (gated / RNN) and ``K`` sequential steps (the latent of the token
    sampled before, its bias ``W2 u`` added to the slot's logits, sampling) over the whole vocabulary or over
    vLLM's top-k candidates, and the confidence head. Over a reduced draft vocabulary the LM head, ``W2`` and the
    sampling cover the draft tokens only; the embedding and ``W1`` read target ids."""
    d, vocab, rank, b = geometry.hidden_size, geometry.vocab_size, cfg.markov_rank, shape.batch
    draft_vocab = min(cfg.draft_vocab_size or vocab, vocab)
    block = cfg.block_size
    # z-lab labels: slot 0 holds the anchor and drafts nothing.
    drafts = block if cfg.labels == "dspark" else block - 1
    new = b * shape.rows_added(drafts)
    kv_width = geometry.num_key_value_heads * geometry.head_dim
    groups = []

    taps_group = GroupBuilder("taps projection")
    taps_group.matmul("fc.weight", new, taps * d, d)
    taps_group.norm("hidden_norm.weight", new, d)
    groups.append(taps_group.done())

    # One product for every layer's keys and values of the new rows (vLLM and ParallelDrafter.context_kv fuse it).
    context = GroupBuilder("context keys / values")
    for i in range(cfg.num_layers):
        context.matmul(f"layers.{i}.self_attn.k_proj.weight", new, d, kv_width)
        context.matmul(f"layers.{i}.self_attn.v_proj.weight", new, d, kv_width)
        context.norm(f"layers.{i}.self_attn.k_norm.weight", new * geometry.num_key_value_heads, geometry.head_dim)
    groups.append(context.done())

    embed = GroupBuilder("block embedding")
    embed.gather("embed_tokens.weight", vocab, d, b * block)
    groups.append(embed.done())
    for i in range(cfg.num_layers):
        layer = GroupBuilder("backbone layer", role=GroupRole.BACKBONE_LAYER)
        decoder_layer(layer, f"layers.{i}.", geometry, LayerPass(b, block, shape.context_len + block), d, True,
                       ("input_layernorm",))
        groups.append(layer.done())

    slots = b * drafts
    head = GroupBuilder("LM head over the block")
    head.norm("norm.weight", b * block, d)
    head.matmul("lm_head.weight", slots, d, draft_vocab, out_bytes=LOGIT_BYTES)
    groups.append(head.done())
    if rank > 0:
        groups += _markov_groups(cfg, geometry, shape, drafts)
    else:
        sample = GroupBuilder("sampling", role=GroupRole.SAMPLING)
        sample.sample(slots, draft_vocab)
        groups.append(sample.done())
    if cfg.confidence_head:
        conf = GroupBuilder("confidence head")
        if rank > 0:
            conf.gather("markov_head.markov_w1.weight", vocab, rank, slots)
        conf.matmul("confidence_head.proj.weight", slots, d + rank, 1, bias="confidence_head.proj.bias")
        groups.append(conf.done())
    return ServingRound(drafts, tuple(groups))


def _markov_groups(cfg: DrafterConfig, geometry: DrafterGeometry, shape: RoundShape, drafts: int) -> list[KernelGroup]:
    """The Markov head's groups (see ``parallel_round``); ``MarkovHead`` in ``models.parallel_drafter`` has the
    formulas, the form's record (``models.markov_forms``) its projection. The slot-state part of a gated / RNN
    projection does not depend on the samples: one product first."""
    d, vocab, r, b = geometry.hidden_size, geometry.vocab_size, cfg.markov_rank, shape.batch
    draft_vocab = min(cfg.draft_vocab_size or vocab, vocab)
    slots = b * drafts
    # The gate / joint projection's weight [out, token_part + d]: (name, out, token_part), None without one.
    form_projection = markov_form(cfg.markov_head_type).projection
    projection = None if form_projection is None else (
        form_projection.name, form_projection.out_width(r), form_projection.token_width(r)
    )
    groups = []
    if projection is not None:
        name, out, token_part = projection
        pre = GroupBuilder("Markov slot-state projection")
        pre.matmul(f"markov_head.{name}.weight", slots, d, out, bias=f"markov_head.{name}.bias",
                   numel=out * (d + token_part))
        groups.append(pre.done())
    topk = shape.draft_topk
    if topk is not None:
        # vLLM: the top-k of every slot's base logits once, the logits row then filled with -inf, and each step
        # scatters its k corrected candidates into it before the usual dense sampler reads the row.
        select = GroupBuilder("top-k candidates")
        select.sample(slots, draft_vocab)
        select.activations += slots * (topk * (LOGIT_BYTES + INDEX_BYTES) + LOGIT_BYTES * draft_vocab)
        groups.append(select.done())
    for _ in range(drafts):
        step = GroupBuilder("Markov step")
        step.gather("markov_head.markov_w1.weight", vocab, r, b)
        if projection is not None:
            name, out, token_part = projection
            step.matmul(f"markov_head.{name}.weight", b, token_part, out, numel=out * (d + token_part))
        if topk is None:
            # The bias accumulated into the slot's logits: read and written back, then sampled.
            step.matmul("markov_head.markov_w2.weight", b, r, draft_vocab, out_bytes=2 * LOGIT_BYTES)
        else:
            # Each request gathers its k candidate rows of W2 and scatters their k corrected logits (values and
            # indices read, logits written).
            step.weights.append(Weight("markov_head.markov_w2.weight", draft_vocab * r, b * topk * r))
            step.activations += b * topk * (INDEX_BYTES + 2 * LOGIT_BYTES)
            step.flops += 2 * b * topk * r
        step.sample(b, draft_vocab)
        groups.append(step.done())
    return groups
