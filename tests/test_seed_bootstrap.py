"""The two-level bootstrap over training seeds and prompts (``evaluation.seed_bootstrap``): its point estimate is
the pooled tau ratio computed by hand, with one training seed it is exactly the paired prompt bootstrap, and a
spread between training seeds that the prompts do not show widens the interval (a one-level bootstrap over the
pooled prompts would miss it)."""

from __future__ import annotations

import numpy as np
import pytest

from deepspec_train.evaluation.paired_bootstrap import bootstrap_tau_ratios, prompt_totals
from deepspec_train.evaluation.seed_bootstrap import pooled_tau, seed_and_prompt_ratios


def _seed(emitted_a, emitted_b, rounds=(10.0, 10.0, 10.0, 10.0)):
    return {"math": {"a": prompt_totals(emitted_a, rounds), "b": prompt_totals(emitted_b, rounds)}}


def test_point_estimate_is_the_pooled_ratio() -> None:
    totals = [_seed([40, 50, 60, 30], [30, 30, 30, 30]), _seed([20, 30, 40, 50], [30, 30, 30, 31])]
    got = seed_and_prompt_ratios(totals, [("a", "b")], replicates=200)[("a", "b")]
    expected = (40 + 50 + 60 + 30 + 20 + 30 + 40 + 50) / (30 * 7 + 31)
    assert got["math"].value == pytest.approx(expected) and got["geomean"].value == pytest.approx(expected)
    assert pooled_tau(totals)["math"]["b"] == pytest.approx((30 * 7 + 31) / 80)


def test_one_training_seed_is_the_paired_prompt_bootstrap() -> None:
    rng = np.random.default_rng(3)
    single = {c: {k: prompt_totals(rng.integers(10, 60, 12), rng.integers(5, 15, 12)) for k in ("a", "b")}
              for c in ("code", "math")}
    two_level = seed_and_prompt_ratios([single], [("a", "b")], replicates=500, seed=7)
    one_level = bootstrap_tau_ratios(single, [("a", "b")], replicates=500, seed=7)
    assert two_level == one_level


def test_seed_spread_widens_the_interval() -> None:
    same = [_seed([50, 50, 50, 50], [40, 40, 40, 40]) for _ in range(4)]
    spread = [_seed([e] * 4, [40, 40, 40, 40]) for e in (40, 60, 45, 55)]
    narrow = seed_and_prompt_ratios(same, [("a", "b")], replicates=1000)[("a", "b")]["math"]
    wide = seed_and_prompt_ratios(spread, [("a", "b")], replicates=1000)[("a", "b")]["math"]
    assert narrow.value == wide.value == pytest.approx(1.25)
    assert narrow.high - narrow.low == pytest.approx(0.0) and wide.high - wide.low > 0.1
