"""Streamed drafter groups (``jobs.streamed``): one target worker feeds a DSpark and an EAGLE-3 group,
one drafter rank each, launched as plain ranks the way ``srun`` starts them (``tests/helpers/streaming_world.py``).

Each group's per-step losses, validation metrics and final weights equal, bit for bit, its recipe trained alone
with the same ``run.seed`` and ``run.data_seed`` (the streamed features of one drafter rank are the colocated
ones, ``test_streaming_launch.py``); a group with fewer steps ends while the other goes on; a user error in one
group ends every rank with one line naming the group; SIGTERM leaves one checkpoint per group and
``train.resume=auto`` finishes both as if uninterrupted (the `full` tier).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from deepspec_train.jobs.run import run_training
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.checkable_target import write_checkable_target
from tests.helpers.run_history import assert_same_training, history
from tests.helpers.streaming_world import read_logs, recipe_overrides, run_ranks, start_ranks, wait_all

pytestmark = pytest.mark.slow

RECIPES = ("tiny-dspark", "tiny-eagle3")
# What differs between the two recipes on the streaming world (2 target layers: taps from layer 0 only).
PER_RECIPE = {
    "tiny-dspark": ["target.layer_ids=[0]", "drafter.markov_rank=8"],
    "tiny-eagle3": ["target.layer_ids=[0,0,0]", "drafter.ttt_steps=4"],
}
# 1 target worker + 1 drafter rank per group.
WORLD_SIZE = 3


def common(world: dict[str, str], out: Path, **extra) -> list[str]:
    """The streaming world's overrides every group shares (``recipe=`` and per-recipe values left out)."""
    args = recipe_overrides(world, out, **extra)[1:]
    return [a for a in args if not a.startswith(("target.layer_ids", "drafter.markov_rank"))]


def group_args(world: dict[str, str], out: Path, per_recipe: tuple[str, ...] = (), **extra) -> list[str]:
    """train.py's arguments for a streamed DSpark and EAGLE-3 group under ``out``."""
    taps = [f"{recipe}:{value}" for recipe in RECIPES for value in PER_RECIPE[recipe]]
    return ["recipe=tiny-dspark", "compare=[tiny-eagle3]", *common(world, out, **{"topology.target_workers": 1},
                                                                  **extra), *taps, *per_recipe]


def train_alone(world: dict[str, str], recipe: str, out: Path, extra: list[str], **settings) -> Path:
    """``recipe`` trained alone in this process with the groups' seed and data order; its run directory."""
    overrides = common(world, out, **settings) + PER_RECIPE[recipe] + extra + ["run.seed=0", "run.data_seed=0"]
    run_training(load_recipe(recipe, overrides))
    return out








def test_streamed_groups_train_as_alone_and_a_shorter_group_ends_first(streaming_world, tmp_path: Path) -> None:
    shorter = ("tiny-eagle3:train.max_steps=2",)
    run_ranks(group_args(streaming_world, tmp_path / "run", shorter), WORLD_SIZE, tmp_path / "logs", timeout=240)
    groups = tmp_path / "run" / "groups"
    listed = json.loads((tmp_path / "run" / "groups.json").read_text())["groups"]
    assert [g["label"] for g in listed] == ["tiny-dspark-seed0", "tiny-eagle3-seed0"]
    logs = read_logs(tmp_path / "logs", WORLD_SIZE)
    assert "2 target forwards ran for 4 asked" not in logs and "target forwards ran for" in logs
    assert sorted(history(groups / "tiny-dspark-seed0")) == [1, 2, 3, 4]
    assert sorted(history(groups / "tiny-eagle3-seed0")) == [1, 2]
    assert_same_training(groups / "tiny-dspark-seed0", train_alone(streaming_world, "tiny-dspark", tmp_path / "d", []))
    assert_same_training(groups / "tiny-eagle3-seed0",
                         train_alone(streaming_world, "tiny-eagle3", tmp_path / "e", ["train.max_steps=2"]))


def test_a_user_error_in_one_streamed_group_ends_every_rank_in_one_line(streaming_world, tmp_path: Path) -> None:
    # A folder shaped like an export (config.json and readable safetensors) passes the checks made before the run;
    # that its config names no drafter layout is found on the group's drafter rank, once it loads.
    not_a_drafter = write_checkable_target(tmp_path / "not_a_drafter")
    args = group_args(streaming_world, tmp_path / "run", (f"tiny-eagle3:drafter.init_from={not_a_drafter}",))
    codes = wait_all(start_ranks(["train.py", *args], WORLD_SIZE, tmp_path / "logs"), timeout=240)
    logs = read_logs(tmp_path / "logs", WORLD_SIZE)
    assert codes == [2] * WORLD_SIZE, logs
    errors = [line for line in logs.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "group tiny-eagle3-seed0: drafter.init_from" in errors[0], logs
    assert "Traceback" not in logs


# Full tier: SIGTERM to a streamed run (a drafter group of one, the same job path) is test_preemption's, and
# preemption of several groups (one checkpoint each, resume restores them all) is test_drafter_groups' colocated one.
@pytest.mark.full
def test_preemption_checkpoints_every_streamed_group_and_resume_restores_them(streaming_world, tmp_path: Path) -> None:
    steps = 24
    settings = {"train.max_steps": steps, "train.eval_every": steps, "train.checkpoint_every": steps}
    args = group_args(streaming_world, tmp_path / "run", **settings)
    procs = start_ranks(["train.py", *args], WORLD_SIZE, tmp_path / "logs")
    metrics = tmp_path / "run" / "groups" / "tiny-dspark-seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, read_logs(tmp_path / "logs", 3)
        time.sleep(0.05)
    # The scheduler signals one rank (the target worker); the stop request reaches every group through the store.
    procs[0].send_signal(signal.SIGTERM)
    codes = wait_all(procs, timeout=120)
    assert codes == [PREEMPTED_EXIT_CODE] * WORLD_SIZE, read_logs(tmp_path / "logs", WORLD_SIZE)
    groups = tmp_path / "run" / "groups"
    for recipe in RECIPES:
        kept = list_checkpoints(groups / f"{recipe}-seed0")
        assert len(kept) == 1 and int(kept[0].name.removeprefix("step_")) < steps, kept
    run_ranks(args + ["train.resume=auto"], WORLD_SIZE, tmp_path / "resume_logs", timeout=240)
    for recipe in RECIPES:
        alone = train_alone(streaming_world, recipe, tmp_path / f"alone-{recipe}", [], **settings)
        assert_same_training(groups / f"{recipe}-seed0", alone)
