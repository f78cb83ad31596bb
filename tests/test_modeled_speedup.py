"""The quality benchmark's modeled-speedup columns (``bench/modeled_speedup.py``) on small synthetic inputs: the
speedup ratios against a bootstrap of the speedups themselves, the table against direct formulas, and the
production counterpart of a trained drafter read from its directory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import Qwen3Config

from bench.modeled_speedup import modeled_cost, scaled, speedup_ratios, speedup_table, trained_settings
from deepspec_train.config.schema import DrafterConfig, RecipeConfig, TargetConfig
from deepspec_train.evaluation.paired_bootstrap import RatioEstimate, bootstrap_tau_ratios, prompt_totals
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.costs.gpu_specs import gpu_spec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.costs.serving_cost import production_counterpart, round_times

FACTORS = {"a": 0.81, "b": 0.74}


def _totals(scale: dict[str, float]) -> dict:
    g = np.random.default_rng(1)
    out = {}
    for category in ("code", "math", "prose"):
        rounds = g.integers(4, 20, 9)
        out[category] = {name: prompt_totals(rounds * g.uniform(1.5, 6, 9) * scale[name], rounds)
                         for name in ("a", "b")}
    return out


def test_speedup_ratios_equal_a_bootstrap_of_the_speedups_themselves() -> None:
    """Scaling each drafter's emitted tokens by its factor makes tau the modeled speedup; bootstrapping those with
    the same draws gives the speedup ratios directly."""
    taus = bootstrap_tau_ratios(_totals({"a": 1.0, "b": 1.0}), [("a", "b")], 3000, seed=4)
    direct = bootstrap_tau_ratios(_totals(FACTORS), [("a", "b")], 3000, seed=4)[("a", "b")]
    modeled = speedup_ratios(taus, FACTORS)[("a", "b")]
    assert set(modeled) == {"code", "math", "prose", "geomean"}
    for category, estimate in modeled.items():
        want = direct[category]
        assert (estimate.value, estimate.se, estimate.low, estimate.high) == pytest.approx(
            (want.value, want.se, want.low, want.high), rel=1e-9)


def test_scaled_refuses_a_non_positive_factor() -> None:
    e = RatioEstimate(1.2, 0.03, 1.15, 1.26)
    assert scaled(e, 2.0) == RatioEstimate(2.4, 0.06, 2.3, 2.52)
    with pytest.raises(ValueError, match="positive"):
        scaled(e, 0.0)


def test_speedup_table_cells() -> None:
    totals = {"code": {"a": prompt_totals([30, 10], [10, 5]), "b": prompt_totals([20, 10], [10, 5])},
              "math": {"a": prompt_totals([40], [8]), "b": prompt_totals([36], [8])}}
    factors = {1: FACTORS, 32: {"a": 0.7, "b": 0.6}}
    ratios = {b: speedup_ratios(bootstrap_tau_ratios(totals, [("a", "b")], 200, seed=0), f) for b, f in factors.items()}
    columns, rows = speedup_table(totals, ["a", "b"], factors, ratios)
    assert columns == ["category", "a b=1", "b b=1", "a b=32", "b b=32", "a / b b=1", "a / b b=32"]
    code, math_row, geomean = rows
    assert code[:5] == ["code", f"{40 / 15 * 0.81:.3f}", f"{2 * 0.74:.3f}", f"{40 / 15 * 0.7:.3f}", f"{2 * 0.6:.3f}"]
    assert math_row[1] == f"{5 * 0.81:.3f}"
    assert geomean[1] == f"{math.sqrt(40 / 15 * 0.81 * 5 * 0.81):.3f}"
    assert geomean[5].startswith(f"{ratios[1][('a', 'b')]['geomean'].value:.3f} [")


def test_modeled_cost_of_a_trained_drafter(tmp_path) -> None:
    """The settings come back from the trained-drafter directory; the times are the counterpart's at each batch."""
    config = Qwen3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, vocab_size=97, num_hidden_layers=4, max_position_embeddings=512)
    drafter = DrafterConfig(num_layers=3, markov_rank=8, markov_head_type="rnn", mask_token_id=3)
    cfg = RecipeConfig(drafter=drafter, target=TargetConfig(layer_ids=[1, 2]))
    module = kind_spec("dspark").build(drafter, geometry_from_target_config(config), [1, 2], None)
    write_trained_drafter(module, cfg, tmp_path / "drafter")
    settings, taps = trained_settings(tmp_path / "drafter")
    assert settings == drafter and taps == 2
    cost = modeled_cost("tiny-dspark", settings, taps, batches=(1, 32))
    served = production_counterpart(drafter, 2, "tiny-dspark")
    assert cost.times[32] == round_times(served, gpu_spec("H200"), 32)
    assert cost.served.geometry.hidden_size == 4096 and cost.served.drafter.markov_head_type == "rnn"
    summary = cost.to_dict()
    assert summary["counterpart"]["num_layers"] == 3 and summary["counterpart"]["taps"] == 2
    assert summary["batches"]["1"]["draft_us"] == pytest.approx(1e6 * cost.times[1].draft_s)
