"""The EAGLE-3 drafter kind (baseline): one autoregressive decoder layer on three fused target layers, trained
with training-time test over the block slots and a draft vocabulary counted from the training data.

One draft costs ``num_layers x ttt_steps`` sequential layer passes (each step consumes the previous step's
sample). The loss weights step ``k`` (0-based) by ``ttt_decay ** k`` and scores the draft-vocabulary LM head
through the ``d2t`` map; the module's frozen tensor is the target's input embedding only.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import fields
from typing import TYPE_CHECKING, Optional

from deepspec_train.config.schema import DrafterConfig, RecipeConfig
from deepspec_train.families.records import eagle3_layer_ids
from deepspec_train.serving_layouts.eagle3_layout import EAGLE3_LAYOUT, NUM_FUSED_LAYERS
from deepspec_train.kinds.eagle3_round import eagle3_round
from deepspec_train.kinds.spec import (
    CONFIDENCE_SETTINGS, DFLASH2_SETTINGS, MARKOV_SETTINGS, DrafterKind, LossInputs, layer_stack_flops,
    unused_settings,
)
from deepspec_train.models.geometry import DrafterGeometry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.models.block_drafting import BlockDrafter
    from deepspec_train.models.draft_vocab import DraftVocab
    from deepspec_train.models.parallel_drafter import DrafterOutput

NAME = "eagle3"


def _problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    defaults = {f.name: f.default for f in fields(DrafterConfig)}
    problems = unused_settings(d, MARKOV_SETTINGS + CONFIDENCE_SETTINGS + DFLASH2_SETTINGS)
    if d.num_layers != 1:
        problems.append(f"drafter.kind={NAME} has one decoder layer: drafter.num_layers must be 1, got {d.num_layers}")
    if d.ttt_steps != d.block_size:
        problems.append(
            f"drafter.kind={NAME} unrolls one TTT step per block slot: drafter.ttt_steps ({d.ttt_steps}) must equal "
            f"drafter.block_size ({d.block_size})"
        )
    if not 0 < d.ttt_decay <= 1:
        problems.append(f"drafter.ttt_decay = {d.ttt_decay!r} must be in (0, 1]")
    if d.markov_rank != 0 or d.confidence_head:
        problems.append(
            f"drafter.kind={NAME} has no Markov or confidence head: drafter.markov_rank must be 0 and "
            f"drafter.confidence_head false, got {d.markov_rank} and {str(d.confidence_head).lower()}"
        )
    if d.labels != defaults["labels"]:
        problems.append(f"drafter.labels={d.labels} is DFlash's own convention: only with drafter.kind=dflash")
    if d.draft_vocab_size is not None and d.draft_vocab_size < 1:
        problems.append(f"drafter.draft_vocab_size = {d.draft_vocab_size} must be >= 1 (or unset: full vocabulary)")
    if cfg.target.layer_ids is not None and len(cfg.target.layer_ids) != NUM_FUSED_LAYERS:
        problems.append(
            f"drafter.kind={NAME} fuses exactly {NUM_FUSED_LAYERS} target layers: target.layer_ids has "
            f"{len(cfg.target.layer_ids)} ({cfg.target.layer_ids})"
        )
    return problems


def _build(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
           token_counts: Optional[torch.Tensor]) -> nn.Module:
    import torch

    from deepspec_train.models.draft_vocab import build_draft_vocab
    from deepspec_train.models.eagle3_drafter import Eagle3Drafter

    counts = token_counts if token_counts is not None else torch.ones(geometry.vocab_size, dtype=torch.long)
    return Eagle3Drafter(geometry, drafter_cfg, layer_ids, build_draft_vocab(counts, drafter_cfg.draft_vocab_size))


def _build_from_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
                      state: Mapping[str, torch.Tensor]) -> nn.Module:
    from deepspec_train.models.draft_vocab import DraftVocab
    from deepspec_train.models.eagle3_drafter import Eagle3Drafter

    return Eagle3Drafter(geometry, drafter_cfg, layer_ids, DraftVocab(d2t=state["d2t"], t2d=state["t2d"]))


def _complete_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry,
                    state: MutableMapping[str, torch.Tensor]) -> None:
    import torch

    from deepspec_train.models.draft_vocab import build_draft_vocab

    if "d2t" in state and "t2d" in state:
        return
    size = drafter_cfg.draft_vocab_size
    if size is not None and size < geometry.vocab_size:
        raise ValueError(f"the checkpoint has no d2t/t2d maps for its {size}-token draft vocabulary")
    # A full draft vocabulary is the identity map, which needs no stored data.
    full = build_draft_vocab(torch.ones(geometry.vocab_size, dtype=torch.long), None)
    state["d2t"], state["t2d"] = full.d2t, full.t2d


def _frozen_heads(embed: torch.Tensor, lm_head: torch.Tensor, draft_vocab: Optional[DraftVocab]) -> dict[str, torch.Tensor]:
    return {"embed_tokens.weight": embed}


def _slot_weights(module: nn.Module, cfg: RecipeConfig) -> torch.Tensor:
    return module.step_weights(cfg.drafter.block_size)


def _loss_inputs(module: nn.Module, output: DrafterOutput, cfg: RecipeConfig) -> LossInputs:
    weights = _slot_weights(module, cfg).to(output.slot_index.device)[output.slot_index]
    vocab = module.draft_vocab
    draft_to_target = None if vocab.is_full else vocab.target_ids().to(output.slot_index.device)
    return LossInputs(weights, draft_to_target, None)


def _block_drafter(module: nn.Module, labels: str) -> BlockDrafter:
    from deepspec_train.models.block_drafting import Eagle3BlockDrafter
    from deepspec_train.models.eagle3_drafter import Eagle3Drafter

    if not isinstance(module, Eagle3Drafter):
        raise TypeError(f"drafter.kind={NAME} needs an Eagle3Drafter, got {type(module).__name__}")
    return Eagle3BlockDrafter(module)


def _sequential_passes(cfg: DrafterConfig) -> int:
    return cfg.num_layers * cfg.ttt_steps


def _flops(cfg: RecipeConfig, geometry: DrafterGeometry, anchors: list[int], supervised: int) -> float:
    """Forward + backward FLOPs of one nominal sequence: context entries go through ``fc`` and the layer's k/v
    projections of its 2d-wide input, the layer runs once per block slot (the TTT steps), slot ``k`` of the block
    at ``a`` sees ``a`` context entries and slots ``0..k``; at each supervised slot the trainable draft-vocabulary
    LM head (forward, input and weight gradients) and the target LM head (forward)."""
    d, block, vocab = geometry.hidden_size, cfg.drafter.block_size, geometry.vocab_size
    visible = sum(block * a + block * (block - 1) // 2 for a in anchors)
    draft_vocab = cfg.drafter.draft_vocab_size or vocab
    heads = supervised * (3 * 2 * d * draft_vocab + 2 * d * vocab)
    return layer_stack_flops(cfg, geometry, anchors, 2 * d, visible, heads)


def _layouts(labels: str) -> tuple[str, ...]:
    return (EAGLE3_LAYOUT.name,)


def _holds_export(drafter: DrafterConfig) -> bool:
    return True


EAGLE3 = DrafterKind(
    name=NAME,
    summary="one autoregressive layer on fused target features, trained with training-time test",
    needs_token_counts=lambda drafter_cfg: True,
    uses_mask_token=False,
    recipe_problems=_problems,
    build=_build,
    build_from_state=_build_from_state,
    complete_state=_complete_state,
    frozen_head_state=_frozen_heads,
    slot_weights=_slot_weights,
    loss_inputs=_loss_inputs,
    block_drafter=_block_drafter,
    sequential_passes=_sequential_passes,
    flops_per_sequence=_flops,
    serving_round=eagle3_round,
    layouts=_layouts,
    holds_export=_holds_export,
    # One decoder layer, run once per training-time-test step.
    decoder_layer_prefixes=lambda d: ("midlayer.",),
    default_taps=eagle3_layer_ids,
)
