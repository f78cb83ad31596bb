"""The DSpark paper's Table-1 layout from the rounds of several drafters decoded on the same suites: tau per suite
and its macro average, each drafter's tau ratio against a baseline with a paired bootstrap over prompts,
conditional acceptance per position, and the measured draft cost per round.

Definitions (as ``deepspec eval``'s report and ``evaluation.paired_bootstrap``):

- ``tau`` of a suite = emitted tokens / verification rounds over all its prompts and seeds (bonus included),
  with each drafter's own 95% bootstrap interval over prompts (``paired_bootstrap.bootstrap_tau``, the same draws
  as the ratios');
- macro average = the unweighted mean of the suites' tau (each suite counts the same, as the paper's average);
- ratio ``d / baseline`` per suite = tau_d / tau_baseline; across suites, the geometric mean of those ratios.
  Intervals come from one paired bootstrap per temperature: a replicate redraws each suite's prompts (seeds
  pooled per prompt) and recomputes every drafter's tau on that draw;
- ``P(A_k | A_<k)`` per position (``evaluation.report.conditional_acceptance``) and the rounds that reached each
  position (``evaluation.report.acceptance_rounds``);
- draft cost: sequential decoder-layer passes per round (from the drafter's kind) and measured drafter time per
  round, as CPU time of the decoding thread and as wall time, each with a bootstrap interval over prompts;
- tau by position bucket (``evaluation.position_buckets``): per axis (answer index, conversation position), suite
  and drafter, the tau and rounds of the rounds starting in each bucket, a bootstrap interval over prompts and the
  paired ratio against the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.common.errors import UserError
from deepspec_train.evaluation.paired_bootstrap import RatioEstimate, bootstrap_tau, bootstrap_tau_ratios
from deepspec_train.evaluation.drafter_comparison import draft_ms_per_round, markdown, tau_by_category, totals_by_category
from deepspec_train.evaluation.position_buckets import (
    POSITION_AXES, POSITION_BUCKETS, BucketStat, bucket_cell, position_stats,
)
from deepspec_train.evaluation.report import acceptance_rounds, conditional_acceptance
from deepspec_train.formats.eval_traces import TraceRound

MACRO = "macro avg"
GEOMEAN = "geomean"


@dataclass(frozen=True)
class DraftCost:
    """A drafter's cost per round: layer passes one after the other, measured ms (CPU and wall) and, when its
    settings are known, the modeled draft time of its production counterpart (``serving_cost``: the same
    structure at Qwen3-8B widths, batch 1, context 1,024, on an H200), in microseconds."""

    sequential_layer_passes: int
    cpu_ms: RatioEstimate
    wall_ms: RatioEstimate
    modeled_us: Optional[float] = None


@dataclass(frozen=True)
class Table1:
    """One temperature's comparison; see the module docstring for every number."""

    temperature: float
    seeds: tuple[int, ...]
    baseline: str
    drafters: tuple[str, ...]
    suites: tuple[str, ...]
    prompts: dict[str, int]
    tau: dict[str, dict[str, float]]
    macro_tau: dict[str, float]
    ratios: dict[str, dict[str, RatioEstimate]]
    acceptance: dict[str, dict[str, list[Optional[float]]]]
    cost: dict[str, DraftCost]
    # axis -> drafter -> suite -> one BucketStat per POSITION_BUCKETS entry.
    positions: dict[str, dict[str, dict[str, list[BucketStat]]]]
    # drafter -> suite -> the drafter's own tau interval, and the rounds behind each P(A_k | A_<k).
    tau_interval: dict[str, dict[str, RatioEstimate]]
    acceptance_rounds: dict[str, dict[str, list[int]]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature, "seeds": list(self.seeds), "baseline": self.baseline,
            "drafters": list(self.drafters), "suites": list(self.suites), "prompts": self.prompts,
            "tau": self.tau, "macro_tau": self.macro_tau,
            "tau_interval": {d: {s: e.to_dict() for s, e in by_suite.items()}
                             for d, by_suite in self.tau_interval.items()},
            "ratios": {d: {s: e.to_dict() for s, e in by_suite.items()} for d, by_suite in self.ratios.items()},
            "conditional_acceptance": self.acceptance, "acceptance_rounds": self.acceptance_rounds,
            "draft_cost": {d: {"sequential_layer_passes": c.sequential_layer_passes, "cpu_ms": c.cpu_ms.to_dict(),
                               "wall_ms": c.wall_ms.to_dict(), "modeled_us_h200_batch1": c.modeled_us}
                           for d, c in self.cost.items()},
            "tau_by_position": {axis: {d: {s: [b.to_dict() for b in stats] for s, stats in by_suite.items()}
                                       for d, by_suite in by_drafter.items()}
                                for axis, by_drafter in self.positions.items()},
        }


