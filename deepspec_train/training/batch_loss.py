"""Forward a drafter on one packed micro-batch and compute its loss: shared by training and validation.

``DrafterLoss`` is made once per run from the recipe (``DrafterLoss.for_recipe``): the drafter kind's record
(``kinds``) and the loss settings of ``cfg.loss`` are resolved there, not per micro-batch. The kind record supplies
what differs between kinds: the per-slot position weights (DSpark/DFlash ``exp(-(k-1)/gamma_decay)``, EAGLE-3
``ttt_decay ** k``), the draft-vocabulary map, the Markov factor and any term of its own (``extra_loss``); Markov
rows and confidence logits come with the drafter's output when it has those heads. ``normalizer`` is the step's
supervised-slot count or, for per-sequence normalisation, one denominator per supervised row
(``training.loss_normalizers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.kinds.spec import DrafterKind
from deepspec_train.losses.selected_logit_loss import LossOutput, LossSettings, SupervisedRows, selected_logit_loss
from deepspec_train.packing.batch import PackedBatch


@dataclass
class BatchLoss:
    loss: LossOutput
    slot_index: torch.Tensor
    supervised_mask: torch.Tensor


def unwrap(model: nn.Module) -> nn.Module:
    """The drafter inside a DDP / DeepSpeed wrapper."""
    return getattr(model, "module", model)


@dataclass(frozen=True, eq=False)
class DrafterLoss:
    """One run's micro-batch loss: the recipe, its drafter kind's record, the loss settings, the frozen target
    LM-head weight and the attention backend of the drafter's forward."""

    cfg: RecipeConfig
    kind: DrafterKind
    settings: LossSettings
    target_head_weight: torch.Tensor
    attention: str

    @classmethod
    def for_recipe(cls, cfg: RecipeConfig, target_head_weight: torch.Tensor, attention: str) -> "DrafterLoss":
        """The loss ``cfg`` (a recipe from ``kinds.recipe_validation.load_recipe``) asks for."""
        return cls(cfg, kind_spec(cfg.drafter.kind), LossSettings.of(cfg.loss), target_head_weight, attention)

    def slot_weights(self, model: nn.Module) -> torch.Tensor:
        """The loss's position weight of each block slot, ``[block_size]``, for ``model`` (possibly wrapped)."""
        return self.kind.slot_weights(unwrap(model), self.cfg)

    def __call__(self, model: nn.Module, batch: PackedBatch, normalizer: float | torch.Tensor) -> BatchLoss:
        """Forward ``model`` (possibly wrapped) on ``batch`` and compute the weighted CE + TV + confidence loss."""
        drafter = unwrap(model)
        out = model(batch, attention=self.attention)
        labels = batch.labels[batch.supervised_mask]
        inputs = self.kind.loss_inputs(drafter, out, self.cfg)
        rows = SupervisedRows(
            out.hidden,
            drafter.lm_head.weight,
            batch.target_hidden,
            self.target_head_weight,
            labels,
            inputs.weights.to(out.hidden.device),
            markov_rows=out.markov_rows,
            markov_w2=inputs.markov_w2,
            conf_logits=out.conf_logits,
            draft_to_target=inputs.draft_to_target,
        )
        loss = selected_logit_loss(rows, self.settings, normalizer)
        if self.kind.extra_loss is not None:
            # A kind's own term (DFlash2's selector CE), normalised like the rest: the sum stays the step's loss.
            loss.loss = loss.loss + self.kind.extra_loss(drafter, out, batch, self.cfg, normalizer)
        if self.kind.acceptance is not None and not drafter.training:
            # Validation (eval mode) reports the acceptance of what the kind actually drafts (DFlash2: the selector's
            # proposal); training keeps the loss's c*, which costs no second pass over the heads.
            loss.c_star, loss.draft_correct = self.kind.acceptance(drafter, out, batch, self.cfg,
                                                                   self.target_head_weight)
        return BatchLoss(loss=loss, slot_index=out.slot_index, supervised_mask=batch.supervised_mask)
