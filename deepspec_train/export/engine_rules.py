"""What vLLM 0.33 and SGLang 0.5.23 make of an export: which target layers they capture, which tensors and config
fields they need or refuse, and the serve command line. ``deepspec export`` refuses an export that an engine
would read differently from how the drafter was trained; tests check every production recipe against the rules.

    readings = check_engines(config, tensors, target_config, trained_layer_ids)  # raises EngineRuleError
    reading = engine_reading("sglang", config, tensors, target_config)            # one engine, no trained ids
    readings = check_export_dir("exports/qwen3-8b-dspark", "models/Qwen3-8B")

Facts, from the engines' code:

- Capture. Both engines walk the target's decoder layers in order and, for every layer index ``i`` in their
  capture set, keep the residual stream entering layer ``i`` (the output of decoder layer ``i - 1``; ``i = 0`` is
  the embedding output). So each layer is captured at most once, in increasing order (that order is ``fc``'s
  input-column order), and the last layer's output, which enters no layer, is never captured.
- Capture sets. DSpark / z-lab DFlash: ``target_layer_ids`` (DFlash: ``dflash_config.target_layer_ids``) + 1 in
  both engines; vLLM prefers a top-level ``eagle_aux_hidden_state_layer_ids`` when one is present. EAGLE-3 in
  vLLM: the top-level ``eagle_aux_hidden_state_layer_ids`` as given (hidden-state indices). EAGLE-3 in SGLang:
  only ``eagle_config.eagle_aux_hidden_state_layer_ids``, turned into capture points by the target family's rule
  (``architecture_rules``: + 1 for Qwen3 / Qwen2 / Llama / Gemma 3, + 1 only when the first id is 1 for
  DeepSeek-V2/V3). Without ids both engines capture the hidden-state indices ``[2, L//2, L-3]`` for EAGLE-3.
- Architectures. Which layouts an engine serves for a target at all is the target family's record
  (``architecture_rules``); an architecture without a record, or one an engine does not serve, makes that
  engine's reading ``unserved`` (``by_architecture``) and the export is still written.
- vLLM reads ``markov_rank`` without a default; reads no ``markov_head_type`` and builds only the vanilla
  Markov head (``markov_w1`` / ``markov_w2``), so it does not serve a gated or RNN head; builds a ``d2t``
  parameter only for a draft vocabulary smaller than the target's (with a full one, a ``d2t`` tensor makes its
  loader raise "There is no module or parameter named ..."); ignores ``t2d``; drops a confidence head whose tensors are missing; runs ``dflash`` layers
  causally when ``is_causal`` / ``dflash_config.causal`` says so or a layer is ``sliding_attention``.
- SGLang's DSPARK requires ``markov_rank > 0``, ``markov_head_type`` in vanilla / gated / rnn and a
  ``mask_token_id`` inside the vocabulary, and uses the target's embedding and LM head; its DFLASH path and
  vLLM's ``dflash`` method are the z-lab semantics (slot j drafts position p+j), so a DSpark-label DFlash
  (``markov_rank 0``) is served by neither SGLang path.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepspec_train.export.architecture_rules import architecture_unserved, sglang_eagle3_capture_points
from deepspec_train.export.engine_files import STS_FILENAME
from deepspec_train.kinds.serving_layouts import (
    TensorSpec,
    layer_ids_from_eagle3_config,
    layout_of_config,
    validate_layout,
)

ENGINES = ("vllm", "sglang")
SGLANG_MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
VLLM_MARKOV_HEAD_TYPES = ("vanilla",)
_SAMPLE = "probabilistic"


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
    # True when ``unserved`` comes from the target's architecture (``architecture_rules``), not from the export.
    by_architecture: bool = False


class EngineRuleError(ValueError):
    """An export an engine would misread; ``problems`` holds one line per problem, prefixed with the engine."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class _Target:
    num_layers: int
    vocab_size: int
    architecture: str


def _target_facts(target_config: Mapping[str, Any]) -> _Target:
    archs = target_config.get("architectures") or ["(a config without architectures)"]
    return _Target(int(target_config["num_hidden_layers"]), int(target_config["vocab_size"]), str(archs[0]))


