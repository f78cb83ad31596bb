"""Export plans of the production recipes at their real target shapes (drafters on the meta device, nothing
allocated or written), and the table of what each serving engine captures from them.

    python -m deepspec_train.export.production_plans        # markdown table: recipe x engine -> captured layers

``production_export_plan(recipe)`` gives the plan, the target config and the recipe, for tests and for checks of
the engine rules (``engine_rules.check_engines``) at production shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.export.engine_rules import check_engines
from deepspec_train.export.exporter import ExportPlan, default_layout, plan_export
from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.serving_layouts.engine_reading import ENGINES, EngineReading
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.costs.reference_targets import FAMILY_RECIPES, meta_drafter, reference_target_config

PRODUCTION_RECIPES = (
    *(f"qwen3-{size}{variant}" for size in ("4b", "8b", "14b") for variant in ("", "-dflash", "-eagle3")),
    "qwen3-8b-dflash2",
    "qwen3-8b-v32k",
    "qwen3-8b-32k",
    "qwen3-8b-eagle3-32k",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
)


def production_export_plan(recipe: str) -> tuple[ExportPlan, dict, RecipeConfig]:
    """``(plan, target config dict, recipe)`` of ``recipe``'s drafter exported in its default layout."""
    # The production targets are not on this machine: their published configs stand in for config.json.
    cfg = load_recipe(recipe, check_target=False)
    hf_config = reference_target_config(cfg)
    module = meta_drafter(cfg, hf_config)
    d = cfg.drafter
    mask = d.mask_token_id if kind_spec(d.kind).uses_mask_token else None
    loaded = LoadedDrafter(module, d.kind, d.block_size, list(cfg.target.layer_ids), mask, None, d.labels, "training")
    target_config = hf_config.to_dict()
    plan = plan_export(loaded, target_config, default_layout(loaded), num_anchors=cfg.anchors.num_per_sequence)
    return plan, target_config, cfg


def production_readings(recipe: str) -> list[EngineReading]:
    """Every engine's reading of ``recipe``'s export (refused exports raise ``EngineRuleError``)."""
    plan, target_config, cfg = production_export_plan(recipe)
    return check_engines(plan.config, plan.tensors, target_config, cfg.target.layer_ids)


def capture_table(recipes: Sequence[str] = PRODUCTION_RECIPES + FAMILY_RECIPES) -> str:
    """Markdown table: for each recipe, its layout, trained taps and what each engine captures."""
    lines = ["| recipe | layout | trained taps | " + " | ".join(f"{e} captures" for e in ENGINES) + " |",
             "|---" * (3 + len(ENGINES)) + "|"]
    for recipe in recipes:
        plan, _, cfg = production_export_plan(recipe)
        readings = {r.engine: r for r in production_readings(recipe)}
        cells = []
        for engine in ENGINES:
            reading = readings[engine]
            cells.append("not served" if reading.unserved else " ".join(map(str, reading.captured_layers)))
        taps = " ".join(map(str, cfg.target.layer_ids))
        lines.append(f"| {recipe} | {plan.layout} | {taps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(capture_table())
