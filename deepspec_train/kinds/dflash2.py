"""The DFlash2 drafter kind: DFlash's backbone with dynamic depthwise convolutions in every layer, plus a low-rank
pairwise candidate selector over each slot's top-K candidates (``models.dflash2_drafter``).

It drafts like DFlash (one backbone pass over ``[x_a, MASK, ...]``) in the 1 + N layout both engines serve it in
(``sample_from_anchor`` false: z-lab labels, slot ``j >= 1`` predicts ``x_{a+j}``, so ``drafter.labels`` must be
``zlab``), then walks the selector's lattice (``models.dflash2_drafting``). Its loss is DFlash's (the recipe's
decay-weighted CE + distance terms) plus ``selector_loss_weight`` times the K-way CE of the selector against the
true next token given the true predecessor (``models.dflash2_selector_loss``). It warm-starts from a trained DFlash of
the same shape (``drafter.init_from``): the convolutions start as the identity and the selector's pairwise term at
zero, so the start drafts like the DFlash restricted to its top-K. It exports in the ``dflash2`` layout
(``serving_layouts.dflash2_layout``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Optional

from deepspec_train.config.schema import ZLAB_LABELS, DrafterConfig, RecipeConfig
from deepspec_train.serving_layouts.dflash2_layout import DFLASH2_LAYOUT
from deepspec_train.kinds.dflash2_round import dflash2_round
from deepspec_train.kinds.parallel import DFLASH
from deepspec_train.kinds.spec import CONFIDENCE_SETTINGS, MARKOV_SETTINGS, DrafterKind, WarmStart, unused_settings
from deepspec_train.models.geometry import DrafterGeometry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.models.block_drafting import BlockDrafter
    from deepspec_train.models.draft_vocab import DraftVocab
    from deepspec_train.models.parallel_drafter import DrafterOutput
    from deepspec_train.packing.batch import PackedBatch

NAME = "dflash2"
# The kind whose trained drafters a DFlash2 starts from, and the tensors such a start leaves at their init.
_WARM_START_FROM = (DFLASH.name,)
_NEW_TENSORS = ("attention_conv.", "mlp_conv.", "candidate_selector.")
_UNUSED = ("ttt_steps", "ttt_decay", "draft_vocab_size") + MARKOV_SETTINGS + CONFIDENCE_SETTINGS


def _problems(cfg: RecipeConfig) -> list[str]:
    d = cfg.drafter
    problems = unused_settings(d, _UNUSED)
    if d.markov_rank != 0 or d.confidence_head:
        problems.append(f"drafter.kind={NAME} needs drafter.markov_rank=0 and drafter.confidence_head=false, got "
                        f"{d.markov_rank} and {str(d.confidence_head).lower()}")
    if d.labels != ZLAB_LABELS:
        problems.append(f"drafter.kind={NAME} drafts in the engines' 1 + N layout: drafter.labels must be "
                        f"{ZLAB_LABELS}, got {d.labels}")
    if d.block_size < 2:
        problems.append(f"drafter.kind={NAME} drafts block_size - 1 tokens: drafter.block_size must be >= 2, got "
                        f"{d.block_size}")
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank"):
        if getattr(d, name) < 1:
            problems.append(f"drafter.kind={NAME} needs drafter.{name} >= 1, got {getattr(d, name)}")
    if d.selector_top_k < 2:
        # One candidate leaves the selector nothing to choose: the walk would be the DFlash's argmax.
        problems.append(f"drafter.kind={NAME} needs drafter.selector_top_k >= 2 (the selector chooses among the top "
                        f"K candidates), got {d.selector_top_k}")
    if d.selector_loss_weight < 0:
        problems.append(f"drafter.selector_loss_weight = {d.selector_loss_weight!r} must be >= 0")
    return problems


def _target_problems(cfg: RecipeConfig, target_config: Mapping[str, Any]) -> list[str]:
    """The rules that need the target's ``config.json``: the drafter shares the target's hidden width, which the
    convolution's channel groups must split evenly, and the selector's candidates come from its vocabulary."""
    d = cfg.drafter
    problems = []
    width, vocab = target_config.get("hidden_size"), target_config.get("vocab_size")
    if isinstance(width, int) and d.conv_group_size >= 1 and width % d.conv_group_size:
        problems.append(f"drafter.conv_group_size = {d.conv_group_size} must divide the target's hidden width "
                        f"(hidden_size = {width}), which the drafter shares")
    if isinstance(vocab, int) and d.selector_top_k > vocab:
        problems.append(f"drafter.selector_top_k = {d.selector_top_k} exceeds the target's vocabulary ({vocab})")
    return problems


def _build(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
           token_counts: Optional[torch.Tensor]) -> nn.Module:
    from deepspec_train.models.dflash2_drafter import DFlash2Drafter

    return DFlash2Drafter(geometry, drafter_cfg, layer_ids)


def _build_from_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry, layer_ids: list[int],
                      state: Mapping[str, torch.Tensor]) -> nn.Module:
    return _build(drafter_cfg, geometry, layer_ids, None)


def _complete_state(drafter_cfg: DrafterConfig, geometry: DrafterGeometry,
                    state: MutableMapping[str, torch.Tensor]) -> None:
    """Every tensor of a DFlash2 is stored or comes from the target."""


def _frozen_heads(embed: torch.Tensor, lm_head: torch.Tensor,
                  draft_vocab: Optional[DraftVocab]) -> dict[str, torch.Tensor]:
    return {"embed_tokens.weight": embed, "lm_head.weight": lm_head}


def predecessor_tokens(batch: PackedBatch) -> torch.Tensor:
    """``[Nb, B]``: the true token before the one slot ``j`` predicts under z-lab labels, ``x_{a+j-1}`` (the anchor
    for slot 1; slot 0 predicts nothing and gets the anchor too)."""
    import torch

    return torch.cat([batch.block_prev[:, :1], batch.block_prev[:, :-1]], dim=1)


def _extra_loss(module: nn.Module, output: DrafterOutput, batch: PackedBatch, cfg: RecipeConfig,
                normalizer: Any) -> torch.Tensor:
    """The selector's weighted K-way CE on the supervised rows (``models.dflash2_selector_loss``)."""
    from deepspec_train.models.dflash2_selector_loss import SelectorRows, selector_loss

    supervised = batch.supervised_mask
    rows = SelectorRows(output.hidden, module.lm_head.weight, predecessor_tokens(batch)[supervised],
                        batch.labels[supervised], DFLASH.loss_inputs(module, output, cfg).weights)
    drafter = cfg.drafter
    return selector_loss(rows, module.candidate_selector, drafter.selector_top_k, drafter.selector_loss_weight,
                         cfg.loss.temperature, normalizer, cfg.loss.chunk_size).loss


