"""The parallel drafter: DSpark (with Markov and confidence heads) and DFlash (without), one class.

A backbone of Qwen3-style decoder layers runs once over every anchor block of a ``PackedBatch``. Target
context enters as ``H_ctx = hidden_norm(fc([H_l1; ...; H_lK]))``; every layer projects ``H_ctx`` with its own
``k_proj``/``v_proj`` (then ``k_norm`` and RoPE at the context positions) and puts those keys/values before
the block's own. Which context rows and slots a query sees comes from the batch metadata
(``deepspec_train.packing.attention_mask``): context of its own sequence before its anchor, and its whole
block (bidirectional). Token embedding and LM head are frozen copies of the target's.

DSpark adds a low-rank Markov head (slot logits += ``W2 u_k``, ``u_k`` an ``r``-dim latent of the previous
token ``x_prev``) and a confidence head (``Linear(d + r, 1)`` on ``[h_k ; W1[x_prev]]``). The Markov head is one
of DeepSpec's / SGLang's three ``markov_head_type`` forms (``MarkovHead``): ``vanilla`` (``u_k = W1[x_prev]``),
``gated`` (a sigmoid gate on ``W1[x_prev]`` read from ``[h_k ; W1[x_prev]]``) or ``rnn`` (a GRU-like state carried
left to right through the block's slots, so slot ``k`` sees every earlier token of its block, not only the last).
DFlash is ``markov_rank = 0`` and ``confidence_head = False``: a recipe switch.

A DSpark may draft over a reduced vocabulary (``drafter.draft_vocab_size``: the ``N`` target tokens most often
supervised in the training data, ``models.draft_vocab``), as vLLM serves it: the LM head (frozen rows of the
target's) and the Markov factor ``W2`` then have ``N`` rows, the draft logits live on draft ids, and ``d2t`` /
``t2d`` buffers map them to target ids. The Markov input ``W1`` and the token embedding keep the full vocabulary
(they read target ids: the anchor and the tokens sampled before). ``forward`` returns slot states
only at supervised slots; full-vocabulary logits are left to the chunked loss, and decoding computes the logits of
the slot it samples (``models.block_drafting``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.activation_checkpointing import checkpointed, row_chunked
from deepspec_train.models.draft_vocab import DraftVocab
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.markov_forms import DEFAULT_FORM, markov_form
from deepspec_train.models.qwen3_layers import AttentionBackend, RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary, attend
from deepspec_train.packing.attention_mask import dense_mask, flex_block_mask
from deepspec_train.packing.batch import PackedBatch

INIT_STD = 0.02
# The residual branches of a decoder layer, in order (``ParallelDecoderLayer.branch``).
ATTENTION_BRANCH, MLP_BRANCH = 0, 1


@dataclass
class DrafterOutput:
    """Drafter states at the supervised slots, in row-major order of ``batch.supervised_mask``."""

    hidden: torch.Tensor
    # The Markov latents ``u`` (``W2 u`` is the bias): ``W1[x_prev]`` for the vanilla head.
    markov_rows: Optional[torch.Tensor]
    conf_logits: Optional[torch.Tensor]
    slot_index: torch.Tensor


@dataclass
class _Rotary:
    """cos/sin for the block queries and for the keys ``[context; block]``, ``[1, T, head_dim]`` each."""

    query_cos: torch.Tensor
    query_sin: torch.Tensor
    key_cos: torch.Tensor
    key_sin: torch.Tensor


class ContextAttention(nn.Module):
    """GQA self-attention of block slots whose keys/values are ``[projected context; block]``."""

    def __init__(self, geometry: DrafterGeometry) -> None:
        super().__init__()
        d, h = geometry.hidden_size, geometry.head_dim
        self.num_heads = geometry.num_attention_heads
        self.num_kv_heads = geometry.num_key_value_heads
        self.head_dim = h
        self.q_proj = nn.Linear(d, self.num_heads * h, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * h, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * h, bias=False)
        self.o_proj = nn.Linear(self.num_heads * h, d, bias=False)
        self.q_norm = RMSNorm(h, geometry.rms_norm_eps)
        self.k_norm = RMSNorm(h, geometry.rms_norm_eps)

    def _heads(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        # [1, T, heads*h] -> [1, heads, T, h]
        return x.view(x.shape[0], x.shape[1], num_heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k_norm, then RoPE at the rows' positions) and values of ``x [b, T, d]``: ``[b, G, T, h]`` each."""
        k = apply_rotary(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        ctx: Optional[torch.Tensor],
        rotary: _Rotary,
        mask: Union[torch.Tensor, BlockMask, None],
        backend: AttentionBackend,
        compiled: bool,
        ctx_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """``x [b, Q, d]`` (normed block states), ``ctx [1, Nc, d]`` (H_ctx) -> ``[b, Q, d]``. At decode time the
        context's keys / values may come projected already (``ctx_kv``, ``[1, G, Nc, h]`` each, shared by the
        ``b`` blocks); the block's own then sit at the query positions."""
        q = apply_rotary(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), rotary.query_cos, rotary.query_sin)
        if ctx_kv is None:
            k, v = self.keys_values(torch.cat([ctx, x], dim=1), rotary.key_cos, rotary.key_sin)
        else:
            block_k, block_v = self.keys_values(x, rotary.query_cos, rotary.query_sin)
            rows = x.shape[0]
            k = torch.cat([ctx_kv[0].expand(rows, -1, -1, -1), block_k], dim=2)
            v = torch.cat([ctx_kv[1].expand(rows, -1, -1, -1), block_v], dim=2)
        out = attend(q, k, v, mask, backend, compiled)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class ParallelDecoderLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer over block slots, with context keys/values injected."""

    def __init__(self, geometry: DrafterGeometry) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(geometry.hidden_size, geometry.rms_norm_eps)
        self.self_attn = ContextAttention(geometry)
        self.post_attention_layernorm = RMSNorm(geometry.hidden_size, geometry.rms_norm_eps)
        self.mlp = SwiGLU(geometry.hidden_size, geometry.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        ctx: Optional[torch.Tensor],
        rotary: _Rotary,
        mask: Union[torch.Tensor, BlockMask, None],
        backend: AttentionBackend,
        compiled: bool,
        ctx_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        # H_ctx is already normed by hidden_norm; only the block stream gets the layer's input norm.
        x = x + self.branch(ATTENTION_BRANCH, self.input_layernorm(x),
                            lambda h: self.self_attn(h, ctx, rotary, mask, backend, compiled, ctx_kv))
        return x + self.branch(MLP_BRANCH, self.post_attention_layernorm(x), self.mlp)

    def branch(self, index: int, h: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Residual branch ``index`` (``ATTENTION_BRANCH`` or ``MLP_BRANCH``) on its normed input ``h``: the
        sublayer alone here; a subclass may wrap it (DFlash2's convolutions, ``models.dflash2_drafter``)."""
        return sublayer(h)