@dataclass(frozen=True)
class TableSettings:
    """How one temperature's table is computed: the ``baseline`` drafter the ratios divide by, the decoding
    ``temperature`` and ``seeds``, the command line's ``suite_order`` and the bootstrap's replicates and seed."""

    baseline: str
    temperature: float
    seeds: tuple[int, ...]
    suite_order: tuple[str, ...] = ()
    replicates: int = 2000
    bootstrap_seed: int = 0


def build_table1(
    rows: dict[str, list[TraceRound]],
    block_sizes: dict[str, int],
    layer_passes: dict[str, int],
    settings: TableSettings,
    modeled_us: Optional[dict[str, Optional[float]]] = None,
) -> Table1:
    """The table of drafters ``rows`` (name -> their rounds, every drafter on the same prompts and seeds); suites
    in ``settings.suite_order`` come first, in that order (the command line's), any others after them;
    ``modeled_us``: each drafter's modeled draft time per round at production widths, where known."""
    baseline, suite_order = settings.baseline, settings.suite_order
    replicates, bootstrap_seed = settings.replicates, settings.bootstrap_seed
    if baseline not in rows:
        raise UserError(f"--baseline {baseline!r} is not one of the drafters {sorted(rows)}")
    drafters = tuple(rows)
    totals = totals_by_category(rows, group_of=lambda r: r.suite)
    suites = tuple([s for s in suite_order if s in totals] + sorted(set(totals) - set(suite_order)))
    tau = tau_by_category(totals)
    by_drafter = {d: {s: tau[s][d] for s in suites} for d in drafters}
    others = [d for d in drafters if d != baseline]
    estimates = bootstrap_tau_ratios(totals, [(d, baseline) for d in others], replicates, bootstrap_seed)
    own = bootstrap_tau(totals, replicates, bootstrap_seed)
    by_suite_rows = {d: {s: [r for r in rows[d] if r.suite == s] for s in suites} for d in drafters}
    acceptance = {d: {s: conditional_acceptance(by_suite_rows[d][s], block_sizes[d]) for s in suites} for d in drafters}
    reached = {d: {s: acceptance_rounds(by_suite_rows[d][s], block_sizes[d]) for s in suites} for d in drafters}
    cost = {
        d: DraftCost(layer_passes[d], draft_ms_per_round(rows[d], replicates, bootstrap_seed),
                     draft_ms_per_round(rows[d], replicates, bootstrap_seed, field="draft_seconds"),
                     (modeled_us or {}).get(d))
        for d in drafters
    }
    # Traces written before rounds recorded their positions give no position tables.
    positioned = all(r.answer_start is not None and r.context_start is not None for d in drafters for r in rows[d])
    positions: dict[str, dict[str, dict[str, list[BucketStat]]]] = {}
    for axis in POSITION_AXES.values() if positioned else ():
        on_axis = positions.setdefault(axis.name, {d: {} for d in drafters})
        for s in suites:
            stats = position_stats({d: [r for r in rows[d] if r.suite == s] for d in drafters}, axis, baseline,
                                   replicates, bootstrap_seed)
            for d in drafters:
                on_axis[d][s] = stats[d]
    return Table1(
        temperature=settings.temperature, seeds=settings.seeds, baseline=baseline, drafters=drafters, suites=suites,
        prompts={s: next(iter(totals[s].values())).emitted.size for s in suites},
        tau=by_drafter, macro_tau={d: sum(by_drafter[d].values()) / len(suites) for d in drafters},
        ratios={d: estimates[(d, baseline)] for d in others}, acceptance=acceptance, cost=cost, positions=positions,
        tau_interval={d: {s: own[s][d] for s in suites} for d in drafters}, acceptance_rounds=reached,
    )


