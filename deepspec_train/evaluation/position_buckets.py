"""Acceptance by position: tau of the verification rounds that start in each position bucket, per drafter, with
a bootstrap over prompts (paired between drafters for their ratios), as ``deepspec eval`` reports it.

Definitions:

- a round's position on an axis (``PositionAxis``): ``answer`` = the answer tokens of its turn emitted before the
  round (``TraceRound.answer_start``); ``context`` = the position of its anchor in the conversation, prompt and
  earlier turns included (``TraceRound.context_start``);
- buckets (``POSITION_BUCKETS``): half-open token ranges ``[start, end)``, 0-1K, 1K-4K, 4K-16K and 16K+
  (K = 1,024 tokens); a round counts in the bucket holding its start;
- tau of a bucket = emitted tokens / rounds over the rounds that start in it (bonus included; all prompts and
  seeds of the suite), as ``tau`` of a whole suite;
- intervals: a replicate draws the suite's prompts (seeds pooled per prompt, prompts aligned across drafters) with
  replacement and recomputes every drafter's bucket tau on that same draw, so a ratio ``tau_d / tau_baseline`` of
  a bucket is paired like ``evaluation.paired_bootstrap``'s. A prompt whose answer never reaches a bucket adds
  nothing to it; a replicate whose draw has no round in a bucket (for either drafter of a ratio) is left out of
  that bucket's interval, and a bucket with fewer than two usable replicates has no interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from deepspec_train.evaluation.paired_bootstrap import RatioEstimate, estimate_from_replicates
from deepspec_train.formats.eval_traces import TraceRound

KILO = 1024


@dataclass(frozen=True)
class PositionBucket:
    """Rounds starting at positions ``start <= p < end`` (``end`` None: no upper end)."""

    name: str
    start: int
    end: Optional[int]

    def holds(self, position: int) -> bool:
        return self.start <= position and (self.end is None or position < self.end)


POSITION_BUCKETS: tuple[PositionBucket, ...] = (
    PositionBucket("0-1K", 0, KILO),
    PositionBucket("1K-4K", KILO, 4 * KILO),
    PositionBucket("4K-16K", 4 * KILO, 16 * KILO),
    PositionBucket("16K+", 16 * KILO, None),
)


@dataclass(frozen=True)
class PositionAxis:
    """Which position a round is bucketed by: the ``TraceRound`` attribute ``field``, described by ``label``."""

    name: str
    field: str
    label: str


POSITION_AXES: dict[str, PositionAxis] = {
    axis.name: axis
    for axis in (
        PositionAxis("answer", "answer_start", "answer tokens before the round"),
        PositionAxis("context", "context_start", "conversation position of the round's anchor"),
    )
}


def bucket_index(position: int) -> int:
    """Index in ``POSITION_BUCKETS`` of the bucket holding ``position``."""
    for index, bucket in enumerate(POSITION_BUCKETS):
        if bucket.holds(position):
            return index
    raise ValueError(f"position {position} is in no bucket (negative?)")


def position_of(r: TraceRound, axis: PositionAxis) -> int:
    value = getattr(r, axis.field)
    if value is None:
        raise ValueError(f"round {r.round} of prompt {r.prompt_id} has no {axis.field} (a trace from before positions "
                         f"were recorded): decode again to get acceptance by position")
    return int(value)


@dataclass(frozen=True)
class BucketTotals:
    """One drafter's sums per prompt and bucket, prompts aligned across drafters: ``emitted[n, b]`` tokens over
    ``rounds[n, b]`` rounds."""

    emitted: np.ndarray
    rounds: np.ndarray


def bucket_totals(rows: dict[str, Sequence[TraceRound]], axis: PositionAxis) -> dict[str, BucketTotals]:
    """Per drafter, per-prompt bucket sums over the union of the drafters' prompts (``suite/prompt_id``; a
    drafter with no round of a prompt in a bucket has zeros there)."""
    keys = sorted({f"{r.suite}/{r.prompt_id}" for drafter_rows in rows.values() for r in drafter_rows})
    row_of = {key: i for i, key in enumerate(keys)}
    out = {}
    for name, drafter_rows in rows.items():
        emitted = np.zeros((len(keys), len(POSITION_BUCKETS)))
        rounds = np.zeros_like(emitted)
        for r in drafter_rows:
            cell = (row_of[f"{r.suite}/{r.prompt_id}"], bucket_index(position_of(r, axis)))
            emitted[cell] += r.emitted
            rounds[cell] += 1
        out[name] = BucketTotals(emitted, rounds)
    return out


@dataclass(frozen=True)
class BucketStat:
    """One drafter's rounds in one bucket: how many (and over how many prompts), their tau with its interval and,
    for a drafter other than the baseline, its paired tau ratio against the baseline."""

    bucket: str
    rounds: int
    prompts: int
    tau: Optional[float]
    interval: Optional[RatioEstimate]
    ratio: Optional[RatioEstimate] = None

    def to_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "rounds": self.rounds, "prompts": self.prompts, "tau": self.tau,
                "interval": None if self.interval is None else self.interval.to_dict(),
                "ratio": None if self.ratio is None else self.ratio.to_dict()}


def _ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)


def _finite_estimate(point: float, replicates: np.ndarray, level: float) -> Optional[RatioEstimate]:
    usable = replicates[np.isfinite(replicates)]
    return estimate_from_replicates(point, usable, level) if usable.size >= 2 else None


def position_stats(
    rows: dict[str, Sequence[TraceRound]],
    axis: PositionAxis,
    baseline: Optional[str] = None,
    replicates: int = 2000,
    seed: int = 0,
) -> dict[str, list[BucketStat]]:
    """``{drafter: [one BucketStat per POSITION_BUCKETS entry]}`` of ``rows`` (one suite's rounds per drafter, the
    drafters on the same prompts); ratios against ``baseline`` when it is given."""
    level = 0.95
    totals = bucket_totals(rows, axis)
    num_prompts = next(iter(totals.values())).rounds.shape[0]
    draws = np.random.default_rng(seed).integers(0, num_prompts, size=(replicates, num_prompts))
    replicate_tau = {name: _ratio_of_sums(t.emitted[draws].sum(axis=1), t.rounds[draws].sum(axis=1))
                     for name, t in totals.items()}
    out: dict[str, list[BucketStat]] = {}
    for name, t in totals.items():
        tau = _ratio_of_sums(t.emitted.sum(axis=0), t.rounds.sum(axis=0))
        stats = []
        for b, bucket in enumerate(POSITION_BUCKETS):
            point = None if np.isnan(tau[b]) else float(tau[b])
            interval = ratio = None
            if point is not None:
                interval = _finite_estimate(point, replicate_tau[name][:, b], level)
                base_tau = _ratio_of_sums(totals[baseline].emitted[:, b].sum(), totals[baseline].rounds[:, b].sum()) \
                    if baseline is not None and name != baseline else np.nan
                if np.isfinite(base_tau):
                    ratio = _finite_estimate(point / float(base_tau),
                                             replicate_tau[name][:, b] / replicate_tau[baseline][:, b], level)
            stats.append(BucketStat(bucket.name, int(t.rounds[:, b].sum()), int((t.rounds[:, b] > 0).sum()), point,
                                    interval, ratio))
        out[name] = stats
    return out


def bucket_cell(stat: BucketStat) -> str:
    """``tau [low, high] (n rounds)``, or ``-`` for a bucket without rounds."""
    if stat.tau is None:
        return "-"
    interval = "" if stat.interval is None else f" [{stat.interval.low:.3f}, {stat.interval.high:.3f}]"
    return f"{stat.tau:.3f}{interval} ({stat.rounds} rounds)"
