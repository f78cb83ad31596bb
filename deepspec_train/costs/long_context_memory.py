"""Per-GPU memory of a target rank and of a drafter rank at long context (8K / 32K / 128K tokens), as named terms.

Printed by ``python -m deepspec_train.costs`` (its long-context section) and tabulated in
``docs/howto/train_qwen3_8b.md``; every term is checked against a measured peak of the real modules at scale-copy widths
(``tests/test_long_context_memory.py``). Bytes are counted from what the code allocates, op by op:

**Target rank** (frozen, ``torch.no_grad``, transformers' default ``sdpa`` attention, which on GPU runs a flash /
memory-efficient kernel for one unpadded causal sequence: no ``L x L`` tensor):

- ``weights``: every parameter in the target's dtype.
- ``layer transient``: the largest live set inside one decoder layer over ``L`` tokens, the largest of its three
  phases: an RMSNorm (the residual plus two fp32 copies: Qwen3's norm upcasts, squares and scales), attention
  (residual, normed input, q / k / v, fp32 q-norm copies) and the MLP (residual, normed input, ``silu(gate)``,
  ``up`` and their product, ``I`` wide each).
- ``eager L x L``: what ``attn_implementation="eager"`` adds: per head the ``L x L`` masked scores and the fp32
  softmax's copy of them and result (and the additive causal mask). Not part of the peak of the default ``sdpa``;
  it is why eager attention must not be used at 32K.
- ``kept taps``: the K tapped layers' outputs and the final-norm states, ``(K+1) x L x d``; when the forward returns,
  ``TargetTap`` concatenates the K taps while holding them, so ``(2K+1) x L x d`` is live for a moment.
- ``packed micro-batch``: the ``PackedBatch`` being built from the kept states: the gathered context rows and their
  concatenation (two copies of its ``K*d`` features) and the supervised final-hidden rows.

**Drafter rank** (torch autocast to bf16 around fp32 weights, the trainer's DDP path):

- ``state``: fp32 weights, gradients and AdamW's two moments of the trainable parameters (16 B each; the module's
  own fp32 weights are the master copy: there is no other), fp32 frozen embedding / LM head, the bf16 target LM
  head, and autocast's bf16 copies of the trainable weights (cached for the forward).
- ``received micro-batch``: the ``PackedBatch`` (``K*d`` bf16 features per context row, ``d`` per supervised slot).
- ``context projection``: under autocast ``fc`` reads the received bf16 features as they are (no copy) and writes
  bf16 ``H_ctx`` rows, which ``hidden_norm`` normalises in fp32 (``20 d`` bytes per context row while it runs).
  With checkpointing it runs ``CONTEXT_CHUNK_ROWS`` rows at a time and keeps nothing.
- ``saved activations``: per backbone layer, what autograd keeps over the ``Nc + Q`` key rows (two bf16 copies of
  the concatenated context / block input for ``k_proj`` and ``v_proj``, the k-norm's fp32 input, keys and values)
  and over the ``Q`` block slots (the layer's fp32 input and norms, q, attention output and log-sum-exp, the MLP's
  four ``I``-wide tensors). With ``drafter.activation_checkpointing`` each layer keeps only its fp32 input, the
  context projection nothing, and one layer's full set is live again while it is recomputed.
- ``attention mask``: the dense path (``sdpa``, CPU) builds a bool ``Q x (Nc+Q)`` mask and each layer's SDPA keeps
  it as a bf16 additive bias for backward; the GPU path's flex ``BlockMask`` keeps int32 tile tables only.
- ``loss chunk``: ``selected_logit_loss`` holds a few fp32 ``chunk_size x V`` buffers at a time (target
  probabilities, draft logits / probabilities, their difference, the elementwise minimum) plus the bf16 matmul
  outputs and the bf16 cast of the frozen fp32 draft head that autocast makes for each product, and the fp32
  gradient of the Markov factor ``W2`` accumulated over the chunks.

A rank's peak adds its persistent terms to the largest of its phases (``TargetRankMemory.peak_bytes``,
``DrafterRankMemory.peak_bytes``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deepspec_train.models.geometry import DrafterGeometry

FP32 = 4
BF16 = 2
BOOL = 1
INT32 = 4
# flex_attention's default tile: a BlockMask keeps, per (query tile, key tile), int32 indices in four tables
# (partial and full blocks, by query and by key).
FLEX_TILE = 128
BLOCK_MASK_TABLES = 4
# The long-context lengths of the docs' table.
LONG_CONTEXT_LENGTHS = (8192, 32768, 131072)
LONG_CONTEXT_TARGETS = (("qwen3-8b", "Qwen3-8B"), ("qwen3-14b", "Qwen3-14B"))
# fp32 [chunk, V] buffers live at once in ``selected_logit_loss._chunk_terms`` (p_target, p_draft, p_draft -
# p_target, min(p_draft, p_target)), and the bf16 matmul output being cast to fp32 next to the first two.
LOSS_FP32_BUFFERS = 4


@dataclass(frozen=True)
class MemoryTerm:
    """One named amount of memory of a rank, in bytes."""

    name: str
    bytes: float


def _attention_widths(hf_config: Any) -> tuple[int, int, int, int]:
    """(hidden, query width heads*head_dim, key/value width, heads) of a target config."""
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return hf_config.hidden_size, heads * head_dim, hf_config.num_key_value_heads * head_dim, heads


def target_layer_transient_bytes(hf_config: Any, tokens: int, value_bytes: int) -> float:
    """The largest live set of one no-grad decoder layer over ``tokens`` tokens (``value_bytes``: the target's
    dtype), with a flash / memory-efficient attention kernel (no ``L x L`` tensor)."""
    d, q_width, kv_width, _ = _attention_widths(hf_config)
    norm = value_bytes * d + 2 * FP32 * d
    # residual + normed input + q (and the q-norm's two fp32 copies of it) + k, v.
    attention = value_bytes * (2 * d + q_width + 2 * kv_width) + 2 * FP32 * q_width
    mlp = value_bytes * (2 * d + 3 * hf_config.intermediate_size)
    return tokens * max(norm, attention, mlp)


def eager_attention_bytes(hf_config: Any, tokens: int, value_bytes: int) -> float:
    """What eager attention adds inside one layer: per head the masked ``L x L`` scores in the target's dtype and,
    while ``softmax(..., dtype=float32)`` runs, its fp32 copy of them and its fp32 result, plus the ``L x L``
    additive causal mask."""
    heads = _attention_widths(hf_config)[3]
    return tokens * tokens * (heads * (value_bytes + 2 * FP32) + value_bytes)


def kept_states_bytes(taps: int, hidden: int, tokens: int, value_bytes: int) -> float:
    """The tapped layers' outputs and the final-norm states ``TargetTap`` keeps: ``(K+1) x L x d``."""
    return (taps + 1) * hidden * tokens * value_bytes


