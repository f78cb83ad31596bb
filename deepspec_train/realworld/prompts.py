"""Prompt sets for the real world from local files: a seeded split of a JSONL source (GSM8K train's
``{"question", "answer"}`` rows in the docs and tests, or a set shipped with the package, ``builtin:gsm8k-train``)
into disjoint ``train.jsonl`` and ``validation.jsonl``, and on request a third disjoint part, ``suite.jsonl``, in
the evaluator's suite format (``evaluation.suites``) for a ``deepspec eval`` on prompts training never saw.

Each row becomes a chat row (``messages``: the prompt field as the user turn, an empty assistant turn) with a
stable ``id`` (its line in the source) so that ``deepspec regenerate --backend local`` can fill the answers with
the target's own and resume.
Recipe settings are chosen on the validation rows; the benchmark suites (GSM8K test, HumanEval) are other files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from deepspec_train.common.errors import UserError
from deepspec_train.realworld.builtin_prompts import resolve_prompt_source


def read_rows(source: Path, prompt_field: str = "question") -> list[dict]:
    """Every JSON object of ``source`` as a chat row whose user turn is its ``prompt_field``, each with an ``id``
    (the row's own, or ``<file stem>-<line>``)."""
    if not source.is_file():
        raise UserError(f"--source {source}: no such file")
    rows = []
    with source.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{source}:{number} is not a JSON object") from None
            if not isinstance(row, dict) or not isinstance(row.get(prompt_field), str):
                raise UserError(f"{source}:{number} has no text field {prompt_field!r}: name it with --prompt-field")
            messages = [{"role": "user", "content": row[prompt_field]}, {"role": "assistant", "content": ""}]
            rows.append({"id": str(row.get("id", f"{source.stem}-{number}")), "messages": messages})
    return rows


def _suite_row(row: dict, category: str) -> dict:
    return {"id": row["id"], "category": category, "turns": [row["messages"][0]["content"]]}


def split_prompts(source: str | Path, out: str | Path, train: int, validation: int, seed: int = 0,
                  prompt_field: str = "question", suite: int = 0) -> dict[str, int]:
    """Write ``train`` and ``validation`` rows of ``source`` (a path or ``builtin:NAME``), drawn without overlap by
    a ``seed``-ed shuffle, to ``out/train.jsonl`` and ``out/validation.jsonl``, and ``suite`` more as
    ``out/suite.jsonl`` (none when 0); returns the counts written."""
    path = resolve_prompt_source(source)
    rows = read_rows(path, prompt_field)
    if train + validation + suite > len(rows):
        asked = f"--train {train} + --validation {validation}" + (f" + --suite {suite}" if suite else "")
        raise UserError(f"{asked} exceed the {len(rows)} rows of {source}")
    random.Random(seed).shuffle(rows)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"train": rows[:train], "validation": rows[train:train + validation]}
    if suite:
        held_out = rows[train + validation:train + validation + suite]
        parts["suite"] = [_suite_row(row, path.stem) for row in held_out]
    for name, part in parts.items():
        with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in part)
    return {name: len(part) for name, part in parts.items()}
