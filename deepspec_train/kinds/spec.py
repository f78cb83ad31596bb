"""What a drafter kind is to the rest of the pipeline: one ``DrafterKind`` record per kind.

Every decision that depends on the kind of drafter (DSpark, DFlash, EAGLE-3, or a future one) goes through the
record of that kind instead of a ``kind == ...`` switch: which recipe settings it accepts, how its module is
built and given the target's frozen heads, whether it needs the training data's token counts, what it feeds the
selected-logit loss, how it drafts a block at evaluation time, how many sequential layer passes one draft
costs, its FLOPs for sizing, its kernel groups per serving round (``serving_cost``), and which serving layouts it
exports to (the layouts themselves are ``ServingLayout`` records, ``serving_layouts.layout_spec``). The records
themselves live in ``kinds/parallel.py`` and ``kinds/eagle3.py``; ``kinds/registry.py`` looks them up.

The kind modules import torch and the model code only inside their functions: recipe validation
(``kinds.recipe_validation.load_recipe``) asks every kind for its recipe rules, and must answer a bad recipe in
milliseconds, long before torch is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional

from deepspec_train.config.schema import DrafterConfig, RecipeConfig
from deepspec_train.families.records import dspark_layer_ids
from deepspec_train.models.geometry import DrafterGeometry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.models.block_drafting import BlockDrafter
    from deepspec_train.models.draft_vocab import DraftVocab
    from deepspec_train.models.parallel_drafter import DrafterOutput
    from deepspec_train.packing.batch import PackedBatch
    from deepspec_train.kinds.serving_kernels import RoundShape, ServingRound


@dataclass(frozen=True)
class WarmStart:
    """Which other kinds' drafters a kind starts from, and ``keeps_init(name)``: whether a tensor of the kind's
    module that such a drafter lacks keeps its init (any other missing tensor is an error)."""

    kinds: tuple[str, ...]
    keeps_init: Callable[[str], bool]


@dataclass
class LossInputs:
    """The kind-specific fields of the loss's ``SupervisedRows`` for one forward's supervised rows."""

    weights: "torch.Tensor"
    draft_to_target: "Optional[torch.Tensor]"
    markov_w2: "Optional[torch.Tensor]"


@dataclass(frozen=True)
class DrafterKind:
    """One drafter kind; see the module docstring. All callables are pure functions of their arguments.

    - ``recipe_problems(cfg)``: one-line messages for recipe settings this kind cannot train as asked (settings it
      does not use must hold their neutral value); empty when the recipe is fine. Needs the recipe only.
    - ``target_problems(cfg, target_config)``: the kind's rules that need the target's ``config.json`` (no weights),
      e.g. DFlash2's convolution groups dividing the target's hidden width; None for a kind without any.
    - ``build(drafter_cfg, geometry, layer_ids, token_counts)``: the untrained module (random weights, frozen
      heads not loaded). ``token_counts`` (``[V]`` supervised-token counts of the training data) is given when
      ``needs_token_counts``, else None.
    - ``build_from_state(drafter_cfg, geometry, layer_ids, state)``: the module a checkpoint ``state`` fills
      (called on the meta device), e.g. sized by the draft-vocabulary maps stored in it.
    - ``complete_state(drafter_cfg, geometry, state)``: adds to a checkpoint ``state`` (in place) the tensors a
      checkpoint may leave out because they follow from the config (EAGLE-3's identity maps of a full vocabulary).
    - ``needs_token_counts(drafter_cfg)``: whether building the module needs the training data's token counts
      (to choose a reduced draft vocabulary).
    - ``frozen_head_state(embed, lm_head, draft_vocab)``: the module's frozen copies of the target's heads, by
      tensor name, for a module over ``draft_vocab`` (None: the whole target vocabulary).
    - ``slot_weights(module, cfg)``: the loss's position weight of each block slot, ``[block_size]``.
    - ``loss_inputs(module, output, cfg)``: position weights, draft-vocabulary map and Markov factor for the loss.
    - ``block_drafter(module, labels)``: the evaluator's drafting strategy for a loaded module.
    - ``sequential_passes(drafter_cfg)``: decoder-layer passes one drafted block needs one after the other.
    - ``flops_per_sequence(cfg, geometry, seq_len, anchors)``: forward + backward FLOPs of one nominal sequence.
    - ``serving_round(drafter_cfg, geometry, taps, shape)``: one serving round's sequential kernel groups, their
      bytes and FLOPs (``serving_kernels``), for a drafter reading ``taps`` target layers.
    - ``layouts(labels)``: the serving layouts a drafter trained with ``labels`` exports to, default first.
    - ``default_taps(num_layers)``: the taps of a recipe that leaves ``target.layer_ids`` null (the families' rule).
    - ``holds_export(drafter_cfg)``: whether the drafter settings read back from an export in one of this kind's
      ``layouts`` are this kind's (a DSpark and a rank-0 DFlash share the DSpark layout).
    - ``extra_loss(module, output, batch, cfg, normalizer)``: a loss term the kind adds to the selected-logit loss
      (DFlash2's selector CE), normalised like it; None for a kind without one.
    - ``acceptance(module, output, batch, cfg, target_head_weight)``: per supervised row, the analytic acceptance
      ``c*`` and the argmax hit of the proposal the kind's drafts are verified against, for validation metrics, where
      that proposal is not the loss's ``softmax(lm_head(h) / T)`` (DFlash2's selector); None: the loss's own.
    - ``decoder_layer_prefixes(drafter_cfg)``: the parameter-name prefixes of the module's decoder layers, in order
      (what ``drafter.init_from_target_layers`` fills from target layers).
    - ``warm_start``: the other kinds whose trained drafters this kind may start from (``drafter.init_from``) and
      which of its tensors such a start leaves at their init (DFlash2 from DFlash: the convolutions and the
      selector); None: only drafters of this kind.
    """

    name: str
    summary: str
    needs_token_counts: Callable[[DrafterConfig], bool]
    # Whether the drafter's block input holds mask tokens (``drafter.mask_token_id``) after the anchor.
    uses_mask_token: bool
    recipe_problems: Callable[[RecipeConfig], list[str]]
    build: "Callable[[DrafterConfig, DrafterGeometry, list[int], Optional[torch.Tensor]], nn.Module]"
    build_from_state: "Callable[[DrafterConfig, DrafterGeometry, list[int], Mapping[str, torch.Tensor]], nn.Module]"
    complete_state: "Callable[[DrafterConfig, DrafterGeometry, MutableMapping[str, torch.Tensor]], None]"
    frozen_head_state: "Callable[[torch.Tensor, torch.Tensor, Optional[DraftVocab]], dict[str, torch.Tensor]]"
    slot_weights: "Callable[[nn.Module, RecipeConfig], torch.Tensor]"
    loss_inputs: "Callable[[nn.Module, DrafterOutput, RecipeConfig], LossInputs]"
    block_drafter: "Callable[[nn.Module, str], BlockDrafter]"
    sequential_passes: Callable[[DrafterConfig], int]
    flops_per_sequence: Callable[[RecipeConfig, DrafterGeometry, int, int], float]
    serving_round: "Callable[[DrafterConfig, DrafterGeometry, int, RoundShape], ServingRound]"
    layouts: Callable[[str], tuple[str, ...]]
    holds_export: Callable[[DrafterConfig], bool]
    # The target layers a recipe that leaves ``target.layer_ids`` null taps, for a target of L decoder layers.
    default_taps: Callable[[int], list[int]] = dspark_layer_ids
    extra_loss: "Optional[Callable[[nn.Module, DrafterOutput, PackedBatch, RecipeConfig, Any], torch.Tensor]]" = None
    acceptance: ("Optional[Callable[[nn.Module, DrafterOutput, PackedBatch, RecipeConfig, torch.Tensor], "
                 "tuple[torch.Tensor, torch.Tensor]]]") = None
    target_problems: Optional[Callable[[RecipeConfig, Mapping[str, Any]], list[str]]] = None
    warm_start: Optional["WarmStart"] = None
    decoder_layer_prefixes: Callable[[DrafterConfig], tuple[str, ...]] = lambda d: tuple(
        f"layers.{i}." for i in range(d.num_layers))

    def load_frozen_heads(self, module: "nn.Module", embed: "torch.Tensor", lm_head: "torch.Tensor") -> None:
        """Copy the target's embedding / LM head into ``module``'s frozen tensors (in place, same dtype)."""
        import torch

        wanted = self.frozen_head_state(embed, lm_head, getattr(module, "draft_vocab", None))
        current = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in wanted.items():
                target = current[name]
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(f"target {name} is {tuple(value.shape)}, the drafter expects {tuple(target.shape)}")
                target.copy_(value)


# Drafter settings that shape the Markov head, and the one that shapes the confidence head's training: only a
# kind with that head reads them (``recipe_problems`` refuses them off their defaults elsewhere).
MARKOV_SETTINGS = ("markov_head_type", "markov_init")
CONFIDENCE_SETTINGS = ("confidence_gradient",)
# The settings of DFlash2's convolutions and selector: every other kind leaves them at 0.
DFLASH2_SETTINGS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "selector_loss_weight")


def unused_settings(cfg: DrafterConfig, names: tuple[str, ...]) -> list[str]:
    """One line for each drafter setting in ``names`` that ``cfg`` moves off its neutral value (its default)."""
    defaults = {f.name: f.default for f in fields(DrafterConfig)}
    return [
        f"drafter.{name} = {getattr(cfg, name)!r} is not used by drafter.kind={cfg.kind} (leave it unset)"
        for name in names
        if getattr(cfg, name) != defaults[name]
    ]


def layer_stack_flops(
    cfg: RecipeConfig, geometry: DrafterGeometry, anchors: list[int], attention_input: int, visible_pairs: int,
    head_flops: float,
) -> float:
    """The part of the kinds' cost models they share (forward + backward, backward twice forward): the drafter's
    ``num_layers`` decoder layers, whose attention projects an ``attention_input``-wide input, run once per block
    slot; every context row goes through ``fc`` and each layer's key / value projections; each layer attends over
    ``visible_pairs`` (query, key) pairs; ``head_flops`` are the LM-head work at the supervised slots."""
    d, hd, block = geometry.hidden_size, geometry.head_dim, cfg.drafter.block_size
    q, kv = geometry.num_attention_heads * hd, geometry.num_key_value_heads * hd
    layers, taps = cfg.drafter.num_layers, len(cfg.target.layer_ids)
    layer = attention_input * (q + 2 * kv) + q * d + 3 * d * geometry.intermediate_size
    context_projection = taps * d * d + layers * 2 * attention_input * kv
    linear = 2 * (layer * layers * len(anchors) * block + context_projection * max(anchors))
    attention = 4 * geometry.num_attention_heads * hd * visible_pairs * layers
    return 3 * (linear + attention) + head_flops
