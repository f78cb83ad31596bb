"""One run per output directory (``jobs.run_directory``): a fresh run into a directory holding another run is
refused in one line, ``run.overwrite=true`` moves the old run aside, and a resume continues only a run with the
same identity. Probe from the issue: a second fresh run into the same directory used to mix two step-10 losses
into ``metrics.jsonl``, overwrite the first run's checkpoint and leave its later ones for a resume to pick up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deepspec_train.config.loader import ConfigError
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.jobs.run_directory import (
    IDENTITY_FILE, claim_output_dir, identity_fields, output_dir_problems, set_aside_metrics_after,
)
from tests.helpers.tiny_world_overrides import training_overrides, world_overrides

REPO = Path(__file__).resolve().parents[1]


def _cfg(tiny_world: Path, tmp_path: Path, *extra: str):
    return load_recipe("tiny-dspark", world_overrides(tiny_world, "tiny-dspark", tmp_path) + list(extra))


def test_an_empty_directory_takes_a_fresh_run(tiny_world, tmp_path) -> None:
    assert output_dir_problems(_cfg(tiny_world, tmp_path)) == []
    (tmp_path / "run").mkdir()
    assert output_dir_problems(_cfg(tiny_world, tmp_path)) == []


@pytest.mark.parametrize("marker", ["metrics.jsonl", "summary.json", "checkpoints/step_00000010", "drafter"])
def test_a_fresh_run_into_a_used_directory_is_refused(tiny_world, tmp_path, marker: str) -> None:
    path = tmp_path / "run" / marker
    if "." in marker:
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    else:
        path.mkdir(parents=True)
    (problem,) = output_dir_problems(_cfg(tiny_world, tmp_path))
    assert "already holds a run: train.resume=auto continues it, run.overwrite=true starts over" in problem


def test_auto_resume_refuses_a_run_without_checkpoints(tiny_world, tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    (problem,) = output_dir_problems(_cfg(tiny_world, tmp_path, "train.resume=auto"))
    assert "left no checkpoint to continue" in problem


def test_resume_refuses_a_run_of_another_identity(tiny_world, tmp_path) -> None:
    first = _cfg(tiny_world, tmp_path)
    claim_output_dir(first)
    (tmp_path / "run" / "checkpoints" / "step_00000010").mkdir(parents=True)
    same = _cfg(tiny_world, tmp_path, "train.resume=auto", "logging.log_every=5", "train.stop_at_step=20",
                "drafter.activation_checkpointing=true")
    assert output_dir_problems(same) == []
    layers = first.drafter.num_layers
    other = _cfg(tiny_world, tmp_path, "train.resume=auto", f"drafter.num_layers={layers + 1}")
    (problem,) = output_dir_problems(other)
    assert f"drafter.num_layers: {layers} there, {layers + 1} here" in problem and "\n" not in problem
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000010"
    (checkpoint / "trainer_state.json").write_text("{}")
    forked = _cfg(tiny_world, tmp_path / "fork", f"train.resume={checkpoint}", "anchors.num_per_sequence=4")
    (problem,) = output_dir_problems(forked)
    assert "anchors.num_per_sequence: 32 there, 4 here" in problem


def test_identity_covers_model_and_data_not_schedule_or_cadence(tiny_world, tmp_path) -> None:
    fields = identity_fields(_cfg(tiny_world, tmp_path))
    assert {"drafter.num_layers", "target.layer_ids", "data.train", "anchors.num_per_sequence", "run.seed"} <= set(fields)
    assert {"drafter.markov_head_type", "drafter.markov_init", "drafter.confidence_gradient", "loss.distance",
            "loss.normalizer"} <= set(fields)
    assert not {k for k in fields if k.startswith(("logging.", "topology.", "stream."))}
    assert not {"loss.alpha_ce", "loss.alpha_tv", "loss.gamma_decay", "loss.chunk_size"} & set(fields)
    assert not {"train.checkpoint_every", "train.stop_at_step", "train.max_steps", "train.lr"} & set(fields)
    # Checkpointing changes how the same gradients are computed (memory against time), not the run.
    assert "drafter.activation_checkpointing" not in fields


def test_an_identity_recorded_before_a_field_existed_reads_it_as_its_default(tiny_world, tmp_path) -> None:
    claim_output_dir(_cfg(tiny_world, tmp_path))
    (tmp_path / "run" / "checkpoints" / "step_00000010").mkdir(parents=True)
    path = tmp_path / "run" / IDENTITY_FILE
    record = json.loads(path.read_text())
    record["fields"] = {k: v for k, v in record["fields"].items() if k not in ("loss.normalizer", "drafter.markov_init")}
    path.write_text(json.dumps(record))
    assert output_dir_problems(_cfg(tiny_world, tmp_path, "train.resume=auto")) == []
    (problem,) = output_dir_problems(_cfg(tiny_world, tmp_path, "train.resume=auto", "loss.normalizer=sequence"))
    assert "loss.normalizer: 'token' there, 'sequence' here" in problem


def test_a_start_that_failed_before_training_leaves_no_run(tiny_world, tmp_path) -> None:
    cfg = _cfg(tiny_world, tmp_path)
    claim_output_dir(_cfg(tiny_world, tmp_path, f"drafter.num_layers={cfg.drafter.num_layers + 1}"))
    assert output_dir_problems(cfg) == []
    claim_output_dir(cfg)
    recorded = json.loads((tmp_path / "run" / IDENTITY_FILE).read_text())["fields"]
    assert recorded["drafter.num_layers"] == cfg.drafter.num_layers


def test_overwrite_moves_the_old_run_aside(tiny_world, tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 10}\n')
    cfg = _cfg(tiny_world, tmp_path, "run.overwrite=true")
    assert output_dir_problems(cfg) == []
    moved = claim_output_dir(cfg)
    assert moved is not None and (moved / "metrics.jsonl").read_text() == '{"step": 10}\n'
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [IDENTITY_FILE]


def test_overwrite_with_resume_is_a_recipe_error(tiny_world, tmp_path) -> None:
    with pytest.raises(ConfigError, match="run.overwrite=true starts the run over: it cannot be combined"):
        _cfg(tiny_world, tmp_path, "run.overwrite=true", "train.resume=auto")


@pytest.mark.slow
def test_a_second_fresh_run_is_refused_and_the_first_kept(tiny_world, tmp_path) -> None:
    args = ["recipe=tiny-dspark", *training_overrides(tiny_world, "tiny-dspark", tmp_path, steps=2)]
    first = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    second = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1 and "already holds a run" in lines[0], second.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    identity = json.loads((tmp_path / "run" / IDENTITY_FILE).read_text())
    recipe_layers = load_recipe("tiny-dspark", world_overrides(tiny_world, "tiny-dspark", tmp_path)).drafter.num_layers
    assert identity["fields"]["drafter.num_layers"] == recipe_layers and identity["identity"]


def test_a_resume_sets_aside_the_records_it_will_log_again(tmp_path) -> None:
    lines = [{"step": s, "train/loss": float(s)} for s in (1, 2, 3, 4)] + [{"step": 4, "table": "t", "rows": []}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert set_aside_metrics_after(tmp_path, 2) == 3
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    moved = [json.loads(line) for line in (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()]
    assert kept == lines[:2] and moved == lines[2:]
    assert set_aside_metrics_after(tmp_path, 2) == 0
