"""One drafter forward + loss on a packed micro-batch, shared by training and validation.

This is the single place that knows how each drafter kind meets the selected-logit loss: which head weight
scores the drafter's states, which position weights apply (DSpark/DFlash: ``exp(-(k-1)/gamma_decay)``,
EAGLE-3: ``ttt_decay ** k``), and whether Markov rows, confidence logits and a draft vocabulary take part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.losses.position_weights import decay_weights
from deepspec_train.losses.selected_logit_loss import LossOutput, selected_logit_loss
from deepspec_train.packing.batch import PackedBatch


@dataclass
class StepResult:
    loss: LossOutput
    slot_index: torch.Tensor
    supervised_mask: torch.Tensor


def unwrap(model: nn.Module) -> nn.Module:
    """The drafter inside a DDP / DeepSpeed wrapper."""
    return getattr(model, "module", model)


def drafter_loss(
    model: nn.Module,
    batch: PackedBatch,
    cfg: RecipeConfig,
    target_head_weight: torch.Tensor,
    normalizer: float,
    attention: str,
) -> StepResult:
    """Forward ``model`` (possibly wrapped) on ``batch`` and compute the weighted CE + TV + confidence loss."""
    drafter = unwrap(model)
    out = model(batch, attention=attention)
    labels = batch.labels[batch.supervised_mask]
    if cfg.drafter.kind == "eagle3":
        weights = drafter.step_weights(cfg.drafter.block_size).to(out.slot_index.device)[out.slot_index]
        draft_to_target = None if drafter.draft_vocab.is_full else drafter.draft_vocab.target_ids().to(labels.device)
        markov_w2 = None
    else:
        weights = decay_weights(out.slot_index, cfg.loss.gamma_decay)
        draft_to_target = None
        markov_w2 = drafter.markov_head.markov_w2.weight if out.markov_rows is not None else None
    loss = selected_logit_loss(
        out.hidden,
        drafter.lm_head.weight,
        batch.target_hidden,
        target_head_weight,
        labels,
        weights.to(out.hidden.device),
        markov_rows=out.markov_rows,
        markov_w2=markov_w2,
        conf_logits=getattr(out, "conf_logits", None),
        draft_to_target=draft_to_target,
        temperature=cfg.loss.temperature,
        alpha_ce=cfg.loss.alpha_ce,
        alpha_tv=cfg.loss.alpha_tv,
        alpha_conf=cfg.loss.alpha_conf,
        chunk_size=cfg.loss.chunk_size,
        normalizer=normalizer,
    )
    return StepResult(loss=loss, slot_index=out.slot_index, supervised_mask=batch.supervised_mask)
