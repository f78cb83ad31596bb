"""Per target architecture: whether an engine serves a drafter layout for it at all, and how SGLang reads an
EAGLE-3 config's layer ids for it. The facts are the target families' (``families.catalog``, read in vLLM 0.33.0
and SGLang 0.5.23); ``engine_rules`` asks here before applying its layout rules, so an export for a target an
engine does not serve, or whose rule is not known, is named as such and still written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deepspec_train.families.catalog import architecture_of, family_of


def architecture_unserved(engine: str, layout: str, target_config: Mapping[str, Any]) -> str | None:
    """Why ``engine`` serves no ``layout`` drafter for this target, or None when it does."""
    family = family_of(target_config)
    if family is None:
        return (f"its capture rule for a {architecture_of(target_config) or 'config without architectures'} "
                "target is not known here (no target family record): check the engine's model class before "
                "serving")
    return family.engines[engine].unserved(layout)


def sglang_eagle3_capture_points(ids: Sequence[int], target_config: Mapping[str, Any]) -> list[int] | None:
    """The capture points SGLang's ``set_eagle3_layers_to_capture`` makes of ``eagle_config`` ids for this
    target's class (None when the family is not known)."""
    family = family_of(target_config)
    if family is None:
        return None
    return family.engines["sglang"].eagle3_points(list(ids), int(target_config["num_hidden_layers"]))