def _interval(estimate: RatioEstimate) -> str:
    return f"{estimate.value:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"


def tau_rows(table: Table1) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the main table, laid out as the paper's: one column per suite (with its prompt count)
    and the macro average, a tau row per drafter (with its interval), then a ratio row per drafter other than the
    baseline (whose last cell is the geometric mean of the suites' ratios)."""
    others = [d for d in table.drafters if d != table.baseline]
    columns = ["", *(f"{s} (n={table.prompts[s]})" for s in table.suites), f"{MACRO} (ratios: {GEOMEAN})"]
    body = [[f"tau {d}", *(_interval(table.tau_interval[d][s]) for s in table.suites), f"{table.macro_tau[d]:.3f}"]
            for d in table.drafters]
    body += [[f"{d} / {table.baseline}", *(_interval(table.ratios[d][s]) for s in table.suites),
              _interval(table.ratios[d][GEOMEAN])] for d in others]
    return columns, body


def acceptance_rows(table: Table1) -> tuple[list[str], list[list[str]]]:
    """``drafter | suite | P(A_1) .. P(A_K)`` for the longest block among the drafters."""
    width = max(len(curve) for by_suite in table.acceptance.values() for curve in by_suite.values())
    columns = ["drafter", "suite", *(f"k={k}" for k in range(1, width + 1))]
    body = []
    for d in table.drafters:
        for s in table.suites:
            cells = ["-" if v is None else f"{v:.3f}" for v in table.acceptance[d][s]]
            body.append([d, s, *cells, *[""] * (width - len(cells))])
    return columns, body


def cost_rows(table: Table1) -> tuple[list[str], list[list[str]]]:
    columns = ["drafter", "sequential layer passes / round", "draft CPU ms / round", "draft wall ms / round",
               "modeled draft us / round (Qwen3-8B widths, H200, batch 1)"]
    body = [[d, str(c.sequential_layer_passes), _interval(c.cpu_ms), _interval(c.wall_ms),
             "-" if c.modeled_us is None else f"{c.modeled_us:,.0f}"] for d, c in table.cost.items()]
    return columns, body


def position_rows(table: Table1, axis: str) -> tuple[list[str], list[list[str]]]:
    """``drafter | suite | one cell per bucket``: tau [interval] (rounds) per drafter, then each other drafter's
    paired ratio against the baseline."""
    columns = ["", "suite", *(b.name for b in POSITION_BUCKETS)]
    by_drafter = table.positions[axis]
    body = [[f"tau {d}", s, *(bucket_cell(b) for b in by_drafter[d][s])] for d in table.drafters for s in table.suites]
    body += [[f"{d} / {table.baseline}", s, *("-" if b.ratio is None else _interval(b.ratio) for b in by_drafter[d][s])]
             for d in table.drafters if d != table.baseline for s in table.suites]
    return columns, body


def table1_markdown(table: Table1) -> str:
    """The tables of one temperature as markdown, under a heading naming temperature and seeds."""
    seeds = ", ".join(str(s) for s in table.seeds)
    parts = [f"## T = {table.temperature:g} (seeds {seeds}; baseline {table.baseline})", "",
             markdown(*tau_rows(table)), "", "P(A_k | A_<k), per position:", "", markdown(*acceptance_rows(table)),
             "", "Draft cost (measured on this machine; modeled at production widths):", "", markdown(*cost_rows(table))]
    for axis in (POSITION_AXES[name] for name in table.positions):
        parts += ["", f"tau by {axis.label} (rounds starting in each bucket; 95% bootstrap over prompts):", "",
                  markdown(*position_rows(table, axis.name))]
    return "\n".join(parts)
