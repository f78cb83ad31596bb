"""Drafter groups (``jobs.drafter_groups``, ``jobs.colocated``): one colocated run trains several drafters
over one target pass, each bit for bit as its recipe trained alone with the same ``run.seed`` and
``run.data_seed`` (per-step losses, validation metrics, final weights), on the `test`-preset tiny world.

Also: the union tap's views equal single taps; a group with fewer steps ends and the others go on; a bad value in
the second recipe, a setting the groups do not share and a user error met by one group during the run each end
the run in one line; SIGTERM writes one checkpoint per group, all at the same step, and ``train.resume=auto``
then finishes every group as an uninterrupted grouped run does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from deepspec_train.commands.train_entry import main
from deepspec_train.jobs.run import run_training
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.shared_pass import SharedTargetPass
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.run_history import assert_same_training, history, records
from tests.helpers.tiny_world_overrides import LAYER_IDS, training_overrides

REPO = Path(__file__).resolve().parents[1]
RECIPES = ("tiny-dspark", "tiny-eagle3")


def group_args(tiny_world: Path, out: Path, seeds: int = 1, steps: int = 4, extra: tuple[str, ...] = ()) -> list[str]:
    """train.py's arguments for a DSpark and an EAGLE-3 group per seed on the tiny world, under ``out / 'run'``."""
    common = [o for o in training_overrides(tiny_world, "tiny-dspark", out, steps) if not o.startswith("target.")]
    common.append(f"target.path={tiny_world / 'target'}")
    taps = [f"{recipe}:target.layer_ids={LAYER_IDS[recipe]}" for recipe in RECIPES]
    return ["recipe=tiny-dspark", "compare=[tiny-eagle3]", f"seeds={seeds}", *common, *taps, *extra]


def train_alone(tiny_world: Path, recipe: str, out: Path, seed: int, steps: int = 4) -> Path:
    """The recipe trained alone with the group's seed and data order; its run directory."""
    run_training(load_recipe(recipe, training_overrides(tiny_world, recipe, out, steps)
                             + [f"run.seed={seed}", "run.data_seed=0"]))
    return out / "run"


def test_views_of_the_union_tap_equal_taps_on_their_own_layers() -> None:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    shared = SharedTargetPass(model, [[2, 0], [1, 2, 2]])
    for layers in ([2, 0], [1, 2, 2]):
        alone = TargetTap(model, layers)(ids, mask)
        view = shared.view(layers)(ids, mask)
        assert torch.equal(view.ctx_features, alone.ctx_features)
        assert torch.equal(view.final_hidden, alone.final_hidden)
    assert (shared.forwards, shared.requests) == (1, 2)
    shared.clear()
    shared.view([0])(ids, mask)
    assert shared.forwards == 2


def test_each_group_trains_as_its_recipe_alone(tiny_world: Path, tmp_path: Path) -> None:
    assert main(group_args(tiny_world, tmp_path, seeds=2)) == 0
    listed = json.loads((tmp_path / "run" / "groups.json").read_text())["groups"]
    labels = [g["label"] for g in listed]
    assert labels == ["tiny-dspark-seed0", "tiny-dspark-seed1", "tiny-eagle3-seed0", "tiny-eagle3-seed1"]
    for group in listed:
        alone = train_alone(tiny_world, group["recipe"], tmp_path / f"alone-{group['label']}", group["seed"])
        run_dir = Path(group["output_dir"])
        assert run_dir == tmp_path / "run" / "groups" / group["label"]
        assert_same_training(run_dir, alone)
        logged = records(run_dir)
        assert sorted({r["step"] for r in logged if "train/loss" in r}) == [1, 2, 3, 4]
        assert any("val/expected_len" in r for r in logged)
    # The two seeds of one recipe trained differently, from the same sequences.
    assert history(tmp_path / "run" / "groups" / labels[0]) != history(tmp_path / "run" / "groups" / labels[1])


