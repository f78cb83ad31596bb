"""The row shapes a data source may hold, one record each, and how a row of each becomes training content.

A shape names the fields it reads (``fields``, each renameable with ``data.fields``), gives a one-line example
(shown in errors, in ``deepspec data check`` and in ``docs/howto/data.md``), turns a row into content (``read``) and
says how that content is supervised (``supervision``: assistant turns rendered with a chat template, every token
of plain text, or the assistant spans of pre-rendered chat text).

- ``chat``: OpenAI ``messages`` or ShareGPT ``conversations`` (``conversations.normalize_conversation``); the
  two may share a source, as they always could.
- pairs (``prompt_completion``, ``prompt_response``, ``question_answer``, ``alpaca``): a user turn and an
  assistant turn, read through the same normaliser as a chat row (so reasoning, blank answers and non-text
  content are handled alike), supervised on the assistant turn.
- ``text``: plain text, every token after the first supervised (base models and pretraining-style data).
- ``preformatted``: ``text`` rows holding the target's own turn markers; never guessed, since its rows look like
  ``text`` rows.

Which shape a source holds is ``data.format``, or with ``auto`` the first shape (in ``SHAPES`` order) whose fields
its first rows carry (``shape_detection``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from deepspec_train.data.conversations import BadRow, normalize_conversation
from deepspec_train.data.supervision import ASSISTANT_TURNS, EVERY_TOKEN, MARKED_TURNS, Supervision

# A row's field name for each of a shape's canonical names (``data.fields``; a name absent maps to itself).
FieldMap = Mapping[str, str]


@dataclass(frozen=True)
class RowShape:
    """One row shape: its ``data.format`` name, the fields it needs (canonical names, which ``data.fields`` may
    rename) and may have, a one-line example, how a row is recognised, how it becomes content and how that
    content is supervised."""

    name: str
    fields: tuple[str, ...]
    optional_fields: tuple[str, ...]
    example: dict
    matches: Callable[[dict, FieldMap], bool]
    read: Callable[[dict, FieldMap, str], Any]
    supervision: Supervision
    # Whether ``data.format=auto`` may pick this shape (``preformatted`` rows look exactly like ``text`` rows).
    guessed: bool = True
    # Whether one of ``fields`` is enough (a chat row has ``messages`` or ``conversations``), not all of them.
    any_field: bool = False

    def field_list(self) -> str:
        return (" or " if self.any_field else ", ").join((*self.fields, *self.optional_fields))

    def example_line(self) -> str:
        return json.dumps(self.example, ensure_ascii=False)


def _named(names: FieldMap, name: str) -> str:
    return names.get(name, name)


def _has_fields(*required: str) -> Callable[[dict, FieldMap], bool]:
    return lambda record, names: all(record.get(_named(names, name)) is not None for name in required)


def _has_a_turn_list(record: dict, names: FieldMap) -> bool:
    return isinstance(record.get("messages"), list) or isinstance(record.get("conversations"), list)


def _read_chat(record: dict, names: FieldMap, where: str) -> list[dict]:
    return normalize_conversation(record, where)


def _pair_reader(prompt_fields: tuple[str, ...], answer_field: str) -> Callable[[dict, FieldMap, str], list[dict]]:
    """A reader of rows whose ``prompt_fields`` (joined by a blank line; absent or empty ones, after the first,
    left out) make the user turn and ``answer_field`` the assistant turn."""

    def read(record: dict, names: FieldMap, where: str) -> list[dict]:
        for name in (prompt_fields[0], answer_field):
            if record.get(_named(names, name)) is None:
                raise BadRow("missing_field", where, f"no {_named(names, name)!r} field")
        prompt_parts = [record.get(_named(names, name)) for name in prompt_fields]
        for name, value in zip(prompt_fields, prompt_parts):
            if value is not None and not isinstance(value, str):
                raise BadRow("missing_field", where, f"field {_named(names, name)!r} is not text")
        prompt = "\n\n".join(part for part in prompt_parts if part)
        answer = record[_named(names, answer_field)]
        # The same normaliser as a chat row's: a blank answer, non-text content or an unclosed <think> block in
        # the answer are the same bad rows, and inline reasoning becomes the same field.
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        return normalize_conversation({"messages": turns}, where)

    return read


def _read_text(record: dict, names: FieldMap, where: str) -> str:
    field_name = names.get("text", "text")
    text = record.get(field_name)
    if not isinstance(text, str):
        raise BadRow("missing_field", where, f"no text field {field_name!r}")
    if not text.strip():
        raise BadRow("nothing_to_supervise", where, f"field {field_name!r} is blank")
    return text


def _pair(name: str, prompt: str, answer: str, example: dict) -> RowShape:
    reader = _pair_reader((prompt,), answer)
    return RowShape(name, (prompt, answer), (), example, _has_fields(prompt, answer), reader, ASSISTANT_TURNS)


# In detection order: a row carrying the fields of several shapes is read as the first.
SHAPES: dict[str, RowShape] = {
    shape.name: shape
    for shape in (
        RowShape(
            "chat", ("messages", "conversations"), (),
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
            _has_a_turn_list, _read_chat, ASSISTANT_TURNS, any_field=True,
        ),
        RowShape(
            "alpaca", ("instruction", "output"), ("input",),
            {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
            _has_fields("instruction", "output"), _pair_reader(("instruction", "input"), "output"), ASSISTANT_TURNS,
        ),
        _pair("prompt_completion", "prompt", "completion", {"prompt": "2+3=", "completion": "5"}),
        _pair("prompt_response", "prompt", "response", {"prompt": "Say hi.", "response": "Hi!"}),
        _pair("question_answer", "question", "answer", {"question": "What is 2+3?", "answer": "5"}),
        RowShape(
            "text", ("text",), (), {"text": "Once upon a time ..."}, _has_fields("text"), _read_text, EVERY_TOKEN
        ),
        RowShape(
            "preformatted", ("text",), (),
            {"text": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"},
            _has_fields("text"), _read_text, MARKED_TURNS, guessed=False,
        ),
    )
}


def field_map(fields: Any) -> dict[str, str]:
    """``data.fields`` (a ``FieldNames`` record or a mapping) as ``{canonical: row field}``, renamed fields only."""
    items = fields.items() if isinstance(fields, Mapping) else vars(fields).items()
    return {name: str(value) for name, value in items if value is not None and value != name}


def read_row(shape: RowShape | None, record: dict, names: FieldMap, where: str) -> Any:
    """The content of ``record`` read as ``shape``; a row of a source whose shape is unknown (``None``: its first
    rows matched no shape) is ``BadRow("missing_field")`` naming the fields it has."""
    if shape is None:
        raise BadRow("missing_field", where, f"its fields {sorted(record)[:8]} match no row shape")
    return shape.read(record, names, where)


def accepted_shapes() -> str:
    """The shapes ``data.format`` names, each with the fields it reads, for one-line errors."""
    return ", ".join(f"{shape.name} ({shape.field_list()})" for shape in SHAPES.values())
