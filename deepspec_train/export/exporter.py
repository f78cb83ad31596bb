"""Write a trained drafter in a serving layout: ``config.json`` + ``model.safetensors`` (never pickle).

``export_drafter`` loads the drafter (training output or an earlier export) with the project's loader, plans the
export (``plan_export``: the target's ``config.json`` plus the layout's fields, and the tensors under their
serving names, which are already the modules' own names), validates the plan with ``validate_layout``
and checks it against the engines' rules (``engine_rules.check_engines``: captured layers, refused tensors,
needed fields) before a single byte is written; a plan with a missing field or tensor, a wrong shape, or one an
engine would misread is refused. Next to the weights go a README.md (per engine: what it captures, the serve
lines), the SGLang STS file when a calibration is given, and the layout's companion files (the z-lab layout's
``dflash.py`` modeling file, which ``AutoModel.from_pretrained(DIR, trust_remote_code=True)`` loads). Everything
that depends on the layout comes from its ``ServingLayout`` record (``serving_layouts.layout_registry``).

The config is the target's minus the fields that would change the drafter the engines build (its
``quantization_config``, ``auto_map``, legacy ``rope_scaling``), with the drafter's own layer fields written out
(``serving_layouts.draft_layers``: ``head_dim``, no attention bias, SiLU, the one RoPE its layers use) and the layout's
``model_type`` (``qwen3``; EAGLE-3 ``llama``), never the target family's: vLLM turns a ``deepseek_v3`` draft
config into a DeepSeek MTP draft, and each family's config class fills in its own defaults.

Which drafter goes in which layout (the kinds' ``layouts``): DSpark -> ``dspark``; DFlash trained with DSpark
labels -> ``dspark`` (``markov_rank 0``, no confidence head); DFlash trained with z-lab labels -> ``zlab-dflash``;
EAGLE-3 -> ``eagle3`` (``d2t`` / ``t2d`` only for a reduced draft vocabulary). Any other combination is refused:
weights trained with one label convention compute something else under the other. A layout that stores copies of the
target's ``embed_tokens`` / ``lm_head`` (DSpark's) gets them from the target checkpoint so that engines which use
the target's own heads get the same model.

Run as ``deepspec export --drafter RUN/drafter --target TARGET --out DIR`` (see ``deepspec_train.export.cli``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from deepspec_train.config.schema import AnchorConfig
from deepspec_train.common.disk_space import tensor_bytes, whole_or_nothing
from deepspec_train.export.engine_files import STS_FILENAME, read_sts, write_strict_json
from deepspec_train.export.engine_rules import check_engines
from deepspec_train.export.export_readme import README_FILE, export_readme
from deepspec_train.formats.drafter_loader import (
    EXPORT_CONFIG,
    EXPORT_WEIGHTS,
    FINGERPRINT_FIELD,
    LoadedDrafter,
    load_exported_drafter,
    read_tensor_specs,
    resolve_drafter_dir,
)
from deepspec_train.serving_layouts.draft_layers import TARGET_ONLY_FIELDS, drafter_layer_fields
from deepspec_train.serving_layouts.layout_registry import layout_of_config, serving_layout, validate_layout
from deepspec_train.serving_layouts.layout_spec import LayoutError, WrittenDrafter
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.target.head_weights import load_head_weights

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


@dataclass
class ExportPlan:
    """Everything an export writes: the layout, the config dict and the tensors (validated together)."""

    layout: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]


def default_layout(loaded: LoadedDrafter) -> str:
    """The layout a drafter exports to when none is asked for: the first of its kind's layouts that holds it."""
    layouts = [name for name in kind_spec(loaded.kind).layouts(loaded.labels) if serving_layout(name).holds(loaded.module)]
    if not layouts:
        raise LayoutError("none", [f"a {loaded.kind} drafter trained with {loaded.labels} labels has no serving layout"])
    return layouts[0]


def check_layout_fits(loaded: LoadedDrafter, layout: str) -> None:
    """Refuse a drafter / layout combination whose serving semantics would differ from training: weights trained
    with one label convention compute something else under the other, and a layout without a draft vocabulary
    cannot hold a drafter that has one."""
    spec = serving_layout(layout)
    allowed = kind_spec(loaded.kind).layouts(loaded.labels)
    if layout not in allowed:
        problem = (
            f"a {loaded.kind} drafter trained with {loaded.labels} labels exports only as "
            f"{' / '.join(allowed) or 'nothing'}, not {layout} (the DSpark layout holds DSpark-label dspark/dflash "
            f"drafters, zlab-dflash a DFlash trained with drafter.labels=zlab, eagle3 an EAGLE-3)"
        )
        raise LayoutError(layout, [problem])
    if not spec.holds(loaded.module):
        fitting = [name for name in allowed if serving_layout(name).holds(loaded.module)]
        raise LayoutError(layout, [
            f"the {layout} layout cannot hold this {loaded.kind} drafter (a reduced draft vocabulary needs a layout "
            f"with one); export it as {' / '.join(fitting) or 'nothing'}"
        ])


