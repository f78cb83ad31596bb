"""Tables of a simulated run grid: the frontier curve each run belongs to, the schedulers' gains over the best
fixed gamma at each load, the console table and the JSON document ``deepspec simulate`` writes."""

from __future__ import annotations

from typing import Sequence

from deepspec_train.scheduling.simulator import SimulationResult
from deepspec_train.scheduling.sps_table import SPSTable


def curve_label(result: SimulationResult) -> str:
    """The frontier curve a run belongs to: the policy, plus the confidence source unless it is the trace's."""
    if result.confidence_source in (None, "trace"):
        return result.policy
    return f"{result.policy} ({result.confidence_source})"


def scheduler_gains(results: Sequence[SimulationResult]) -> list[dict]:
    """Per concurrency and scheduler curve: aggregate and per-user tok/s against the best fixed gamma's aggregate
    at the same load (``gain`` = ratio - 1)."""
    best_fixed: dict[int, SimulationResult] = {}
    for r in results:
        if r.policy.startswith("gamma=") and (
            r.concurrency not in best_fixed or r.aggregate_tok_s > best_fixed[r.concurrency].aggregate_tok_s
        ):
            best_fixed[r.concurrency] = r
    gains = []
    for r in results:
        if r.policy.startswith("gamma=") or r.concurrency not in best_fixed:
            continue
        ref = best_fixed[r.concurrency]
        gains.append(
            {
                "concurrency": r.concurrency,
                "curve": curve_label(r),
                "aggregate_tok_s": r.aggregate_tok_s,
                "best_fixed": ref.policy,
                "best_fixed_aggregate_tok_s": ref.aggregate_tok_s,
                "aggregate_gain": r.aggregate_tok_s / ref.aggregate_tok_s - 1.0,
                "per_user_gain": r.per_user_tok_s / ref.per_user_tok_s - 1.0,
                "mean_budget": r.mean_budget,
            }
        )
    return gains


def format_table(results: Sequence[SimulationResult]) -> list[str]:
    """One line per run, grouped by concurrency, with the gain over the best fixed gamma for scheduler runs."""
    gain_of = {(g["concurrency"], g["curve"]): g["aggregate_gain"] for g in scheduler_gains(results)}
    categories = sorted({c for r in results for c in r.budget_by_category})
    header = f"{'N':>4}  {'policy':<34} {'user tok/s':>10} {'agg tok/s':>10} {'mean L':>6} {'vs best':>8}"
    lines = [header + "".join(f" {('L ' + c)[:10]:>10}" for c in categories)]
    for r in sorted(results, key=lambda r: r.concurrency):
        gain = gain_of.get((r.concurrency, curve_label(r)))
        gain_text = f"{100 * gain:+7.1f}%" if gain is not None else f"{'':>8}"
        lines.append(
            f"{r.concurrency:>4}  {curve_label(r):<34} {r.per_user_tok_s:>10.1f} {r.aggregate_tok_s:>10.1f}"
            f" {r.mean_budget:>6.2f} {gain_text}"
            + "".join(f" {r.budget_by_category.get(c, float('nan')):>10.2f}" for c in categories)
        )
    return lines


def results_document(results: Sequence[SimulationResult], sps: SPSTable, settings: dict) -> dict:
    """The JSON written by ``deepspec simulate``: settings, every run, and the scheduler's gains."""
    return {
        "settings": settings,
        "sps": sps.to_dict(),
        "runs": [r.to_dict() for r in results],
        "gains": scheduler_gains(results),
    }
