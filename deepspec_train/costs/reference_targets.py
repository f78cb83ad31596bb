"""The targets the cost model sizes: the published config of a recipe's target (or of a target without a recipe),
the recipe's drafter on the meta device, and the production recipes of the families beyond Qwen3."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from deepspec_train.config.schema import RecipeConfig


def reference_target_config(cfg: RecipeConfig, name: Optional[str] = None) -> Any:
    """The published config of the recipe's target (named by its ``target.path`` directory, ``models/Qwen3-8B``),
    or of the target ``name``."""
    from deepspec_train.models.family_configs import family_reference_configs
    from deepspec_train.models.reference_configs import reference_configs

    name = name or Path(cfg.target.path).name
    configs = reference_configs() | family_reference_configs()
    if name not in configs:
        raise KeyError(f"no reference config for target {name!r}; known: {sorted(configs)}")
    return configs[name]


def meta_drafter(cfg: RecipeConfig, hf_config: Any) -> torch.nn.Module:
    """The recipe's drafter for ``hf_config``, on the meta device (shapes only, no memory)."""
    from deepspec_train.kinds.builder import build_drafter_for_geometry
    from deepspec_train.models.geometry import geometry_from_target_config

    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    with torch.device("meta"):
        return build_drafter_for_geometry(cfg, geometry)


def recipe_and_target(recipe: str, target: Optional[str]) -> tuple[RecipeConfig, Any]:
    """The recipe, its taps moved to ``target``'s (when given, for a target without a recipe), and the config."""
    import dataclasses

    from deepspec_train.kinds.recipe_validation import load_recipe
    from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS

    cfg = load_recipe(recipe, check_target=False)
    if target is not None:
        cfg = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, layer_ids=REFERENCE_LAYER_IDS[target]))
    return cfg, reference_target_config(cfg, target)


# The production recipes of the target families beyond Qwen3 (Llama 3, Gemma 3, GPT-OSS, DeepSeek-V3 / Kimi-K2).
FAMILY_RECIPES = (
    "llama-3.1-8b", "llama-3.1-8b-dflash", "llama-3.1-8b-eagle3", "llama-3.3-70b", "gemma-3-12b", "gpt-oss-20b",
    "gpt-oss-120b", "deepseek-v3", "kimi-k2",
)
