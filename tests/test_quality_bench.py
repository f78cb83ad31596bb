"""The quality benchmark's statistics and pieces: paired bootstrap of tau ratios against exhaustive enumeration,
held-out confidence metrics against direct formulas, and interleaved decoding with real (tiny) drafters."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from deepspec_train.calibration.cli import TraceArrays
from deepspec_train.calibration.heldout import conditional_auroc_bound, held_out_confidence
from deepspec_train.calibration.temperature_scaling import sequential_temperature_scaling
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.evaluation.paired_bootstrap import bootstrap_mean, bootstrap_tau_ratios, prompt_totals
from deepspec_train.evaluation.drafter_comparison import (
    BenchDrafter, DecodeSettings, decode_interleaved, decode_seed, draft_ms_per_round, tau_table, totals_by_category,
)
from deepspec_train.evaluation.suites import Suite, SuitePrompt
from deepspec_train.formats.eval_traces import TraceRound, parse_round
from deepspec_train.metrics.calibration import auroc, ece
from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter
from tests.helpers.tiny_world_overrides import world_overrides


def _exhaustive(a, b) -> np.ndarray:
    """Every ordered resample of n prompts (n^n equally likely draws): the exact bootstrap distribution."""
    n = len(a.emitted)
    values = []
    for draw in itertools.product(range(n), repeat=n):
        idx = np.array(draw)
        values.append((a.emitted[idx].sum() / a.rounds[idx].sum()) / (b.emitted[idx].sum() / b.rounds[idx].sum()))
    return np.array(values)


def test_paired_bootstrap_matches_the_exact_resampling_distribution() -> None:
    a = prompt_totals([30, 12, 51, 20], [10, 6, 11, 9])
    b = prompt_totals([25, 14, 40, 22], [10, 7, 12, 9])
    exact = _exhaustive(a, b)
    est = bootstrap_tau_ratios({"code": {"a": a, "b": b}}, [("a", "b")], replicates=60_000, seed=3)[("a", "b")]
    point = (81 + 32) / 36 / ((79 + 22) / 38)
    assert est["code"].value == pytest.approx(point)
    assert est["code"].se == pytest.approx(exact.std(), rel=0.03)
    assert est["code"].low == pytest.approx(np.quantile(exact, 0.025), abs=0.01)
    assert est["code"].high == pytest.approx(np.quantile(exact, 0.975), abs=0.01)
    # One category: the geometric mean is that category's ratio, replicate by replicate.
    assert est["geomean"].value == pytest.approx(point) and est["geomean"].se == pytest.approx(est["code"].se)


def test_pairing_cancels_prompt_difficulty() -> None:
    """Identical drafters give a ratio of exactly 1 in every replicate, however different their prompts are."""
    g = np.random.default_rng(0)
    rounds = g.integers(5, 30, 40)
    same = prompt_totals(rounds * g.uniform(1, 6, 40), rounds)
    est = bootstrap_tau_ratios({"x": {"a": same, "b": same}, "y": {"a": same, "b": same}}, [("a", "b")], 500)
    for e in est[("a", "b")].values():
        assert (e.value, e.se, e.low, e.high) == (pytest.approx(1.0), pytest.approx(0.0), pytest.approx(1.0),
                                                  pytest.approx(1.0))


def test_geomean_and_errors() -> None:
    a = prompt_totals([4, 6], [2, 2])
    b = prompt_totals([2, 3], [2, 2])
    c = prompt_totals([8, 8], [2, 2])
    d = prompt_totals([4, 4], [2, 2])
    est = bootstrap_tau_ratios({"p": {"a": a, "b": b}, "q": {"a": c, "b": d}}, [("a", "b")], 200)[("a", "b")]
    assert est["geomean"].value == pytest.approx(math.sqrt(2.0 * 2.0))
    assert est["geomean"].excludes_one()
    with pytest.raises(ValueError, match="different prompt counts"):
        bootstrap_tau_ratios({"p": {"a": a, "b": prompt_totals([1], [1])}}, [("a", "b")])
    with pytest.raises(ValueError, match="at least one verification round"):
        prompt_totals([1, 2], [1, 0])
    mean = bootstrap_mean([np.array([1.0, 3.0]), np.array([2.0])], replicates=200)
    assert mean.value == pytest.approx(2.0)


def _traces(rng: np.random.Generator, n: int, k: int, skill: float) -> TraceArrays:
    """Rounds whose acceptance follows the logits (a head with ranking skill ``skill``)."""
    logits = rng.normal(1.0, 1.0, (n, k))
    accept = rng.random((n, k)) < 1 / (1 + np.exp(-skill * logits))
    survived = np.cumprod(accept, axis=1).astype(float)
    drafted = rng.integers(1, k + 1, n)
    valid = np.arange(1, k + 1)[None, :] <= drafted[:, None]
    return TraceArrays(logits=logits, survived=survived * valid, valid=valid, skipped=0, suites=["synthetic"])


def test_held_out_confidence_against_direct_formulas() -> None:
    rng = np.random.default_rng(5)
    fit, test = _traces(rng, 3000, 4, 1.5), _traces(rng, 2000, 4, 1.5)
    report = held_out_confidence(fit, test)
    temps = sequential_temperature_scaling(fit.logits, fit.survived, fit.valid).temperatures
    assert report.temperatures == pytest.approx(temps)
    conf = 1 / (1 + np.exp(-test.logits / np.array(temps)))
    survival = np.cumprod(conf, axis=1)
    for k in range(4):
        rows = test.valid[:, k]
        assert report.counts[k] == int(rows.sum())
        assert report.ece[k] == pytest.approx(ece(survival[rows, k], test.survived[rows, k]))
        assert report.auroc_cumulative[k] == pytest.approx(auroc(survival[rows, k], test.survived[rows, k]))
        reached = rows if k == 0 else rows & (test.survived[:, k - 1] > 0.5)
        assert report.auroc_conditional[k] == pytest.approx(auroc(test.logits[reached, k], test.survived[reached, k]))
    # Outcomes drawn from the head's own logits: calibrated by construction, so the held-out ECE sits at the
    # sampling-noise floor, and the floor shrinks with more rounds.
    assert all(abs(e - f) < 0.02 for e, f in zip(report.ece, report.ece_floor))
    big = held_out_confidence(fit, _traces(rng, 20000, 4, 1.5))
    assert all(b < f for b, f in zip(big.ece_floor, report.ece_floor))
    # A head that predicts acceptance ranks it: well above chance, on rounds it was not fitted on.
    assert min(report.auroc_conditional) > 0.65
    assert max(report.ece) < 0.05


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, one_torch_thread):
    return load_tiny_target(Path(tmp_path_factory.mktemp("target")))


def test_interleaved_decoding_is_order_independent_and_tabulates(tiny_target) -> None:
    target, tokenizer = tiny_target
    drafters = [BenchDrafter.of(kind, random_drafter(target, tokenizer, kind, seed=i))
                for i, kind in enumerate(("dspark", "dflash", "eagle3"))]
    suites = [Suite("code", (SuitePrompt("c1", "code", ("def f(x):",)), SuitePrompt("c2", "code", ("import os",)))),
              Suite("prose", (SuitePrompt("p1", "prose", ("Tell me about",)),))]
    conversations: dict = {}
    settings = DecodeSettings(1.0, (0, 1), 12)
    rows = decode_interleaved(target, tokenizer, drafters, suites, settings, False, conversations)
    assert {name: len(c) for name, c in conversations.items()} == {"dspark": 6, "dflash": 6, "eagle3": 6}
    alone = decode_interleaved(target, tokenizer, drafters[2:], suites, settings, progress=False)
    untimed = [dataclasses.replace(r, draft_seconds=None, draft_cpu_seconds=None) for r in rows["eagle3"]]
    assert untimed == [dataclasses.replace(r, draft_seconds=None, draft_cpu_seconds=None) for r in alone["eagle3"]]
    # Two worker processes decode the same rounds, in the same order, with the same per-conversation counts.
    parallel_conversations: dict = {}
    parallel = decode_interleaved(target, tokenizer, drafters, suites, settings, False, parallel_conversations,
                                  workers=2)
    for name in rows:
        assert [dataclasses.replace(r, draft_seconds=None, draft_cpu_seconds=None) for r in parallel[name]] == [
            dataclasses.replace(r, draft_seconds=None, draft_cpu_seconds=None) for r in rows[name]]
        assert [(c.suite, c.new_tokens) for c in parallel_conversations[name]] == [
            (c.suite, c.new_tokens) for c in conversations[name]]
    assert {r.seed for r in rows["dspark"]} == {0, 1}
    totals = totals_by_category(rows)
    assert sorted(totals) == ["code", "prose"] and totals["code"]["dspark"].emitted.size == 2
    code_rows = [r for r in rows["dflash"] if r.category == "code"]
    assert float(totals["code"]["dflash"].tau()) == pytest.approx(sum(r.emitted for r in code_rows) / len(code_rows))
    ratios = bootstrap_tau_ratios(totals, [("dspark", "dflash"), ("dspark", "eagle3")], 100)
    columns, body = tau_table(totals, ["dspark", "dflash", "eagle3"], ratios)
    assert columns[-1] == "dspark / eagle3" and [row[0] for row in body] == ["code", "prose", "geomean"]
    assert draft_ms_per_round(rows["eagle3"], 100, 0).value > 0
    assert [d.sequential_layer_passes() for d in drafters] == [1, 1, drafters[2].block_size]
    assert decode_seed(0, "code", 1) != decode_seed(0, "prose", 1) != decode_seed(1, "code", 1)


def test_auroc_ceiling_uses_the_rounds_that_reached_each_position() -> None:
    rows = [
        TraceRound("s", "c", str(i), 0, 0, 3, accepted, accepted + 1, None, None, (1.0,) * 3, analytic_accept=c_star)
        for i, (accepted, c_star) in enumerate([
            (3, (0.9, 0.8, 0.7)), (0, (0.2, 0.5, 0.5)), (1, (0.6, 0.3, 0.9)), (2, (0.4, 0.9, 0.1))])
    ]
    bound = conditional_auroc_bound(rows, 3)
    assert bound[0] == pytest.approx(auroc([0.9, 0.2, 0.6, 0.4], [1, 0, 1, 1]))
    assert bound[1] == pytest.approx(auroc([0.8, 0.3, 0.9], [1, 0, 1]))
    assert bound[2] == pytest.approx(auroc([0.7, 0.1], [1, 0]))


def test_trace_rounds_keep_the_new_fields_and_old_traces_still_load() -> None:
    """The analytic acceptance, draft timings and seed round-trip through the trace format; a line written before
    they existed reads with them unset."""
    old = {"suite": "s", "category": "c", "prompt_id": "p", "turn": 0, "round": 1, "drafted": 2, "accepted": 1,
           "emitted": 2, "confidence_logits": None, "confidences": None, "target_accept_probs": [1.0, 0.5]}
    legacy = parse_round(old)
    assert (legacy.analytic_accept, legacy.draft_seconds, legacy.draft_cpu_seconds, legacy.seed) == (None,) * 4
    new = dataclasses.replace(legacy, analytic_accept=(0.75, 0.5), draft_seconds=0.01, draft_cpu_seconds=0.005, seed=3)
    assert parse_round(json.loads(json.dumps(dataclasses.asdict(new)))) == new
    with pytest.raises(ValueError, match="analytic_accept has 1 entries for 2 drafted tokens"):
        parse_round({**old, "analytic_accept": [0.5]})
    with pytest.raises(ValueError, match="draft_seconds = -1 is negative"):
        parse_round({**old, "draft_seconds": -1})



def _world_settings(tiny_world: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Overrides every tiny recipe needs on the `test` world, and each recipe's taps there."""
    mask_id = json.loads((tiny_world / "build_report.json").read_text())["mask_token_id"]
    shared = ["train.global_batch_sequences=4", "train.micro_batch_sequences=2", "anchors.num_per_sequence=8",
              f"drafter.mask_token_id={mask_id}", f"data.cache_dir={tmp_path / 'cache'}", "train.eval_sequences=8",
              "logging.wandb=false"]
    layer_ids = {"tiny-dspark": "[0]", "tiny-dflash2": "[0]", "tiny-eagle3": "[0,0,0]", "tiny-dflash": "[0]"}
    return shared, layer_ids


