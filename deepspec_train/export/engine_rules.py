"""What vLLM 0.33 and SGLang 0.5.23 make of an export: which target layers they capture, which tensors and config
fields they need or refuse, and the serve command line. ``deepspec export`` refuses an export that an engine
would read differently from how the drafter was trained; tests check every production recipe against the rules.

    readings = check_engines(config, tensors, target_config, trained_layer_ids)  # raises EngineRuleError
    reading = engine_reading("sglang", config, tensors, target_config)            # one engine, no trained ids
    readings = check_export_dir("exports/qwen3-8b-dspark", "models/Qwen3-8B")

The facts per layout are its ``ServingLayout`` record's engine readers (``serving_layouts/*_layout.py``; the facts all
layouts share are ``serving_layouts.engine_reading``'s); this module runs them, compares what each engine captures with
the taps the drafter was trained on, and turns the problems into one refusal. Before a layout's reader runs, the
target's family record (``families``) says whether the engine's model class of that target captures features for
the layout's drafters at all; an architecture it does not serve, or one no record covers, is named as such and the
export is still written.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deepspec_train.export.engine_files import STS_FILENAME
from deepspec_train.serving_layouts.engine_reading import (
    ENGINES, EngineReading, ServePaths, architecture_unserved, target_facts,
)
from deepspec_train.serving_layouts.layout_registry import layout_of_config, serving_layout, validate_layout
from deepspec_train.serving_layouts.layout_checks import TensorSpec


class EngineRuleError(ValueError):
    """An export an engine would misread; ``problems`` holds one line per problem, prefixed with the engine."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _serve_paths(target_path: str | None, export_dir: str | None, sps_path: str | None) -> ServePaths:
    export = export_dir or "EXPORT_DIR"
    return ServePaths(
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
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {list(ENGINES)}")
    layout = serving_layout(layout_of_config(config))
    target = target_facts(target_config)
    unserved = architecture_unserved(engine, layout.capture, target)
    if unserved is not None:
        return EngineReading(engine, layout.name, None, unserved=unserved, by_architecture=True)
    reader = layout.engines.get(engine)
    if reader is None:
        return EngineReading(engine, layout.name, None, unserved=f"{engine} has no loader for the {layout.name} layout")
    return reader(config, tensors, target, _serve_paths(target_path, export_dir, sps_path))


def trained_layer_ids(config: Mapping[str, Any]) -> list[int]:
    """The taps (our convention) an export records for its drafter, as our loader reads them."""
    return serving_layout(layout_of_config(config)).taps(config)


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
