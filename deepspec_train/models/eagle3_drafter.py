"""EAGLE-3 drafter (baseline): one autoregressive decoder layer on fused target features, trained with TTT.

The drafter fuses its tapped target layers (EAGLE-3 always taps three: low, mid, high) with ``fc (3d -> d)`` and
runs one decoder layer (``midlayer``) whose attention input is ``[input_layernorm(emb(x_t)) ; hidden_norm(hidden_t)]``
(2d wide). It is trained on the project's anchor blocks so that it is compared with DSpark on exactly the same
supervised positions:

- Context entry ``t`` (``1 <= t <= a-1``): token ``x_t`` and fused target feature ``fc(g_{t-1})``. A
  single-layer model only needs their keys and values.
- TTT step 0 (slot 0, position ``a``): ``[emb(x_a) ; fc(g_{a-1})]``. Step ``k >= 1`` (position ``a+k``):
  ``[emb(x_{a+k}) ; h_{k-1}]`` where ``h_{k-1}`` is the layer's own pre-norm output of the previous step
  (training-time test: the drafter consumes what it would consume at inference, with teacher-forced tokens).
- Slot ``k`` attends causally to the context entries ``t <= a-1`` of its sequence and to slots ``0..k`` of its
  own block, whose keys and values were computed at their own step (a KV cache). Slot ``k`` predicts
  ``x_{a+k+1}``, the DSpark label convention, and no target feature at a position ``>= a`` is read.

Parameter names are SGLang's ``LlamaForCausalLMEagle3`` layout (``midlayer.*``, ``fc``, ``norm``, ``lm_head``,
``d2t``, ``t2d``); the frozen ``embed_tokens`` copy of the target's embedding is the only non-exported entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Union

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.activation_checkpointing import checkpointed, row_chunked
from deepspec_train.models.draft_vocab import DraftVocab
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.parallel_drafter import DrafterOutput
from deepspec_train.models.qwen3_layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary, attend
from deepspec_train.packing.batch import PackedBatch

def eagle3_target_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's low / mid / high taps as 0-indexed decoder-layer outputs: ``[1, L//2-1, L-4]``."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


class Eagle3Attention(nn.Module):
    """Grouped-query attention whose queries, keys and values are projected from the 2d-wide fused input."""

    def __init__(self, geometry: DrafterGeometry) -> None:
        super().__init__()
        d, h = geometry.hidden_size, geometry.head_dim
        self.num_heads = geometry.num_attention_heads
        self.num_kv_heads = geometry.num_key_value_heads
        self.head_dim = h
        self.q_proj = nn.Linear(2 * d, self.num_heads * h, bias=False)
        self.k_proj = nn.Linear(2 * d, self.num_kv_heads * h, bias=False)
        self.v_proj = nn.Linear(2 * d, self.num_kv_heads * h, bias=False)
        self.o_proj = nn.Linear(self.num_heads * h, d, bias=False)

    def _heads(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """``[T, heads*h] -> [1, heads, T, h]``."""
        return x.view(x.shape[0], num_heads, self.head_dim).transpose(0, 1).unsqueeze(0)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary(self._heads(self.q_proj(x), self.num_heads), cos, sin)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = apply_rotary(self._heads(self.k_proj(x), self.num_kv_heads), cos, sin)
        return k, self._heads(self.v_proj(x), self.num_kv_heads)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """``[1, H, T, h] -> [T, d]``."""
        return self.o_proj(attended[0].transpose(0, 1).reshape(attended.shape[2], -1))


class Eagle3MidLayer(nn.Module):
    """The single decoder layer; its residual stream is the (un-normed) hidden half of the input."""

    def __init__(self, geometry: DrafterGeometry) -> None:
        super().__init__()
        d, eps = geometry.hidden_size, geometry.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.hidden_norm = RMSNorm(d, eps)
        self.self_attn = Eagle3Attention(geometry)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = SwiGLU(d, geometry.intermediate_size)

    def fused_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual add after attention, then the MLP sub-block; returns the pre-norm output hidden."""
        h = residual + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class _ContextEntries:
    """EAGLE entries built from context rows: entry ``t`` pairs token ``x_t`` with feature ``g_{t-1}``."""

    tokens: torch.Tensor
    features: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor


def _row_lookup(batch: PackedBatch, seq: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Context row holding ``(seq, pos)`` for each query, and whether it exists."""
    if batch.ctx_pos.numel() == 0:
        return torch.zeros_like(pos, dtype=torch.long), torch.zeros_like(pos, dtype=torch.bool)
    # One integer key per (sequence, position); a sorted search then finds each wanted row.
    stride = int(torch.cat([batch.ctx_pos, batch.block_anchor, pos]).max()) + 2
    sorted_keys, order = torch.sort(batch.ctx_seq.long() * stride + batch.ctx_pos.long())
    wanted = seq.long() * stride + pos.long()
    idx = torch.searchsorted(sorted_keys, wanted).clamp(max=len(sorted_keys) - 1)
    found = (sorted_keys[idx] == wanted) & (pos >= 0)
    return order[idx], found


def _context_entries(batch: PackedBatch) -> _ContextEntries:
    """Every context row ``p`` whose successor token ``x_{p+1}`` is also a context row becomes entry ``p+1``.

    A block with anchor ``a`` needs entries ``t <= a-1``, i.e. rows ``p <= a-2`` and tokens up to ``x_{a-1}``,
    all of which are context rows of its sequence (context covers every position ``< a``).
    """
    nxt, has_next = _row_lookup(batch, batch.ctx_seq, batch.ctx_pos + 1)
    rows = torch.nonzero(has_next).squeeze(1)
    return _ContextEntries(
        tokens=batch.ctx_tokens[nxt[rows]],
        features=batch.ctx_features[rows],
        seq=batch.ctx_seq[rows],
        pos=batch.ctx_pos[rows] + 1,
    )


def _may_attend(
    q_block: torch.Tensor,
    q_seq: torch.Tensor,
    q_anchor: torch.Tensor,
    kv_block: torch.Tensor,
    kv_seq: torch.Tensor,
    kv_pos: torch.Tensor,
) -> torch.Tensor:
    """The step mask: a slot sees its own block's slots so far, and context entries of its sequence before ``a``.

    Context entries carry ``kv_block = -1``. Written once, used densely (SDPA) and as a flex ``mask_mod``.
    """
    own_block = kv_block == q_block
    context = (kv_block < 0) & (kv_seq == q_seq) & (kv_pos < q_anchor)
    return own_block | context


class Eagle3Drafter(nn.Module):
    """EAGLE-3 drafter over packed anchor blocks; ``forward`` unrolls the training-time test."""

    def __init__(
        self,
        geometry: DrafterGeometry,
        drafter_cfg: DrafterConfig,
        target_layer_ids: list[int],
        draft_vocab: DraftVocab,
    ) -> None:
        super().__init__()
        # The recipe rules (one layer, one TTT step per block slot, three taps) ran in
        # ``kinds.recipe_validation.load_recipe``; only the draft vocabulary (counted from the data or read from a
        # checkpoint) is checked against the target.
        if draft_vocab.target_vocab_size != geometry.vocab_size:
            raise ValueError(
                f"draft vocab maps a {draft_vocab.target_vocab_size}-token vocabulary, target has {geometry.vocab_size}"
            )
        d = geometry.hidden_size
        self.geometry = geometry
        self.target_layer_ids = list(target_layer_ids)
        self.ttt_steps = drafter_cfg.ttt_steps
        self.ttt_decay = drafter_cfg.ttt_decay
        # Recompute each TTT step and the context entries' keys / values in backward
        # (``models.activation_checkpointing``).
        self.activation_checkpointing = drafter_cfg.activation_checkpointing
        self.embed_tokens = nn.Embedding(geometry.vocab_size, d)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False)
        self.midlayer = Eagle3MidLayer(geometry)
        self.norm = RMSNorm(d, geometry.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab.size, bias=False)
        self.rotary = RotaryEmbedding.for_geometry(geometry)
        self.register_buffer("d2t", torch.empty(draft_vocab.size, dtype=torch.long))
        self.register_buffer("t2d", torch.empty(geometry.vocab_size, dtype=torch.bool))
        self.load_draft_vocab(draft_vocab)

    @property
    def draft_vocab(self) -> DraftVocab:
        return DraftVocab(d2t=self.d2t, t2d=self.t2d)

    @torch.no_grad()
    def load_draft_vocab(self, draft_vocab: DraftVocab) -> None:
        """(Re)write the ``d2t`` / ``t2d`` buffers, e.g. after a meta-device model is materialised."""
        if draft_vocab.size != self.d2t.shape[0] or draft_vocab.target_vocab_size != self.t2d.shape[0]:
            raise ValueError("draft vocabulary sizes differ from the drafter's")
        self.d2t.copy_(draft_vocab.d2t)
        self.t2d.copy_(draft_vocab.t2d)

    @torch.no_grad()
    def load_target_embedding(self, weight: torch.Tensor) -> None:
        """Copy the target's input embedding ``[V, d]`` into the frozen ``embed_tokens``."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"embedding {tuple(weight.shape)} != expected {tuple(self.embed_tokens.weight.shape)}")
        self.embed_tokens.weight.copy_(weight)

    def step_weights(self, block_size: int) -> torch.Tensor:
        """Per-slot loss weight ``ttt_decay ** k`` for ``k = 0..block_size-1``."""
        return self.ttt_decay ** torch.arange(block_size, dtype=torch.float32)

    def compile_blocks(self) -> None:
        """torch.compile the test-time-training step, the drafter's one block (``models.block_compile``); it
        reads ``midlayer`` through its parts, so the step is compiled rather than ``midlayer.forward``."""
        self._ttt_step = torch.compile(self._ttt_step)

    def forward(self, batch: PackedBatch, attention: str = "sdpa") -> DrafterOutput:
        """Final-normed hidden ``[Ns, d]`` of every supervised slot, in row-major order of ``batch.labels``."""
        supervised = batch.supervised_mask
        # Supervised slots are a prefix of each block: later steps feed nothing that carries loss.
        num_steps = int(supervised.sum(1).max()) if batch.num_blocks else 0
        hidden = self.unroll(batch, num_steps, attention)
        mask = supervised[:, :num_steps]
        slot_index = torch.arange(num_steps, device=mask.device).expand_as(mask)[mask]
        return DrafterOutput(hidden=self.norm(hidden[mask]), markov_rows=None, conf_logits=None, slot_index=slot_index)

    def unroll(self, batch: PackedBatch, num_steps: int, attention: str = "sdpa") -> torch.Tensor:
        """Run TTT steps ``0..num_steps-1`` over every block; returns pre-norm hiddens ``[Nb, num_steps, d]``."""
        if batch.block_size > self.ttt_steps:
            raise ValueError(f"block size {batch.block_size} exceeds ttt_steps {self.ttt_steps}")
        width = len(self.target_layer_ids) * self.geometry.hidden_size
        if batch.ctx_features.shape[-1] != width:
            raise ValueError(f"ctx_features width {batch.ctx_features.shape[-1]} != taps * hidden ({width})")
        nb = batch.num_blocks
        entries, ctx_k, ctx_v, hidden, seq_len = self._context_and_first_hidden(batch, num_steps)

        device = hidden.device
        q_block = torch.arange(nb, device=device)
        kv_block, kv_seq, kv_pos = [torch.full_like(entries.pos, -1)], [entries.seq], [entries.pos]
        keys, values, outputs = [ctx_k], [ctx_v], []
        for k in range(num_steps):
            positions = batch.block_anchor + k
            rotary = self.rotary.cos_sin(positions, seq_len)
            kv_block.append(q_block)
            kv_seq.append(batch.block_seq)
            kv_pos.append(positions)
            mask = self._step_mask(batch, q_block, torch.cat(kv_block), torch.cat(kv_seq), torch.cat(kv_pos), attention)
            # Snapshots of the key / value lists: a recompute in backward must see the steps before this one only.
            hidden, step_k, step_v = checkpointed(
                self._ttt_step, batch.block_prev[:, k], hidden, rotary, tuple(keys), tuple(values), mask, attention,
                enabled=self.activation_checkpointing,
            )
            keys.append(step_k)
            values.append(step_v)
            outputs.append(hidden)
        if not outputs:
            return hidden.new_zeros(nb, 0, self.geometry.hidden_size)
        return torch.stack(outputs, dim=1)

    def _ttt_step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        past_keys: tuple[torch.Tensor, ...],
        past_values: tuple[torch.Tensor, ...],
        mask: Union[torch.Tensor, BlockMask],
        attention: str,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One TTT step of every block: consumes ``tokens [Nb]`` and the previous hidden ``[Nb, d]``, attends over
        the keys / values before it and its own; returns (pre-norm hidden, its keys, its values)."""
        attn = self.midlayer.self_attn
        x = self.midlayer.fused_input(self.embed_tokens(tokens), hidden)
        q = attn.queries(x, *rotary)
        step_k, step_v = attn.keys_values(x, *rotary)
        compiled = attention == "flex" and q.is_cuda
        keys, values = torch.cat([*past_keys, step_k], dim=2), torch.cat([*past_values, step_v], dim=2)
        attended = attend(q, keys, values, mask, attention, compiled)
        return self.midlayer.finish(hidden, attn.output(attended)), step_k, step_v

    def _context_and_first_hidden(
        self, batch: PackedBatch, num_steps: int
    ) -> tuple[_ContextEntries, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The context entries, their keys / values ``[1, G, Nc, h]``, step 0's hidden input ``fc(g_{a-1})`` and
        the rotary length of a forward of ``num_steps`` steps."""
        entries = _context_entries(batch)
        # One length for every rotary call of this forward, so dynamic RoPE scaling rotates all keys and queries
        # with the same frequencies (the largest position any step reaches, + 1).
        last = [entries.pos.max()] if entries.pos.numel() else []
        if batch.num_blocks and num_steps:
            last.append((batch.block_anchor + num_steps - 1).max())
        seq_len = int(torch.stack(last).max()) + 1 if self.rotary.dynamic and last else 0
        ctx_k, ctx_v = row_chunked(partial(self.entry_kv, seq_len=seq_len),
                                   [entries.tokens, entries.features, entries.pos], 2, self.activation_checkpointing)
        prev_row, found = _row_lookup(batch, batch.block_seq, batch.block_anchor - 1)
        if not bool(found.all()):
            raise ValueError("every block needs the target feature at position a-1 among its context rows")
        return entries, ctx_k, ctx_v, self.fc(batch.ctx_features[prev_row].to(self.fc.weight.dtype)), seq_len

    def entry_kv(
        self, tokens: torch.Tensor, prev_features: torch.Tensor, positions: torch.Tensor, seq_len: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys / values ``[1, G, n, h]`` of context entries ``t``: token ``x_t``, feature ``g_{t-1}``, position ``t``
        (rotated for the length ``seq_len`` of dynamic RoPE scaling; ignored by the other RoPE types). Per entry,
        so a decoder can keep the entries of earlier rounds (engines cache them)."""
        x = self.midlayer.fused_input(self.embed_tokens(tokens), self.fc(prev_features.to(self.fc.weight.dtype)))
        return self.midlayer.self_attn.keys_values(x, *self.rotary.cos_sin(positions, seq_len))

    def start_draft(
        self, ctx_kv: tuple[torch.Tensor, torch.Tensor], last_feature: torch.Tensor, rows: int, anchor: int,
        seq_len: int = 0,
    ) -> "DraftSteps":
        """Decode-time stepping of ``rows`` blocks that share one context and anchor: ``ctx_kv`` are the keys /
        values of the context entries ``1..a-1`` (``entry_kv``), ``last_feature [3d]`` is ``g_{a-1}``. Each
        ``DraftSteps.step`` runs one TTT step for every row on top of the keys / values of the steps before (a KV
        cache: ``K`` steps cost ``K`` single-position passes, where ``unroll(batch, k + 1)`` for each ``k`` would
        re-run every earlier step). ``seq_len``: the rotary length of dynamic RoPE scaling, that of the context's
        keys (``a + K`` for ``K`` steps, as in ``unroll``). Equal to ``unroll`` (tested)."""
        hidden = self.fc(last_feature.to(self.fc.weight.dtype)).expand(rows, -1)
        # Per-row caches [R, G, T, h]: the shared context first, then each row's own steps.
        return DraftSteps(self, ctx_kv[0].expand(rows, -1, -1, -1), ctx_kv[1].expand(rows, -1, -1, -1), hidden, anchor,
                          seq_len)

    @staticmethod
    def _step_mask(
        batch: PackedBatch,
        q_block: torch.Tensor,
        kv_block: torch.Tensor,
        kv_seq: torch.Tensor,
        kv_pos: torch.Tensor,
        attention: str,
    ) -> Union[torch.Tensor, BlockMask]:
        """Dense boolean ``[Nb, KV]`` mask for SDPA, or the same rule as a flex ``BlockMask``."""
        q_seq, q_anchor = batch.block_seq, batch.block_anchor
        if attention == "flex":
            def mask_mod(b, h, qi, kvi):  # noqa: ANN001 - flex_attention's mask_mod signature
                return _may_attend(q_block[qi], q_seq[qi], q_anchor[qi], kv_block[kvi], kv_seq[kvi], kv_pos[kvi])

            return create_block_mask(mask_mod, None, None, len(q_block), len(kv_block), device=q_block.device)
        return _may_attend(
            q_block[:, None], q_seq[:, None], q_anchor[:, None], kv_block[None, :], kv_seq[None, :], kv_pos[None, :]
        )


class DraftSteps:
    """The KV-cached TTT state of ``R`` rows being drafted (made by ``Eagle3Drafter.start_draft``)."""

    def __init__(
        self, module: Eagle3Drafter, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor, anchor: int,
        seq_len: int,
    ) -> None:
        self.module = module
        self.keys = keys
        self.values = values
        self.hidden = hidden
        self.position = anchor
        self.seq_len = seq_len

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One TTT step consuming ``tokens [R]`` (the anchor first, then each row's last draft); returns the step's
        pre-norm hidden ``[R, d]``, which the next step also consumes."""
        module = self.module
        attn = module.midlayer.self_attn
        positions = torch.full_like(tokens, self.position)
        cos, sin = module.rotary.cos_sin(positions, self.seq_len)
        x = module.midlayer.fused_input(module.embed_tokens(tokens), self.hidden)
        # Rows are the batch dimension here: [1, heads, R, h] -> [R, heads, 1, h].
        q = attn.queries(x, cos, sin).transpose(0, 2)
        k, v = (t.transpose(0, 2) for t in attn.keys_values(x, cos, sin))
        self.keys = torch.cat([self.keys, k], dim=2)
        self.values = torch.cat([self.values, v], dim=2)
        attended = attend(q, self.keys, self.values, None, "sdpa")
        self.hidden = module.midlayer.finish(self.hidden, attn.output(attended.transpose(0, 2)))
        self.position += 1
        return self.hidden