def packed_build_bytes(taps: int, hidden: int, ctx_rows: int, supervised: int, value_bytes: int) -> float:
    """A ``PackedBatch`` being built: the gathered context rows and their concatenation (two copies of ``K*d``
    features), the supervised final-hidden rows and their concatenation."""
    return 2 * value_bytes * (ctx_rows * taps * hidden + supervised * hidden)


@dataclass(frozen=True)
class RankTerms:
    """A rank's memory at one sequence length: every other field is a term, in bytes."""

    seq_len: int

    def terms(self) -> list[MemoryTerm]:
        """The named terms in field order (the table's rows)."""
        return [MemoryTerm(f.name.replace("_", " "), getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != "seq_len"]


@dataclass(frozen=True)
class TargetRankMemory(RankTerms):
    """A target rank over one sequence of ``seq_len`` tokens: the terms, and how they add up to its peak."""

    weights: float
    layer_transient: float
    eager_attention: float
    kept_taps: float
    final_states: float
    packed_batch: float
    stream_in_flight: float

    def activation_peak_bytes(self, eager: bool = False) -> float:
        """The largest of the rank's phases beyond its weights: the last layers' transient with every tap kept,
        the concatenation of the taps (a second copy while the captured outputs are held), and the micro-batch
        being built from the kept states."""
        forward = self.kept_taps + self.layer_transient + (self.eager_attention if eager else 0.0)
        kept = self.kept_taps + self.final_states
        return max(forward, kept + self.kept_taps, kept + self.packed_batch)

    def peak_bytes(self, streamed: bool = False, eager: bool = False) -> float:
        """Weights plus the activation peak, plus the send queue's micro-batches on a streamed target worker."""
        return self.weights + self.activation_peak_bytes(eager) + (self.stream_in_flight if streamed else 0.0)


def drafter_key_row_saved_bytes(geometry: DrafterGeometry) -> float:
    """Bytes one backbone layer keeps for backward per key row (context row or block slot) under bf16 autocast:
    the two bf16 casts of the ``[context; block]`` input (``k_proj``, ``v_proj``), the k-norm's fp32 input and
    statistic, its bf16 output, the rotated keys and the values."""
    kv_width = geometry.num_key_value_heads * geometry.head_dim
    return 2 * BF16 * geometry.hidden_size + (FP32 + 3 * BF16) * kv_width + FP32 * geometry.num_key_value_heads


def drafter_slot_saved_bytes(geometry: DrafterGeometry) -> float:
    """Bytes one backbone layer keeps for backward per block slot beyond its key row: the fp32 layer input, both
    RMSNorms' fp32 input, output and statistic, the q projection's input and the q-norm's, the rotated queries,
    the attention output and log-sum-exp, the ``o_proj`` input, and the MLP's inputs and four ``I``-wide tensors."""
    d, heads = geometry.hidden_size, geometry.num_attention_heads
    q_width = heads * geometry.head_dim
    norms = 2 * (2 * FP32 * d + FP32)
    attention = BF16 * d + (FP32 + 4 * BF16) * q_width + 2 * FP32 * heads
    mlp = 2 * BF16 * d + 4 * BF16 * geometry.intermediate_size
    return FP32 * d + norms + attention + mlp


def drafter_shared_saved_bytes(geometry: DrafterGeometry, taps: int, ctx_rows: int, slots: int,
                               checkpointing: bool) -> float:
    """What the backbone keeps once, whatever its depth: the context states ``H_ctx`` (fp32, every layer reads
    them), the rotary tables of the key rows, the final norm's saved tensors; without checkpointing also
    ``hidden_norm``'s saved tensors (``fc`` keeps the received features themselves, counted with the batch)."""
    d, head_dim = geometry.hidden_size, geometry.head_dim
    shared = ctx_rows * FP32 * d + (ctx_rows + slots) * 2 * FP32 * head_dim + slots * (2 * FP32 * d + FP32)
    if not checkpointing:
        shared += ctx_rows * (FP32 * d + FP32 + BF16 * d)
    return shared


def drafter_saved_bytes(geometry: DrafterGeometry, layers: int, ctx_rows: int, slots: int,
                        checkpointing: bool) -> float:
    """The layers' saved activations over ``ctx_rows + slots`` key rows and ``slots`` queries (attention mask
    excluded): all of them, or with checkpointing each layer's fp32 input plus one layer's set (recomputed)."""
    one_layer = (ctx_rows + slots) * drafter_key_row_saved_bytes(geometry) + slots * drafter_slot_saved_bytes(geometry)
    if checkpointing:
        return layers * slots * FP32 * geometry.hidden_size + one_layer
    return layers * one_layer


def dense_mask_bytes(ctx_rows: int, slots: int, layers: int, checkpointing: bool) -> float:
    """The dense path's mask: the bool ``Q x (Nc+Q)`` mask and the bf16 additive bias SDPA makes of it, kept per
    layer for backward (one layer's at a time while it is recomputed with checkpointing)."""
    keys = ctx_rows + slots
    return slots * keys * (BOOL + BF16 * (1 if checkpointing else layers))


def block_mask_bytes(ctx_rows: int, slots: int, tile: int = FLEX_TILE) -> float:
    """A flex ``BlockMask``'s tile tables: int32 counts and indices of partial and full tiles, by query tile and
    by key tile (``BLOCK_MASK_TABLES`` index tables of ``q_tiles x kv_tiles``, counts negligible)."""
    q_tiles, kv_tiles = -(-slots // tile), -(-(ctx_rows + slots) // tile)
    return BLOCK_MASK_TABLES * INT32 * q_tiles * kv_tiles


def loss_chunk_bytes(chunk_rows: int, vocab: int, hidden: int, markov_rank: int) -> float:
    """``selected_logit_loss``'s peak for one chunk: ``LOSS_FP32_BUFFERS`` fp32 ``[chunk, V]`` buffers, the bf16
    copy of the frozen fp32 draft head that autocast casts for the chunk's product, and the fp32 gradient buffer
    of the Markov factor ``W2 [V, r]`` that the chunks accumulate into."""
    return LOSS_FP32_BUFFERS * FP32 * chunk_rows * vocab + BF16 * vocab * hidden + FP32 * vocab * markov_rank


@dataclass(frozen=True)
class DrafterRankMemory(RankTerms):
    """A drafter rank training on the packed micro-batch of one ``seq_len``-token sequence."""

    state: float
    received_batch: float
    context_projection: float
    context_projection_checkpointed: float
    saved_activations: float
    saved_activations_checkpointed: float
    dense_mask: float
    dense_mask_checkpointed: float
    block_mask: float
    loss_chunk: float

    def activation_peak_bytes(self, checkpointing: bool, flex: bool = True) -> float:
        """The largest phase beyond state and batch: the context projection, or the saved activations with the
        mask at the end of the forward or with the loss chunk after it."""
        saved = self.saved_activations_checkpointed if checkpointing else self.saved_activations
        mask = self.block_mask if flex else (self.dense_mask_checkpointed if checkpointing else self.dense_mask)
        projection = self.context_projection_checkpointed if checkpointing else self.context_projection
        return max(projection, saved + mask, saved + self.loss_chunk)

    def peak_bytes(self, checkpointing: bool, flex: bool = True) -> float:
        """State and received batch plus the activation peak (``flex``: the GPU path's BlockMask)."""
        return self.state + self.received_batch + self.activation_peak_bytes(checkpointing, flex)
