"""Drafter groups at a production recipe's shapes: a DSpark (``qwen3-8b``) and an EAGLE-3 (``qwen3-8b-eagle3``)
group over one pass of the Qwen3-8B scale copy (36 layers, vocabulary 151,936, the recipes' taps, anchors,
Markov rank and 32,000-token draft vocabulary; ``tests/helpers/scale_world.py``) train 2 steps, each bit for bit
as its recipe trained alone (per-step losses, validation metrics, final weights): colocated in the default run,
streamed (1 target worker + one drafter rank per group, real processes through ``train.py``) in the full tier.
Both compare with the same alone runs, trained once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepspec_train.commands.train_entry import main
from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.run_history import assert_same_training, history
from tests.helpers.scale_world import build_scale_world, scale_overrides
from tests.helpers.streaming_world import run_ranks

# One intra-op thread here, as in the streamed ranks: a streamed group and its recipe trained alone in this
# process then reduce in the same order and their final weights are bit-identical, not only their losses.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

RECIPES = ("qwen3-8b", "qwen3-8b-eagle3")
GROUP_ARGS = ["recipe=qwen3-8b", "compare=[qwen3-8b-eagle3]"]


@pytest.fixture(scope="module")
def scale_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drafter_groups_scale")


@pytest.fixture(scope="module")
def world(scale_root: Path) -> dict[str, str]:
    return build_scale_world(scale_root / "world", "Qwen3-8B")


@pytest.fixture(scope="module")
def alone(scale_root: Path, world: dict[str, str], one_torch_thread: None) -> dict[str, Path]:
    """Each recipe trained alone in this process with the groups' data order; its run directory by recipe."""
    runs = {recipe: scale_root / f"alone-{recipe}" for recipe in RECIPES}
    for recipe, out in runs.items():
        run_training(load_recipe(recipe, scale_overrides(world, out) + ["run.data_seed=0"]))
    return runs





def assert_groups_trained_as_alone(run_dir: Path, alone: dict[str, Path]) -> None:
    for recipe, expected in alone.items():
        group = run_dir / "groups" / f"{recipe}-seed0"
        assert sorted(history(group)) == [1, 2]
        assert_same_training(group, expected)


def test_dspark_and_eagle3_groups_train_as_alone_on_the_qwen3_8b_copy(
    world: dict[str, str], alone: dict[str, Path], tmp_path: Path
) -> None:
    assert main([*GROUP_ARGS, *scale_overrides(world, tmp_path / "groups")]) == 0
    assert_groups_trained_as_alone(tmp_path / "groups", alone)


@pytest.mark.full
def test_streamed_dspark_and_eagle3_groups_train_as_alone_on_the_qwen3_8b_copy(
    world: dict[str, str], alone: dict[str, Path], tmp_path: Path
) -> None:
    overrides = scale_overrides(world, tmp_path / "groups", **{"topology.target_workers": 1})
    # 1 target worker + 1 drafter rank per group.
    run_ranks([*GROUP_ARGS, *overrides], 1 + len(RECIPES), tmp_path / "logs", timeout=600)
    assert_groups_trained_as_alone(tmp_path / "groups", alone)
