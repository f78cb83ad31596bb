"""The tiny world is a function of its preset and seed: a `test`-preset world built beside CPU-bound processes equals
the session's (built earlier, under whatever load the machine had then), bit for bit; only an explicit time cap
may cut the target's training short, and it says so; a target that does not beat the unigram entropy of a domain
is named in a warning; each build phase says when it starts and how long it took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from deepspec_train.tinyworld.build import build_tiny_world, loss_warning, time_cap_warning
from deepspec_train.tinyworld.cli import main as cli_main
from deepspec_train.tinyworld.phases import BuildPhases
from deepspec_train.tinyworld.presets import SMALL, TEST
from deepspec_train.tinyworld.target_training import planned_steps, train_target

# Files that must come out the same: the target's weights and the drafters' data the target wrote.
COMPARED = ("target/model.safetensors", "conversations/train.jsonl", "conversations/validation.jsonl")


def spinners(count: int) -> list[subprocess.Popen]:
    """``count`` processes that keep a core busy each until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@pytest.mark.slow
def test_world_built_beside_busy_processes_equals_the_session_s(tiny_world: Path, tmp_path: Path, one_torch_thread):
    """The session's world (tests/conftest.py: the `test` preset, seed 0, one thread) built again in this process
    while CPU-bound processes take the cores."""
    # One spinner per core (at least two): the build gets a fraction of a core, as on a shared CI machine.
    busy_processes = spinners(max(2, os.cpu_count() or 1))
    try:
        busy = build_tiny_world(tmp_path / "busy", TEST, seed=0, progress=False)
        assert all(p.poll() is None for p in busy_processes), "a spinner stopped before the busy build ended"
    finally:
        for process in busy_processes:
            process.kill()
            process.wait()
    session = json.loads((tiny_world / "build_report.json").read_text())
    for report in (session, busy):
        training = report["training"]
        assert training["steps"] == training["planned_steps"] == training["preset_steps"] == TEST.max_steps
        assert training["max_train_seconds"] is None and not training["stopped_by_time"]
    for name in COMPARED:
        assert (tiny_world / name).read_bytes() == (tmp_path / "busy" / name).read_bytes(), name
    assert busy["heldout_loss"] == session["heldout_loss"]


def test_steps_are_the_preset_s_unless_a_time_cap_is_asked_for():
    for seconds_per_step in (1e-3, 1.0, 1e3):
        assert planned_steps(SMALL, None, seconds_per_step) == SMALL.max_steps
    assert planned_steps(TEST, 10.0, seconds_per_step=1e-3) == TEST.max_steps
    assert planned_steps(TEST, 10.0, seconds_per_step=10.0 / 50) == 50
    assert planned_steps(TEST, 10.0, seconds_per_step=1e3) == TEST.warmup_steps + 1


def test_a_time_cap_stops_training_and_is_reported(one_torch_thread):
    config = Qwen3Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32, tie_word_embeddings=True)
    torch.manual_seed(0)
    conversations = [[i % 60 + 1 for i in range(40)] for _ in range(4)]
    stats = train_target(Qwen3ForCausalLM(config), conversations, 0, TEST, seed=0, progress=False,
                         max_seconds=1e-9)
    assert stats.steps == 0 < stats.preset_steps == TEST.max_steps and stats.stopped_by_time
    assert stats.max_train_seconds == 1e-9
    assert time_cap_warning(stats) == (
        f"--max-train-seconds 1e-09 stopped the target after 0 of its {TEST.max_steps} steps: this world depends "
        "on the machine's speed and load"
    )
    uncapped = train_target(Qwen3ForCausalLM(config), conversations, 0, TEST, seed=0, progress=False)
    assert uncapped.steps == uncapped.planned_steps == TEST.max_steps and not uncapped.stopped_by_time
    assert time_cap_warning(uncapped) is None


def test_loss_warning_names_each_domain_not_below_its_unigram_entropy():
    entropies = {"code": 6.0, "prose": 6.4, "math": 3.5}
    assert loss_warning({"code": 4.3, "prose": 5.1, "math": 0.7}, entropies) is None
    line = loss_warning({"code": 4.3, "prose": 6.6, "math": 3.5}, entropies)
    assert line == ("held-out loss not below the unigram entropy (prose 6.600 >= 6.400, math 3.500 >= 3.500 "
                    "nats/token): the target has learned little beyond token frequencies there")


def test_phases_announce_themselves_and_time_each_phase(capsys):
    phases = BuildPhases(total=2)
    with phases.phase("corpus", "corpus: 3 conversations"):
        pass
    with phases.phase("target_training", "target training: 4 steps"):
        pass
    timings = phases.finish()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tinyworld [1/2] corpus: 3 conversations"
    assert lines[1].startswith("tinyworld [1/2] corpus done in ") and lines[1].endswith(" s")
    assert lines[2] == "tinyworld [2/2] target training: 4 steps"
    assert lines[3].startswith("tinyworld [2/2] target training done in ") and len(lines) == 4
    assert set(timings) == {"corpus_s", "target_training_s", "total_s"}
    assert timings["total_s"] >= timings["corpus_s"] + timings["target_training_s"]
    silent = BuildPhases(total=1, enabled=False)
    with silent.phase("corpus", "corpus"):
        pass
    assert capsys.readouterr().err == "" and set(silent.finish()) == {"corpus_s", "total_s"}


def test_a_cap_that_is_not_positive_is_refused_in_one_line(tmp_path, capsys):
    status = cli_main(["build", "--out", str(tmp_path / "world"), "--preset", "test", "--max-train-seconds", "0"])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--max-train-seconds must be positive, got 0")
    assert not (tmp_path / "world").exists()
