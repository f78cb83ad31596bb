"""The one validation of a training recipe: its types (``config.loader``), the rules of ``config.rules``, the
anchor rate's (``packing.anchor_counts``), the drafter kind's own rules (``kinds``) and, when asked,
the rules that need the target's ``config.json`` (the kind's too), after the settings a recipe leaves null are taken from the target
(``config.target_tokens``).

It sits in ``kinds``, above the kind records and ``config``, so that neither imports the other's rules: the kind
records import the config schema, and the schema knows nothing of kinds. Every entry point loads recipes through
``load_recipe``; what it returns has passed every rule, and the rest of the pipeline trusts it.
"""

from __future__ import annotations

from deepspec_train.config.loader import ConfigError, read_recipe
from deepspec_train.config.rules import read_target_config, recipe_problems, target_problems
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.config.target_tokens import resolve as resolve_from_target
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.packing.anchor_counts import anchor_rate_problems


def recipe_and_kind_problems(cfg: RecipeConfig) -> list[str]:
    """The rules that need the recipe only: ``config.rules`` first, the anchor rate's
    (``packing.anchor_counts``), then the drafter kind's (once the kind's name itself is known to be valid, which
    the schema's types guarantee)."""
    return (
        recipe_problems(cfg)
        + anchor_rate_problems(cfg.anchors, cfg.data.max_length)
        + kind_spec(cfg.drafter.kind).recipe_problems(cfg)
    )


def load_recipe(name_or_path: str, overrides: list[str] | None = None, check_target: bool = True) -> RecipeConfig:
    """Find, merge, override and validate a recipe: types first, then every rule (see the module docstring).

    ``check_target`` also reads the target's ``config.json`` (never its weights) for the rules that need it; tools
    that only look at a recipe's shape (sizing, data preparation) leave it off.
    """
    path, cfg = read_recipe(name_or_path, overrides)
    problems = recipe_and_kind_problems(cfg)
    if check_target and not problems:
        spec = kind_spec(cfg.drafter.kind)
        uses_mask_token = spec.uses_mask_token
        try:
            target_config = read_target_config(cfg.target.path)
            resolve_from_target(cfg, target_config, uses_mask_token, spec.default_taps)
            problems = target_problems(cfg, target_config, uses_mask_token)
            if spec.target_problems is not None:
                problems += spec.target_problems(cfg, target_config)
        except (OSError, ValueError) as exc:
            problems = [str(exc)]
    if problems:
        raise ConfigError(f"recipe {path.stem}: " + "; ".join(problems))
    return cfg
