"""The pictures of a multi-drafter ``deepspec eval`` (``evaluation.comparison_eval.write_plots``) against the table
they draw: built from synthetic rounds, each PNG's record (``formats.figures.read_drawn``) must hold every interval
and count of the table, grey the points below the stated minimum, name temperature and seeds, keep labels and
colours distinct, and fit its axes to the data it drew (no empty position bucket, no point on an axis edge)."""

from __future__ import annotations

import numpy as np
import pytest

from deepspec_train.comparison.position_plots import MIN_ROUNDS, probability_limits
from deepspec_train.evaluation.comparison_eval import write_plots
from deepspec_train.evaluation.table1 import TableSettings, build_table1
from deepspec_train.formats.eval_traces import TraceRound
from deepspec_train.formats.figures import read_drawn

BLOCK = 5
DRAFTERS = ("dspark", "dflash")


def _round(suite: str, prompt: int, index: int, accepted: int, seed: int) -> TraceRound:
    return TraceRound(suite=suite, category=suite, prompt_id=f"p{prompt}", turn=0, round=index, drafted=BLOCK,
                      accepted=accepted, emitted=accepted + 1, confidence_logits=None, confidences=None,
                      target_accept_probs=(1.0,) * BLOCK, draft_seconds=0.002, draft_cpu_seconds=0.001, seed=seed,
                      answer_start=4 * index, context_start=60 + 4 * index)


def _rows() -> dict[str, list[TraceRound]]:
    """Twelve prompts of 8 rounds on each of two suites per seed; dspark accepts more, so its late positions are
    reached by more rounds than dflash's (some below the minimum). Every round starts in the first position
    bucket (answers of at most 32 tokens)."""
    rng = np.random.default_rng(7)
    rows: dict[str, list[TraceRound]] = {}
    for drafter, p in zip(DRAFTERS, (0.8, 0.45)):
        rows[drafter] = [_round(suite, prompt, i, int(min(rng.geometric(1 - p) - 1, BLOCK)), seed)
                         for suite in ("math", "code") for prompt in range(12) for seed in (0, 1) for i in range(8)]
    return rows


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    rows = _rows()
    table = build_table1(rows, {d: BLOCK for d in DRAFTERS}, {d: 1 for d in DRAFTERS},
                         TableSettings("dflash", 1.0, (0, 1), ("math", "code"), replicates=300))
    out = tmp_path_factory.mktemp("plots")
    paths = write_plots(table, {d: d for d in DRAFTERS}, out)
    return table, {p.name: read_drawn(p) for p in paths}


def test_tau_bars_draw_the_tables_intervals_and_paired_ratios(drawn):
    table, plots = drawn
    tau = plots["tau_per_suite_T1.png"]
    assert tau["title"] == "tau per suite (95% bootstrap interval over prompts), T = 1, seeds 0, 1"
    assert tau["groups"] == ["math", "code", "mean"]
    for series in tau["series"]:
        d = series["label"]
        assert series["y"][:2] == pytest.approx([table.tau[d][s] for s in table.suites])
        assert series["interval"][:2] == [pytest.approx([table.tau_interval[d][s].low, table.tau_interval[d][s].high])
                                          for s in table.suites]
        assert all(low < y < high for y, (low, high) in zip(series["y"], series["interval"][:2]))
    assert len({s["colour"] for s in tau["series"]}) == len({s["label"] for s in tau["series"]}) == 2
    (ratio,) = tau["ratios"]
    assert ratio["label"] == "dspark / dflash" and ratio["groups"] == ["math", "code", "geomean"]
    expected = table.ratios["dspark"]
    assert ratio["value"] == pytest.approx([expected[g].value for g in ratio["groups"]])
    assert ratio["interval"] == [pytest.approx([expected[g].low, expected[g].high]) for g in ratio["groups"]]
    assert tau["ylim"][1] >= max(high for s in tau["series"] for _, high in s["interval"][:2])


def test_acceptance_curves_carry_their_rounds_and_grey_the_few(drawn):
    table, plots = drawn
    for suite in table.suites:
        plot = plots[f"conditional_acceptance_{suite}_T1.png"]
        assert plot["title"] == f"conditional acceptance on {suite}, T = 1, seeds 0, 1"
        for series in plot["series"]:
            d = series["label"]
            counts = table.acceptance_rounds[d][suite]
            assert series["counts"] == counts and series["y"] == pytest.approx(table.acceptance[d][suite])
            assert series["greyed"] == [n < MIN_ROUNDS for n in counts]
        low, high = plot["ylim"]
        assert all(low < y < high for s in plot["series"] for y in s["y"] if y is not None)
    # The synthetic dflash reaches its last positions in fewer rounds than the minimum; dspark never does.
    math = {s["label"]: s for s in plots["conditional_acceptance_math_T1.png"]["series"]}
    assert math["dflash"]["greyed"][-1] and not any(math["dspark"]["greyed"])


def test_position_buckets_show_only_buckets_with_rounds_inside_the_axes(drawn):
    table, plots = drawn
    plot = plots["tau_by_answer_position_math_T1.png"]
    assert plot["buckets"] == ["0-1K"] and plot["empty_buckets"] == ["1K-4K", "4K-16K", "16K+"]
    # One bucket: the point sits mid-axis, not on its edge.
    assert plot["xlim"] == pytest.approx([-0.5, 0.5])
    for series in plot["series"]:
        (stat,) = [b for b in table.positions["answer"][series["label"]]["math"] if b.rounds]
        assert series["counts"] == [stat.rounds] and series["y"] == pytest.approx([stat.tau])
        assert [series["low"][0], series["high"][0]] == pytest.approx([stat.interval.low, stat.interval.high])
        low, high = plot["ylim"]
        assert low < stat.interval.low and stat.interval.high < high


def test_probability_limits_fit_the_data_without_magnifying_noise():
    assert probability_limits([0.77, 0.78]) == pytest.approx((0.775 - 0.125 - 0.03, 0.775 + 0.125 + 0.03))
    low, high = probability_limits([0.95, 1.0])
    assert high == pytest.approx(1.03) and high - low == pytest.approx(0.25 + 0.03 + 0.03)
    assert probability_limits([0.0, 1.0]) == pytest.approx((-0.03, 1.03))
    assert probability_limits([]) == (-0.03, 1.03)
