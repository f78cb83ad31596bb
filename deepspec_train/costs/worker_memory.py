"""Memory per GPU of a training run: a drafter worker's persistent state, a target rank's working set beyond its
weights, and every term of both ranks for one long nominal sequence (``costs.long_context_memory`` says what each
term counts).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.costs import long_context_memory as lcm
from deepspec_train.costs.reference_targets import meta_drafter
from deepspec_train.costs.stream_payload import (
    feature_bytes_per_value, nominal_anchor_count, payload_bytes, stream_bytes_in_flight,
)
from deepspec_train.costs.training_flops import target_total_params
from deepspec_train.models.geometry import DrafterGeometry

# Adam in fp32: parameter, gradient, first and second moment.
TRAINABLE_BYTES_PER_PARAM = 16
FROZEN_BYTES_PER_PARAM = 4
TARGET_BYTES_PER_PARAM = 2  # bf16 checkpoints
# Rough working sets beyond persistent state (estimates, not measured): a drafter's activations for a
# 16,384-token micro-batch under bf16 autocast plus the chunked loss; a target rank's no-grad forward.
DRAFTER_ACTIVATION_BYTES = 12e9
TARGET_FORWARD_BYTES = 2e9


def drafter_worker_bytes(drafter: torch.nn.Module, target_head_params: int) -> int:
    """Persistent memory of a drafter worker: Adam state of trainable parameters, fp32 frozen copies
    (embedding, LM head), and the target LM head in bf16 (target logits at supervised slots)."""
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    return TRAINABLE_BYTES_PER_PARAM * trainable + FROZEN_BYTES_PER_PARAM * frozen + 2 * target_head_params


def target_working_bytes(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int) -> float:
    """A target rank's memory beyond its weights: the forward, the tapped features of one chunk of
    ``train.micro_batch_sequences`` sequences, and the stream's micro-batches in flight."""
    features = cfg.train.micro_batch_sequences * seq_len * (len(cfg.target.layer_ids) + 1) * geometry.hidden_size
    return TARGET_FORWARD_BYTES + feature_bytes_per_value(cfg) * features + stream_bytes_in_flight(cfg, geometry, seq_len)


# Whose anchor rule (128 per 1K valid positions over a floor of 512) the long-context rows give every target.
LONG_CONTEXT_ANCHOR_RECIPE = "qwen3-8b-32k"


def long_context_recipe(recipe: str, seq_len: int) -> RecipeConfig:
    """``recipe`` at ``seq_len`` tokens with the long-context recipes' anchor rule (``LONG_CONTEXT_ANCHOR_RECIPE``):
    one sequence per target forward (``train.micro_batch_sequences=1``) and a token budget that packs a whole
    nominal sequence's blocks in one micro-batch (``L + anchors * B``); a budget of only ``L + B`` splits it into
    several micro-batches that each carry most of the context again."""
    import dataclasses

    from deepspec_train.kinds.recipe_validation import load_recipe

    cfg = load_recipe(recipe, check_target=False)
    rate = load_recipe(LONG_CONTEXT_ANCHOR_RECIPE, check_target=False).anchors.per_1k_tokens
    cfg = dataclasses.replace(cfg, anchors=dataclasses.replace(cfg.anchors, per_1k_tokens=rate))
    budget = max(cfg.anchors.token_budget, seq_len + nominal_anchor_count(cfg, seq_len) * cfg.drafter.block_size)
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, max_length=seq_len),
        anchors=dataclasses.replace(cfg.anchors, token_budget=budget),
        train=dataclasses.replace(cfg.train, micro_batch_sequences=1))


def long_context_memory(
    cfg: RecipeConfig, hf_config: Any, seq_len: int, drafter: Optional[torch.nn.Module] = None
) -> tuple[lcm.TargetRankMemory, lcm.DrafterRankMemory]:
    """The target rank's and the drafter rank's memory terms for one nominal sequence of ``seq_len`` tokens
    (``drafter``: the recipe's drafter, built on the meta device when not given)."""
    from deepspec_train.models.activation_checkpointing import CONTEXT_CHUNK_ROWS
    from deepspec_train.models.geometry import geometry_from_target_config

    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    value_bytes, taps, d = feature_bytes_per_value(cfg), len(cfg.target.layer_ids), geometry.hidden_size
    payload = payload_bytes(cfg, geometry, 1, seq_len, nominal_anchor_count(cfg, seq_len))
    if payload.micro_batches != 1:
        raise ValueError(f"a nominal {seq_len}-token sequence takes {payload.micro_batches} micro-batches")
    ctx_rows, slots = payload.context_rows, payload.blocks * cfg.drafter.block_size
    target = lcm.TargetRankMemory(
        seq_len, value_bytes * target_total_params(hf_config),
        lcm.target_layer_transient_bytes(hf_config, seq_len, value_bytes),
        lcm.eager_attention_bytes(hf_config, seq_len, value_bytes),
        taps * lcm.kept_states_bytes(0, d, seq_len, value_bytes), lcm.kept_states_bytes(0, d, seq_len, value_bytes),
        lcm.packed_build_bytes(taps, d, ctx_rows, payload.supervised, value_bytes),
        stream_bytes_in_flight(cfg, geometry, seq_len))
    drafter = drafter if drafter is not None else meta_drafter(cfg, hf_config)
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    layers = cfg.drafter.num_layers
    saved = [lcm.drafter_shared_saved_bytes(geometry, taps, ctx_rows, slots, ckpt)
             + lcm.drafter_saved_bytes(geometry, layers, ctx_rows, slots, ckpt) for ckpt in (False, True)]
    state = drafter_worker_bytes(drafter, hf_config.vocab_size * d) + lcm.BF16 * trainable
    # Bytes per context row while the context projection runs (fc reads the bf16 features in place under
    # autocast): fc's bf16 output, then hidden_norm's fp32 upcast, its square, the normalised rows, their cast back
    # to bf16 and the fp32 product with the norm's weight.
    projection = d * (2 * lcm.BF16 + 4 * lcm.FP32)
    drafter_memory = lcm.DrafterRankMemory(
        seq_len, state, payload.largest_micro_batch_bytes, projection * ctx_rows,
        projection * min(ctx_rows, CONTEXT_CHUNK_ROWS),
        saved[0], saved[1], lcm.dense_mask_bytes(ctx_rows, slots, layers, False),
        lcm.dense_mask_bytes(ctx_rows, slots, layers, True), lcm.block_mask_bytes(ctx_rows, slots),
        lcm.loss_chunk_bytes(min(cfg.loss.chunk_size, payload.supervised), geometry.vocab_size, d,
                             cfg.drafter.markov_rank))
    return target, drafter_memory