def captured_decoder_layers(capture_points: Sequence[int], num_target_layers: int) -> list[int]:
    """Decoder-layer outputs an engine feeds the drafter when it keeps the stream entering every layer listed in
    ``capture_points``: walked in layer order, once each, only for layers that exist."""
    wanted = {int(i) for i in capture_points}
    return [i - 1 for i in range(num_target_layers) if i in wanted]


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def _vllm_capture_points(config: Mapping[str, Any]) -> list[int] | None:
    """vLLM's capture set for a draft config: the top-level EAGLE-3 ids first, else DFlash / DSpark ids + 1."""
    top = _ids(config.get("eagle_aux_hidden_state_layer_ids"))
    if top is not None:
        return top
    dflash = config.get("dflash_config")
    nested = _ids(dflash.get("target_layer_ids")) if isinstance(dflash, Mapping) else None
    if nested is not None:
        return [i + 1 for i in nested]
    plain = _ids(config.get("target_layer_ids"))
    return None if plain is None else [i + 1 for i in plain]


def _default_eagle3_points(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def _draft_vocab_problems(engine: str, config: Mapping[str, Any], tensors: Mapping[str, Any], vocab: int) -> list[str]:
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


def _causal_problems(config: Mapping[str, Any]) -> list[str]:
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), Mapping) else {}
    if config.get("is_causal") or dflash.get("causal") or "sliding_attention" in (config.get("layer_types") or []):
        return ["the config makes vLLM run the drafter's layers causally (is_causal / dflash_config.causal / "
                "sliding_attention), but the block was trained bidirectional"]
    return []


def _spec_config(config: dict[str, Any]) -> str:
    return shlex.quote(json.dumps(config, separators=(",", ":")))


def _vllm_reading(layout: str, config: Mapping[str, Any], tensors: Mapping[str, Any], target: _Target,
                  paths: "_ServePaths") -> EngineReading:
    reading = EngineReading("vllm", layout, None)
    points = _vllm_capture_points(config)
    if layout == "eagle3":
        if _ids(config.get("eagle_aux_hidden_state_layer_ids")) is None:
            points = _default_eagle3_points(target.num_layers)
            reading.problems.append(
                f"no top-level eagle_aux_hidden_state_layer_ids: vLLM captures its default hidden states {points}")
        if config.get("norm_before_residual"):
            reading.problems.append("norm_before_residual is true, but the drafter keeps the un-normed residual")
        reading.problems += _draft_vocab_problems("vllm", config, tensors, target.vocab_size)
        steps = int(config.get("block_size", 7))
        spec = {"method": "eagle3", "model": paths.export, "num_speculative_tokens": steps}
        reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {_spec_config(spec)}")
    else:
        head_type = config.get("markov_head_type", "vanilla")
        if layout == "dspark" and head_type not in VLLM_MARKOV_HEAD_TYPES:
            reading.unserved = (f"vLLM's qwen3_dspark builds only the vanilla Markov head and ignores "
                                f"markov_head_type; a {head_type} head's tensors would be refused: serve it with SGLang")
            return reading
        reading.problems += _causal_problems(config)
        reading.problems += _draft_vocab_problems("vllm", config, tensors, target.vocab_size)
        if layout == "dspark":
            _vllm_dspark(reading, config, tensors, paths)
        else:
            block = int(config.get("block_size", 0))
            spec = {"method": "dflash", "model": paths.export, "num_speculative_tokens": block - 1}
            reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {_spec_config(spec)}")
        if points is None:
            reading.problems.append("no target_layer_ids: vLLM would not know which target layers to capture")
    if points is not None:
        reading.captured_layers = captured_decoder_layers(points, target.num_layers)
    return reading


def _vllm_dspark(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any],
                 paths: "_ServePaths") -> None:
    if "markov_rank" not in config:
        reading.problems.append("markov_rank is missing: vLLM reads it without a default")
    if "mask_token_id" not in config:
        reading.problems.append("mask_token_id is missing: vLLM fills the block with it")
    confidence = bool(config.get("enable_confidence_head"))
    if confidence and "confidence_head.proj.weight" not in tensors:
        reading.problems.append("enable_confidence_head is true but the confidence head tensors are missing: vLLM "
                                "drops the head and cannot schedule by confidence")
    if config.get("markov_rank") == 0:
        reading.notes.append("markov_rank 0 (a DSpark-label DFlash): vLLM builds an empty Markov head; this "
                             "combination is not run by any test here")
    reading.notes.append("vLLM serves method dspark on its V2 model runner only")
    block = int(config.get("block_size", 0))
    spec = {"method": "dspark", "model": paths.export, "num_speculative_tokens": block, "draft_sample_method": _SAMPLE}
    reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {_spec_config(spec)}")
    if confidence:
        adaptive = {**spec, "enable_adaptive_verification": True}
        reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {_spec_config(adaptive)}")


