"""One target forward for several drafters: a tap on the union of their layers, whose result each drafter reads
through a view of its own layers.

Drafter groups (``jobs.drafter_groups``) train several drafters over one target and one data order. Each group
builds its micro-batches with its own chunk builder, exactly as it would alone; the builders' taps are views of
one ``SharedTargetPass``, which runs the target once per distinct input (the same token ids and padding) and
hands every later request for that input the states it kept. A view cuts its layers out of the union's
concatenated outputs and concatenates them in its own order: copies of the values one forward produced, so a
group's features are bit for bit those of a tap on its layers alone (forward hooks only read what the layers
return). What is kept lives until ``clear``: the grouped run clears it after every round of steps, so it holds at
most one step's forwards.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from deepspec_train.target.hidden_states import TargetStates, TargetTap


class SharedTargetPass:
    """A tap on the union of ``layer_sets`` that runs the target once per distinct input until ``clear``."""

    def __init__(self, model: PreTrainedModel, layer_sets: list[list[int]]):
        self.layer_ids = sorted({layer for layers in layer_sets for layer in layers})
        self.tap = TargetTap(model, self.layer_ids)
        self._kept: dict[tuple, TargetStates] = {}
        # Forwards asked for by the views and forwards run: their ratio is the saving.
        self.requests = 0
        self.forwards = 0

    def view(self, layer_ids: list[int]) -> "TapView":
        """What one drafter's chunk builder uses as its tap."""
        missing = sorted(set(layer_ids) - set(self.layer_ids))
        if missing:
            raise ValueError(f"layers {missing} are not tapped by this shared pass (taps {self.layer_ids})")
        return TapView(self, [self.layer_ids.index(layer) for layer in layer_ids])

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> TargetStates:
        """The union's states for this input: kept ones when the same input ran since the last ``clear``."""
        self.requests += 1
        key = _input_key(input_ids, attention_mask)
        kept = self._kept.get(key)
        if kept is None:
            kept = self.tap(input_ids, attention_mask)
            self._kept[key] = kept
            self.forwards += 1
        return kept

    def clear(self) -> None:
        self._kept.clear()


class TapView:
    """The ``TargetTap`` interface over a shared pass: the union's states cut to one drafter's layers (``slots``:
    the positions of its layers in the union, in the drafter's order)."""

    def __init__(self, shared: SharedTargetPass, slots: list[int]):
        self.shared = shared
        self.slots = slots

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> TargetStates:
        states = self.shared.states(input_ids, attention_mask)
        width = states.final_hidden.shape[-1]
        parts = [states.ctx_features[..., slot * width : (slot + 1) * width] for slot in self.slots]
        return TargetStates(ctx_features=torch.cat(parts, dim=-1), final_hidden=states.final_hidden)


def _input_key(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple:
    """Equal keys for equal inputs (shape and every id; the padding mask too)."""
    mask = None if attention_mask is None else attention_mask.cpu().numpy().tobytes()
    return tuple(input_ids.shape), input_ids.cpu().numpy().tobytes(), mask
