"""One verification round at serving time, kernel group by kernel group: what each sequential group of kernels
reads and writes in device memory and the matmul FLOPs it does, for ``batch`` requests decoding together.

The drafter kinds compose their rounds from these pieces (``DrafterKind.serving_round``: ``parallel_round`` for
DSpark / DFlash, ``dflash2_round`` for DFlash2, ``eagle3_round`` for EAGLE-3); ``target_round`` is the target's
forward over the tokens it verifies. ``deepspec_train.serving_cost`` turns the groups into roofline times on named
GPUs. Pure arithmetic: no torch, so the kind records can import it.

Accounting (what "bytes" and "FLOPs" mean here, the same for every group):

- weights: bf16, each tensor a group uses is read once per group whatever the batch (the batch's rows share one
  read); a gather (embedding rows, the Markov factor's candidate rows) reads only the rows it picks;
- activations: bf16, a matmul reads its input rows and writes its output rows, a norm reads and writes its rows,
  attention reads its queries and each request's cached keys / values and writes its output; logits are fp32
  (what the samplers read), and sampling reads each row of logits once;
- FLOPs: matmuls and attention only, 2 per multiply-add, attention ``4 * heads * head_dim`` per (query, key) pair
  (scores and values). Norms, activations functions and sampling are elementwise and left out: what
  ``torch.utils.flop_counter`` counts, which the tests compare against on the real modules.

The rounds follow the project's decoder (``models.block_drafting``), which does what an engine does: the context
rows a round adds (``RoundShape.new_rows``) are projected once and kept as keys / values, a parallel drafter runs
its layers once over the block, EAGLE-3 steps through its KV cache one drafted token at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Optional

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.models.markov_forms import markov_form

WEIGHT_BYTES = 2
ACTIVATION_BYTES = 2
LOGIT_BYTES = 4
INDEX_BYTES = 8


@dataclass(frozen=True)
class Weight:
    """A parameter tensor of ``numel`` elements, of which a group reads ``read`` (all of it unless gathered)."""

    name: str
    numel: int
    read: int

    @property
    def bytes_read(self) -> int:
        return WEIGHT_BYTES * self.read


class GroupRole(Enum):
    """What a kernel group does in a round, for a round built on another one (DFlash2 on DFlash) to find the
    groups it extends or replaces; the group's name is only its label in tables."""

    BACKBONE_LAYER = auto()
    SAMPLING = auto()


@dataclass(frozen=True)
class KernelGroup:
    """Kernels that run one after the other inside a round and cannot overlap with the next group (each needs the
    previous group's output): the weights they read, their activation bytes and matmul FLOPs, and the group's
    ``role`` where a derived round looks for it (None: none does)."""

    name: str
    weights: tuple[Weight, ...]
    activation_bytes: float
    flops: float
    role: Optional[GroupRole] = None

    @property
    def weight_bytes(self) -> int:
        return sum(w.bytes_read for w in self.weights)

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes


@dataclass(frozen=True)
class RoundShape:
    """The serving situation of a round: ``batch`` requests, each with ``context_len`` context positions before
    its anchor (the keys its block attends to), ``new_rows`` of which were added by the previous verification and
    are projected this round (None: one verification's positions, drafts + 1, what vLLM's captured draft step
    projects), and vLLM's ``dspark_draft_topk`` (None: the Markov bias over the whole draft vocabulary)."""

    batch: int = 1
    context_len: int = 1024
    new_rows: Optional[int] = None
    draft_topk: Optional[int] = None

    def rows_added(self, drafts: int) -> int:
        return drafts + 1 if self.new_rows is None else self.new_rows


@dataclass(frozen=True)
class ServingRound:
    """A round's sequential kernel groups, in order; ``drafts`` is the number of tokens drafted (0 for a target
    pass)."""

    drafts: int
    groups: tuple[KernelGroup, ...]

    def parameters(self) -> dict[str, int]:
        """Every parameter tensor the round touches, by name: its element count."""
        found: dict[str, int] = {}
        for group in self.groups:
            for w in group.weights:
                if found.setdefault(w.name, w.numel) != w.numel:
                    raise ValueError(f"tensor {w.name} has two sizes: {found[w.name]} and {w.numel}")
        return found

    @property
    def flops(self) -> float:
        return sum(g.flops for g in self.groups)

    @property
    def weight_bytes(self) -> float:
        return sum(g.weight_bytes for g in self.groups)

    @property
    def activation_bytes(self) -> float:
        return sum(g.activation_bytes for g in self.groups)


