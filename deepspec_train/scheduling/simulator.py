"""Serving simulator: replay evaluator traces as N concurrent users under different verification policies.

Input: a workload built from the per-round traces of ``deepspec eval --save-traces`` (``scheduling.workload``):
per request (the rounds of one ``(suite, prompt_id, turn)``), each round's drafted tokens, realised number of
accepted drafts and the confidences the policy sees.

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

The workload (requests, their rounds and the confidences a policy sees) comes from ``scheduling.workload``; the
tables of a run grid from ``scheduling.simulation_tables``, its plot from ``scheduling.frontier_plot``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Sequence

from deepspec_train.scheduling.greedy_prefix import allocate, greedy_path
from deepspec_train.scheduling.sps_table import SPSTable
from deepspec_train.scheduling.workload import ReplayRound


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