@pytest.mark.parametrize(("code", "says"), [(4, "stopped by a signal after writing its checkpoints"),
                                             (3, "failed with exit code 3")])
def test_a_training_command_stopped_by_a_signal_says_to_continue_with_reuse(tmp_path: Path, code: int,
                                                                            says: str) -> None:
    """``train_all``: a command that ends with the preemption status (its checkpoints written) is told apart from a
    failure, and the message says how to continue."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.group_training import train_all
    from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE

    assert PREEMPTED_EXIT_CODE == 4
    with pytest.raises(SystemExit) as stopped:
        train_all({"run": [sys.executable, "-c", f"raise SystemExit({code})"]}, 1, tmp_path)
    message = str(stopped.value)
    assert message.startswith("training run ") and says in message
    assert ("--reuse" in message) == (code == PREEMPTED_EXIT_CODE)


def test_training_plan_groups_recipes_splits_them_and_falls_back(tiny_world: Path, tmp_path: Path) -> None:
    """``bench/group_training.plan_training``: one grouped command for recipes that share a target pass, split by
    recipe over the jobs with the data order pinned, a pass of its own (with a note) for a recipe whose data differ,
    and ``reuse`` skipping a recipe whose every seed has a drafter."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.group_training import plan_training

    shared, layer_ids = _world_settings(tiny_world, tmp_path)
    shared += [f"target.path={tiny_world / 'target'}", f"data.train=[{tiny_world / 'conversations' / 'train.jsonl'}]",
               f"data.validation=[{tiny_world / 'conversations' / 'validation.jsonl'}]"]
    per_recipe = {r: [f"target.layer_ids={ids}"] for r, ids in layer_ids.items()}
    recipes = ["tiny-dspark", "tiny-dflash2", "tiny-eagle3"]
    out = tmp_path / "q"
    one = plan_training(recipes, 2, shared, per_recipe, out, 1, reuse=False)
    (name, command), = one.commands.items()
    assert name == "tiny-dspark+tiny-dflash2+tiny-eagle3" and one.notes == []
    assert command[2:5] == ["recipe=tiny-dspark", "compare=[tiny-dflash2,tiny-eagle3]", "seeds=2"]
    assert "tiny-eagle3:target.layer_ids=[0,0,0]" in command and "run.data_seed=0" in command
    assert one.run_dir("tiny-eagle3", 1) == out / "groups" / "tiny-eagle3-seed1"
    assert one.groups[("tiny-dflash2", 1)].cfg.run.seed == 1
    # Two jobs: the recipes round robin over two commands, every group where the single command puts it.
    two = plan_training(recipes, 2, shared, per_recipe, out, 2, reuse=False)
    assert list(two.commands) == ["tiny-dspark+tiny-eagle3", "tiny-dflash2"]
    assert {k: g.out_dir for k, g in two.groups.items()} == {k: g.out_dir for k, g in one.groups.items()}
    assert all("run.data_seed=0" in c for c in two.commands.values())
    # A recipe with other data settings cannot join the pass: it trains alone, and the plan says why in one line.
    apart = plan_training(recipes, 1, shared, {**per_recipe, "tiny-eagle3": [*per_recipe["tiny-eagle3"],
                                                                              "data.max_length=96"]}, out, 1, False)
    assert list(apart.commands) == ["tiny-dspark+tiny-dflash2", "tiny-eagle3"]
    (note,) = apart.notes
    assert note.startswith("note: tiny-eagle3 trains in a target pass of its own") and "data.max_length" in note
    # Reuse: a recipe whose every seed has a drafter at the end of the schedule is not trained again; one missing
    # seed retrains the recipe.
    end = one.groups[("tiny-dspark", 0)].cfg.train.max_steps
    for seed in (0, 1):
        _ended_at(one.run_dir("tiny-dspark", seed), end)
    _ended_at(one.run_dir("tiny-eagle3", 0), end)
    reused = plan_training(recipes, 2, shared, per_recipe, out, 1, reuse=True)
    assert list(reused.commands) == ["tiny-dflash2+tiny-eagle3"] and reused.command_of("tiny-dspark") is None
    assert reused.write_record() == out / "groups.json"
    listed = json.loads((out / "groups.json").read_text())["groups"]
    assert [g["label"] for g in listed] == [f"{r}-seed{s}" for r in recipes for s in (0, 1)]
    assert "run.overwrite=true" in reused.commands["tiny-dflash2+tiny-eagle3"]
    # Accumulation: runs that stopped short of this invocation's end (train.stop_at_step, or a preemption's last
    # checkpoint) continue from their checkpoints; a run that reached it is not trained again.
    for seed in (0, 1):
        _ended_at(one.run_dir("tiny-dflash2", seed), 2)
    (one.run_dir("tiny-eagle3", 1) / "checkpoints" / "step_00000003").mkdir(parents=True)
    later = plan_training(recipes, 2, shared, per_recipe, out, 1, reuse=True, stop_at=end)
    (name, command), = later.commands.items()
    assert name == "tiny-dflash2+tiny-eagle3"
    assert "train.resume=auto" in command and "run.overwrite=true" not in command
    assert f"train.stop_at_step={end}" in command
    assert later.notes == [f"note: tiny-dflash2 continues from step 2 to {end} (train.resume=auto)",
                           f"note: tiny-eagle3 continues from step 3 to {end} (train.resume=auto)"]
    assert plan_training(recipes, 2, shared, per_recipe, out, 1, reuse=True, stop_at=2).commands == {}


