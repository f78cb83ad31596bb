"""Rewrite the assistant turns of a prompt set with the target's own answers, resumably.

``regenerate_file`` reads any source ``deepspec_train.data.conversations.iter_records`` reads, keeps each row's
system and user turns, and asks a backend for every assistant turn in order. With ``multi_turn="first"`` a
row is cut after its first user turn(s) and gets one answer; with ``"all"`` every assistant turn is
regenerated, turn by turn, each prompt holding the target's own earlier answers. A row that ends with a user
turn gets an answer appended.

Output is OpenAI-form JSON lines (``id``, ``category`` when the input has one, ``messages``). Each finished
row is appended and fsynced, so a crash loses only the rows in flight; a re-run reads the output, drops a
half-written last line, and skips ids already there. The output may not be the input file (after resolving
links) nor lie inside an input directory: both are refused before anything is read. Rows whose generation failed
are not written, so the next run retries them. Row order in the output is completion order, except for a batched
backend that does not stream (chunk order).

A streaming backend (``backend.StreamingBackend``: the local one) is fed one turn at a time: a row's next turn is
queued as soon as its previous answer is back, so the backend's batch stays full, and its progress moves with
every decoding step (``progress``).
"""

from __future__ import annotations

import json
import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import count, islice
from pathlib import Path
from typing import Any

from deepspec_train.data.conversations import (
    REASONING_INPUT_FIELDS, SHAREGPT_ROLES, BadRow, iter_records, normalize_conversation,
)
from deepspec_train.common.errors import UserError
from deepspec_train.regenerate.backend import ChatBackend, GenerationError, Message, StreamingBackend, TurnRequest
from deepspec_train.regenerate.progress import RegenerateProgress
from deepspec_train.regenerate.sampling import SamplingParams

MULTI_TURN_MODES = ("first", "all")
# Stands in for an assistant turn until the target's answer replaces it; never written out.
_PENDING = None


class NoPromptError(ValueError):
    """A row in which some assistant turn has no user turn before it, so there is nothing to answer."""


@dataclass
class RegenerateSummary:
    done: int = 0
    # Rows already in the output from an earlier run.
    skipped: int = 0
    failed: int = 0
    failure_reasons: Counter = field(default_factory=Counter)
    bad_rows: Counter = field(default_factory=Counter)

    def format(self) -> str:
        text = f"regenerated {self.done} rows, skipped {self.skipped} already done, {self.failed} failed"
        if self.failure_reasons:
            text += " (" + ", ".join(f"{r}: {n}" for r, n in self.failure_reasons.most_common()) + ")"
        if self.bad_rows:
            text += "; bad input rows: " + ", ".join(f"{r}: {n}" for r, n in self.bad_rows.most_common())
        return text


@dataclass
class PlannedRow:
    """One input row to answer, with its pending assistant turns."""

    id: Any
    category: Any
    # Assistant turns to (re)generate have content ``_PENDING``.
    messages: list[dict]


def _next_pending(messages: list[dict]) -> int | None:
    return next((i for i, m in enumerate(messages) if m["content"] is _PENDING), None)


def plan_turns(messages: list[Message], multi_turn: str) -> list[dict]:
    """The conversation with each assistant turn to generate marked pending; raises ``NoPromptError`` if an
    assistant turn would have no user turn before it."""
    if multi_turn == "first":
        first_answer = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        kept = messages[:first_answer]
    else:
        kept = list(messages)
    plan = [{"role": "assistant", "content": _PENDING} if m["role"] == "assistant" else dict(m) for m in kept]
    if not plan or plan[-1]["role"] != "assistant":
        plan.append({"role": "assistant", "content": _PENDING})
    first_pending = next(i for i, m in enumerate(plan) if m["role"] == "assistant")
    if not any(m["role"] == "user" for m in plan[:first_pending]):
        raise NoPromptError("no user turn before the first assistant turn")
    return plan