@dataclass
class _Group:
    """Accumulates one ``KernelGroup``."""

    name: str
    weights: list[Weight] = field(default_factory=list)
    activations: float = 0.0
    flops: float = 0.0
    role: Optional[GroupRole] = None

    def matmul(self, weight: str, rows: int, n_in: int, n_out: int, bias: Optional[str] = None,
               numel: Optional[int] = None, out_bytes: int = ACTIVATION_BYTES) -> None:
        """``rows`` inputs of width ``n_in`` times an ``[n_out, n_in]`` weight (a slice of a tensor of ``numel``
        elements when given), plus a bias."""
        self.weights.append(Weight(weight, numel or n_in * n_out, n_in * n_out))
        if bias is not None:
            self.weights.append(Weight(bias, n_out, n_out))
        self.activations += rows * (ACTIVATION_BYTES * n_in + out_bytes * n_out)
        self.flops += 2 * rows * n_in * n_out

    def norm(self, weight: str, rows: int, width: int) -> None:
        self.weights.append(Weight(weight, width, width))
        self.activations += 2 * ACTIVATION_BYTES * rows * width

    def gather(self, weight: str, table_rows: int, width: int, rows: int) -> None:
        """``rows`` rows of a ``[table_rows, width]`` table, written out as activations."""
        self.weights.append(Weight(weight, table_rows * width, rows * width))
        self.activations += ACTIVATION_BYTES * rows * width

    def attention(self, geometry: DrafterGeometry, requests: int, queries: int, keys: int) -> None:
        """Each request's ``queries`` attend to its ``keys`` cached keys / values (grouped-query heads)."""
        q_width = geometry.num_attention_heads * geometry.head_dim
        kv_width = geometry.num_key_value_heads * geometry.head_dim
        self.activations += ACTIVATION_BYTES * requests * (2 * queries * q_width + 2 * keys * kv_width)
        self.flops += 4 * requests * queries * keys * q_width

    def sample(self, rows: int, vocab: int) -> None:
        """Sampling reads each row of logits once."""
        self.activations += LOGIT_BYTES * rows * vocab

    def done(self) -> KernelGroup:
        return KernelGroup(self.name, tuple(self.weights), self.activations, self.flops, self.role)


@dataclass(frozen=True)
class _LayerPass:
    """One pass of a decoder layer: ``queries`` rows for each of ``requests`` requests, each seeing ``keys`` keys."""

    requests: int
    queries: int
    keys: int