def _acceptance(module: nn.Module, output: DrafterOutput, batch: PackedBatch, cfg: RecipeConfig,
                target_head_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation's c* and argmax hits from the selector's proposal ``q`` over the top-K candidates
    (``models.dflash2_selector_loss.selector_acceptance``), not from the plain slot distribution ``softmax(lm_head(h) /
    T)``: the walk drafts from ``q`` and verification accepts against ``q`` (``models.dflash2_drafting``), so
    ``val/expected_len`` estimates what the evaluator measures. Teacher forcing gives each slot its true
    predecessor, i.e. an accepted prefix, as DFlash's c* does; the temperature is the loss's, as there."""
    from deepspec_train.models.dflash2_selector_loss import SelectorRows, selector_acceptance

    supervised = batch.supervised_mask
    rows = SelectorRows(output.hidden, module.lm_head.weight, predecessor_tokens(batch)[supervised],
                        batch.labels[supervised], DFLASH.loss_inputs(module, output, cfg).weights)
    return selector_acceptance(rows, batch.target_hidden, target_head_weight, module.candidate_selector,
                               cfg.drafter.selector_top_k, cfg.loss.temperature, cfg.loss.chunk_size)


def _block_drafter(module: nn.Module, labels: str) -> BlockDrafter:
    from deepspec_train.models.dflash2_drafter import DFlash2Drafter
    from deepspec_train.models.dflash2_drafting import DFlash2BlockDrafter

    if not isinstance(module, DFlash2Drafter):
        raise TypeError(f"drafter kind {NAME} needs a DFlash2Drafter, got {type(module).__name__}")
    return DFlash2BlockDrafter(module, labels)


def _flops(cfg: RecipeConfig, geometry: DrafterGeometry, anchors: list[int], supervised: int) -> float:
    """DFlash's FLOPs (``kinds.parallel``) plus, per block slot and layer, the two convolutions' kernel
    projections (forward + backward), and per supervised slot the candidates' head logits (forward), the selector's
    hidden projection and its ``K`` pairwise scores (forward + backward)."""
    d, block, vocab = geometry.hidden_size, cfg.drafter.block_size, geometry.vocab_size
    taps, group = cfg.drafter.conv_kernel_size, cfg.drafter.conv_group_size
    rank, top_k = cfg.drafter.selector_rank, cfg.drafter.selector_top_k
    convs = 3 * 2 * 2 * d * (2 * taps * (d // max(group, 1))) * cfg.drafter.num_layers * len(anchors) * block
    selector = supervised * (2 * d * vocab + 3 * 2 * (d * rank + top_k * (d + rank)))
    return DFLASH.flops_per_sequence(cfg, geometry, anchors, supervised) + convs + selector


def _layouts(labels: str) -> tuple[str, ...]:
    # Both engines serve DFlash2 in the 1 + N (z-lab) layout only.
    return (DFLASH2_LAYOUT.name,) if labels == ZLAB_LABELS else ()


def _holds_export(drafter: DrafterConfig) -> bool:
    return drafter.selector_rank > 0


def _keeps_init(name: str) -> bool:
    return any(part in name for part in _NEW_TENSORS)


DFLASH2 = DrafterKind(
    name=NAME,
    summary="DFlash backbone + dynamic depthwise convolutions + pairwise top-K candidate selector",
    needs_token_counts=lambda drafter_cfg: False,
    uses_mask_token=True,
    recipe_problems=_problems,
    target_problems=_target_problems,
    build=_build,
    build_from_state=_build_from_state,
    complete_state=_complete_state,
    frozen_head_state=_frozen_heads,
    # DFlash's slot weights, loss inputs and depth: the convolutions and the selector change none of them.
    slot_weights=DFLASH.slot_weights,
    loss_inputs=DFLASH.loss_inputs,
    block_drafter=_block_drafter,
    sequential_passes=DFLASH.sequential_passes,
    flops_per_sequence=_flops,
    serving_round=dflash2_round,
    layouts=_layouts,
    holds_export=_holds_export,
    extra_loss=_extra_loss,
    acceptance=_acceptance,
    warm_start=WarmStart(_WARM_START_FROM, _keeps_init),
)
