"""Serving simulator: replay evaluator traces as N concurrent users under different verification policies.

Input: the per-round traces of ``deepspec eval --save-traces`` (one JSON object per verification round with the
drafter's per-position confidences and the realised number of accepted drafts). A *request* is the stream of
rounds of one ``(suite, prompt_id, turn)``.

Users. ``N`` users each walk the whole pool of requests, one after another, starting at request
``floor(u * M / N)`` of the ``M`` requests and wrapping around, and consume one round per simulated step. Every
user is busy for the whole run (no ramp-up or tail), and the users of ``N`` are a subset of those of ``2N`` at
the same offsets, so loads can be compared step by step.

One step. Every user offers its current round's confidences; the policy picks a verification length ``L_u``
(0..drafted); the step verifies ``B = sum_u (base + L_u)`` tokens (``base`` = 1: the position whose target
logits give the correction or bonus token) and takes ``1 / SPS(B)`` seconds; user ``u`` emits
``min(accepted_u, L_u) + 1`` tokens. Truncating the realised acceptance to the verified prefix is exact: whether
the first ``L`` drafts are accepted does not depend on drafts after them. The next step moves every user to its
next round whatever was emitted (the trace's next round stands in for the draft the user would make next).

Policies:

- ``scheduler``: ``allocate`` (greedy prefix admission on ``Theta = tau* x SPS(B)``) with the current confidences;
- ``full-scan``: the best point of the whole greedy path instead of the first non-increase: the optimum over all
  allocations for any SPS profile. It differs from ``scheduler`` only where the profile breaks the early stop's
  exactness conditions, so the gap between the two measures what the early stop costs on a given profile;
- ``async``: the capacity ``B_cap`` is the batch the scheduler would have chosen from the confidences of
  ``delay`` (= 2) steps earlier (the CUDA-graph batch size must be fixed before the current step's drafts
  exist); the current confidences then fill the ``B_cap - N * base`` draft slots greedily by cumulative
  survival (the same order ``greedy_path`` admits, so prefixes are respected), with no early stop: the
  capacity is already paid for. Before ``delay`` steps of history exist, no draft slots are granted;
- ``fixed`` gamma: every user verifies ``min(gamma, drafted)`` drafts.

Reported per run: per-user tok/s (mean over users of tokens / simulated time), aggregate tok/s (all tokens /
simulated time) and the mean verification budget ``L`` overall and per request category.

Confidences come from the traces as recorded (``trace``), or are recomputed from the recorded confidence logits
as ``sigmoid(z_k)`` (``uncalibrated``) or ``sigmoid(z_k / T_k)`` with a calibration's temperatures
(``calibrated``), so the effect of calibration on the scheduler can be simulated side by side. The ``oracle``
source (1 on every accepted draft, 0 from the first rejected one) looks at the outcome and breaks
non-anticipation on purpose: it is the upper bound a perfect confidence head would reach on the same traffic.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from deepspec_train.scheduling.greedy_prefix import allocate, greedy_path
from deepspec_train.scheduling.sps_table import SPSTable

CONFIDENCE_SOURCES = ("trace", "uncalibrated", "calibrated", "oracle")


@dataclass(frozen=True)
class TraceRound:
    """One verification round as the evaluator recorded it."""

    drafted: int
    accepted: int
    confidence_logits: tuple[float, ...] | None
    confidences: tuple[float, ...] | None


@dataclass(frozen=True)
class TraceRequest:
    """The rounds of one ``(suite, prompt_id, turn)``, in round order."""

    suite: str
    category: str
    prompt_id: str
    turn: int
    rounds: tuple[TraceRound, ...]


@dataclass(frozen=True)
class ReplayRound:
    """What the simulator needs from a round: its category, drafts, realised acceptance, and the confidences the
    policy sees (``None`` when the drafter has no confidence head)."""

    category: str
    drafted: int
    accepted: int
    confidences: tuple[float, ...] | None


@dataclass(frozen=True)
class Policy:
    """``kind`` is ``scheduler``, ``full-scan``, ``async`` or ``fixed`` (with ``gamma``); ``delay`` is the async lag
    in steps."""

    kind: str
    gamma: int = 0
    delay: int = 2

    def __post_init__(self) -> None:
        if self.kind not in ("scheduler", "full-scan", "async", "fixed"):
            raise ValueError(f"unknown policy kind {self.kind!r}")
        if self.kind == "fixed" and self.gamma < 0:
            raise ValueError(f"gamma must be non-negative, got {self.gamma}")
        if self.kind == "async" and self.delay < 1:
            raise ValueError(f"the async delay must be at least one step, got {self.delay}")

    @property
    def name(self) -> str:
        names = {"scheduler": "scheduler", "full-scan": "full-scan-scheduler", "async": "async-scheduler"}
        return names.get(self.kind, f"gamma={self.gamma}")

    @property
    def needs_confidences(self) -> bool:
        return self.kind != "fixed"


@dataclass
class SimulationResult:
    """Totals of one run; ``lengths[t][u]`` (every step's decisions) only when requested."""

    policy: str
    concurrency: int
    steps: int
    seconds: float
    tokens: int
    per_user_tok_s: float
    aggregate_tok_s: float
    mean_budget: float
    mean_batch_tokens: float
    budget_by_category: dict[str, float]
    confidence_source: str | None = None
    lengths: list[list[int]] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("lengths")
        return out


def _float_tuple(values: Sequence[float] | None, drafted: int, what: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    if len(values) != drafted:
        raise ValueError(f"{what} has {len(values)} entries for {drafted} drafted tokens")
    return tuple(float(v) for v in values)


def parse_trace_round(row: dict) -> TraceRound:
    """Validate one trace line's round fields."""
    drafted, accepted = int(row["drafted"]), int(row["accepted"])
    if not 0 <= accepted <= drafted:
        raise ValueError(f"accepted {accepted} outside 0..drafted ({drafted})")
    return TraceRound(
        drafted,
        accepted,
        _float_tuple(row.get("confidence_logits"), drafted, "confidence_logits"),
        _float_tuple(row.get("confidences"), drafted, "confidences"),
    )


def load_traces(paths: Iterable[str | os.PathLike]) -> list[TraceRequest]:
    """Group the rounds of every trace file into requests (first-seen order), each sorted by round number."""
    rows: dict[tuple[str, str, int], list[tuple[int, TraceRound]]] = {}
    categories: dict[tuple[str, str, int], str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = (str(row["suite"]), str(row["prompt_id"]), int(row["turn"]))
                    parsed = parse_trace_round(row)
                    round_no = int(row["round"])
                except (KeyError, ValueError, TypeError) as exc:
                    raise ValueError(f"{path}:{line_no}: bad trace round: {exc}") from exc
                rows.setdefault(key, []).append((round_no, parsed))
                categories.setdefault(key, str(row.get("category") or row["suite"]))
    requests = []
    for key, numbered in rows.items():
        numbered.sort(key=lambda item: item[0])
        requests.append(TraceRequest(key[0], categories[key], key[1], key[2], tuple(r for _, r in numbered)))
    return requests


def load_temperatures(path: str | os.PathLike) -> list[float]:
    """Per-position temperatures from ``deepspec calibrate``'s JSON (``temperatures``) or an exported DSpark
    config (``confidence_temperatures``)."""
    data = json.loads(Path(path).read_text())
    for key in ("temperatures", "confidence_temperatures"):
        if key in data:
            temperatures = [float(t) for t in data[key]]
            if any(t <= 0 for t in temperatures):
                raise ValueError(f"{path}: temperatures must be positive, got {temperatures}")
            return temperatures
    raise ValueError(f"{path} has neither 'temperatures' nor 'confidence_temperatures'")


def _sigmoid(x: float) -> float:
    # Split by sign so that large |x| neither overflows exp nor loses the tiny probability.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def round_confidences(
    trace_round: TraceRound, source: str, temperatures: Sequence[float] | None = None
) -> tuple[float, ...] | None:
    """The confidences a policy sees for a round under ``source`` (see the module docstring)."""
    if source == "trace":
        return trace_round.confidences
    if source == "oracle":
        return tuple(float(k < trace_round.accepted) for k in range(trace_round.drafted))
    if source not in CONFIDENCE_SOURCES:
        raise ValueError(f"unknown confidence source {source!r}; expected one of {CONFIDENCE_SOURCES}")
    logits = trace_round.confidence_logits
    if logits is None:
        return None
    if source == "uncalibrated":
        return tuple(_sigmoid(z) for z in logits)
    if temperatures is None:
        raise ValueError("calibrated confidences need temperatures")
    if len(logits) > len(temperatures):
        raise ValueError(f"a round drafted {len(logits)} tokens but only {len(temperatures)} temperatures exist")
    return tuple(_sigmoid(z / t) for z, t in zip(logits, temperatures))


def build_workload(
    requests: Sequence[TraceRequest], source: str = "trace", temperatures: Sequence[float] | None = None
) -> list[list[ReplayRound]]:
    """Per request, its rounds as the simulator replays them, with confidences from ``source``."""
    return [
        [
            ReplayRound(request.category, r.drafted, r.accepted, round_confidences(r, source, temperatures))
            for r in request.rounds
        ]
        for request in requests
        if request.rounds
    ]


def _async_lengths(confidences: list[tuple[float, ...]], capacity: int, sps: SPSTable, base: int) -> list[int]:
    """Fill ``capacity - N * base`` draft slots in greedy admission order (prefix-respecting), no early stop."""
    lengths = [0] * len(confidences)
    slots = max(capacity - base * len(confidences), 0)
    for request, position in greedy_path(confidences, sps, base).order[:slots]:
        lengths[request] = position
    return lengths


def _best_of_path_lengths(confidences: list[tuple[float, ...]], sps: SPSTable, base: int) -> list[int]:
    """The best point of the whole greedy path (the optimum over all allocations for any SPS profile)."""
    path = greedy_path(confidences, sps, base)
    best = max(range(len(path.throughputs)), key=path.throughputs.__getitem__)
    lengths = [0] * len(confidences)
    for request, position in path.order[:best]:
        lengths[request] = position
    return lengths


def simulate(
    workload: Sequence[Sequence[ReplayRound]],
    policy: Policy,
    concurrency: int,
    sps: SPSTable,
    base_tokens_per_request: int = 1,
    max_steps: int | None = None,
    record_lengths: bool = False,
) -> SimulationResult:
    """Run ``concurrency`` users over the workload (one full pass per user unless ``max_steps`` says otherwise)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    flat = [r for request in workload for r in request]
    if not flat:
        raise ValueError("the workload has no rounds")
    if policy.needs_confidences and any(r.confidences is None for r in flat):
        raise ValueError(f"policy {policy.name} needs confidences, but some rounds have none (no confidence head?)")
    starts, offset = [], 0
    for request in workload:
        starts.append(offset)
        offset += len(request)
    user_starts = [starts[u * len(workload) // concurrency] for u in range(concurrency)]
    steps = len(flat) if max_steps is None else max_steps
    base = base_tokens_per_request

    tokens = [0] * concurrency
    seconds = 0.0
    batch_total = 0
    budget_sum: dict[str, int] = defaultdict(int)
    budget_count: dict[str, int] = defaultdict(int)
    past_capacities: list[int] = []
    decisions: list[list[int]] = []
    for t in range(steps):
        rounds = [flat[(start + t) % len(flat)] for start in user_starts]
        if policy.kind == "fixed":
            lengths = [min(policy.gamma, r.drafted) for r in rounds]
        elif policy.kind == "full-scan":
            lengths = _best_of_path_lengths([r.confidences for r in rounds], sps, base)
        else:
            confidences = [r.confidences for r in rounds]
            plan = allocate(confidences, sps, base)
            if policy.kind == "scheduler":
                lengths = plan.lengths
            else:
                past_capacities.append(plan.batch_tokens)
                capacity = past_capacities[t - policy.delay] if t >= policy.delay else base * concurrency
                lengths = _async_lengths(confidences, capacity, sps, base)
        batch = sum(base + length for length in lengths)
        seconds += 1.0 / sps.sps(batch)
        batch_total += batch
        for u, (r, length) in enumerate(zip(rounds, lengths)):
            tokens[u] += min(r.accepted, length) + 1
            budget_sum[r.category] += length
            budget_count[r.category] += 1
        if record_lengths:
            decisions.append(list(lengths))

    total_tokens = sum(tokens)
    return SimulationResult(
        policy=policy.name,
        concurrency=concurrency,
        steps=steps,
        seconds=seconds,
        tokens=total_tokens,
        per_user_tok_s=sum(n / seconds for n in tokens) / concurrency,
        aggregate_tok_s=total_tokens / seconds,
        mean_budget=sum(budget_sum.values()) / sum(budget_count.values()),
        mean_batch_tokens=batch_total / steps,
        budget_by_category={c: budget_sum[c] / budget_count[c] for c in sorted(budget_count)},
        lengths=decisions if record_lengths else None,
    )


def run_grid(
    workloads: dict[str, Sequence[Sequence[ReplayRound]]],
    gammas: Sequence[int],
    concurrencies: Sequence[int],
    sps: SPSTable,
    base_tokens_per_request: int = 1,
    async_delay: int = 2,
    max_steps: int | None = None,
    full_scan: bool = False,
) -> list[SimulationResult]:
    """Every policy at every concurrency: fixed gammas once (acceptance does not depend on the confidence source),
    scheduler and async scheduler (and the full-scan scheduler when asked) once per confidence source whose
    rounds all carry confidences."""
    if not workloads:
        raise ValueError("no workload to simulate")
    results = []
    any_workload = next(iter(workloads.values()))
    for n in concurrencies:
        for gamma in gammas:
            results.append(simulate(any_workload, Policy("fixed", gamma), n, sps, base_tokens_per_request, max_steps))
        for source, workload in workloads.items():
            if any(r.confidences is None for request in workload for r in request):
                continue
            policies = [Policy("scheduler"), Policy("async", delay=async_delay)]
            if full_scan:
                policies.append(Policy("full-scan"))
            for policy in policies:
                result = simulate(workload, policy, n, sps, base_tokens_per_request, max_steps)
                result.confidence_source = source
                results.append(result)
    return results


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


# Frontier styling: a colour per confidence source, a line style per scheduler policy, greys for fixed gamma.
_SOURCE_COLOURS = {
    None: "tab:blue",
    "trace": "tab:blue",
    "uncalibrated": "tab:orange",
    "calibrated": "tab:green",
    "oracle": "tab:purple",
}
_POLICY_STYLES = {"scheduler": "-", "async-scheduler": "--", "full-scan-scheduler": "-."}


def plot_frontier(results: Sequence[SimulationResult], path: str | os.PathLike) -> Path:
    """Aggregate tok/s (y) against per-user tok/s (x), one curve per policy, points labelled by concurrency."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves: dict[str, list[SimulationResult]] = defaultdict(list)
    for r in results:
        curves[curve_label(r)].append(r)
    gammas = sorted({r.policy for r in results if r.policy.startswith("gamma=")}, key=lambda p: int(p[6:]))
    greys = colormaps["Greys"]
    fig = Figure(figsize=(8.0, 5.5))
    ax = fig.add_subplot()
    for label, runs in curves.items():
        runs.sort(key=lambda r: r.concurrency)
        xs, ys = [r.per_user_tok_s for r in runs], [r.aggregate_tok_s for r in runs]
        policy = runs[0].policy
        if policy in gammas:
            shade = 0.35 + 0.6 * gammas.index(policy) / max(len(gammas) - 1, 1)
            ax.plot(xs, ys, marker=".", linestyle=":", color=greys(shade), label=label)
        else:
            colour = _SOURCE_COLOURS.get(runs[0].confidence_source, "tab:red")
            ax.plot(xs, ys, marker="o", markersize=4, linestyle=_POLICY_STYLES[policy], color=colour, label=label)
        for r, x, y in zip(runs, xs, ys):
            ax.annotate(f"N={r.concurrency}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user tokens/s")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title("throughput frontier (up and right is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, format="png", dpi=120, bbox_inches="tight")
    return out


def results_document(results: Sequence[SimulationResult], sps: SPSTable, settings: dict) -> dict:
    """The JSON written by ``deepspec simulate``: settings, every run, and the scheduler's gains."""
    return {
        "settings": settings,
        "sps": sps.to_dict(),
        "runs": [r.to_dict() for r in results],
        "gains": scheduler_gains(results),
    }
