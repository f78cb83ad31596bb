"""Evaluation traces: one JSON object per verification round, written by ``deepspec eval --save-traces`` and read
by ``deepspec calibrate`` (sequential temperature scaling), ``deepspec simulate`` (the scheduler replay) and the
quality benchmark.

A line holds ``suite``, ``category``, ``prompt_id`` (which request it belongs to), ``turn`` and ``round`` (its place
in that request), ``drafted`` K, ``accepted`` n (``0 <= n <= K``), ``emitted`` (n + 1: the accepted drafts and
the correction or bonus token), ``confidence_logits`` / ``confidences`` (K values each, or null for a drafter
without a confidence head) and ``target_accept_probs`` (the target's acceptance ratio of each draft). Optional,
null or absent in traces written before they existed: ``analytic_accept`` (K values, the analytic acceptance
``c*_k = sum min(p_k, q_k)`` of each position given the drafted prefix), ``draft_seconds`` /
``draft_cpu_seconds`` (wall time of the drafter's call for the round, and the calling thread's CPU time during
it), ``seed`` (the sampling seed, when a benchmark pools several), ``answer_start`` (answer tokens of this
turn emitted before the round) and ``context_start`` (the position of the round's anchor in the conversation:
every prompt, bridge and answer token before it), which ``evaluation.position_buckets`` groups rounds by.
``write_traces`` and ``read_traces`` are the only code that knows this layout; a malformed line fails reading
with one line naming ``file:line``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class TraceRound:
    """One verification round of one request (``(suite, prompt_id, turn)``)."""

    suite: str
    category: str
    prompt_id: str
    turn: int
    round: int
    drafted: int
    accepted: int
    emitted: int
    confidence_logits: Optional[tuple[float, ...]]
    confidences: Optional[tuple[float, ...]]
    target_accept_probs: tuple[float, ...]
    analytic_accept: Optional[tuple[float, ...]] = None
    draft_seconds: Optional[float] = None
    draft_cpu_seconds: Optional[float] = None
    seed: Optional[int] = None
    answer_start: Optional[int] = None
    context_start: Optional[int] = None

    @property
    def request(self) -> tuple[str, str, int]:
        return (self.suite, self.prompt_id, self.turn)


def _optional_number(value: Any, name: str, kind: type) -> Any:
    if value is None:
        return None
    number = kind(value)
    if number < 0:
        raise ValueError(f"{name} = {value!r} is negative")
    return number


def _floats(value: Any, drafted: int, name: str, required: bool) -> Optional[tuple[float, ...]]:
    if value is None:
        if required:
            raise ValueError(f"{name} is missing")
        return None
    values = tuple(float(v) for v in value)
    if name != "target_accept_probs" and len(values) != drafted:
        raise ValueError(f"{name} has {len(values)} entries for {drafted} drafted tokens")
    return values


def parse_round(row: dict) -> TraceRound:
    """One decoded trace line as a ``TraceRound``; raises ``ValueError`` on a malformed one."""
    drafted, accepted = int(row["drafted"]), int(row["accepted"])
    if drafted < 0 or not 0 <= accepted <= drafted:
        raise ValueError(f"accepted {accepted} outside 0..drafted ({drafted})")
    return TraceRound(
        suite=str(row["suite"]),
        category=str(row.get("category") or row["suite"]),
        prompt_id=str(row["prompt_id"]),
        turn=int(row["turn"]),
        round=int(row["round"]),
        drafted=drafted,
        accepted=accepted,
        emitted=int(row["emitted"]),
        confidence_logits=_floats(row.get("confidence_logits"), drafted, "confidence_logits", False),
        confidences=_floats(row.get("confidences"), drafted, "confidences", False),
        target_accept_probs=_floats(row.get("target_accept_probs", []), drafted, "target_accept_probs", True),
        analytic_accept=_floats(row.get("analytic_accept"), drafted, "analytic_accept", False),
        draft_seconds=_optional_number(row.get("draft_seconds"), "draft_seconds", float),
        draft_cpu_seconds=_optional_number(row.get("draft_cpu_seconds"), "draft_cpu_seconds", float),
        seed=_optional_number(row.get("seed"), "seed", int),
        answer_start=_optional_number(row.get("answer_start"), "answer_start", int),
        context_start=_optional_number(row.get("context_start"), "context_start", int),
    )


def write_traces(path: str | os.PathLike, rounds: Iterable[TraceRound]) -> Path:
    """Write ``rounds`` as JSON lines (strict JSON) to ``path``; returns it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for r in rounds:
            handle.write(json.dumps(dataclasses.asdict(r), allow_nan=False) + "\n")
    return out


def read_traces(paths: Sequence[str | os.PathLike]) -> list[TraceRound]:
    """Every round of the trace files ``paths``, in file order."""
    rounds = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rounds.append(parse_round(json.loads(line)))
                except (KeyError, ValueError, TypeError) as exc:
                    raise ValueError(f"{path}:{line_no}: bad trace round: {exc}") from None
    return rounds