def _sglang_target_ids(config: Mapping[str, Any]) -> list[int] | None:
    dflash = config.get("dflash_config")
    nested = _ids(dflash.get("target_layer_ids")) if isinstance(dflash, Mapping) else None
    return nested if nested is not None else _ids(config.get("target_layer_ids"))


def _sglang_eagle3_points(config: Mapping[str, Any], target: _Target, reading: EngineReading,
                          target_config: Mapping[str, Any]) -> list[int] | None:
    eagle = config.get("eagle_config")
    ids = _ids(eagle.get("eagle_aux_hidden_state_layer_ids")) if isinstance(eagle, Mapping) else None
    if ids is None:
        points = _default_eagle3_points(target.num_layers)
        reading.problems.append(
            f"no eagle_config.eagle_aux_hidden_state_layer_ids (the only field SGLang reads): it captures its "
            f"default hidden states {points}")
        return points
    return sglang_eagle3_capture_points(ids, target_config)


def _sglang_reading(layout: str, config: Mapping[str, Any], tensors: Mapping[str, Any], target: _Target,
                    paths: "_ServePaths", target_config: Mapping[str, Any]) -> EngineReading:
    reading = EngineReading("sglang", layout, None)
    launch = f"python -m sglang.launch_server --model-path {paths.target}"
    draft = f"--speculative-draft-model-path {shlex.quote(paths.export)}"
    if layout == "eagle3":
        points = _sglang_eagle3_points(config, target, reading, target_config)
        reading.problems += _draft_vocab_problems("sglang", config, tensors, target.vocab_size)
        reading.serve_commands.append(
            f"{launch} --speculative-algorithm EAGLE3 {draft} "
            "--speculative-num-steps 6 --speculative-eagle-topk 10 --speculative-num-draft-tokens 32")
    else:
        ids = _sglang_target_ids(config)
        if ids is None:
            reading.problems.append("no target_layer_ids: SGLang would pick its own evenly spaced target layers")
            points = None
        elif any(not 0 <= i < target.num_layers for i in ids):
            reading.problems.append(f"target_layer_ids {ids} leave 0..{target.num_layers - 1}: SGLang refuses them")
            points = None
        else:
            points = [i + 1 for i in ids]
        block = int(config.get("block_size", 0))
        if layout == "dspark":
            rank = config.get("markov_rank", 0)
            if not isinstance(rank, int) or rank <= 0:
                reading.unserved = (f"SGLang's DSPARK requires markov_rank > 0 (got {rank}); a DSpark-label DFlash "
                                    "is for comparisons, not for serving")
                return reading
            if config.get("markov_head_type") not in SGLANG_MARKOV_HEAD_TYPES:
                reading.problems.append(f"markov_head_type {config.get('markov_head_type')!r} is not one of "
                                        f"{list(SGLANG_MARKOV_HEAD_TYPES)}: SGLang's DSPARK refuses it")
            mask = config.get("mask_token_id")
            if not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
                reading.problems.append(f"mask_token_id {mask!r} is not a token of the {target.vocab_size}-token "
                                        "vocabulary: SGLang's DSPARK refuses it")
            reading.notes.append("SGLang uses the target's embedding and LM head, not the export's copies")
            base = f"{launch} --speculative-algorithm DSPARK {draft}"
            reading.serve_commands.append(base)
            if config.get("enable_confidence_head"):
                reading.serve_commands.append(
                    f"SGLANG_RAGGED_VERIFY_MODE=compact {base} --speculative-dspark-block-size {block} "
                    f"--speculative-dspark-sps-table-path {paths.sps} "
                    f"--speculative-dspark-confidence-sts-path {paths.sts}")
        else:
            reading.serve_commands.append(
                f"{launch} --speculative-algorithm DFLASH {draft} "
                f"--speculative-num-draft-tokens {block}")
    if points is not None:
        reading.captured_layers = captured_decoder_layers(points, target.num_layers)
    return reading


@dataclass(frozen=True)
class _ServePaths:
    target: str
    export: str
    sts: str
    sps: str


def _serve_paths(target_path: str | None, export_dir: str | None, sps_path: str | None) -> _ServePaths:
    export = export_dir or "EXPORT_DIR"
    return _ServePaths(
        target=shlex.quote(target_path or "TARGET"),
        export=export,
        sts=shlex.quote(str(Path(export) / STS_FILENAME)),
        sps=shlex.quote(sps_path or "sps.sglang.json"),
    )


