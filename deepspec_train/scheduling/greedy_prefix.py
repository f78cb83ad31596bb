"""DSpark's confidence scheduler: how many drafted tokens of each request the target verifies this step.

Definitions (``R`` requests; request ``r`` drafted ``K_r`` tokens with calibrated conditional confidences
``c_{r,1..K_r}``, each the probability that slot ``i`` is accepted given slots ``1..i-1`` were):

- cumulative survival ``a_{r,j} = prod_{i<=j} c_{r,i}``: the probability that drafted token ``j`` is accepted;
- verifying ``j`` drafted tokens of request ``r`` costs ``base + j`` batch tokens (``base``, default 1: the
  target always scores the request's current position, which yields the guaranteed correction/bonus token);
- expected tokens emitted by request ``r`` with prefix ``j``: ``1 + sum_{i<=j} a_{r,i}``;
- ``tau*(B) = sum_r (1 + sum_{i<=j_r} a_{r,i})``, ``B = sum_r (base + j_r)``, throughput ``Theta = tau* x SPS(B)``.

Greedy admission (the paper's): start from ``j_r = 0`` for all requests, sort every candidate extension
``(r, j)`` by ``a_{r,j}`` descending (stable; ties by ``r`` then ``j``), and admit candidates in that order while
each admission strictly increases ``Theta``; stop at the first one that does not. Because ``a_{r,j}`` is
non-increasing in ``j`` and ties break by ``j``, ``(r, j)`` always comes after ``(r, j-1)``: prerequisites hold.

What is exact, and when:

1. For every SPS profile, the best ``Theta`` along the greedy path equals the best over *all* allocations. For a
   fixed number ``m`` of admitted tokens ``B`` is fixed, so the best allocation maximises ``tau*``, i.e. takes
   the ``m`` largest ``a_{r,j}``; those form a valid allocation (prerequisites), and they are the greedy path's
   first ``m`` candidates.
2. If ``SPS`` is positive, non-increasing and concave over the batch sizes in play, the early stop is exact too:
   ``tau*`` along the path is increasing and concave in ``m`` (its increments are sorted descending), and the
   product of a positive increasing concave sequence with a positive non-increasing concave one is concave, hence
   unimodal, so the first non-increase is the maximum. For other profiles (e.g. a step down followed by a flat
   stretch) the early stop can end below the optimum; that is the price of deciding without looking ahead.
3. More load never lengthens anyone's verification (same SPS conditions): adding requests raises ``tau*`` and
   ``B`` at every point of the scan, and admitting candidate ``x`` after ``m`` admissions requires
   ``a_x / tau*_m > (SPS(B_m) - SPS(B_m + 1)) / SPS(B_m + 1)``, whose left side falls and right side rises.

Non-anticipation: ``allocate`` sees only the confidences computed from the drafted block before verification;
nothing about verification outcomes can reach it, and once it stops it never revisits earlier decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from deepspec_train.scheduling.sps_table import SPSTable


@dataclass(frozen=True)
class Allocation:
    """A verification plan for one step.

    ``lengths[r]``: drafted tokens of request ``r`` to verify. ``expected_accepted``: ``tau*``, the expected
    number of tokens the step emits across requests, the guaranteed token of every request included.
    ``batch_tokens``: ``B``. ``throughput``: ``Theta = tau* x SPS(B)`` in expected tokens per second.
    """

    lengths: list[int]
    expected_accepted: float
    batch_tokens: int
    throughput: float


@dataclass(frozen=True)
class GreedyPath:
    """Every candidate ``(request, position)`` in admission order (positions 1-based) and ``Theta`` after admitting
    the first ``m`` of them, ``throughputs[m]`` for ``m = 0..len(order)``."""

    order: list[tuple[int, int]]
    throughputs: list[float]


def cumulative_survivals(confidences: Sequence[Sequence[float]]) -> list[list[float]]:
    """``a_{r,j} = prod_{i<=j} c_{r,i}`` per request; confidences must lie in [0, 1]."""
    survivals = []
    for r, row in enumerate(confidences):
        running, out = 1.0, []
        for c in row:
            c = float(c)
            if not 0.0 <= c <= 1.0:
                raise ValueError(f"confidence {c} of request {r} is outside [0, 1]")
            running *= c
            out.append(running)
        survivals.append(out)
    return survivals


def evaluate_allocation(
    lengths: Sequence[int], confidences: Sequence[Sequence[float]], sps: SPSTable, base_tokens_per_request: int = 1
) -> Allocation:
    """``tau*``, ``B`` and ``Theta`` of a given plan ``lengths`` (each between 0 and that request's draft count)."""
    survivals = cumulative_survivals(confidences)
    if len(lengths) != len(survivals):
        raise ValueError(f"{len(lengths)} lengths for {len(survivals)} requests")
    tau = 0.0
    batch = 0
    for j, a in zip(lengths, survivals):
        if not 0 <= j <= len(a):
            raise ValueError(f"length {j} outside 0..{len(a)}")
        tau += 1.0 + sum(a[:j])
        batch += base_tokens_per_request + j
    return Allocation(list(map(int, lengths)), tau, batch, tau * sps.sps(batch))


def greedy_path(
    confidences: Sequence[Sequence[float]], sps: SPSTable, base_tokens_per_request: int = 1
) -> GreedyPath:
    """The whole greedy admission order and ``Theta`` along it (for analysis; ``allocate`` stops early)."""
    if base_tokens_per_request < 0:
        raise ValueError("base_tokens_per_request must be non-negative")
    survivals = cumulative_survivals(confidences)
    candidates = [(a, r, j + 1) for r, row in enumerate(survivals) for j, a in enumerate(row)]
    candidates.sort(key=lambda cand: (-cand[0], cand[1], cand[2]))
    tau = float(len(survivals))
    batch = base_tokens_per_request * len(survivals)
    throughputs = [tau * sps.sps(batch)]
    for a, _, _ in candidates:
        tau += a
        batch += 1
        throughputs.append(tau * sps.sps(batch))
    return GreedyPath([(r, j) for _, r, j in candidates], throughputs)


def allocate(
    confidences: Sequence[Sequence[float]], sps: SPSTable, base_tokens_per_request: int = 1
) -> Allocation:
    """Verification lengths per request by greedy admission with early stopping (see the module docstring).

    ``confidences[r]`` are request ``r``'s calibrated conditional confidences for its drafted positions, the only
    information the decision may use.
    """
    path = greedy_path(confidences, sps, base_tokens_per_request)
    lengths = [0] * len(confidences)
    admitted = 0
    while admitted < len(path.order) and path.throughputs[admitted + 1] > path.throughputs[admitted]:
        request, position = path.order[admitted]
        lengths[request] = position
        admitted += 1
    return evaluate_allocation(lengths, confidences, sps, base_tokens_per_request)