def target_config_as_loaded(target_config: Mapping[str, Any]) -> Any:
    """The target's config.json as training read it (``AutoConfig`` without remote code): parsed by the
    transformers class of its ``model_type``, whose derived fields count (DeepSeek-V3's config.json has no
    ``head_dim``; ``DeepseekV3Config`` makes it ``qk_rope_head_dim``, not hidden / heads); a model type transformers
    does not know (Kimi-K2's ``kimi_k2``, read with remote code) is taken field by field."""
    from transformers import AutoConfig

    fields = dict(target_config)
    model_type = fields.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError:
        return SimpleNamespace(**target_config)


def check_same_geometry(geometry: DrafterGeometry, target_config: Mapping[str, Any]) -> None:
    """Refuse to pair a drafter with a target of another shape (only the drafter's MLP width may differ)."""
    try:
        target = geometry_from_target_config(target_config_as_loaded(target_config), geometry.intermediate_size)
    except AttributeError as err:
        raise ValueError(f"target config.json lacks a geometry field: {err}") from err
    diffs = [
        f"{f.name}: drafter {getattr(geometry, f.name)} vs target {getattr(target, f.name)}"
        for f in dataclasses.fields(DrafterGeometry)
        if getattr(geometry, f.name) != getattr(target, f.name)
    ]
    if diffs:
        raise ValueError("drafter was not built for this target: " + "; ".join(diffs))


def plan_export(
    loaded: LoadedDrafter,
    target_config: Mapping[str, Any],
    layout: str | None = None,
    confidence_temperatures: Sequence[float] | None = None,
    num_anchors: int = AnchorConfig().num_per_sequence,
    dtype: torch.dtype = torch.bfloat16,
) -> ExportPlan:
    """Config and tensors of ``loaded`` in ``layout`` (default: ``default_layout``), validated; writes nothing.

    Works on a module built on the meta device (the plan then only carries names, shapes and dtypes)."""
    layout = layout or default_layout(loaded)
    check_layout_fits(loaded, layout)
    spec = serving_layout(layout)
    if confidence_temperatures is not None and not spec.carries_temperatures:
        raise LayoutError(layout, ["confidence temperatures only go into the DSpark layout"])
    module = loaded.module
    check_same_geometry(module.geometry, target_config)
    num_layers = spec.depth(module)
    config = {key: value for key, value in target_config.items() if key not in TARGET_ONLY_FIELDS}
    dtype_name = _DTYPE_NAMES[dtype]
    config.update(
        architectures=[spec.architecture],
        num_hidden_layers=num_layers,
        intermediate_size=module.geometry.intermediate_size,
        layer_types=["full_attention"] * num_layers,
        # transformers 5 reads "dtype", older readers "torch_dtype".
        dtype=dtype_name,
        torch_dtype=dtype_name,
        # The drafter's own layer fields, whatever the target family has (Gemma's per-type RoPE, GPT-OSS's biases).
        **drafter_layer_fields(module.geometry),
    )
    temperatures = None if confidence_temperatures is None else list(confidence_temperatures)
    fingerprint = loaded.target_fingerprint or {}
    written = WrittenDrafter(module, loaded.block_size, loaded.mask_token_id, list(loaded.target_layer_ids),
                             num_anchors, temperatures, dict(target_config), str(fingerprint.get("path") or ""))
    config.update(spec.fields(written))
    if loaded.target_fingerprint is not None:
        config[FINGERPRINT_FIELD] = dict(loaded.target_fingerprint)
    omitted = spec.unwritten(module)
    tensors = {
        name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).contiguous()
        for name, t in module.state_dict().items()
        if name not in omitted
    }
    validate_layout(layout, config, tensors)
    return ExportPlan(layout=layout, config=config, tensors=tensors)