def _decoder_layer(group: _Group, prefix: str, geometry: DrafterGeometry, layer_pass: _LayerPass,
                   attention_input: int, qk_norm: bool, input_norms: tuple[str, ...]) -> None:
    """A pre-norm Qwen3 decoder layer over ``requests * queries`` rows whose attention projects an
    ``attention_input``-wide input (the drafters' ``d``, EAGLE-3's ``2d``) and attends to ``keys`` per request."""
    requests, queries, keys = layer_pass.requests, layer_pass.queries, layer_pass.keys
    d, hd = geometry.hidden_size, geometry.head_dim
    q, kv, rows = geometry.num_attention_heads * hd, geometry.num_key_value_heads * hd, requests * queries
    for norm in input_norms:
        group.norm(f"{prefix}{norm}.weight", rows, d)
    attn = f"{prefix}self_attn."
    group.matmul(f"{attn}q_proj.weight", rows, attention_input, q)
    group.matmul(f"{attn}k_proj.weight", rows, attention_input, kv)
    group.matmul(f"{attn}v_proj.weight", rows, attention_input, kv)
    if qk_norm:
        group.norm(f"{attn}q_norm.weight", rows * geometry.num_attention_heads, hd)
        group.norm(f"{attn}k_norm.weight", rows * geometry.num_key_value_heads, hd)
    group.attention(geometry, requests, queries, keys)
    group.matmul(f"{attn}o_proj.weight", rows, q, d)
    group.norm(f"{prefix}post_attention_layernorm.weight", rows, d)
    width = geometry.intermediate_size
    group.matmul(f"{prefix}mlp.gate_proj.weight", rows, d, width)
    group.matmul(f"{prefix}mlp.up_proj.weight", rows, d, width)
    group.matmul(f"{prefix}mlp.down_proj.weight", rows, width, d)


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

    taps_group = _Group("taps projection")
    taps_group.matmul("fc.weight", new, taps * d, d)
    taps_group.norm("hidden_norm.weight", new, d)
    groups.append(taps_group.done())

    # One product for every layer's keys and values of the new rows (vLLM and ParallelDrafter.context_kv fuse it).
    context = _Group("context keys / values")
    for i in range(cfg.num_layers):
        context.matmul(f"layers.{i}.self_attn.k_proj.weight", new, d, kv_width)
        context.matmul(f"layers.{i}.self_attn.v_proj.weight", new, d, kv_width)
        context.norm(f"layers.{i}.self_attn.k_norm.weight", new * geometry.num_key_value_heads, geometry.head_dim)
    groups.append(context.done())

    embed = _Group("block embedding")
    embed.gather("embed_tokens.weight", vocab, d, b * block)
    groups.append(embed.done())
    for i in range(cfg.num_layers):
        layer = _Group("backbone layer", role=GroupRole.BACKBONE_LAYER)
        _decoder_layer(layer, f"layers.{i}.", geometry, _LayerPass(b, block, shape.context_len + block), d, True,
                       ("input_layernorm",))
        groups.append(layer.done())

    slots = b * drafts
    head = _Group("LM head over the block")
    head.norm("norm.weight", b * block, d)
    head.matmul("lm_head.weight", slots, d, draft_vocab, out_bytes=LOGIT_BYTES)
    groups.append(head.done())
    if rank > 0:
        groups += _markov_groups(cfg, geometry, shape, drafts)
    else:
        sample = _Group("sampling", role=GroupRole.SAMPLING)
        sample.sample(slots, draft_vocab)
        groups.append(sample.done())
    if cfg.confidence_head:
        conf = _Group("confidence head")
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
        pre = _Group("Markov slot-state projection")
        pre.matmul(f"markov_head.{name}.weight", slots, d, out, bias=f"markov_head.{name}.bias",
                   numel=out * (d + token_part))
        groups.append(pre.done())
    topk = shape.draft_topk
    if topk is not None:
        # vLLM: the top-k of every slot's base logits once, the logits row then filled with -inf, and each step
        # scatters its k corrected candidates into it before the usual dense sampler reads the row.
        select = _Group("top-k candidates")
        select.sample(slots, draft_vocab)
        select.activations += slots * (topk * (LOGIT_BYTES + INDEX_BYTES) + LOGIT_BYTES * draft_vocab)
        groups.append(select.done())
    for _ in range(drafts):
        step = _Group("Markov step")
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

    taps_group = _Group("taps projection")
    taps_group.matmul("fc.weight", new + b, taps * d, d)
    groups = [taps_group.done()]
    context = _Group("context keys / values")
    context.gather("embed_tokens.weight", vocab, d, new)
    context.norm("midlayer.input_layernorm.weight", new, d)
    context.norm("midlayer.hidden_norm.weight", new, d)
    context.matmul("midlayer.self_attn.k_proj.weight", new, 2 * d, kv_width)
    context.matmul("midlayer.self_attn.v_proj.weight", new, 2 * d, kv_width)
    groups.append(context.done())
    # Entries 1..a-1 are cached; step k's own key joins them, so it attends to (a - 1) + (k + 1) keys.
    for k in range(drafts):
        step = _Group("layer step")
        step.gather("embed_tokens.weight", vocab, d, b)
        _decoder_layer(step, "midlayer.", geometry, _LayerPass(b, 1, shape.context_len + k), 2 * d, False,
                       ("input_layernorm", "hidden_norm"))
        step.norm("norm.weight", b, d)
        step.matmul("lm_head.weight", b, d, draft_vocab, out_bytes=LOGIT_BYTES)
        step.sample(b, draft_vocab)
        groups.append(step.done())
    return ServingRound(drafts, tuple(groups))


