"""The parallel drafter kinds: DSpark (Markov and confidence heads on) and DFlash (both off), one module class.

Both draft a whole block in one backbone pass (``ParallelDrafter``); one draft costs ``num_layers`` sequential
layer passes (DSpark's Markov loop adds only a rank-``r`` lookup per slot). They share the DSpark label
convention; a DFlash trained with z-lab labels (slot ``j >= 1`` predicts ``x_{a+j}``) is the only drafter that
exports in z-lab's own layout. Their loss weights slot ``k`` (0-based) by ``exp(-k / gamma_decay)``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Optional

from deepspec_train.config.schema import DSPARK_LABELS, ZLAB_LABELS, DrafterConfig, RecipeConfig
from deepspec_train.serving_layouts.dspark_layout import DSPARK_LAYOUT
from deepspec_train.kinds.parallel_round import parallel_round
from deepspec_train.serving_layouts.speculators_dspark_layout import SPECULATORS_DSPARK_LAYOUT
from deepspec_train.kinds.spec import (
    CONFIDENCE_SETTINGS, DFLASH2_SETTINGS, MARKOV_SETTINGS, DrafterKind, LossInputs, layer_stack_flops,
    unused_settings,
)
from deepspec_train.serving_layouts.zlab_dflash_layout import ZLAB_DFLASH_LAYOUT
from deepspec_train.models.geometry import DrafterGeometry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.models.block_drafting import BlockDrafter
    from deepspec_train.models.draft_vocab import DraftVocab
    from deepspec_train.models.parallel_drafter import DrafterOutput

# Settings of DrafterConfig that only EAGLE-3 (or DFlash2) reads: DSpark / DFlash leave them at their defaults.
_EAGLE3_ONLY = ("ttt_steps", "ttt_decay") + DFLASH2_SETTINGS
# A reduced draft vocabulary: DSpark's (as vLLM serves it) and EAGLE-3's, not DFlash's.
_DRAFT_VOCAB = ("draft_vocab_size",)


def _dspark_problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    problems = unused_settings(d, _EAGLE3_ONLY + (() if d.confidence_head else CONFIDENCE_SETTINGS))
    if d.draft_vocab_size is not None and d.draft_vocab_size < 1:
        problems.append(f"drafter.draft_vocab_size = {d.draft_vocab_size} must be >= 1 (or unset: full vocabulary)")
    if d.markov_rank <= 0:
        problems.append(f"drafter.kind=dspark needs drafter.markov_rank > 0, got {d.markov_rank} (use kind=dflash for rank 0)")
    if d.labels != DSPARK_LABELS:
        problems.append(f"drafter.labels={d.labels} is DFlash's own convention: only with drafter.kind=dflash")
    return problems


def _dflash_problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    problems = unused_settings(d, _EAGLE3_ONLY + _DRAFT_VOCAB + MARKOV_SETTINGS + CONFIDENCE_SETTINGS)
    if d.markov_rank != 0 or d.confidence_head:
        problems.append(
            f"drafter.kind=dflash needs drafter.markov_rank=0 and drafter.confidence_head=false, got "
            f"{d.markov_rank} and {str(d.confidence_head).lower()}"
        )
    if d.labels == ZLAB_LABELS and d.block_size < 2:
        problems.append(f"drafter.labels=zlab drafts block_size - 1 tokens: drafter.block_size must be >= 2, got {d.block_size}")
    return problems


def _needs_token_counts(drafter_cfg: DrafterConfig) -> bool:
    return drafter_cfg.draft_vocab_size is not None


def _build(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
           token_counts: Optional[torch.Tensor]) -> nn.Module:
    import torch

    from deepspec_train.models.draft_vocab import build_draft_vocab
    from deepspec_train.models.parallel_drafter import ParallelDrafter

    vocab = None
    if drafter_cfg.draft_vocab_size is not None:
        # Training passes the data's counts; a shape-only build (sizing, export plans) takes the first ids.
        counts = token_counts if token_counts is not None else torch.ones(geometry.vocab_size, dtype=torch.long)
        vocab = build_draft_vocab(counts, drafter_cfg.draft_vocab_size)
    return ParallelDrafter(geometry, drafter_cfg, layer_ids, vocab)


def _build_from_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
                      state: Mapping[str, torch.Tensor]) -> nn.Module:
    from deepspec_train.models.draft_vocab import stored_draft_vocab
    from deepspec_train.models.parallel_drafter import ParallelDrafter

    return ParallelDrafter(geometry, drafter_cfg, layer_ids, stored_draft_vocab(state))


def _complete_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry,
                    state: MutableMapping[str, torch.Tensor]) -> None:
    """Every tensor of a parallel drafter is stored or comes from the target; a reduced draft vocabulary's maps
    must be stored (they come from the training data)."""
    size = drafter_cfg.draft_vocab_size
    if size is not None and size < geometry.vocab_size and not ("d2t" in state and "t2d" in state):
        raise ValueError(f"the checkpoint has no d2t/t2d maps for its {size}-token draft vocabulary")


def _frozen_heads(embed: torch.Tensor, lm_head: torch.Tensor, draft_vocab: Optional[DraftVocab]) -> dict[str, torch.Tensor]:
    # Over a reduced draft vocabulary the frozen LM head is the target head's rows of the draft tokens.
    reduced = draft_vocab is not None and draft_vocab.size < draft_vocab.target_vocab_size
    return {"embed_tokens.weight": embed, "lm_head.weight": lm_head[draft_vocab.target_ids()] if reduced else lm_head}


def _slot_weights(module: nn.Module, cfg: RecipeConfig) -> torch.Tensor:
    return _block_decay_weights(cfg.drafter.block_size, cfg.loss.gamma_decay)


@functools.lru_cache(maxsize=16)
def _block_decay_weights(block_size: int, gamma_decay: float) -> torch.Tensor:
    """The slot weights of one block, computed (and their indices checked) once per run, not per micro-batch.
    Callers index or move the cached CPU tensor, never write into it."""
    import torch

    from deepspec_train.losses.position_weights import decay_weights

    return decay_weights(torch.arange(block_size), gamma_decay)


def _loss_inputs(module: nn.Module, output: DrafterOutput, cfg: RecipeConfig) -> LossInputs:
    markov_w2 = module.markov_head.markov_w2.weight if output.markov_rows is not None else None
    weights = _slot_weights(module, cfg).to(output.slot_index.device)[output.slot_index]
    vocab = module.draft_vocab
    draft_to_target = None if vocab is None else vocab.target_ids().to(output.slot_index.device)
    return LossInputs(weights, draft_to_target, markov_w2)


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
    LM head (forward) and the Markov factor ``W2`` (trainable); the drafter's two over its draft vocabulary."""
    d, block, vocab = geometry.hidden_size, cfg.drafter.block_size, geometry.vocab_size
    draft_vocab = min(cfg.drafter.draft_vocab_size or vocab, vocab)
    visible = sum((a + block) * block for a in anchors)
    heads = supervised * (2 * 2 * d * draft_vocab + 2 * d * vocab + 3 * 2 * cfg.drafter.markov_rank * draft_vocab)
    return layer_stack_flops(cfg, geometry, anchors, d, visible, heads)


def _dspark_layouts(labels: str) -> tuple[str, ...]:
    # The DeepSpec layout first (both engines serve it); a reduced draft vocabulary only fits the speculators one.
    return (DSPARK_LAYOUT.name, SPECULATORS_DSPARK_LAYOUT.name) if labels == DSPARK_LABELS else ()


def _dflash_layouts(labels: str) -> tuple[str, ...]:
    # A DSpark-label DFlash is DeepSpec's DFlash: the DSpark layout with Markov rank 0; z-lab labels only z-lab's.
    return (DSPARK_LAYOUT.name,) if labels == DSPARK_LABELS else (ZLAB_DFLASH_LAYOUT.name,)


def _holds_dspark(drafter: DrafterConfig) -> bool:
    return drafter.markov_rank > 0


def _holds_dflash(drafter: DrafterConfig) -> bool:
    return drafter.markov_rank == 0


_SHARED = dict(
    needs_token_counts=_needs_token_counts,
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
