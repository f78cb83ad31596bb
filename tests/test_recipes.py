"""Recipes: every recipe in recipes/ validates, and bad recipes or overrides fail early with one line.

These tests look at recipes only: their targets are not on this machine, so ``check_target=False`` (the rules
that read a target's config.json are tested in ``test_recipe_rules.py`` against a real one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deepspec_train.config.loader import ConfigError, available_recipes, save_resolved
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.schema import RecipeConfig

REPO = Path(__file__).resolve().parents[1]
RECIPE_FILES = sorted((REPO / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPE_FILES, ids=[p.stem for p in RECIPE_FILES])
def test_every_recipe_validates(path: Path) -> None:
    cfg = load_recipe(path.stem, check_target=False)
    assert isinstance(cfg, RecipeConfig)
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# Launch:") and f"recipe={path.stem}" in first_line
    assert cfg.run.name == path.stem


def test_tiny_recipes_exist() -> None:
    assert {"tiny-dspark", "tiny-dflash", "tiny-eagle3"} <= set(available_recipes())


def test_overrides_apply_and_coerce() -> None:
    overrides = ["train.lr=0.01", "drafter.num_layers=3", "target.layer_ids=[0,2]", "loss.alpha_tv=1"]
    cfg = load_recipe("tiny-dspark", overrides, check_target=False)
    assert cfg.train.lr == 0.01 and cfg.drafter.num_layers == 3 and cfg.target.layer_ids == [0, 2]
    assert isinstance(cfg.loss.alpha_tv, float)


@pytest.mark.parametrize("raw, expected", [("3e-4", 3e-4), ("1E-3", 1e-3), ("+2.5e+1", 25.0), (".5e2", 50.0)])
def test_float_overrides_in_exponent_form(raw: str, expected: float) -> None:
    # YAML 1.1 reads '3e-4' as a string; a float field takes it as the number Python reads.
    assert load_recipe("tiny-dspark", [f"train.lr={raw}"], check_target=False).train.lr == expected


def test_negative_float_in_exponent_form_is_read_then_refused() -> None:
    with pytest.raises(ConfigError, match=r"train.lr = -25.0 must be a positive number"):
        load_recipe("tiny-dspark", ["train.lr=-2.5e+1"], check_target=False)


def test_base_inheritance() -> None:
    dflash = load_recipe("tiny-dflash", check_target=False)
    dspark = load_recipe("tiny-dspark", check_target=False)
    assert dflash.drafter.markov_rank == 0 and not dflash.drafter.confidence_head
    assert dflash.drafter.num_layers == dspark.drafter.num_layers
    assert dflash.train.max_steps == dspark.train.max_steps


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.no_such_key=1"], "unknown key 'model'"),
        (["drafter.num_layerz=2"], "did you mean 'drafter.num_layers'"),
        (["train.lr=fast"], "'train.lr' must be a number"),
        (["drafter.num_layers=2.5"], "'drafter.num_layers' must be an integer"),
        (["drafter.kind=medusa"], "is not one of"),
        (["logging.wandb=maybe"], "must be true or false"),
        (["target.layer_ids=3"], "must be a list"),
        (["train.lr"], "dotted.key=value"),
    ],
)
def test_bad_overrides(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("tiny-dspark", overrides, check_target=False)


def test_unknown_recipe_suggests_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'tiny-dspark'"):
        load_recipe("tiny-dspak", check_target=False)


def test_bad_recipe_file_names_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("# Launch: none\ndrafter:\n  block_sise: 7\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(str(bad), check_target=False)
    assert str(bad) in str(info.value) and "drafter.block_size" in str(info.value)
    assert "\n" not in str(info.value)


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_recipe("tiny-eagle3", ["train.max_steps=3"], check_target=False)
    out = tmp_path / "resolved.yaml"
    save_resolved(cfg, out)
    assert load_recipe(str(out), check_target=False) == cfg


@pytest.mark.parametrize(
    "args, message",
    [(["recipe=does-not-exist"], "unknown recipe 'does-not-exist'"), (["recipe=tiny-dspark", "model.no_such_key=1"], "unknown key 'model'")],
)
def test_train_py_fails_in_one_line(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