def _placeholder_answers(record: dict) -> dict:
    """The record with its assistant turns' text replaced by a placeholder and their reasoning dropped. Every
    answer is regenerated here, so a prompt set may leave them empty or hold answers a training row could not
    (``normalize_conversation`` rejects blank answers and unclosed ``<think>`` blocks)."""
    for turns_key, role_key, content_key in (("messages", "role", "content"), ("conversations", "from", "value")):
        turns = record.get(turns_key)
        if not isinstance(turns, list):
            continue
        filled = []
        for turn in turns:
            text = isinstance(turn, dict) and isinstance(turn.get(content_key), str)
            if text and SHAREGPT_ROLES.get(str(turn.get(role_key)).lower()) == "assistant":
                turn = {key: value for key, value in turn.items() if key not in REASONING_INPUT_FIELDS}
                turn[content_key] = "(to be regenerated)"
            filled.append(turn)
        return {**record, turns_key: filled}
    return record


def regenerate_rows(
    rows: list[PlannedRow], backend: ChatBackend, sampling: SamplingParams
) -> list[list[dict] | GenerationError]:
    """Fill every pending turn of ``rows``: all rows' first pending turns in one ``generate`` call, then all
    second ones, and so on, so a batched backend sees full batches."""
    conversations = [[dict(m) for m in row.messages] for row in rows]
    results: list[list[dict] | GenerationError] = list(conversations)
    while True:
        active = []
        for i, conversation in enumerate(conversations):
            slot = _next_pending(conversation)
            if slot is not None and not isinstance(results[i], GenerationError):
                active.append((i, slot))
        if not active:
            return results
        answers = backend.generate([conversations[i][:slot] for i, slot in active], sampling)
        for (i, slot), answer in zip(active, answers):
            if isinstance(answer, GenerationError):
                results[i] = answer
            else:
                conversations[i][slot]["content"] = answer


def check_output_is_not_input(input_path: str, output_path: str) -> None:
    """Raise ``UserError`` when writing ``output_path`` would overwrite or feed back into ``input_path``."""
    source = Path(os.path.expanduser(input_path)).resolve()
    output = Path(os.path.expanduser(output_path)).resolve()
    same = source == output or (source.is_file() and output.is_file() and os.path.samefile(source, output))
    if same:
        raise UserError(f"--out {output_path} is the input file {input_path}; write the answers to another file")
    if source.is_dir() and output.is_relative_to(source):
        raise UserError(
            f"--out {output_path} lies inside the input directory {input_path}, so a re-run would read it back "
            "as input; write it elsewhere"
        )


