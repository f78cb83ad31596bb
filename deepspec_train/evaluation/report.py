"""Aggregate evaluator rounds into ``results.json``: per suite and per category, tau, conditional acceptance,
throughput and the confidence head's predictions next to the realised acceptance.

Input: the rounds of ``deepspec eval`` (``formats.eval_traces.TraceRound``: ``suite``, ``category``, ``drafted``,
``accepted``, ``emitted``, ``confidences``) and one ``ConversationStats`` per decoded conversation (its new tokens
and wall time). Definitions:

- ``tau`` = emitted tokens / verification rounds (the bonus or correction token included), with
  ``tau_interval``: a 95% bootstrap interval over ``prompts`` (the distinct prompts, seeds and turns pooled per
  prompt; absent below two prompts);
- ``conditional_acceptance[k-1]`` = P(A_k | A_<k): among rounds that drafted at least ``k`` tokens and accepted
  the first ``k-1``, the fraction that accepted draft ``k`` (``None`` when no round reached position ``k``), out
  of ``acceptance_rounds[k-1]`` rounds;
- ``mean_confidence[k-1]``: the mean calibrated confidence ``c_k`` over the same rounds, so it sits next to the
  realised ``conditional_acceptance[k-1]`` (absent without a confidence head);
- ``tokens_per_s`` = new tokens / decoding seconds, summed over conversations;
- ``draft_ms_per_round`` = the drafter's mean wall time per round (``draft_seconds`` of the traces), in ms;
- ``tau_by_position``: per position axis (``answer``, ``context``), one entry per bucket of
  ``evaluation.position_buckets.POSITION_BUCKETS``: tau and rounds of the rounds starting in it, with a bootstrap
  interval over prompts (absent for traces that do not record positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from deepspec_train.evaluation.paired_bootstrap import bootstrap_tau, prompt_totals
from deepspec_train.evaluation.position_buckets import POSITION_AXES, position_stats
from deepspec_train.formats.eval_traces import TraceRound


@dataclass(frozen=True)
class ConversationStats:
    suite: str
    category: str
    new_tokens: int
    seconds: float


def acceptance_rounds(rounds: Sequence[TraceRound], block_size: int) -> list[int]:
    """Rounds that reached position ``k`` (drafted at least ``k`` tokens, accepted the first ``k-1``), for
    ``k = 1..block_size``: the denominators of ``conditional_acceptance``."""
    return [sum(r.drafted >= k and r.accepted >= k - 1 for r in rounds) for k in range(1, block_size + 1)]


def tau_interval(rounds: Sequence[TraceRound]) -> Optional[dict[str, float]]:
    """Bootstrap over prompts of the rounds' pooled tau (``paired_bootstrap.bootstrap_tau``), or None below two
    prompts."""
    sums: dict[str, list[float]] = {}
    for r in rounds:
        entry = sums.setdefault(f"{r.suite}/{r.prompt_id}", [0.0, 0.0])
        entry[0] += r.emitted
        entry[1] += 1
    if len(sums) < 2:
        return None
    totals = prompt_totals([e for e, _ in sums.values()], [n for _, n in sums.values()])
    return bootstrap_tau({"": {"": totals}})[""][""].to_dict()


def conditional_acceptance(rounds: Sequence[TraceRound], block_size: int) -> list[Optional[float]]:
    """P(A_k | A_<k) for ``k = 1..block_size`` from per-round ``drafted`` / ``accepted`` counts."""
    rates: list[Optional[float]] = []
    for k in range(1, block_size + 1):
        reached = [r for r in rounds if r.drafted >= k and r.accepted >= k - 1]
        rates.append(sum(r.accepted >= k for r in reached) / len(reached) if reached else None)
    return rates


def mean_confidence(rounds: Sequence[TraceRound], block_size: int) -> Optional[list[Optional[float]]]:
    """Mean ``c_k`` over the rounds that reached position ``k``; ``None`` when no round carries confidences."""
    scored = [r for r in rounds if r.confidences is not None]
    if not scored:
        return None
    means: list[Optional[float]] = []
    for k in range(1, block_size + 1):
        values = [r.confidences[k - 1] for r in scored if r.drafted >= k and r.accepted >= k - 1]
        means.append(sum(values) / len(values) if values else None)
    return means


def summarize(rounds: Sequence[TraceRound], conversations: list[ConversationStats], block_size: int) -> dict[str, Any]:
    """The metrics of one group of rounds (a suite, or one category of it)."""
    num_rounds = len(rounds)
    new_tokens = sum(c.new_tokens for c in conversations)
    seconds = sum(c.seconds for c in conversations)
    summary: dict[str, Any] = {
        "tau": sum(r.emitted for r in rounds) / num_rounds if num_rounds else None,
        "rounds": num_rounds,
        "prompts": len({(r.suite, r.prompt_id) for r in rounds}),
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / seconds if seconds > 0 else None,
        "conditional_acceptance": conditional_acceptance(rounds, block_size),
        "acceptance_rounds": acceptance_rounds(rounds, block_size),
    }
    interval = tau_interval(rounds)
    if interval is not None:
        summary["tau_interval"] = interval
    timed = [r.draft_seconds for r in rounds if r.draft_seconds is not None]
    if timed:
        summary["draft_ms_per_round"] = 1e3 * sum(timed) / len(timed)
    confidence = mean_confidence(rounds, block_size)
    if confidence is not None:
        summary["mean_confidence"] = confidence
    if rounds and all(r.answer_start is not None and r.context_start is not None for r in rounds):
        summary["tau_by_position"] = {axis.name: [b.to_dict() for b in position_stats({"": rounds}, axis)[""]]
                                      for axis in POSITION_AXES.values()}
    return summary


def _by_key(items: Iterable, key) -> dict[str, list]:
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def build_results(
    rounds: Sequence[TraceRound], conversations: list[ConversationStats], block_size: int, header: dict[str, Any]
) -> dict[str, Any]:
    """``header`` (target, drafter, drafter_kind, block_size, temperature, ...) plus ``suites``: per suite the
    summary and, under ``categories``, the summary of each category."""
    suite_rounds = _by_key(rounds, lambda r: r.suite)
    suite_convs = _by_key(conversations, lambda c: c.suite)
    suites: dict[str, Any] = {}
    for suite in sorted(set(suite_rounds) | set(suite_convs)):
        s_rounds, s_convs = suite_rounds.get(suite, []), suite_convs.get(suite, [])
        cat_rounds = _by_key(s_rounds, lambda r: r.category)
        cat_convs = _by_key(s_convs, lambda c: c.category)
        entry = summarize(s_rounds, s_convs, block_size)
        entry["categories"] = {
            cat: summarize(cat_rounds.get(cat, []), cat_convs.get(cat, []), block_size)
            for cat in sorted(set(cat_rounds) | set(cat_convs))
        }
        suites[suite] = entry
    return {**header, "suites": suites}


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_table(results: dict[str, Any]) -> str:
    """A plain-text table, one row per suite: tau, rounds, tokens/s and conditional acceptance per position."""
    lines = [f"{'suite':<16} {'tau':>6} {'rounds':>7} {'tok/s':>8}  P(A_k | A_<k), k = 1..K"]
    for name, entry in results["suites"].items():
        acceptance = " ".join(_fmt(a) for a in entry["conditional_acceptance"])
        lines.append(
            f"{name:<16} {_fmt(entry['tau']):>6} {entry['rounds']:>7} {_fmt(entry['tokens_per_s'], 1):>8}  {acceptance}"
        )
        if "mean_confidence" in entry:
            confidence = " ".join(_fmt(c) for c in entry["mean_confidence"])
            lines.append(f"{'':<16} {'':>6} {'':>7} {'':>8}  mean confidence: {confidence}")
        for axis, buckets in entry.get("tau_by_position", {}).items():
            cells = "  ".join(f"{b['bucket']} {_fmt(b['tau'])} ({b['rounds']})" for b in buckets)
            lines.append(f"{'':<16} {'':>6} {'':>7} {'':>8}  tau by {axis} position (rounds): {cells}")
    return "\n".join(lines)
