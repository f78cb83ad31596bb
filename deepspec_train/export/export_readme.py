"""The README.md written into every export: how vLLM and SGLang serve it and what each captures.

``export_readme(config, readings)`` renders the engine readings of ``engine_rules.check_engines``, then the
layout's own section (``ServingLayout.readme_section``: the z-lab layout says how transformers loads it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deepspec_train.export.engine_rules import EngineReading, describe
from deepspec_train.serving_layouts.layout_registry import layout_of_config, serving_layout

README_FILE = "README.md"


def export_readme(config: Mapping[str, Any], readings: Sequence[EngineReading]) -> str:
    """README.md text for an export with ``config``, from the engines' readings."""
    arch = config["architectures"][0]
    lines = [
        f"# {arch} drafter exported by deepspec_train",
        "",
        "Target layers are 0-indexed decoder layers: layer k's output is transformers' `hidden_states[k + 1]`.",
        "",
        "## Serving",
        "",
    ]
    for reading in readings:
        lines += ["```", *describe(reading), "```", ""]
    lines += serving_layout(layout_of_config(config)).readme_section(config)
    return "\n".join(lines)