def read_finished_ids(output_path: str) -> set[str]:
    """Ids of the rows already in ``output_path``. A last line without its newline is the row a crash was
    writing: it is cut off the file so the next append starts on a clean line."""
    finished: set[str] = set()
    if not os.path.exists(output_path):
        return finished
    complete_bytes = 0
    with open(output_path, "rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                break
            complete_bytes += len(line)
            if not line.strip():
                continue
            try:
                finished.add(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                raise UserError(
                    f"{output_path}:{line_number} is not a regenerated row; fix or remove it before resuming"
                ) from None
    if complete_bytes < os.path.getsize(output_path):
        os.truncate(output_path, complete_bytes)
    return finished


def _input_rows(
    input_path: str,
    split: str,
    multi_turn: str,
    finished: set[str],
    summary: RegenerateSummary,
    on_skip: Callable[[], None],
) -> Iterator[PlannedRow]:
    seen: set[str] = set()
    for index, (where, record) in enumerate(iter_records(input_path, split)):
        if isinstance(record, BadRow):
            summary.bad_rows[record.reason] += 1
            on_skip()
            continue
        row_id = record.get("id")
        row_id = index if row_id is None else row_id
        key = str(row_id)
        if key in seen:
            summary.bad_rows["duplicate_id"] += 1
            on_skip()
            continue
        seen.add(key)
        if key in finished:
            summary.skipped += 1
            on_skip()
            continue
        try:
            plan = plan_turns(normalize_conversation(_placeholder_answers(record), where), multi_turn)
        except BadRow as bad:
            summary.bad_rows[bad.reason] += 1
            on_skip()
            continue
        except NoPromptError:
            summary.bad_rows["no_user_turn"] += 1
            on_skip()
            continue
        yield PlannedRow(row_id, record.get("category"), plan)


def _chunks(rows: Iterable[PlannedRow], size: int) -> Iterator[list[PlannedRow]]:
    iterator = iter(rows)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _streamed_rows(
    rows: Iterator[PlannedRow], backend: StreamingBackend, sampling: SamplingParams, progress: RegenerateProgress
) -> Iterator[tuple[PlannedRow, list[dict]]]:
    """Rows answered turn by turn through ``backend.stream``, each as soon as its last turn is done."""
    next_turns: deque[TurnRequest] = deque()
    filling: dict[int, tuple[PlannedRow, list[dict]]] = {}
    keys = count()

    def turn(key: int, conversation: list[dict]) -> TurnRequest:
        slot = _next_pending(conversation)
        return TurnRequest(key, conversation[:slot], seed_key=f"{filling[key][0].id}/{slot}")

    def next_request() -> TurnRequest | None:
        if next_turns:
            return next_turns.popleft()
        row = next(rows, None)
        if row is None:
            return None
        key = next(keys)
        filling[key] = (row, [dict(m) for m in row.messages])
        return turn(key, filling[key][1])

    for request, completion in backend.stream(next_request, sampling, progress.step):
        row, conversation = filling[request.key]
        conversation[_next_pending(conversation)]["content"] = completion.text
        if _next_pending(conversation) is None:
            del filling[request.key]
            yield row, conversation
        else:
            next_turns.append(turn(request.key, conversation))


def _answered_rows(
    rows: Iterator[PlannedRow], backend: ChatBackend, sampling: SamplingParams, progress: RegenerateProgress
) -> Iterator[tuple[PlannedRow, list[dict] | GenerationError]]:
    if callable(getattr(backend, "stream", None)):
        yield from _streamed_rows(rows, backend, sampling, progress)
        return
    if backend.batched:
        for chunk in _chunks(rows, backend.max_in_flight):
            yield from zip(chunk, regenerate_rows(chunk, backend, sampling))
        return
    # Independent requests: keep max_in_flight rows going and hand each back as soon as it is done, so one long
    # answer does not hold up the rest (a server batches whatever is in flight).
    pool = ThreadPoolExecutor(max_workers=backend.max_in_flight, thread_name_prefix="regenerate")
    pending: dict[Future, PlannedRow] = {}
    try:
        for row in rows:
            if len(pending) >= backend.max_in_flight:
                yield from _collect(pending, wait(pending, return_when=FIRST_COMPLETED).done)
            pending[pool.submit(regenerate_rows, [row], backend, sampling)] = row
        while pending:
            yield from _collect(pending, wait(pending, return_when=FIRST_COMPLETED).done)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _collect(
    pending: dict[Future, PlannedRow], done: set[Future]
) -> Iterator[tuple[PlannedRow, list[dict] | GenerationError]]:
    for future in done:
        yield pending.pop(future), future.result()[0]


def _count_input_rows(input_path: str) -> int | None:
    """Rows in a JSON-lines input, for the progress bar's total (other sources are not counted up front)."""
    if not (os.path.isfile(input_path) and input_path.endswith(".jsonl")):
        return None
    with open(input_path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def regenerate_file(
    input_path: str,
    output_path: str,
    backend: ChatBackend,
    sampling: SamplingParams,
    progress: bool = True,
    multi_turn: str = "first",
    split: str = "train",
) -> RegenerateSummary:
    """Regenerate the assistant turns of ``input_path`` into ``output_path`` (see the module docstring)."""
    if multi_turn not in MULTI_TURN_MODES:
        raise ValueError(f"multi_turn must be one of {MULTI_TURN_MODES}, got {multi_turn!r}")
    check_output_is_not_input(input_path, output_path)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    finished = read_finished_ids(output_path)
    summary = RegenerateSummary()
    with (
        open(output_path, "a", encoding="utf-8") as out,
        RegenerateProgress(_count_input_rows(input_path), sampling.max_new_tokens, enabled=progress) as bar,
    ):
        rows = _input_rows(input_path, split, multi_turn, finished, summary, on_skip=bar.skip)
        for row, result in _answered_rows(rows, backend, sampling, bar):
            if isinstance(result, GenerationError):
                summary.failed += 1
                summary.failure_reasons[result.reason] += 1
            else:
                record: dict[str, Any] = {"id": row.id}
                if row.category is not None:
                    record["category"] = row.category
                record["messages"] = result
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
                summary.done += 1
            bar.row_finished(failed=isinstance(result, GenerationError))
    return summary
