"""Drafter training losses: the chunked selected-logit loss (CE + TV + confidence) and position weights."""

from deepspec_train.losses.position_weights import decay_weights
from deepspec_train.losses.selected_logit_loss import LossOutput, LossSettings, SupervisedRows, selected_logit_loss

__all__ = ["LossOutput", "LossSettings", "SupervisedRows", "decay_weights", "selected_logit_loss"]
