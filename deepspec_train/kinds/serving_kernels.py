"""One verification round at serving time, kernel group by kernel group: what each sequential group of kernels
reads and writes in device memory and the matmul FLOPs it does, for ``batch`` requests decoding together.

The drafter kinds compose their rounds from these pieces (``DrafterKind.serving_round``, each beside its kind:
``kinds.parallel_round`` for DSpark / DFlash, ``kinds.dflash2_round`` for DFlash2, ``kinds.eagle3_round`` for
EAGLE-3); ``target_round`` is the target's forward over the tokens it verifies. ``deepspec_train.costs.serving_cost``
turns the groups into roofline times on named GPUs. Pure arithmetic: no torch, so the kind records can import it.

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

from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config

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
class GroupBuilder:
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
class LayerPass:
    """One pass of a decoder layer: ``queries`` rows for each of ``requests`` requests, each seeing ``keys`` keys."""

    requests: int
    queries: int
    keys: int


def decoder_layer(group: GroupBuilder, prefix: str, geometry: DrafterGeometry, layer_pass: LayerPass,
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
    embed = GroupBuilder("target embedding")
    embed.gather("model.embed_tokens.weight", vocab, d, rows)
    groups = [embed.done()]
    for i in range(hf_config.num_hidden_layers):
        layer = GroupBuilder("target layer")
        decoder_layer(layer, f"model.layers.{i}.", geometry, LayerPass(b, tokens, shape.context_len + tokens), d, True,
                       ("input_layernorm",))
        groups.append(layer.done())
    head = GroupBuilder("target LM head")
    head.norm("model.norm.weight", rows, d)
    # A tied target's LM head is its embedding table.
    head_name = "model.embed_tokens.weight" if hf_config.tie_word_embeddings else "lm_head.weight"
    head.matmul(head_name, rows, d, vocab, out_bytes=LOGIT_BYTES)
    groups.append(head.done())
    return ServingRound(0, tuple(groups))