def _ended_at(run_dir: Path, step: int) -> None:
    """What a run that ended (or stopped) at ``step`` leaves: its drafter and summary."""
    (run_dir / "drafter").mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps({"steps": step}))


@pytest.mark.slow
def test_benchmark_end_to_end_on_the_test_world(tiny_world: Path, tmp_path: Path) -> None:
    """``bench/quality.py`` as a user runs it: trains DSpark, DFlash2 and EAGLE-3 x 2 training seeds as drafter
    groups (a few steps, the `test` world's shapes, split over two grouped commands), decodes at T = 1 and 0 in two
    worker processes, prints the tables with the training seeds behind each ratio, writes results and traces."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    shared, layer_ids = _world_settings(tiny_world, tmp_path)
    recipes = ["tiny-dspark", "tiny-dflash2", "tiny-eagle3"]
    command = [sys.executable, str(repo / "bench" / "quality.py"), "--tinyworld", str(tiny_world),
               "--out", str(tmp_path / "q"), "--recipes", *recipes, "--steps", "2", "--prompts", "2",
               "--new-tokens", "6", "--seeds", "1", "--bootstrap", "50", "--calibration-prompts", "2",
               "--no-progress", "--train-jobs", "2", "--decode-workers", "2", "--training-seeds", "2", "--no-wandb"]
    command += [a for o in shared for a in ("--override-all", o)]
    command += [a for r in recipes for a in ("--override", f"{r}:target.layer_ids={layer_ids[r]}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tiny-dspark / tiny-dflash2" in done.stdout and "## Draft cost" in done.stdout
    assert "2 training seeds per drafter; two-level bootstrap over training seeds and prompts" in done.stdout
    out = tmp_path / "q"
    report = json.loads((out / "quality.json").read_text())
    assert set(report["temperatures"]) == {"1", "0"} and report["training_seeds"] == 2
    assert set(report["drafters"]) == set(recipes)
    # Two grouped commands side by side, each logging to its own file and timed on its own process tree; every
    # drafter of a command reports that command's time.
    assert set(report["training_commands"]) == {"tiny-dspark+tiny-eagle3", "tiny-dflash2"}
    assert "drafter groups: tiny-dspark-seed0, tiny-dspark-seed1, tiny-eagle3-seed0" in (
        out / "tiny-dspark+tiny-eagle3.log").read_text()
    assert report["drafters"]["tiny-eagle3"]["train"]["command"] == "tiny-dspark+tiny-eagle3"
    assert report["drafters"]["tiny-eagle3"]["sequential_layer_passes"] == 7
    recipe_layers = load_recipe("tiny-dspark", world_overrides(tiny_world, "tiny-dspark", tmp_path)).drafter.num_layers
    assert report["drafters"]["tiny-dspark"]["sequential_layer_passes"] == recipe_layers
    assert len(report["confidence"]["ece"]) == 7
    assert (out / "groups" / "tiny-dflash2-seed0" / "eval" / "results.json").is_file()
    assert report["runs"]["tiny-dflash2@s1"] == str(out / "groups" / "tiny-dflash2-seed1")
    assert len(json.loads((out / "groups.json").read_text())["groups"]) == 6


def test_training_seeds_pool_tau_and_bootstrap_over_seeds_and_prompts() -> None:
    """``bench/quality.py --training-seeds 2``: each recipe's tau pools its two seeds' drafters (prompts of both side
    by side) and the ratio interval comes from the two-level bootstrap (one seed: the paired prompt bootstrap)."""
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.quality import run_name, tau_ratios

    def rounds(name: str, emitted: list[int]) -> list[TraceRound]:
        return [TraceRound("math", "math", f"p{i}", 0, 0, 7, e - 1, e, None, None, ()) for i, e in enumerate(emitted)]

    per_run = {"a": [6, 4, 5], "b": [3, 3, 3], "a@s1": [2, 2, 2], "b@s1": [2, 2, 2]}
    rows = {name: rounds(name, emitted) for name, emitted in per_run.items()}
    args = argparse.Namespace(training_seeds=2, recipes=["a", "b"], bootstrap=200)
    assert run_name("a", 1) == "a@s1" and run_name("a", 0) == "a"
    totals, ratios = tau_ratios(rows, args, "a", ["b"])
    assert totals["math"]["a"].tau() == pytest.approx(21 / 6) and totals["math"]["b"].tau() == pytest.approx(15 / 6)
    estimate = ratios[("a", "b")]["math"]
    # A replicate that draws seed 1 twice compares two equal drafters: the interval reaches 1.
    assert estimate.value == pytest.approx(21 / 15) and estimate.low <= 1.0 < estimate.high
    one_seed = argparse.Namespace(training_seeds=1, recipes=["a", "b"], bootstrap=200)
    _, single = tau_ratios({"a": rows["a"], "b": rows["b"]}, one_seed, "a", ["b"])
    assert single[("a", "b")]["math"].value == pytest.approx(15 / 9) and single[("a", "b")]["math"].low > 1.0
