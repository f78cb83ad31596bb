"""The simulator's workload: evaluator traces grouped into requests, and the confidences a policy sees.

A *request* is the stream of rounds of one ``(suite, prompt_id, turn)`` in the traces of ``deepspec eval
--save-traces`` (read through ``formats.eval_traces``), in round order.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from deepspec_train.formats.eval_traces import TraceRound

CONFIDENCE_SOURCES = ("trace", "uncalibrated", "calibrated", "oracle")


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


def group_requests(rounds: Sequence[TraceRound]) -> list[TraceRequest]:
    """Group trace rounds into requests (first-seen order), each sorted by round number."""
    grouped: dict[tuple[str, str, int], list[TraceRound]] = {}
    for r in rounds:
        grouped.setdefault(r.request, []).append(r)
    return [
        TraceRequest(suite, members[0].category, prompt_id, turn, tuple(sorted(members, key=lambda r: r.round)))
        for (suite, prompt_id, turn), members in grouped.items()
    ]


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