def target_round(hf_config: Any, tokens: int, shape: RoundShape) -> ServingRound:
    """The target's forward over ``tokens`` new positions per request (``drafts + 1`` to verify a block, 1 for a
    plain decode step) on top of ``shape.context_len`` cached ones: one group per decoder layer, then the final
    norm and LM head. Parameter names are ``Qwen3ForCausalLM``'s; dense targets only."""
    if getattr(hf_config, "num_experts", 0):
        raise ValueError("target_round models dense targets; a mixture-of-experts target reads a batch-dependent "
                         "set of experts per layer")
    geometry = geometry_from_target_config(hf_config)
    d, vocab, b = geometry.hidden_size, geometry.vocab_size, shape.batch
    rows = b * tokens
    embed = _Group("target embedding")
    embed.gather("model.embed_tokens.weight", vocab, d, rows)
    groups = [embed.done()]
    for i in range(hf_config.num_hidden_layers):
        layer = _Group("target layer")
        _decoder_layer(layer, f"model.layers.{i}.", geometry, _LayerPass(b, tokens, shape.context_len + tokens), d, True,
                       ("input_layernorm",))
        groups.append(layer.done())
    head = _Group("target LM head")
    head.norm("model.norm.weight", rows, d)
    # A tied target's LM head is its embedding table.
    head_name = "model.embed_tokens.weight" if hf_config.tie_word_embeddings else "lm_head.weight"
    head.matmul(head_name, rows, d, vocab, out_bytes=LOGIT_BYTES)
    groups.append(head.done())
    return ServingRound(0, tuple(groups))


def dflash2_round(cfg: DrafterConfig, geometry: DrafterGeometry, taps: int, shape: RoundShape) -> ServingRound:
    """DFlash2: the DFlash round (``parallel_round``) with, in each backbone layer, the two convolutions'
    ``kernel_projection`` over the block's rows and their ``base_kernel``; instead of sampling from the whole
    vocabulary, the top-K candidates of each drafted slot's logits, the selector's lattice (``hidden_projection``,
    the predecessor rows of the anchor and of the previous slot's candidates, the successor rows of the slot's
    candidates, one ``[K, r] x [r, K]`` product per slot) and the walk, which reads one row of K scores per slot
    and writes q over the K candidates (vLLM walks all slots in one kernel: one group). The convolutions'
    products themselves are elementwise (no matmul FLOPs)."""
    d, vocab, b, block = geometry.hidden_size, geometry.vocab_size, shape.batch, cfg.block_size
    top_k, rank = cfg.selector_top_k, cfg.selector_rank
    base = parallel_round(cfg, geometry, taps, shape)
    groups, layer = [], 0
    for group in base.groups:
        if group.role is GroupRole.BACKBONE_LAYER:
            extra = _Group("")
            for conv in ("attention_conv", "mlp_conv"):
                prefix = f"layers.{layer}.{conv}."
                extra.matmul(prefix + "kernel_projection.weight", b * block, d,
                             2 * cfg.conv_kernel_size * (d // cfg.conv_group_size))
                extra.weights.append(Weight(prefix + "base_kernel", 2 * cfg.conv_kernel_size * d,
                                            2 * cfg.conv_kernel_size * d))
                # Each convolution reads its rows and writes them back, once per side.
                extra.activations += 2 * 2 * ACTIVATION_BYTES * b * block * d
            groups.append(KernelGroup(group.name, group.weights + tuple(extra.weights),
                                      group.activation_bytes + extra.activations, group.flops + extra.flops,
                                      group.role))
            layer += 1
        elif group.role is not GroupRole.SAMPLING:
            groups.append(group)
    slots = b * base.drafts
    select = _Group("top-K candidates")
    select.sample(slots, vocab)
    select.activations += slots * top_k * (LOGIT_BYTES + INDEX_BYTES)
    groups.append(select.done())
    lattice = _Group("selector lattice")
    lattice.matmul("candidate_selector.hidden_projection.weight", slots, d, rank)
    lattice.gather("candidate_selector.predecessor_codebook", vocab, rank, slots * top_k)
    lattice.gather("candidate_selector.successor_codebook", vocab, rank, slots * top_k)
    lattice.flops += 2 * slots * top_k * top_k * rank
    lattice.activations += LOGIT_BYTES * slots * top_k * top_k
    groups.append(lattice.done())
    walk = _Group("selector walk")
    walk.activations += slots * top_k * (2 * LOGIT_BYTES + INDEX_BYTES)
    groups.append(walk.done())
    return ServingRound(base.drafts, tuple(groups))
