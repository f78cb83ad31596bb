"""The engine readers of the block-drafter layouts (DSpark, z-lab DFlash), which capture alike.

Both engines read such a layout's ``target_layer_ids`` (DFlash: ``dflash_config.target_layer_ids``) in our
convention and add 1 inside; vLLM prefers a top-level ``eagle_aux_hidden_state_layer_ids`` when one is present.
What differs between the layouts (the engine's method, the fields and tensors it needs, when it does not serve an
export at all) is the ``BlockServing`` each layout record passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.serving_layouts.draft_layers import layer_config_problems, shared_embedding_problems
from deepspec_train.serving_layouts.engine_reading import (
    EngineReading,
    ServePaths,
    TargetFacts,
    captured_decoder_layers,
    causal_problems,
    config_ids,
    draft_vocab_problems,
    vllm_capture_points,
)
from deepspec_train.serving_layouts.layout_spec import EngineReader

Config = Mapping[str, Any]


def layers_as_configured(engine: str, config: Config, tensors: Config) -> list[str]:
    """``layers`` of a layout whose config.json itself holds the drafter's layer fields (parsed by model type)."""
    return layer_config_problems(engine, config, tensors)


def always_served(config: Config) -> Optional[str]:
    """``BlockServing.unserved`` of a layout the engine serves whatever its config holds."""
    return None


@dataclass(frozen=True)
class BlockServing:
    """One engine's view of one block-drafter layout: ``unserved(config)`` says why the engine does not serve an
    export (None: it does); ``serve(reading, config, tensors, target, paths)`` adds the layout's problems, notes
    and serve command lines to a served export's reading; ``layers(engine, config, tensors)`` says how the engine
    would build the drafter's layers differently (``serving_layouts.draft_layers``)."""

    unserved: Callable[[Config], Optional[str]]
    serve: Callable[[EngineReading, Config, Config, TargetFacts, ServePaths], None]
    layers: Callable[[str, Config, Config], list[str]] = layers_as_configured


def _built_differently(engine: str, serving: BlockServing, config: Config, tensors: Config,
                       target: TargetFacts) -> list[str]:
    return serving.layers(engine, config, tensors) + shared_embedding_problems(engine, target.embedding_scale)


def block_layout_engines(layout: str, vllm: BlockServing, sglang: BlockServing) -> dict[str, EngineReader]:
    """The ``engines`` of block-drafter ``layout``: each engine's reader with the layout's ``BlockServing``."""
    return {"vllm": vllm_block_reader(layout, vllm), "sglang": sglang_block_reader(layout, sglang)}


def _sglang_target_ids(config: Config) -> list[int] | None:
    dflash = config.get("dflash_config")
    nested = config_ids(dflash.get("target_layer_ids")) if isinstance(dflash, Mapping) else None
    return nested if nested is not None else config_ids(config.get("target_layer_ids"))


def vllm_block_reader(layout: str, serving: BlockServing) -> EngineReader:
    """vLLM's reader of block-drafter ``layout``."""

    def read(config: Config, tensors: Config, target: TargetFacts, paths: ServePaths) -> EngineReading:
        reading = EngineReading("vllm", layout, None)
        reading.unserved = serving.unserved(config)
        if reading.unserved is None:
            reading.problems += causal_problems(config)
            reading.problems += _built_differently("vllm", serving, config, tensors, target)
            reading.problems += draft_vocab_problems("vllm", config, tensors, target.vocab_size)
            serving.serve(reading, config, tensors, target, paths)
            points = vllm_capture_points(config)
            if points is None:
                reading.problems.append("no target_layer_ids: vLLM would not know which target layers to capture")
            else:
                reading.captured_layers = captured_decoder_layers(points, target.num_layers)
        return reading

    return read


def sglang_block_reader(layout: str, serving: BlockServing) -> EngineReader:
    """SGLang's reader of block-drafter ``layout``."""

    def read(config: Config, tensors: Config, target: TargetFacts, paths: ServePaths) -> EngineReading:
        reading = EngineReading("sglang", layout, None)
        ids = _sglang_target_ids(config)
        points = None
        if ids is None:
            reading.problems.append("no target_layer_ids: SGLang would pick its own evenly spaced target layers")
        elif any(not 0 <= i < target.num_layers for i in ids):
            reading.problems.append(f"target_layer_ids {ids} leave 0..{target.num_layers - 1}: SGLang refuses them")
        else:
            points = [i + 1 for i in ids]
        reading.unserved = serving.unserved(config)
        if reading.unserved is None:
            reading.problems += _built_differently("sglang", serving, config, tensors, target)
            serving.serve(reading, config, tensors, target, paths)
            if points is not None:
                reading.captured_layers = captured_decoder_layers(points, target.num_layers)
        return reading

    return read
