"""The parallel drafter kinds: DSpark (Markov and confidence heads on) and DFlash (both off), one module class.

Both draft a whole block in one backbone pass (``ParallelDrafter``); one draft costs ``num_layers`` sequential
layer passes (DSpark's Markov loop adds only a rank-``r`` lookup per slot). They share the DSpark label
convention; a DFlash trained with z-lab labels (slot ``j >= 1`` predicts ``x_{a+j}``) is the only drafter that
exports in z-lab's own layout. Their loss weights slot ``k`` (0-based) by ``exp(-k / gamma_decay)``.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Optional

from deepspec_train.config.schema import DSPARK_LABELS, ZLAB_LABELS, DrafterConfig, RecipeConfig
from deepspec_train.kinds.dspark_layout import DSPARK_LAYOUT
from deepspec_train.kinds.spec import (
    CONFIDENCE_SETTINGS, MARKOV_SETTINGS, DrafterKind, LossInputs, layer_stack_flops, unused_settings,
)
from deepspec_train.kinds.zlab_dflash_layout import ZLAB_DFLASH_LAYOUT
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.serving_kernels import parallel_round

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.models.block_drafting import BlockDrafter
    from deepspec_train.models.parallel_drafter import DrafterOutput

# Settings of DrafterConfig that only EAGLE-3 reads: a parallel drafter must leave them at their defaults.
_EAGLE3_ONLY = ("ttt_steps", "ttt_decay", "draft_vocab_size")


def _dspark_problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    problems = unused_settings(d, _EAGLE3_ONLY + (() if d.confidence_head else CONFIDENCE_SETTINGS))
    if d.markov_rank <= 0:
        problems.append(f"drafter.kind=dspark needs drafter.markov_rank > 0, got {d.markov_rank} (use kind=dflash for rank 0)")
    if d.labels != DSPARK_LABELS:
        problems.append(f"drafter.labels={d.labels} is DFlash's own convention: only with drafter.kind=dflash")
    return problems


def _dflash_problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    problems = unused_settings(d, _EAGLE3_ONLY + MARKOV_SETTINGS + CONFIDENCE_SETTINGS)
    if d.markov_rank != 0 or d.confidence_head:
        problems.append(
            f"drafter.kind=dflash needs drafter.markov_rank=0 and drafter.confidence_head=false, got "
            f"{d.markov_rank} and {str(d.confidence_head).lower()}"
        )
    if d.labels == ZLAB_LABELS and d.block_size < 2:
        problems.append(f"drafter.labels=zlab drafts block_size - 1 tokens: drafter.block_size must be >= 2, got {d.block_size}")
    return problems


def _build(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
           token_counts: Optional[torch.Tensor]) -> nn.Module:
    from deepspec_train.models.parallel_drafter import ParallelDrafter

    return ParallelDrafter(geometry, drafter_cfg, layer_ids)


def _build_from_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
                      state: Mapping[str, torch.Tensor]) -> nn.Module:
    return _build(drafter_cfg, geometry, layer_ids, None)


def _complete_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry,
                    state: MutableMapping[str, torch.Tensor]) -> None:
    """Every tensor of a parallel drafter is stored or comes from the target."""


def _frozen_heads(embed: torch.Tensor, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"embed_tokens.weight": embed, "lm_head.weight": lm_head}


def _slot_weights(module: nn.Module, cfg: RecipeConfig) -> torch.Tensor:
    import torch

    from deepspec_train.losses.position_weights import decay_weights

    return decay_weights(torch.arange(cfg.drafter.block_size), cfg.loss.gamma_decay)


def _loss_inputs(module: nn.Module, output: DrafterOutput, cfg: RecipeConfig) -> LossInputs:
    markov_w2 = module.markov_head.markov_w2.weight if output.markov_rows is not None else None
    weights = _slot_weights(module, cfg).to(output.slot_index.device)[output.slot_index]
    return LossInputs(weights, None, markov_w2)


def _block_drafter(module: nn.Module, labels: str) -> BlockDrafter:
    from deepspec_train.models.block_drafting import ParallelBlockDrafter
    from deepspec_train.models.parallel_drafter import ParallelDrafter

    if not isinstance(module, ParallelDrafter):
        raise TypeError(f"a parallel drafter kind needs a ParallelDrafter, got {type(module).__name__}")
    return ParallelBlockDrafter(module, labels)


def _sequential_passes(cfg: DrafterConfig) -> int:
    return cfg.num_layers


def _flops(cfg: RecipeConfig, geometry: DrafterGeometry, anchors: list[int], supervised: int) -> float:
    """Forward + backward FLOPs of one nominal sequence: every block slot goes through the backbone layers, every
    context row through ``fc`` and each layer's k/v projections, each slot attends to the context before its
    anchor and to its block; at each supervised slot the frozen LM head (forward + input gradient), the target
    LM head (forward) and the Markov factor ``W2`` (trainable)."""
    d, block, vocab = geometry.hidden_size, cfg.drafter.block_size, geometry.vocab_size
    visible = sum((a + block) * block for a in anchors)
    heads = supervised * (3 * 2 * d * vocab + 3 * 2 * cfg.drafter.markov_rank * vocab)
    return layer_stack_flops(cfg, geometry, anchors, d, visible, heads)


def _dspark_layouts(labels: str) -> tuple[str, ...]:
    return (DSPARK_LAYOUT.name,) if labels == DSPARK_LABELS else ()


def _dflash_layouts(labels: str) -> tuple[str, ...]:
    # A DSpark-label DFlash is DeepSpec's DFlash: the DSpark layout with Markov rank 0; z-lab labels only z-lab's.
    return (DSPARK_LAYOUT.name,) if labels == DSPARK_LABELS else (ZLAB_DFLASH_LAYOUT.name,)


def _holds_dspark(drafter: DrafterConfig) -> bool:
    return drafter.markov_rank > 0


def _holds_dflash(drafter: DrafterConfig) -> bool:
    return drafter.markov_rank == 0


_SHARED = dict(
    needs_token_counts=False,
    uses_mask_token=True,
    build=_build,
    build_from_state=_build_from_state,
    complete_state=_complete_state,
    frozen_head_state=_frozen_heads,
    slot_weights=_slot_weights,
    loss_inputs=_loss_inputs,
    block_drafter=_block_drafter,
    sequential_passes=_sequential_passes,
    flops_per_sequence=_flops,
    serving_round=parallel_round,
)

DSPARK = DrafterKind(
    name="dspark",
    summary="parallel backbone + low-rank Markov head + confidence head",
    recipe_problems=_dspark_problems,
    layouts=_dspark_layouts,
    holds_export=_holds_dspark,
    **_SHARED,
)

DFLASH = DrafterKind(
    name="dflash",
    summary="parallel backbone only (Markov and confidence heads off)",
    recipe_problems=_dflash_problems,
    layouts=_dflash_layouts,
    holds_export=_holds_dflash,
    **_SHARED,
)
