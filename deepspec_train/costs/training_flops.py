"""Parameters and FLOPs of a training step: the target's (counted on the meta device, exact for every family) and
the drafter's (its kind's cost model) for one nominal sequence (``costs.stream_payload``).

FLOP counts are the usual dense-matmul estimates: ``2`` FLOPs per multiply-add, backward twice forward, attention
``4 * heads * head_dim`` per (query, visible key) pair forward. A mixture-of-experts target multiplies only its routed
experts (``num_experts_per_tok`` of ``num_experts``) and the router per token.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.costs.stream_payload import nominal_anchors, supervised_slots
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import DrafterGeometry


@functools.lru_cache(maxsize=32)
def _meta_param_counts(config_json: str) -> tuple[int, int, int]:
    """(decoder + final norm, routed-expert, attention) parameter counts of the causal LM a config describes,
    counted on the meta device (nothing allocated): exact for every family (MLA projections, shared experts,
    biases and attention sinks included), with no per-architecture formula."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    heads = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    decoder = [(name, p.numel()) for name, p in model.named_parameters() if id(p) not in heads]
    return (sum(n for _, n in decoder), sum(n for name, n in decoder if ".mlp.experts." in name),
            sum(n for name, n in decoder if ".self_attn." in name))


def _counts(hf_config: Any) -> tuple[int, int, int]:
    return _meta_param_counts(json.dumps(hf_config.to_dict(), sort_keys=True, default=str))


def _decoder_params(hf_config: Any, active: bool) -> int:
    decoder, experts, _ = _counts(hf_config)
    if not active or not experts:
        return decoder
    routed = (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
              or getattr(hf_config, "n_routed_experts"))
    # A token is multiplied with num_experts_per_tok of the routed experts (shared experts sit outside .experts.).
    return decoder - experts + experts * hf_config.num_experts_per_tok // routed


def target_decoder_params(hf_config: Any) -> int:
    """Parameters of the decoder layers and final norm (every expert of a MoE target): what a target holds
    besides its embedding and LM head (target workers stop at the final norm; logits are computed by drafter
    workers, and only there)."""
    return _decoder_params(hf_config, active=False)


def target_active_decoder_params(hf_config: Any) -> int:
    """Decoder parameters one token is multiplied with: a MoE layer counts its router and routed experts only."""
    return _decoder_params(hf_config, active=True)


def target_total_params(hf_config: Any) -> int:
    """All target parameters: decoder, embedding, and an untied LM head."""
    embed = hf_config.vocab_size * hf_config.hidden_size
    head = 0 if hf_config.tie_word_embeddings else embed
    return target_decoder_params(hf_config) + embed + head


def target_attention_params(hf_config: Any) -> int:
    """Parameters of the attention blocks (projections, q/k norms, sinks) of all decoder layers."""
    return _counts(hf_config)[2]


def target_flops_per_sequence(hf_config: Any, seq_len: int) -> float:
    """Forward FLOPs of the target over one causal sequence (matmuls + attention scores and values)."""
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    linear = 2 * target_active_decoder_params(hf_config) * seq_len
    # Query i sees i+1 keys: sum over the sequence = L(L+1)/2 pairs per layer.
    pairs = seq_len * (seq_len + 1) / 2
    attention = 4 * hf_config.num_attention_heads * hd * pairs * hf_config.num_hidden_layers
    return linear + attention


def target_attention_flops_per_sequence(hf_config: Any, seq_len: int) -> float:
    """The part of ``target_flops_per_sequence`` spent in attention (projections, scores and values)."""
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    pairs = seq_len * (seq_len + 1) / 2
    scores = 4 * hf_config.num_attention_heads * hd * pairs * hf_config.num_hidden_layers
    return 2 * target_attention_params(hf_config) * seq_len + scores


def drafter_flops_per_sequence(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int, anchors: int) -> float:
    """Forward + backward FLOPs of one drafter step's work for one nominal sequence (the kind's cost model in
    ``kinds``: layer passes, context projections, attention pairs and the heads at supervised slots)."""
    anchor_list = nominal_anchors(seq_len, anchors)
    block = cfg.drafter.block_size
    supervised = sum(supervised_slots(a, seq_len, block, cfg.drafter.labels) for a in anchor_list)
    return kind_spec(cfg.drafter.kind).flops_per_sequence(cfg, geometry, anchor_list, supervised)
