"""The serving layouts the pipeline knows, by name, and the one validation that exporter and loader both run.

``serving_layout(name)`` is how every other module asks a question whose answer depends on the layout (see
``serving_layouts.layout_spec``); ``layout_of_config(config)`` names the layout an exported config.json is in. A new
layout is one more record here.

``validate_layout(layout, config, tensors)`` checks a config dict and a name -> tensor (or ``TensorSpec``) map
against the layout: every required config field with a usable value, every required tensor with the shape the
config implies and the right dtype family, no unexpected tensor (a wrapper prefix such as ``model.`` shows up as
missing + unexpected). It raises ``LayoutError`` listing every problem, so an export is never half right. What
each engine then makes of a valid checkpoint is the records' engine readers' business (``export.engine_rules``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from deepspec_train.serving_layouts.dflash2_layout import DFLASH2_LAYOUT
from deepspec_train.serving_layouts.dspark_layout import DSPARK_LAYOUT
from deepspec_train.serving_layouts.eagle3_layout import EAGLE3_LAYOUT
from deepspec_train.serving_layouts.layout_checks import ConfigCheck, TensorSpec
from deepspec_train.serving_layouts.layout_spec import LayoutError, ServingLayout
from deepspec_train.serving_layouts.speculators_dspark_layout import SPECULATORS_DSPARK_LAYOUT
from deepspec_train.serving_layouts.zlab_dflash_layout import ZLAB_DFLASH_LAYOUT

LAYOUTS: dict[str, ServingLayout] = {
    spec.name: spec
    for spec in (DSPARK_LAYOUT, SPECULATORS_DSPARK_LAYOUT, ZLAB_DFLASH_LAYOUT, EAGLE3_LAYOUT, DFLASH2_LAYOUT)
}
FLOAT = "floating point"


def serving_layout(name: str) -> ServingLayout:
    """The record of layout ``name``; a one-line error naming the known layouts otherwise."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; choose one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def layout_of_config(config: Mapping[str, Any]) -> str:
    """The layout an exported config.json is in, from its ``architectures``."""
    archs = config.get("architectures") or []
    for spec in LAYOUTS.values():
        if spec.architecture in archs:
            return spec.name
    known = sorted(spec.architecture for spec in LAYOUTS.values())
    raise LayoutError("unknown", [f"architectures {archs} is none of {known}"])


def spec_of(tensor: torch.Tensor | TensorSpec) -> TensorSpec:
    """Shape and dtype of a tensor (a ``TensorSpec`` is its own)."""
    if isinstance(tensor, TensorSpec):
        return tensor
    return TensorSpec(tuple(int(n) for n in tensor.shape), tensor.dtype)


def expected_tensors(layout: str, config: Mapping[str, Any]) -> dict[str, TensorSpec]:
    """Name -> required shape/dtype for ``config`` in ``layout`` (float dtypes stand for any floating dtype).

    Raises ``LayoutError`` when the config itself is incomplete."""
    spec = serving_layout(layout)
    check = ConfigCheck(config)
    check.equals("architectures", [spec.architecture])
    tensors = spec.check(check)
    if check.problems or tensors is None:
        raise LayoutError(layout, check.problems or ["config incomplete"])
    return tensors


def _dtype_family_ok(expected: torch.dtype, got: torch.dtype) -> bool:
    if expected.is_floating_point:
        return got.is_floating_point
    return got == expected


def validate_layout(
    layout: str, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor | TensorSpec]
) -> None:
    """Raise ``LayoutError`` unless ``config`` and ``tensors`` form a complete, well-shaped ``layout`` checkpoint."""
    expected = expected_tensors(layout, config)
    got = {name: spec_of(t) for name, t in tensors.items()}
    problems = [f"tensor {name} is missing" for name in sorted(expected.keys() - got.keys())]
    problems += [f"unexpected tensor {name}" for name in sorted(got.keys() - expected.keys())]
    for name in sorted(expected.keys() & got.keys()):
        want, have = expected[name], got[name]
        if want.shape != have.shape:
            problems.append(f"tensor {name} has shape {list(have.shape)}, expected {list(want.shape)}")
        if not _dtype_family_ok(want.dtype, have.dtype):
            kind = FLOAT if want.dtype.is_floating_point else str(want.dtype)
            problems.append(f"tensor {name} has dtype {have.dtype}, expected {kind}")
    if problems:
        raise LayoutError(layout, problems)