def recorded_num_anchors(drafter_dir: str | Path) -> int:
    """Anchors per sequence the drafter was trained with: an export's ``num_anchors``, else the training run's
    resolved recipe next to ``<run>/drafter``, else the schema default."""
    root = resolve_drafter_dir(drafter_dir)
    config = root / EXPORT_CONFIG
    if config.is_file():
        value = json.loads(config.read_text()).get("num_anchors")
        if value is not None:
            return int(value)
    resolved = root.parent / "resolved_config.yaml"
    if resolved.is_file():
        return int(yaml.safe_load(resolved.read_text())["anchors"]["num_per_sequence"])
    return AnchorConfig().num_per_sequence


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    # Write then rename, so a crash never leaves a truncated config next to good weights.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def export_drafter(
    drafter_dir: str | Path,
    target_path: str | Path,
    out_dir: str | Path,
    layout: str | None = None,
    confidence_temperatures: Sequence[float] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    engines: Sequence[str] | None = None,
    sts_file: str | Path | None = None,
) -> Path:
    """Export the drafter at ``drafter_dir`` for the target at ``target_path`` into ``out_dir``; returns it.

    Temperatures default to those already in ``drafter_dir`` (an earlier calibrated export). Before a byte is
    written, the plan is checked against the engines' rules (``engine_rules.check_engines``: ``engines`` default to
    every engine that serves the layout); a refused export raises ``EngineRuleError``. ``sts_file`` (SGLang's STS
    calibration file from ``deepspec calibrate``) is validated and copied next to the export. The export also gets
    a README.md (how each engine serves it) and the layout's companion files (the z-lab layout's dflash.py)."""
    target_path = str(target_path)
    loaded = load_exported_drafter(drafter_dir, target_path)
    target_config = json.loads((Path(target_path) / "config.json").read_text())
    layout = layout or default_layout(loaded)
    spec = serving_layout(layout)
    if spec.copies_target_heads:
        loaded.module.load_target_heads(*load_head_weights(target_path))
    temperatures = confidence_temperatures
    if temperatures is None and spec.carries_temperatures:
        temperatures = loaded.confidence_temperatures
    plan = plan_export(loaded, target_config, layout, temperatures, recorded_num_anchors(drafter_dir), dtype)
    out = Path(out_dir)
    readings = check_engines(plan.config, plan.tensors, target_config, loaded.target_layer_ids, engines,
                             target_path, str(out))
    sts = _checked_sts(sts_file, plan) if sts_file is not None else None
    out.mkdir(parents=True, exist_ok=True)
    # Under a temporary name first: a disk that fills mid-write leaves no weights file a loader takes for whole.
    weights, partial = out / EXPORT_WEIGHTS, out / f".{EXPORT_WEIGHTS}.tmp"
    with whole_or_nothing(weights, tensor_bytes(plan.tensors), lambda: partial.unlink(missing_ok=True)):
        save_file(plan.tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, weights)
    _write_json(out / EXPORT_CONFIG, plan.config)
    for name, text in spec.companion_files().items():
        (out / name).write_text(text)
    if sts is not None:
        write_strict_json(out / STS_FILENAME, sts)
    (out / README_FILE).write_text(export_readme(plan.config, readings))
    return out


def _checked_sts(sts_file: str | Path, plan: ExportPlan) -> dict[str, Any]:
    """The STS file, validated against the export it goes next to (a DSpark layout with a confidence head)."""
    sts = read_sts(sts_file)
    if not serving_layout(plan.layout).carries_temperatures or not plan.config.get("enable_confidence_head"):
        problem = "an STS calibration file only goes with a DSpark export with a confidence head"
        raise LayoutError(plan.layout, [problem])
    if len(sts["temperatures"]) != plan.config["block_size"]:
        problem = f"{sts_file} has {len(sts['temperatures'])} temperatures, block_size is {plan.config['block_size']}"
        raise LayoutError(plan.layout, [problem])
    return sts


def write_confidence_temperatures(export_dir: str | Path, temperatures: Sequence[float]) -> Path:
    """Store calibrated per-position temperatures in a DSpark export's config.json (re-validated first)."""
    root = Path(export_dir)
    path = root / EXPORT_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no {EXPORT_CONFIG}; --drafter must name an exported DSpark directory")
    config = json.loads(path.read_text())
    layout = layout_of_config(config)
    if not serving_layout(layout).carries_temperatures:
        raise LayoutError(layout, ["confidence temperatures only go into the DSpark layout"])
    config["confidence_temperatures"] = [float(t) for t in temperatures]
    validate_layout(layout, config, read_tensor_specs(root / EXPORT_WEIGHTS))
    _write_json(path, config)
    return path
