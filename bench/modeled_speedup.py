"""The quality benchmark's serving-cost columns (``bench/quality.py``): each drafter's production counterpart
(``deepspec_train.costs.serving_cost``: its structure at Qwen3-8B widths), its modeled draft time per round, and the
modeled speedup ``tau * t_target / (t_verify + t_draft)`` with the benchmark's measured tau, per category, at each
reported batch size on one GPU.

For one drafter, batch and GPU the factor ``t_target / (t_verify + t_draft)`` is a constant, so the modeled speedup
of a bootstrap replicate is its tau times that constant, and the ratio of two drafters' modeled speedups is their
tau ratio times the ratio of their constants, replicate by replicate: the paired-bootstrap estimate of the tau
ratio (``evaluation.paired_bootstrap``) scales to the speedup ratio exactly, standard error and percentiles
included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.evaluation.drafter_comparison import ratio_cell
from deepspec_train.config.schema import DrafterConfig
from deepspec_train.evaluation.paired_bootstrap import PromptTotals, RatioEstimate
from deepspec_train.formats.trained_drafter import read_trained_drafter
from deepspec_train.costs.gpu_specs import gpu_spec
from deepspec_train.costs.serving_cost import (
    DEFAULT_CONTEXT, REPORT_BATCHES, REPORT_GPU, RoundTimes, ServedDrafter, production_counterpart, round_times,
)


@dataclass(frozen=True)
class ModeledCost:
    """A drafter's production counterpart and its modeled round times at each batch size on ``gpu``."""

    served: ServedDrafter
    gpu: str
    times: dict[int, RoundTimes]

    def to_dict(self) -> dict:
        d = self.served.drafter
        return {"gpu": self.gpu, "counterpart": {"kind": d.kind, "num_layers": d.num_layers, "block_size": d.block_size,
                                                 "markov_rank": d.markov_rank, "markov_head_type": d.markov_head_type,
                                                 "ttt_steps": d.ttt_steps, "draft_vocab_size": d.draft_vocab_size,
                                                 "taps": self.served.taps},
                "batches": {str(b): {"draft_us": 1e6 * t.draft_s, "verify_us": 1e6 * t.verify_s,
                                     "target_us": 1e6 * t.target_s, "speedup_per_token": t.speedup_per_token}
                            for b, t in self.times.items()}}


def trained_settings(drafter_dir: str | Path) -> tuple[DrafterConfig, int]:
    """The drafter settings and number of tapped target layers of a trained drafter (``<run>/drafter``)."""
    trained = read_trained_drafter(drafter_dir)
    return trained.drafter, len(trained.target_layer_ids)


def modeled_cost(name: str, drafter: DrafterConfig, taps: int, gpu: str = REPORT_GPU,
                 batches: Sequence[int] = REPORT_BATCHES, context_len: int = DEFAULT_CONTEXT) -> ModeledCost:
    """The modeled round times of the production counterpart of a drafter with settings ``drafter`` and ``taps``
    tapped target layers."""
    served = production_counterpart(drafter, taps, name)
    spec = gpu_spec(gpu)
    return ModeledCost(served, gpu, {b: round_times(served, spec, b, context_len) for b in batches})


def scaled(estimate: RatioEstimate, factor: float) -> RatioEstimate:
    """``estimate`` of a ratio multiplied by a positive constant (value, standard error and interval alike)."""
    if factor <= 0:
        raise ValueError(f"the scale factor must be positive, got {factor}")
    return RatioEstimate(estimate.value * factor, estimate.se * factor, estimate.low * factor,
                         estimate.high * factor)


def speedup_ratios(tau_ratios: Mapping[tuple[str, str], Mapping[str, RatioEstimate]],
                   factors: Mapping[str, float]) -> dict[tuple[str, str], dict[str, RatioEstimate]]:
    """Modeled-speedup ratios ``a / b`` per category and geomean, from the paired tau ratios and each drafter's
    ``t_target / (t_verify + t_draft)`` (see the module docstring)."""
    return {(a, b): {c: scaled(e, factors[a] / factors[b]) for c, e in per.items()}
            for (a, b), per in tau_ratios.items()}


def speedup_table(
    totals: Mapping[str, Mapping[str, PromptTotals]],
    names: Sequence[str],
    factors: Mapping[int, Mapping[str, float]],
    ratios: Mapping[int, Mapping[tuple[str, str], Mapping[str, RatioEstimate]]],
) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: per category, each drafter's modeled speedup at each batch size and the speedup ratios
    (``ratios[batch]``, from ``speedup_ratios``); the last row holds geometric means over the categories."""
    batches = list(factors)
    pairs = list(ratios[batches[0]]) if batches else []
    columns = ["category", *(f"{n} b={b}" for b in batches for n in names),
               *(f"{a} / {x} b={b}" for b in batches for a, x in pairs)]
    speedups = {c: {(n, b): float(totals[c][n].tau()) * factors[b][n] for n in names for b in batches}
                for c in totals}
    body = []
    for category in sorted(totals):
        body.append([category, *(f"{speedups[category][n, b]:.3f}" for b in batches for n in names),
                     *(ratio_cell(ratios[b][p][category]) for b in batches for p in pairs)])
    geomean = {key: math.exp(sum(math.log(s[key]) for s in speedups.values()) / len(speedups))
               for key in next(iter(speedups.values()))} if speedups else {}
    body.append(["geomean", *(f"{geomean[n, b]:.3f}" for b in batches for n in names),
                 *(ratio_cell(ratios[b][p]["geomean"]) for b in batches for p in pairs)])
    return columns, body
