"""Modeling code of a z-lab-layout DFlash export, written by deepspec_train (copied into the export as dflash.py).

The export's config.json maps ``AutoModel`` to ``dflash.DFlashDraftModel``, so

    draft = AutoModel.from_pretrained(EXPORT_DIR, trust_remote_code=True)
    target = AutoModelForCausalLM.from_pretrained(TARGET_DIR)
    output_ids = draft.spec_generate(input_ids=prompt_ids, max_new_tokens=256, target=target,
                                     stop_token_ids=[tokenizer.eos_token_id])

builds this drafter and decodes greedily with it (the output is exactly the target's greedy continuation). This
file imports only torch and transformers: the export directory works without deepspec_train installed.

What the drafter computes (the same as deepspec_train's ParallelDrafter trained with z-lab labels):
context features ``H = hidden_norm(fc([h_l1; ...; h_lK]))`` from the target's tapped decoder-layer outputs at
positions before the anchor ``p``; a block ``[x_p, MASK, ..., MASK]`` at positions ``p..p+B-1`` embedded with the
target's embedding; decoder layers whose queries are the block and whose keys/values are ``[H; block]``
(bidirectional inside the block; q/k RMS-normed per head, RoPE from the config's ``rope_parameters`` as the
target applies it); a final norm; the target's LM head. Slot ``j >= 1`` drafts the token at position ``p + j``.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, heads, T, h]`` by ``cos`` / ``sin`` ``[B, T, h]`` in fp32."""
    cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    return (x.float() * cos + _rotate_half(x.float()) * sin).to(x.dtype)


class DFlashAttention(nn.Module):
    """Block queries over keys/values projected from ``[context; block]``."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        d = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [B, Q, d]`` (normed block), ``context [B, C, d]``, ``cos`` / ``sin`` ``[B, C+Q, h]``."""
        keys_in = torch.cat([context, x], dim=1)
        q = self.q_norm(self._split(self.q_proj(x), self.num_heads))
        k = self.k_norm(self._split(self.k_proj(keys_in), self.num_kv_heads))
        v = self._split(self.v_proj(keys_in), self.num_kv_heads)
        queries = x.shape[1]
        q = _rope(q, cos[:, -queries:], sin[:, -queries:])
        k = _rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], queries, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # The context is normed once (hidden_norm); only the block stream gets the layer's input norm.
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(PreTrainedModel):
    """The z-lab-layout DFlash drafter; parameter names are the export's tensor names."""

    config_class = Qwen3Config
    base_model_prefix = ""
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        dflash = config.dflash_config
        self.block_size = int(config.block_size)
        self.mask_token_id = int(dflash["mask_token_id"])
        self.target_layer_ids = [int(i) for i in dflash["target_layer_ids"]]
        d = config.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    def forward(
        self, target_hidden: torch.Tensor, noise_embedding: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Final-normed block states ``[B, Q, d]``.

        ``target_hidden [B, C, K*d]``: the tapped target layers' outputs at the C context positions (concatenated
        in ``target_layer_ids`` order); ``noise_embedding [B, Q, d]``: the target's embedding of
        ``[x_p, MASK, ...]``; ``position_ids [B, C+Q]``: the context positions, then ``p..p+Q-1``.
        """
        dtype = self.fc.weight.dtype
        context = self.hidden_norm(self.fc(target_hidden.to(dtype)))
        x = noise_embedding.to(dtype)
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, context, cos, sin)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits from block states, with the target's LM head (the export carries none)."""
        return lm_head(hidden)

    @torch.no_grad()
    def spec_generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        target: nn.Module,
        temperature: float = 0.0,
        stop_token_ids: list[int] | None = None,
    ) -> torch.Tensor:
        """Greedy speculative decoding of one prompt ``input_ids [1, n]``; returns ``[1, n + new]``.

        Each round drafts ``block_size - 1`` tokens, verifies them with one target forward over the block (the
        target's KV cache holds the verified prefix) and keeps the longest prefix equal to the target's own greedy
        choices plus the target's next token, so the output is the target's greedy continuation."""
        if temperature != 0.0:
            raise ValueError(f"spec_generate decodes greedily only (temperature=0.0), got temperature={temperature}")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, n] (one prompt), got {tuple(input_ids.shape)}")
        taps = _Taps(target, self.target_layer_ids)
        embed = target.get_input_embeddings()
        head = target.get_output_embeddings()
        cache = DynamicCache(config=target.config)
        # transformers 5.2x names the cache argument `cache`; earlier releases `past_key_values`.
        cache_arg = {"cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values": cache}
        stops = set(stop_token_ids or [])
        try:
            logits = target(input_ids=input_ids, use_cache=True, **cache_arg).logits
            context = taps.take()
            sequence = torch.cat([input_ids, logits[:, -1:].argmax(-1)], dim=1)
            while sequence.shape[1] - input_ids.shape[1] < max_new_tokens and int(sequence[0, -1]) not in stops:
                anchor = sequence.shape[1] - 1
                block = torch.full((1, self.block_size), self.mask_token_id, dtype=torch.long, device=sequence.device)
                block[0, 0] = sequence[0, -1]
                positions = torch.arange(anchor + self.block_size, device=sequence.device).unsqueeze(0)
                hidden = self(context, embed(block), positions)
                block[0, 1:] = self.compute_logits(hidden[:, 1:], head).argmax(-1)[0]
                verified = target(input_ids=block, use_cache=True, **cache_arg).logits.argmax(-1)[0]
                accepted = 0
                while accepted < self.block_size - 1 and block[0, 1 + accepted] == verified[accepted]:
                    accepted += 1
                new = torch.cat([block[0, 1:1 + accepted], verified[accepted:accepted + 1]]).unsqueeze(0)
                context = torch.cat([context, taps.take()[:, : accepted + 1]], dim=1)
                # Keep the verified prefix, positions 0..anchor+accepted (crop takes how many tokens to drop).
                drop = cache.get_seq_length() - (anchor + accepted + 1)
                if drop > 0:
                    cache.crop(-drop)
                sequence = torch.cat([sequence, new], dim=1)
        finally:
            taps.remove()
        return _trim(sequence, input_ids.shape[1], max_new_tokens, stops)


def _trim(sequence: torch.Tensor, prompt_len: int, max_new_tokens: int, stops: set[int]) -> torch.Tensor:
    """Cut the output after ``max_new_tokens`` new tokens or after the first stop token, whichever comes first."""
    new = sequence[0, prompt_len:prompt_len + max_new_tokens].tolist()
    for i, token in enumerate(new):
        if token in stops:
            new = new[: i + 1]
            break
    return sequence[:, : prompt_len + len(new)]


class _Taps:
    """Forward hooks on the target's tapped decoder layers: each forward's outputs, concatenated per position."""

    def __init__(self, target: nn.Module, layer_ids: list[int]) -> None:
        layers = target.model.layers
        self.layer_ids = list(layer_ids)
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles = [layers[i].register_forward_hook(self._keep(i)) for i in self.layer_ids]

    def _keep(self, layer_id: int):
        def hook(_module, _inputs, output):
            self.outputs[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def take(self) -> torch.Tensor:
        return torch.cat([self.outputs[i] for i in self.layer_ids], dim=-1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
