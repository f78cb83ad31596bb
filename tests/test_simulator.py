"""The serving simulator against brute-force replays and hand-built cases: fixed-gamma token counts, the
scheduler with perfectly informative confidences, budgets under load, the two-steps-old async capacity,
non-anticipation, trace loading and confidence sources, and the ``deepspec simulate`` command."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest

from deepspec_train.commands.dispatch import main
from deepspec_train.formats.figures import read_drawn
from deepspec_train.formats.eval_traces import read_traces
from deepspec_train.scheduling.simulator import Policy, simulate
from deepspec_train.scheduling.workload import (
    ReplayRound,
    build_workload,
    group_requests,
    load_temperatures,
    round_confidences,
)
from deepspec_train.scheduling.sps_table import SPSTable

BLOCK = 7
# Per-position conditional acceptance of each synthetic category (easy, medium, hard traffic).
CATEGORY_ACCEPTANCE = {"math": 0.92, "code": 0.75, "prose": 0.55}


def synthetic_trace_rows(seed: int, prompts_per_category: int = 3, noise: float = 1.0) -> list[dict]:
    """Trace rows shaped like ``deepspec eval --save-traces``: per round, conditional acceptance probabilities
    vary around the category's level; ``accepted`` is sampled from them and the confidence logits are their
    logits plus Gaussian noise (informative but imperfect). The last round of a request drafts fewer tokens."""
    rng = random.Random(seed)
    rows = []
    for category, level in CATEGORY_ACCEPTANCE.items():
        for prompt in range(prompts_per_category):
            rounds = rng.randint(4, 10)
            for round_no in range(rounds):
                drafted = BLOCK if round_no < rounds - 1 else rng.randint(1, BLOCK)
                difficulty = rng.uniform(-0.25, 0.1)
                probs = [min(max(level + difficulty - 0.02 * k, 0.02), 0.99) for k in range(drafted)]
                accepted = 0
                while accepted < drafted and rng.random() < probs[accepted]:
                    accepted += 1
                logits = [math.log(p / (1 - p)) + rng.gauss(0.0, noise) for p in probs]
                rows.append(
                    {
                        "suite": category,
                        "category": category,
                        "prompt_id": f"{category}-{prompt}",
                        "turn": 0,
                        "round": round_no,
                        "drafted": drafted,
                        "accepted": accepted,
                        "emitted": accepted + 1,
                        "confidence_logits": logits,
                        "confidences": [1 / (1 + math.exp(-z)) for z in logits],
                    }
                )
    return rows


def synthetic_workload(seed: int, **kwargs) -> list[list[ReplayRound]]:
    by_request: dict[str, list[ReplayRound]] = {}
    for row in synthetic_trace_rows(seed, **kwargs):
        by_request.setdefault(row["prompt_id"], []).append(
            ReplayRound(row["category"], row["drafted"], row["accepted"], tuple(row["confidences"]))
        )
    return list(by_request.values())


def perfectly_informative(workload: list[list[ReplayRound]]) -> list[list[ReplayRound]]:
    """Confidence 1 on every accepted draft, 0 from the first rejected one on."""
    return [
        [
            ReplayRound(r.category, r.drafted, r.accepted, tuple(float(k < r.accepted) for k in range(r.drafted)))
            for r in request
        ]
        for request in workload
    ]


def concave_sps(max_batch: int) -> SPSTable:
    """Positive, non-increasing, concave speeds over 1..max_batch (the scheduler's exactness conditions)."""
    sizes = [1, max_batch // 4, max_batch // 2, max_batch]
    return SPSTable(sizes, [100.0 - 0.15 * b - 0.002 * b * b for b in sizes])


def user_streams(workload, concurrency):
    """Brute-force replay helper: each user's rounds, in order, for one pass over the pool."""
    streams = []
    for u in range(concurrency):
        first = u * len(workload) // concurrency
        rotated = workload[first:] + workload[:first]
        streams.append([r for request in rotated for r in request])
    return streams


@pytest.mark.parametrize("concurrency", [1, 3, 8])
@pytest.mark.parametrize("gamma", [2, BLOCK])
def test_fixed_gamma_matches_brute_force_replay(concurrency, gamma):
    workload = synthetic_workload(0)
    sps = concave_sps(concurrency * (BLOCK + 1))
    result = simulate(workload, Policy("fixed", gamma), concurrency, sps)
    streams = user_streams(workload, concurrency)
    tokens = sum(min(r.accepted, gamma) + 1 for stream in streams for r in stream)
    seconds = sum(
        1.0 / sps.sps(sum(1 + min(gamma, stream[t].drafted) for stream in streams)) for t in range(len(streams[0]))
    )
    assert result.tokens == tokens
    assert result.seconds == pytest.approx(seconds, rel=1e-12)
    assert result.aggregate_tok_s == pytest.approx(tokens / seconds, rel=1e-12)
    # Every user is busy the whole run, so the aggregate is N times the mean per-user rate.
    assert result.aggregate_tok_s == pytest.approx(concurrency * result.per_user_tok_s, rel=1e-12)
    if gamma == BLOCK:
        # Verifying every draft emits exactly what the evaluator saw: accepted + 1 per round, per user.
        assert result.tokens == concurrency * sum(r.accepted + 1 for request in workload for r in request)


@pytest.mark.parametrize("seed", range(4))
def test_scheduler_with_perfect_confidences_beats_every_fixed_gamma(seed):
    workload = perfectly_informative(synthetic_workload(seed))
    for concurrency in (1, 2, 4, 8, 16):
        sps = concave_sps(concurrency * (BLOCK + 1))
        scheduled = simulate(workload, Policy("scheduler"), concurrency, sps)
        best_fixed = max(
            simulate(workload, Policy("fixed", g), concurrency, sps).aggregate_tok_s for g in range(BLOCK + 1)
        )
        assert scheduled.aggregate_tok_s >= best_fixed * (1 - 1e-12)


def test_budget_shrinks_as_load_rises():
    workload = synthetic_workload(1, prompts_per_category=4)
    loads = [1, 2, 4, 8, 16]
    sps = concave_sps(loads[-1] * (BLOCK + 1))
    runs = [simulate(workload, Policy("scheduler"), n, sps, record_lengths=True) for n in loads]
    budgets = [r.mean_budget for r in runs]
    assert all(b <= a + 1e-12 for a, b in zip(budgets, budgets[1:])), budgets
    assert budgets[-1] < budgets[0]
    # Stronger, step by step: user u of N runs the same rounds as user 2u of 2N, next to more requests, and never
    # gets a longer verification there.
    for small, large in zip(runs, runs[1:]):
        for step_small, step_large in zip(small.lengths, large.lengths):
            assert all(step_large[2 * u] <= length for u, length in enumerate(step_small))


def _two_user_workload(confidences_per_step):
    """Two requests (one per user at N=2) whose round t carries the given confidences; all drafts accepted."""
    return [
        [ReplayRound("c", len(step[u]), len(step[u]), tuple(step[u])) for step in confidences_per_step]
        for u in range(2)
    ]


def test_async_capacity_comes_from_two_steps_earlier():
    # SPS falls linearly from 100 (B = 2) to 60 (B = 6): 90, 80, 70 in between.
    sps = SPSTable([2, 6], [100.0, 60.0])
    steps = [
        ([1.0, 1.0], [1.0, 1.0]),  # scheduler takes all 4 drafts: capacity 6 for step 2
        ([0.0, 0.0], [0.0, 0.0]),  # scheduler takes none: capacity 2 for step 3
        ([0.9, 0.9], [0.5, 0.5]),  # path 200 -> 261 -> 296.8 -> 294.7: 2 drafts, capacity 4 for step 4
        ([0.9, 0.8], [0.95, 0.1]),  # path 200 -> 265.5 -> 308 -> 319.9 -> 279.9: lengths [2, 1]
        # Survivals .6 .36 | .9 .81: the 2 slots go to user 1 (the scheduler, 200 -> 261 -> 296.8 -> 301.7 ->
        # 280.2, would verify [1, 2]).
        ([0.6, 0.6], [0.9, 0.9]),
    ]
    workload = _two_user_workload(steps)
    asynchronous = simulate(workload, Policy("async"), 2, sps, max_steps=len(steps), record_lengths=True)
    assert asynchronous.lengths == [[0, 0], [0, 0], [2, 2], [0, 0], [0, 2]]
    # The synchronous scheduler decides from the current confidences instead.
    synchronous = simulate(workload, Policy("scheduler"), 2, sps, max_steps=len(steps), record_lengths=True)
    assert synchronous.lengths == [[2, 2], [0, 0], [2, 0], [2, 1], [1, 2]]
    # A one-step lag would have used different capacities.
    one_step = simulate(workload, Policy("async", delay=1), 2, sps, max_steps=len(steps), record_lengths=True)
    assert one_step.lengths != asynchronous.lengths
    assert asynchronous.tokens == sum(2 + sum(step) for step in asynchronous.lengths)


@pytest.mark.parametrize("kind", ["scheduler", "async"])
def test_decisions_never_look_at_outcomes_or_future_confidences(kind):
    workload = synthetic_workload(2)
    concurrency, horizon = 4, 12
    sps = concave_sps(concurrency * (BLOCK + 1))
    policy = Policy(kind)
    base = simulate(workload, policy, concurrency, sps, max_steps=30, record_lengths=True)

    rng = random.Random(0)
    other_outcomes = [
        [ReplayRound(r.category, r.drafted, rng.randint(0, r.drafted), r.confidences) for r in request]
        for request in workload
    ]
    assert simulate(other_outcomes, policy, concurrency, sps, max_steps=30, record_lengths=True).lengths == base.lengths

    # Rewrite the confidences of every round no user has reached by step `horizon`.
    flat_len = sum(len(request) for request in workload)
    starts = np.cumsum([0] + [len(request) for request in workload])
    seen = {
        (int(starts[u * len(workload) // concurrency]) + t) % flat_len
        for u in range(concurrency)
        for t in range(horizon + 1)
    }
    altered, index = [], 0
    for request in workload:
        rows = []
        for r in request:
            confidences = r.confidences if index in seen else tuple(rng.random() for _ in range(r.drafted))
            rows.append(ReplayRound(r.category, r.drafted, r.accepted, confidences))
            index += 1
        altered.append(rows)
    changed = simulate(altered, policy, concurrency, sps, max_steps=30, record_lengths=True).lengths
    assert changed[: horizon + 1] == base.lengths[: horizon + 1]
    assert changed != base.lengths


def test_trace_loading_and_confidence_sources(tmp_path):
    rows = synthetic_trace_rows(3, prompts_per_category=1)
    path = tmp_path / "traces.jsonl"
    # Shuffled lines: the loader must regroup requests and restore round order.
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    path.write_text("".join(json.dumps(row) + "\n" for row in shuffled))
    requests = group_requests(read_traces([path]))
    assert sorted(r.prompt_id for r in requests) == sorted({row["prompt_id"] for row in rows})
    for request in requests:
        expected = [row for row in rows if row["prompt_id"] == request.prompt_id]
        assert [r.accepted for r in request.rounds] == [row["accepted"] for row in expected]
        assert request.category == expected[0]["category"]

    temperatures = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"temperatures": temperatures, "ece_before": [0.1] * 7}))
    assert load_temperatures(calibration) == temperatures
    trace_round = requests[0].rounds[0]
    z = np.asarray(trace_round.confidence_logits)
    k = len(z)
    np.testing.assert_allclose(round_confidences(trace_round, "uncalibrated"), 1 / (1 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_allclose(
        round_confidences(trace_round, "calibrated", temperatures), 1 / (1 + np.exp(-z / temperatures[:k])), rtol=1e-12
    )
    assert round_confidences(trace_round, "trace") == trace_round.confidences
    oracle = round_confidences(trace_round, "oracle")
    assert oracle == tuple([1.0] * trace_round.accepted + [0.0] * (trace_round.drafted - trace_round.accepted))
    assert all(
        r.confidences is not None for request in build_workload(requests, "calibrated", temperatures) for r in request
    )


def test_policies_needing_confidences_refuse_traces_without_them():
    workload = [[ReplayRound("c", 3, 1, None)]]
    sps = SPSTable([1, 8], [10.0, 5.0])
    assert simulate(workload, Policy("fixed", 3), 2, sps).tokens == 4
    with pytest.raises(ValueError, match="needs confidences"):
        simulate(workload, Policy("scheduler"), 2, sps)


def test_simulate_command_writes_results_and_frontier(tmp_path, capsys):
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps(row) + "\n" for row in synthetic_trace_rows(4, prompts_per_category=2)))
    sps = tmp_path / "sps.json"
    concave_sps(8 * (BLOCK + 1)).save(sps)
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"temperatures": [1.5] * BLOCK}))
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--traces",
                str(traces),
                "--sps",
                str(sps),
                "--concurrency",
                "1,8",
                "--gammas",
                "1,4,7",
                "--calibration",
                str(calibration),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    document = json.loads((out / "simulation.json").read_text())
    curves = {(run["policy"], run["confidence_source"], run["concurrency"]) for run in document["runs"]}
    for n in (1, 8):
        for source in ("uncalibrated", "calibrated"):
            assert ("scheduler", source, n) in curves and ("async-scheduler", source, n) in curves
        assert {("gamma=1", None, n), ("gamma=4", None, n), ("gamma=7", None, n)} <= curves
    assert {g["curve"] for g in document["gains"]} == {
        "scheduler (uncalibrated)",
        "scheduler (calibrated)",
        "async-scheduler (uncalibrated)",
        "async-scheduler (calibrated)",
    }
    assert set(document["runs"][0]["budget_by_category"]) == set(CATEGORY_ACCEPTANCE)
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "scheduler (calibrated)" in capsys.readouterr().out
    drawn = read_drawn(out / "frontier.png")
    labels = [c["label"] for c in drawn["curves"]]
    assert len(set(labels)) == len(labels) == 7
    # Each scheduler curve has a colour of its own (not only a line style), and N is written on one curve.
    schedulers = [c for c in drawn["curves"] if not c["label"].startswith("gamma=")]
    assert len({c["colour"] for c in schedulers}) == len(schedulers) == 4
    assert drawn["labelled_curve"] == "scheduler (uncalibrated)"


