"""How a serving engine reads an export, as data, and the engine facts every layout's readers share.

Each layout record (``serving_layouts/*_layout.py``) has one reader per engine that returns an ``EngineReading``: the
target layers the engine captures, why it does not serve the export at all, the ways it would misread it, and the serve
command lines. ``export.engine_rules`` runs the readers and refuses an export an engine would misread. The facts
below come from the engines' code (vLLM 0.33, SGLang 0.5.23;
docs/reference/file_formats.md):

- Capture. Both engines walk the target's decoder layers in order and, for every layer index ``i`` in their capture
  set, keep the residual stream entering layer ``i`` (the output of decoder layer ``i - 1``; ``i = 0`` is the
  embedding output). So each layer is captured at most once, in increasing order (that order is ``fc``'s
  input-column order), and the last layer's output, which enters no layer, is never captured.
- vLLM's capture set for any draft config: a top-level ``eagle_aux_hidden_state_layer_ids`` as given when present,
  else ``dflash_config.target_layer_ids`` + 1, else ``target_layer_ids`` + 1.
- vLLM builds a ``d2t`` parameter only for a draft vocabulary smaller than the target's (with a full one, a ``d2t``
  tensor makes its loader raise "There is no module or parameter named ..."); ignores ``t2d``; runs the drafter's
  layers causally when ``is_causal`` / ``dflash_config.causal`` says so or a layer is ``sliding_attention``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from deepspec_train.families.catalog import engines_of, family_of
from deepspec_train.families.records import EngineSupport, TargetFamily

ENGINES = ("vllm", "sglang")
# vLLM's draft sampling that matches the project's evaluator (its default, "greedy", does not).
SAMPLE_METHOD = "probabilistic"


@dataclass
class EngineReading:
    """How one engine reads one export. ``captured_layers`` are decoder-layer outputs in our convention, in the
    order they reach ``fc`` (-1 = the embedding output); ``unserved`` says why the engine does not serve the export
    at all (then nothing is captured); ``problems`` are the ways it would misread it, one line each."""

    engine: str
    layout: str
    captured_layers: list[int] | None
    problems: list[str] = field(default_factory=list)
    unserved: str | None = None
    serve_commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # True when ``unserved`` comes from the target's architecture (its family record), not from the export.
    by_architecture: bool = False


@dataclass(frozen=True)
class TargetFacts:
    """What the engines' readers need of the target's config.json: its depth, vocabulary, architecture, the
    record of its family (None for a target no family record identifies), the factor its model multiplies the
    stored embedding rows by (Gemma's ``sqrt(hidden_size)``) and what each engine's class of its architecture
    captures (None for an architecture no record covers: SmolLM2 has no family record but Llama's class)."""

    num_layers: int
    vocab_size: int
    architecture: str
    family: Optional[TargetFamily] = None
    embedding_scale: float = 1.0
    engines: Optional[Mapping[str, EngineSupport]] = None


def target_facts(target_config: Mapping[str, Any]) -> TargetFacts:
    """The target facts of a target's config.json (its first ``architectures`` entry names it)."""
    archs = target_config.get("architectures") or ["(a config without architectures)"]
    family = family_of(target_config)
    scale = 1.0 if family is None else float(family.embedding_scale(target_config))
    return TargetFacts(int(target_config["num_hidden_layers"]), int(target_config["vocab_size"]), str(archs[0]),
                       family, scale, engines_of(target_config))


def architecture_unserved(engine: str, capture: str, target: TargetFacts) -> Optional[str]:
    """Why ``engine`` serves no drafter that needs ``capture`` for this target at all (None when it does): its
    architecture's record says so, or no family record covers the architecture (the rule is then not known here)."""
    if target.engines is None:
        return (f"its capture rule for a {target.architecture} target is not known here (no target family record): "
                "check the engine's model class before serving")
    return target.engines[engine].unserved(capture)


@dataclass(frozen=True)
class ServePaths:
    """Shell-quoted paths the serve command lines name (placeholders when unknown)."""

    target: str
    export: str
    sts: str
    sps: str


def captured_decoder_layers(capture_points: Sequence[int], num_target_layers: int) -> list[int]:
    """Decoder-layer outputs an engine feeds the drafter when it keeps the stream entering every layer listed in
    ``capture_points``: walked in layer order, once each, only for layers that exist."""
    wanted = {int(i) for i in capture_points}
    return [i - 1 for i in range(num_target_layers) if i in wanted]


def config_ids(value: Any) -> list[int] | None:
    """``value`` when it is a non-empty list of ints (what an engine accepts as layer ids), else None."""
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def vllm_capture_points(config: Mapping[str, Any]) -> list[int] | None:
    """vLLM's capture set for a draft config: the top-level EAGLE-3 ids first, else DFlash / DSpark ids + 1."""
    top = config_ids(config.get("eagle_aux_hidden_state_layer_ids"))
    if top is not None:
        return top
    dflash = config.get("dflash_config")
    nested = config_ids(dflash.get("target_layer_ids")) if isinstance(dflash, Mapping) else None
    if nested is not None:
        return [i + 1 for i in nested]
    plain = config_ids(config.get("target_layer_ids"))
    return None if plain is None else [i + 1 for i in plain]


def default_eagle3_points(num_layers: int) -> list[int]:
    """The hidden-state indices both engines capture for EAGLE-3 when a config names none."""
    return [2, num_layers // 2, num_layers - 3]


def draft_vocab_problems(engine: str, config: Mapping[str, Any], tensors: Mapping[str, Any], vocab: int) -> list[str]:
    """How ``engine`` would misread the draft-vocabulary fields and maps of an export."""
    draft_vocab = config.get("draft_vocab_size") or vocab
    if draft_vocab >= vocab and "d2t" in tensors:
        if engine == "vllm":
            return [
                f"d2t is present but draft_vocab_size {draft_vocab} is the full vocabulary: vLLM then has no "
                "draft_id_to_target_id parameter and its loader raises 'There is no module or parameter named'"
            ]
        return []
    if draft_vocab < vocab and "d2t" not in tensors:
        return [f"draft_vocab_size {draft_vocab} < vocab_size {vocab} but no d2t: draft ids would be read as target "
                "ids"]
    if draft_vocab < vocab and "lm_head.weight" not in tensors:
        return [f"a reduced draft vocabulary ({draft_vocab}) needs its own lm_head.weight"]
    return []


def causal_problems(config: Mapping[str, Any]) -> list[str]:
    """vLLM runs a block drafter's layers causally on these config settings; ours are trained bidirectional."""
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), Mapping) else {}
    if config.get("is_causal") or dflash.get("causal") or "sliding_attention" in (config.get("layer_types") or []):
        return ["the config makes vLLM run the drafter's layers causally (is_causal / dflash_config.causal / "
                "sliding_attention), but the block was trained bidirectional"]
    return []


def speculative_config(config: dict[str, Any]) -> str:
    """vLLM's ``--speculative-config`` argument, shell-quoted compact JSON."""
    return shlex.quote(json.dumps(config, separators=(",", ":")))


def sglang_launch(paths: ServePaths, algorithm: str) -> str:
    """The start of an SGLang serve line for a drafter served with ``--speculative-algorithm algorithm``."""
    return (f"python -m sglang.launch_server --model-path {paths.target} --speculative-algorithm {algorithm} "
            f"--speculative-draft-model-path {shlex.quote(paths.export)}")
