"""How good the confidence head is for scheduling, measured on rounds held out from the calibration fit.

Sequential temperature scaling is fitted on one set of evaluator rounds (the calibration prompts) and scored on
another (the evaluation suites' rounds), per block position ``k``:

- ``ece``: expected calibration error (10 equal-width bins) of the calibrated cumulative survival
  ``S_k = prod_{i<=k} sigmoid(z_i / T_i)`` against realised survival (positions ``1..k`` all accepted), over
  the rounds that drafted ``k`` tokens: what a scheduler that multiplies confidences relies on;
- ``auroc_cumulative``: AUROC of ``S_k`` against realised survival, same rounds;
- ``auroc_conditional``: AUROC of the position's own confidence ``sigmoid(z_k / T_k)`` against acceptance of
  draft ``k``, over the rounds that reached position ``k`` (drafts ``1..k-1`` accepted): whether the head ranks
  which drafts survive verification at that position.

Binned ECE on a finite sample is biased upwards: even a perfectly calibrated head shows the bins' sampling noise.
``ece_floor`` is that noise level -- the mean ECE of the calibrated survival against outcomes drawn from it
(``Bernoulli(S_k)``, 200 draws) on the same rounds -- so a held-out ECE can be read against what perfect
calibration would measure on this many rounds.

Temperatures do not change an AUROC at one position (they are monotone maps of ``z_k``), only the ECE. The
inputs are ``TraceArrays`` (``deepspec_train.calibration.cli.survival_arrays`` of trace rounds).

What limits the conditional AUROC: before ``d_k`` is drawn, the probability that it will be accepted is the
analytic acceptance ``c*_k = sum min(p_k, q_k)`` (recorded per round as ``analytic_accept``), and whether it is
then accepted is a coin flip with that probability. No predictor that sees only what the head sees can rank the
outcomes better than ``c*_k`` itself, so ``auroc_bound`` -- the AUROC of ``c*_k`` against acceptance, on the same
rounds -- is the ceiling; it is low when ``c*_k`` varies little from block to block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepspec_train.calibration.cli import TraceArrays
from deepspec_train.calibration.temperature_scaling import (
    calibrated_confidences, cumulative_survival, sequential_temperature_scaling,
)
from deepspec_train.formats.eval_traces import TraceRound
from deepspec_train.metrics.calibration import auroc, ece


@dataclass
class HeldOutConfidence:
    """Per-position quality of the calibrated confidence head on held-out rounds (see the module docstring)."""

    temperatures: list[float]
    fit_rounds: int
    test_rounds: int
    counts: list[int]
    ece_before: list[float]
    ece: list[float]
    ece_floor: list[float]
    auroc_cumulative: list[float]
    auroc_conditional: list[float]
    conditional_counts: list[int]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def held_out_confidence(fit: TraceArrays, test: TraceArrays, n_bins: int = 10) -> HeldOutConfidence:
    """Fit STS on ``fit``'s rounds, score on ``test``'s."""
    temperatures = sequential_temperature_scaling(fit.logits, fit.survived, fit.valid, n_bins=n_bins).temperatures
    width = len(temperatures)
    if test.logits.shape[1] > width:
        raise ValueError(f"test rounds draft {test.logits.shape[1]} positions, the fit only calibrated {width}")
    temps = np.asarray(temperatures[: test.logits.shape[1]])
    survival = cumulative_survival(test.logits, temps)
    raw_survival = cumulative_survival(test.logits, np.ones_like(temps))
    conditional = calibrated_confidences(test.logits, temps)
    counts, ece_before, ece_after, floors, auc_cum, auc_cond, cond_counts = [], [], [], [], [], [], []
    rng = np.random.default_rng(0)
    for k in range(test.logits.shape[1]):
        rows = test.valid[:, k]
        outcome = test.survived[rows, k]
        counts.append(int(rows.sum()))
        ece_before.append(ece(raw_survival[rows, k], outcome, n_bins))
        ece_after.append(ece(survival[rows, k], outcome, n_bins))
        floors.append(ece_noise_floor(survival[rows, k], n_bins, rng))
        auc_cum.append(auroc(survival[rows, k], outcome))
        reached = rows if k == 0 else rows & (test.survived[:, k - 1] > 0.5)
        cond_counts.append(int(reached.sum()))
        auc_cond.append(auroc(conditional[reached, k], test.survived[reached, k]))
    return HeldOutConfidence(
        temperatures=[float(t) for t in temperatures],
        fit_rounds=int(fit.logits.shape[0]),
        test_rounds=int(test.logits.shape[0]),
        counts=counts,
        ece_before=ece_before,
        ece=ece_after,
        ece_floor=floors,
        auroc_cumulative=auc_cum,
        auroc_conditional=auc_cond,
        conditional_counts=cond_counts,
    )


def ece_noise_floor(probs: np.ndarray, n_bins: int, rng: np.random.Generator, draws: int = 200) -> float:
    """Mean ECE of ``probs`` against outcomes sampled from ``probs`` themselves: what a perfectly calibrated
    predictor measures on this many rows."""
    if probs.size == 0:
        return float("nan")
    return float(np.mean([ece(probs, (rng.random(probs.shape) < probs).astype(float), n_bins) for _ in range(draws)]))


def summary_lines(report: HeldOutConfidence) -> list[str]:
    """A fixed-width table, one line per position."""
    lines = ["pos      T      n  ECE before  ECE held-out  (floor)  AUROC cumulative  AUROC conditional (n)"]
    for k, t in enumerate(report.temperatures[: len(report.counts)]):
        lines.append(
            f"{k + 1:>3} {t:>6.3f} {report.counts[k]:>6} {report.ece_before[k]:>11.4f} {report.ece[k]:>13.4f}"
            f"  ({report.ece_floor[k]:.4f}) {report.auroc_cumulative[k]:>16.4f}"
            f" {report.auroc_conditional[k]:>18.4f} ({report.conditional_counts[k]})"
        )
    return lines


def conditional_auroc_bound(rows: Sequence[TraceRound], num_positions: int) -> list[float]:
    """Per position ``k``: AUROC of ``c*_k`` (trace ``analytic_accept``) against acceptance of draft ``k`` over the
    rounds that reached ``k`` (see the module docstring)."""
    bounds = []
    for k in range(num_positions):
        reached = [r for r in rows if r.drafted > k and r.accepted >= k and len(r.analytic_accept or ()) > k]
        scores = np.array([r.analytic_accept[k] for r in reached])
        accepted = np.array([float(r.accepted > k) for r in reached])
        bounds.append(auroc(scores, accepted))
    return bounds