def test_full_scan_takes_the_best_allocation_of_every_step_for_any_profile():
    rng = random.Random(5)
    workload = synthetic_workload(5, prompts_per_category=1)
    concurrency = 3
    # A profile with steps and flat stretches, where stopping at the first non-increase can be wrong.
    sizes = list(range(1, concurrency * (BLOCK + 1) + 1))
    sps = SPSTable(sizes, [rng.choice([40.0, 60.0, 100.0]) for _ in sizes])
    result = simulate(workload, Policy("full-scan"), concurrency, sps, max_steps=20, record_lengths=True)
    streams = user_streams(workload, concurrency)

    def theta(lengths, rounds):
        tau = sum(1 + sum(math.prod(r.confidences[:i]) for i in range(1, j + 1)) for j, r in zip(lengths, rounds))
        return tau * sps.sps(sum(1 + j for j in lengths))

    for t, lengths in enumerate(result.lengths):
        rounds = [stream[t] for stream in streams]
        best = max(theta(choice, rounds) for choice in itertools.product(*[range(r.drafted + 1) for r in rounds]))
        assert theta(lengths, rounds) == pytest.approx(best, rel=1e-12)
    # The profile does break the early stop: the paper's scheduler decides differently.
    early_stop = simulate(workload, Policy("scheduler"), concurrency, sps, max_steps=20, record_lengths=True)
    assert early_stop.lengths != result.lengths
