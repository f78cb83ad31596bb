"""What a serving layout is to the rest of the pipeline: one ``ServingLayout`` record per layout.

A serving layout is the format one family of serving-engine loaders reads (config.json + model.safetensors). Every
decision that depends on the layout goes through its record instead of a ``layout == ...`` switch: the
architecture name that identifies it, the config fields the exporter writes and the validator requires, the tensors
it stores, requires and leaves out, what each engine (vLLM, SGLang) captures from it and refuses, and how the
project's loader turns an export back into drafter settings. The records live in ``serving_layouts/dspark_layout.py``,
``serving_layouts/zlab_dflash_layout.py`` and ``serving_layouts/eagle3_layout.py``;
``serving_layouts/layout_registry.py`` looks them up. Which drafter kinds export to which layout is the kinds'
``layouts`` (``kinds.spec``).

Layer ids. Our ``target_layer_ids`` are 0-indexed decoder layers: id ``k`` is the output of decoder layer ``k``,
which is transformers' ``hidden_states[k + 1]`` (``hidden_states[0]`` is the embedding output). Each record says in
which fields and in which convention it stores them (``read`` gives them back in ours).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.serving_layouts.layout_checks import ConfigCheck, TensorSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from deepspec_train.serving_layouts.engine_reading import EngineReading, ServePaths, TargetFacts


class LayoutError(ValueError):
    """An export (or an export plan) that does not match its layout; ``problems`` lists every mismatch."""

    def __init__(self, layout: str, problems: list[str]) -> None:
        self.layout = layout
        self.problems = list(problems)
        super().__init__(f"{layout} layout: " + "; ".join(self.problems))


class WrittenDrafter(NamedTuple):
    """What the exporter knows of a loaded drafter when it writes a layout's config fields."""

    module: "nn.Module"
    block_size: int
    mask_token_id: Optional[int]
    target_layer_ids: list[int]
    num_anchors: int
    confidence_temperatures: Optional[list[float]]
    # The target's own config.json, and where the target was when the drafter was trained ("" when unknown).
    target_config: Mapping[str, Any]
    target_path: str


class ExportReading(NamedTuple):
    """A layout's config read back: the drafter settings (``kind`` left at its default: the kind registry tells it
    from these settings), the taps in our convention, the target depth and the calibrated temperatures."""

    drafter: DrafterConfig
    target_layer_ids: list[int]
    num_target_layers: int
    mask_token_id: Optional[int]
    confidence_temperatures: Optional[list[float]]


# engine name -> how that engine reads an export in the layout (config, tensors, target, serve paths).
EngineReader = Callable[[Mapping[str, Any], Mapping[str, Any], "TargetFacts", "ServePaths"], "EngineReading"]


@dataclass(frozen=True)
class ServingLayout:
    """One serving layout; see the module docstring. All callables are pure functions of their arguments.

    - ``name``: the layout's name (``deepspec export --layout``); ``architecture``: its config's ``architectures``.
    - ``holds(module)``: whether the layout can hold this drafter module at all (the DeepSpec DSpark layout, for
      example, has no draft vocabulary); a kind exports by default to the first of its layouts that holds it.
    - ``capture``: how an engine must capture target features for this layout's drafters (``families.records``:
      the block drafters' capture or EAGLE-3's); a target family whose model class lacks it is not served.
    - ``from_target``: drafter tensors the layout does not store because the engine uses the target's own (the
      loader fills them from the target); ``copies_target_heads``: the layout stores copies of the target's
      embedding / LM head, which the exporter refreshes from the target checkpoint so that they equal it.
    - ``unwritten(module)``: every drafter tensor the exporter leaves out (``from_target`` and what follows from the
      config, e.g. EAGLE-3's identity vocabulary maps).
    - ``depth(module)``: the config's ``num_hidden_layers`` for the drafter ``module``.
    - ``fields(drafter)``: the config fields of the layout, added to the target's config (in this order).
    - ``carries_temperatures``: the layout's config holds calibrated confidence temperatures (and an STS file may
      go next to it).
    - ``check(check)``: reads the layout's required config fields through a ``ConfigCheck`` (which collects the
      problems) and returns the tensors the config requires, name -> spec; None when the config is incomplete.
    - ``taps(config)``: the drafter's target layers (our convention) from a valid config's layer-id fields.
    - ``read(config)``: the drafter settings a valid config describes (see ``ExportReading``).
    - ``engines``: engine name -> its reader (what it captures, refuses and how it is served).
    - ``complete_published(config, state, target_path)``: the config and tensors as the loader reads them, from a
      drafter directory as its publishers ship it (e.g. an EAGLE-3 config without taps; ``formats.published_drafters``).
    - ``target_vocab_tensors``: the stored tensors with one row per target token, checked against a target's
      vocabulary when nothing records which target the drafter was trained for.
    - ``companion_files()``: file name -> text of files the exporter writes next to the weights.
    - ``readme_section(config)``: lines the export's README.md adds after the serving section.
    """

    name: str
    architecture: str
    holds: "Callable[[nn.Module], bool]"
    capture: str
    from_target: tuple[str, ...]
    copies_target_heads: bool
    carries_temperatures: bool
    unwritten: "Callable[[nn.Module], frozenset[str]]"
    depth: "Callable[[nn.Module], int]"
    fields: Callable[[WrittenDrafter], dict[str, Any]]
    check: Callable[[ConfigCheck], Optional[dict[str, TensorSpec]]]
    taps: Callable[[Mapping[str, Any]], list[int]]
    read: Callable[[Mapping[str, Any]], ExportReading]
    engines: Mapping[str, EngineReader]
    complete_published: "Callable[[dict[str, Any], dict[str, torch.Tensor], Optional[str]], tuple[dict[str, Any], dict[str, torch.Tensor]]]"
    target_vocab_tensors: tuple[str, ...]
    companion_files: Callable[[], dict[str, str]]
    readme_section: Callable[[Mapping[str, Any]], list[str]]


def published_as_is(
    config: dict[str, Any], state: dict[str, "torch.Tensor"], target_path: Optional[str]
) -> tuple[dict[str, Any], dict[str, "torch.Tensor"]]:
    """``complete_published`` of a layout whose publishers ship exactly what this project writes."""
    return config, state


def no_companion_files() -> dict[str, str]:
    """``companion_files`` of a layout that is config.json + model.safetensors only."""
    return {}


def no_readme_section(config: Mapping[str, Any]) -> list[str]:
    """``readme_section`` of a layout whose README says nothing beyond the serving lines."""
    return []


def holds_any(module: "nn.Module") -> bool:
    """``holds`` of a layout that holds every drafter of the kinds that export to it."""
    return True


def holds_full_vocabulary(module: "nn.Module") -> bool:
    """``holds`` of a block-drafter layout that has no draft vocabulary (the drafter drafts over the target's)."""
    return module.draft_vocab is None


def stacked_depth(module: "nn.Module") -> int:
    """``depth`` of a layout whose drafter keeps its decoder layers in ``module.layers``."""
    return len(module.layers)