def engine_reading(
    engine: str,
    config: Mapping[str, Any],
    tensors: Mapping[str, Any],
    target_config: Mapping[str, Any],
    target_path: str | None = None,
    export_dir: str | None = None,
    sps_path: str | None = None,
) -> EngineReading:
    """How ``engine`` reads an export given by its config dict and tensor names (values: tensors or specs)."""
    layout = layout_of_config(config)
    target = _target_facts(target_config)
    paths = _serve_paths(target_path, export_dir, sps_path)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {list(ENGINES)}")
    unserved = architecture_unserved(engine, layout, target_config)
    if unserved is not None:
        return EngineReading(engine, layout, None, unserved=unserved, by_architecture=True)
    if engine == "vllm":
        return _vllm_reading(layout, config, tensors, target, paths)
    return _sglang_reading(layout, config, tensors, target, paths, target_config)


def trained_layer_ids(config: Mapping[str, Any]) -> list[int]:
    """The taps (our convention) an export records for its drafter, as our loader reads them."""
    layout = layout_of_config(config)
    if layout == "eagle3":
        return layer_ids_from_eagle3_config(config)
    if layout == "zlab-dflash":
        return list(config["dflash_config"]["target_layer_ids"])
    return list(config["target_layer_ids"])


def check_engines(
    config: Mapping[str, Any],
    tensors: Mapping[str, Any],
    target_config: Mapping[str, Any],
    trained: Sequence[int],
    engines: Sequence[str] | None = None,
    target_path: str | None = None,
    export_dir: str | None = None,
    sps_path: str | None = None,
) -> list[EngineReading]:
    """Every engine's reading, with ``captured != trained`` added as a problem; raises ``EngineRuleError`` when a
    requested engine (default: every engine that serves the layout) would misread the export or, when asked for by
    name, does not serve it, or when no engine serves it."""
    explicit = engines is not None
    wanted = list(engines) if explicit else list(ENGINES)
    readings = [engine_reading(e, config, tensors, target_config, target_path, export_dir, sps_path) for e in ENGINES]
    trained = [int(i) for i in trained]
    for reading in readings:
        if reading.unserved is None and reading.captured_layers is not None and reading.captured_layers != trained:
            reading.problems.append(
                f"captures decoder-layer outputs {reading.captured_layers} (in fc column order), but the drafter "
                f"was trained on {trained}")
    lines = []
    for reading in readings:
        if reading.engine not in wanted:
            continue
        if reading.unserved is not None:
            if explicit:
                lines.append(f"{reading.engine}: does not serve this export: {reading.unserved}")
            continue
        lines += [f"{reading.engine}: {problem}" for problem in reading.problems]
    # An export no engine serves for its target's architecture is still written (each engine names why).
    refused_by_export = [r for r in readings if r.engine in wanted and r.unserved and not r.by_architecture]
    if not explicit and refused_by_export and not any(r.unserved is None for r in readings if r.engine in wanted):
        lines.append(f"no engine among {wanted} serves this {layout_of_config(config)} export")
    if lines:
        raise EngineRuleError(lines)
    return readings


def check_export_dir(
    export_dir: str | Path, target_dir: str | Path, engines: Sequence[str] | None = None, sps_path: str | None = None
) -> list[EngineReading]:
    """``check_engines`` on an export directory (config.json + model.safetensors) for the target in ``target_dir``;
    the trained taps are the ones the export records. The layout itself is validated first."""
    from deepspec_train.formats.drafter_loader import EXPORT_CONFIG, EXPORT_WEIGHTS, read_tensor_specs

    root = Path(export_dir)
    config = json.loads((root / EXPORT_CONFIG).read_text())
    specs: dict[str, TensorSpec] = read_tensor_specs(root / EXPORT_WEIGHTS)
    validate_layout(layout_of_config(config), config, specs)
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    return check_engines(config, specs, target_config, trained_layer_ids(config), engines, str(target_dir),
                         str(root), sps_path)


def describe(reading: EngineReading) -> list[str]:
    """Lines ``deepspec export`` prints for one engine: what it captures (or why it does not serve), notes, and
    the serve command lines."""
    if reading.unserved is not None:
        return [f"{reading.engine}: not served: {reading.unserved}"]
    captured = "none" if not reading.captured_layers else " ".join(str(i) for i in reading.captured_layers)
    lines = [f"{reading.engine}: captures the outputs of target decoder layers {captured}"]
    lines += [f"  note: {note}" for note in reading.notes]
    lines += [f"  serve: {command}" for command in reading.serve_commands]
    return lines