def test_a_group_with_fewer_steps_ends_and_the_others_go_on(tiny_world: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = group_args(tiny_world, tmp_path, extra=("tiny-eagle3:train.max_steps=2", "tiny-eagle3:train.eval_every=2",
                                                  "tiny-eagle3:train.checkpoint_every=2", "logging.wandb=true"))
    assert main(args) == 0
    groups = tmp_path / "run" / "groups"
    # One W&B run per group, open side by side in the one process.
    assert all(len(list((groups / label / "wandb").glob("offline-run-*"))) == 1
               for label in ("tiny-dspark-seed0", "tiny-eagle3-seed0"))
    assert max(r["step"] for r in records(groups / "tiny-eagle3-seed0")) == 2
    assert max(r["step"] for r in records(groups / "tiny-dspark-seed0")) == 4
    assert_same_training(groups / "tiny-dspark-seed0", train_alone(tiny_world, "tiny-dspark", tmp_path / "d", 0))
    assert_same_training(groups / "tiny-eagle3-seed0", train_alone(tiny_world, "tiny-eagle3", tmp_path / "e", 0, 2))


@pytest.mark.parametrize("override, expected", [
    ("tiny-eagle3:drafter.num_layers=0", "error: group tiny-eagle3-seed0: recipe tiny-eagle3: drafter.num_layers"),
    ("tiny-eagle3:data.max_length=256", "error: group tiny-eagle3-seed0: drafter groups share one target and one "
                                        "data order, but data.max_length = 256 here and 512"),
    ("tiny-eagle3:topology.target_workers=1", "error: group tiny-eagle3-seed0: drafter groups share one target and "
                                              "one data order, but topology.target_workers = 1 here and 0"),
])
def test_a_bad_group_is_refused_in_one_line_before_anything_loads(tiny_world: Path, tmp_path: Path, capsys,
                                                                  override: str, expected: str) -> None:
    assert main(group_args(tiny_world, tmp_path, extra=(override,))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected), err
    assert not (tmp_path / "run").exists()


def test_a_user_error_in_one_group_ends_the_run_in_one_line(tiny_world: Path, tmp_path: Path, capsys) -> None:
    # A folder that exists passes the recipe's rules; that it holds no drafter is found before anything loads.
    not_a_drafter = tmp_path / "not_a_drafter"
    not_a_drafter.mkdir()
    assert main(group_args(tiny_world, tmp_path, extra=(f"tiny-eagle3:drafter.init_from={not_a_drafter}",))) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: group tiny-eagle3-seed0: drafter.init_from"), err
    assert not (tmp_path / "run" / "groups" / "tiny-dspark-seed0" / "drafter").exists()


def test_dry_run_prints_every_group_and_writes_nothing(tiny_world: Path, tmp_path: Path, capsys) -> None:
    assert main(group_args(tiny_world, tmp_path, seeds=2) + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("# group ") == 4 and "data_seed: 0" in out and "wandb_group: tiny-dspark-groups" in out
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_preemption_checkpoints_every_group_and_resume_restores_them_all(tiny_world: Path, tmp_path: Path,
                                                                          one_torch_thread) -> None:
    # The preempted part runs in a one-thread process: the parts run here must too, since a second intra-op thread
    # changes the losses' last bits.
    steps = 40
    cadence = (f"train.eval_every={steps}", f"train.checkpoint_every={steps}")
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(group_args(tiny_world, full, steps=steps, extra=cadence)) == 0
    args = group_args(tiny_world, split, steps=steps, extra=cadence)
    log = tmp_path / "split.log"
    with open(log, "w") as handle:
        proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=handle,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    metrics = split / "run" / "groups" / "tiny-dspark-seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE, log.read_text()
    kept = {label: list_checkpoints(split / "run" / "groups" / label) for label in ("tiny-dspark-seed0",
                                                                                    "tiny-eagle3-seed0")}
    assert all(len(paths) == 1 for paths in kept.values()), kept
    assert len({paths[0].name for paths in kept.values()}) == 1, kept
    assert int(kept["tiny-dspark-seed0"][0].name.removeprefix("step_")) < steps
    assert main(args + ["train.resume=auto"]) == 0
    for label in kept:
        assert_same_training(split / "run" / "groups" / label, full / "run" / "groups" / label)


def test_a_streamed_launch_whose_drafter_ranks_do_not_split_into_the_groups_is_refused(tiny_world: Path, tmp_path: Path,
                                                                                       capsys, monkeypatch) -> None:
    # 1 target worker + 3 drafter ranks for 2 groups.
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert main(group_args(tiny_world, tmp_path, extra=("topology.target_workers=1",)) + ["--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 drafter ranks" in err[0] and "2 drafter groups" in err[0], err
    monkeypatch.setenv("WORLD_SIZE", "5")
    assert main(group_args(tiny_world, tmp_path, extra=("topology.target_workers=1",)) + ["--dry-run"]) == 0


def test_sizing_counts_every_group_s_drafter_ranks_behind_one_target_pass() -> None:
    from deepspec_train.costs.groups import balance_grouped, grouped_row

    # A target 4 times as fast as a drafter: 1 target worker keeps up with 4 drafter ranks per group.
    split = balance_grouped({1: 4.0}, [1.0, 1.0, 2.0], gpus=16, global_batch=16)
    assert split.gpus == split.split.groups + 3 * split.split.drafters <= 16
    assert split.label == "1:3x4" and split.split.sequences_per_s == 4.0
    row = grouped_row(["qwen3-8b", "qwen3-8b-dflash", "qwen3-8b-eagle3"], seeds=3, nodes=4, seq_len=2048)
    assert row["groups"] == 9 and row["grouped_gpus"] <= 32 and row["speedup"] > 1
    assert row["target_flops_saved"] == pytest.approx(8 / 9)