class MarkovHead(nn.Module):
    """Low-rank sequential bias ``W2 u_k`` (``markov_w2.weight`` is ``[V, r]``, ``[N, r]`` over a reduced draft
    vocabulary of ``N`` tokens), in DeepSpec's three forms.

    With ``e_k = W1[x_prev]`` (``markov_w1 [V, r]``) and ``h_k`` the slot's final-normed state (the LM head's
    input), the latent ``u_k`` is:

    - ``vanilla``: ``e_k``;
    - ``gated``: ``sigmoid(gate_proj([h_k ; e_k])) * e_k`` (``gate_proj [r, d + r]`` with bias);
    - ``rnn``: ``[g; c; o] = joint_proj([s_{k-1} ; e_k ; h_k])`` (``joint_proj [3r, 2r + d]`` with bias, chunked
      in that order), ``s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c)`` from ``s_0 = 0`` at the block's
      first slot, ``u_k = tanh(o)``.

    Names, shapes and formulas are SGLang's ``models/dspark.py`` (``VanillaMarkov`` / ``GatedMarkovHead`` /
    ``RNNHead``), which loads each type; vLLM's ``qwen3_dspark.py`` has only the vanilla head. What differs between
    the forms (the projection, the state, the step) is the form's record (``models.markov_forms``).
    """

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, head_type: str = DEFAULT_FORM.name,
        draft_vocab_size: int = 0,
    ) -> None:
        """``vocab_size``: the target vocabulary ``W1`` reads; ``draft_vocab_size``: the rows of ``W2`` (0: the
        target vocabulary too)."""
        super().__init__()
        self.form = markov_form(head_type)
        self.head_type = head_type
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)
        projection = self.form.projection
        if projection is not None:
            out_features, in_features = projection.weight_shape(rank, hidden_size)
            self.add_module(projection.name, nn.Linear(in_features, out_features))

    def initial_state(self, like: torch.Tensor) -> Optional[torch.Tensor]:
        """The recurrent state before a block's first slot (``[*like.shape[:-1], r]`` zeros; None without one)."""
        return self.form.initial_state(like, self.rank)

    def hidden_projection(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """The part of the gate / joint projection that reads the slot state, bias included (``[..., r]`` gated,
        ``[..., 3r]`` rnn; None for vanilla). It does not depend on the sampled tokens, so a block computes it for
        every slot in one product before the sequential loop."""
        projection = self.form.projection
        if projection is None:
            return None
        layer = getattr(self, projection.name)
        return F.linear(hidden, layer.weight[:, projection.hidden_columns(self.rank, hidden.shape[-1])], layer.bias)

    def step(
        self, prev_tokens: torch.Tensor, hidden_projection: Optional[torch.Tensor], state: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One slot: ``prev_tokens [...]``, the slot's ``hidden_projection`` and ``state [..., r]`` -> (latent
        ``u [..., r]``, next state)."""
        return self.form.step(self, self.markov_w1(prev_tokens), hidden_projection, state)

    def block_latents(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced latents of whole blocks: ``prev_tokens [Nb, B]``, ``hidden [Nb, B, d]`` -> ``[Nb, B, r]``."""
        projection = self.hidden_projection(hidden.to(self.markov_w1.weight.dtype))
        if not self.form.recurrent:
            return self.step(prev_tokens, projection, None)[0]
        state = self.initial_state(hidden[:, 0])
        latents = []
        for k in range(prev_tokens.shape[1]):
            latent, state = self.step(prev_tokens[:, k], projection[:, k], state)
            latents.append(latent)
        return torch.stack(latents, dim=1)


class ConfidenceHead(nn.Module):
    """Logit of the slot's conditional survival, from ``[h_k ; W1[x_prev]]``."""

    def __init__(self, hidden_size: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1, bias=True)


class ParallelDrafter(nn.Module):
    """DSpark / DFlash drafter; see the module docstring."""

    def __init__(
        self,
        geometry: DrafterGeometry,
        drafter_cfg: DrafterConfig,
        target_layer_ids: list[int],
        draft_vocab: Optional[DraftVocab] = None,
    ) -> None:
        """``draft_vocab``: a reduced draft vocabulary (None, or a full one: draft over the target vocabulary)."""
        super().__init__()
        if not 0 <= drafter_cfg.mask_token_id < geometry.vocab_size:
            raise ValueError(f"mask_token_id {drafter_cfg.mask_token_id} outside vocab {geometry.vocab_size}")
        d, vocab, rank = geometry.hidden_size, geometry.vocab_size, drafter_cfg.markov_rank
        # A draft vocabulary as large as the target's is the identity (``build_draft_vocab``): no maps needed.
        reduced = draft_vocab is not None and draft_vocab.size < draft_vocab.target_vocab_size
        if reduced and draft_vocab.target_vocab_size != vocab:
            raise ValueError(f"draft vocab maps a {draft_vocab.target_vocab_size}-token vocabulary, target has {vocab}")
        draft_size = draft_vocab.size if reduced else 0
        self.geometry = geometry
        self.block_size = drafter_cfg.block_size
        self.mask_token_id = drafter_cfg.mask_token_id
        self.target_layer_ids = list(target_layer_ids)
        self.markov_rank = rank
        self.markov_init = drafter_cfg.markov_init
        # Whether the confidence BCE trains the features it reads (DeepSpec: yes) or only the head's own weights.
        self.confidence_joint = drafter_cfg.confidence_gradient == "joint"
        # Recompute each backbone layer and the context projection in backward (``models.activation_checkpointing``).
        self.activation_checkpointing = drafter_cfg.activation_checkpointing

        self.embed_tokens = nn.Embedding(vocab, d)
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, geometry.rms_norm_eps)
        self.layers = nn.ModuleList(ParallelDecoderLayer(geometry) for _ in range(drafter_cfg.num_layers))
        self.norm = RMSNorm(d, geometry.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_size or vocab, bias=False)
        self.rotary = RotaryEmbedding.for_geometry(geometry)
        self.markov_head = (
            MarkovHead(vocab, rank, d, drafter_cfg.markov_head_type, draft_size) if rank > 0 else None
        )
        if reduced:
            # Only a reduced vocabulary has maps: a full-vocabulary drafter's state is what it always was.
            self.register_buffer("d2t", draft_vocab.d2t.clone())
            self.register_buffer("t2d", draft_vocab.t2d.clone())
        self.confidence_head = ConfidenceHead(d, rank) if drafter_cfg.confidence_head else None
        self.reset_parameters()
        self.embed_tokens.requires_grad_(False)
        self.lm_head.requires_grad_(False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Qwen3-style init (normal, std 0.02; biases at 0; norms at 1). ``markov_init`` picks ``markov_w2``'s:
        ``zero`` (the Markov bias starts at nothing: DFlash's behaviour at step 0) or ``normal`` (DeepSpec's)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
        if self.markov_head is not None and self.markov_init == "zero":
            nn.init.zeros_(self.markov_head.markov_w2.weight)

    @property
    def draft_vocab(self) -> Optional[DraftVocab]:
        """The reduced draft vocabulary's maps; None when the drafter drafts over the whole target vocabulary."""
        return DraftVocab(d2t=self.d2t, t2d=self.t2d) if hasattr(self, "d2t") else None

    @torch.no_grad()
    def load_target_heads(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's token embedding and LM head (both ``[V, d]``; pass the same tensor when tied); over a
        reduced draft vocabulary, the LM head's rows of the draft tokens."""
        self.embed_tokens.weight.copy_(embed_weight)
        vocab = self.draft_vocab
        self.lm_head.weight.copy_(lm_head_weight if vocab is None else lm_head_weight[vocab.target_ids()])

    def _rotary(self, batch: PackedBatch) -> _Rotary:
        slot_pos = batch.slot_positions().reshape(1, -1)
        key_pos = torch.cat([batch.ctx_pos.reshape(1, -1), slot_pos], dim=1)
        # One call for keys and queries (the queries are the keys' last rows): dynamic RoPE scaling then uses
        # the same frequencies for both, as the target's single forward does.
        key_cos, key_sin = self.rotary.cos_sin(key_pos)
        queries = slot_pos.shape[1]
        return _Rotary(key_cos[:, -queries:], key_sin[:, -queries:], key_cos, key_sin)

    def compile_blocks(self) -> None:
        """torch.compile each backbone layer in place (``models.block_compile``)."""
        for layer in self.layers:
            layer.compile()

    def backbone(
        self, batch: PackedBatch, attention: AttentionBackend = "sdpa", compiled: bool = False
    ) -> torch.Tensor:
        """Final-normed slot states ``[Nb, B, d]`` of every block in ``batch``."""
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block size {batch.block_size} != drafter block size {self.block_size}")
        mask = flex_block_mask(batch) if attention == "flex" else dense_mask(batch)
        # On a GPU flex attention runs compiled (as EAGLE-3's does): the eager path fills in the whole
        # heads x queries x keys score matrix, which at 32K context is what the BlockMask exists to avoid.
        compiled = compiled or (attention == "flex" and batch.block_seq.is_cuda)
        rotary = self._rotary(batch)
        x = self.embed_tokens(batch.block_input.reshape(1, -1))
        recompute = self.activation_checkpointing
        ctx = row_chunked(self._context_states, [batch.ctx_features], 0, recompute)[0].unsqueeze(0)
        for layer in self.layers:
            x = checkpointed(layer, x, ctx, rotary, mask, attention, compiled, enabled=recompute)
        return self.norm(x).view(batch.num_blocks, batch.block_size, -1)

    def _context_states(self, features: torch.Tensor) -> tuple[torch.Tensor]:
        """``H_ctx = hidden_norm(fc(features))`` of context rows ``[n, K*d]`` -> ``([n, d],)``, row by row."""
        # Under autocast the projection computes in the autocast dtype whatever its input's, so bf16 features are
        # read as they come: an fp32 copy (K*d*4 bytes a row, 16 GB at 128K for Qwen3-8B) would be rounded back.
        if not torch.is_autocast_enabled(features.device.type):
            features = features.to(self.fc.weight.dtype)
        return (self.hidden_norm(self.fc(features)),)

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor, seq_len: int = 0
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Decode time: every layer's context keys / values ``[1, G, n, h]`` of target features ``[n, K*d]`` at
        ``positions [n]``, rotated for the length ``seq_len`` of dynamic RoPE scaling (the block's last position
        + 1, as in ``backbone``; ignored by the other RoPE types). Per row, so rows projected in earlier rounds
        can be kept (engines cache them).

        Every layer reads the same ``H_ctx``, so all layers' ``k_proj`` / ``v_proj`` run as one product, then one
        RMS statistic, each layer's ``k_norm`` scale and one RoPE for every layer's keys (vLLM fuses the context
        projections of DFlash / DSpark drafters the same way); equal to ``keys_values`` layer by layer (tested).
        """
        ctx = self._context_states(features)[0]
        attns = [layer.self_attn for layer in self.layers]
        if not attns:
            return []
        first = attns[0]
        kv_heads, head_dim, num = first.num_kv_heads, first.head_dim, len(attns)
        weight = torch.cat([a.k_proj.weight for a in attns] + [a.v_proj.weight for a in attns])
        projected = F.linear(ctx, weight).view(ctx.shape[0], 2, num, kv_heads, head_dim)
        keys, values = projected.unbind(1)
        scales = torch.stack([a.k_norm.weight for a in attns])[:, None, :]
        keys = F.rms_norm(keys.float(), (head_dim,), eps=first.k_norm.eps).to(keys.dtype) * scales
        # [n, L, G, h] -> [L, G, n, h]: one RoPE over every layer's keys at the rows' positions.
        cos, sin = self.rotary.cos_sin(positions.reshape(1, -1), seq_len)
        keys = apply_rotary(keys.permute(1, 2, 0, 3), cos, sin)
        values = values.permute(1, 2, 0, 3)
        return [(keys[i : i + 1], values[i : i + 1]) for i in range(num)]

    def decode_states(
        self, block_input: torch.Tensor, anchor_position: int, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Decode time: final-normed slot states ``[R, B, d]`` of ``R`` blocks ``[R, B]`` anchored at one position,
        whose context (every row before the anchor) is ``ctx_kv`` (``context_kv`` of those rows). Each block sees
        all of the context and its own slots: the training mask for one sequence at one anchor."""
        positions = anchor_position + torch.arange(block_input.shape[1], device=block_input.device).reshape(1, -1)
        cos, sin = self.rotary.cos_sin(positions)
        rotary = _Rotary(cos, sin, cos, sin)
        x = self.embed_tokens(block_input)
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, None, rotary, None, "sdpa", False, kv)
        return self.norm(x)

    def markov_rows(self, prev_tokens: torch.Tensor) -> Optional[torch.Tensor]:
        """``W1[x_prev]``, ``[..., r]`` (the confidence head's Markov input); None without a Markov head."""
        return None if self.markov_head is None else self.markov_head.markov_w1(prev_tokens)

    def markov_latents(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """The latents ``u`` that ``W2`` maps to the Markov bias, for whole teacher-forced blocks
        (``prev_tokens [Nb, B]``, ``hidden [Nb, B, d]`` -> ``[Nb, B, r]``); None without a Markov head."""
        return None if self.markov_head is None else self.markov_head.block_latents(prev_tokens, hidden)

    def markov_bias(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents @ W2^T``: the Markov logit bias ``[..., V]`` (``[..., N]`` over a reduced draft vocabulary)."""
        if self.markov_head is None:
            raise RuntimeError("this drafter has no Markov head (markov_rank 0)")
        return self.markov_head.markov_w2(latents)

    def confidence_logits(self, hidden: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
        """Confidence logit ``[...]`` from slot states ``[..., d]`` and ``W1[x_prev]`` rows ``[..., r]``."""
        if self.confidence_head is None:
            raise RuntimeError("this drafter has no confidence head")
        if not self.confidence_joint:
            # Detached: the BCE trains the head's own projection only, never the drafting features it reads.
            hidden = hidden.detach()
            rows = None if rows is None else rows.detach()
        features = hidden if rows is None else torch.cat([hidden, rows.to(hidden.dtype)], dim=-1)
        return self.confidence_head.proj(features).squeeze(-1)

    def forward(
        self, batch: PackedBatch, attention: AttentionBackend = "sdpa", compiled: bool = False
    ) -> DrafterOutput:
        """States at supervised slots (no vocabulary-sized tensors: the loss applies ``lm_head`` in chunks)."""
        supervised = batch.supervised_mask
        blocks = self.backbone(batch, attention, compiled)
        hidden = blocks[supervised]
        rows = self.markov_rows(batch.block_prev[supervised])
        latents = rows
        if self.markov_head is not None and self.markov_head.form.reads_slot_states:
            # Gated and RNN latents read the slot states (RNN: of every earlier slot of the block too).
            latents = self.markov_latents(batch.block_prev, blocks)[supervised]
        conf = self.confidence_logits(hidden, rows) if self.confidence_head is not None else None
        slot_index = torch.arange(batch.block_size, device=supervised.device).expand_as(supervised)[supervised]
        return DrafterOutput(hidden=hidden, markov_rows=latents, conf_logits=conf, slot_index=slot_index)
