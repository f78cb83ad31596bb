"""Prompt suites for the evaluator: MT-Bench-format JSONL files and the tiny world's built-in suites.

A suite file holds one JSON object per line with an id (``id``, or MT-Bench's ``question_id``), a ``category``
and ``turns``, the list of user messages of one conversation. A suite is named on the command line by its path
(named after the file), as ``NAME=PATH`` (a file written by ``deepspec suites prepare``, named ``NAME``), or as
``tinyworld:NAME`` (``code``, ``prose``, ``math``, or ``long``, the long-context suite), which resolves to
``DIR/suites/NAME.jsonl`` of a tiny world built by ``deepspec tinyworld build --out DIR``. A suite that cannot be
read, or that holds no prompt (an empty file, ``max_prompts`` below 1), raises ``SuiteError`` with one line naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from deepspec_train.common.errors import UserError

TINYWORLD_PREFIX = "tinyworld:"
TINYWORLD_SUITES = ("code", "prose", "math")
# Multi-turn conversations that fill most of the target's positions; not one of the domain suites above, which
# benchmarks decode by default.
TINYWORLD_LONG_SUITE = "long"


class SuiteError(UserError, ValueError):
    """A suite that is missing, malformed or empty."""


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: tuple[SuitePrompt, ...]


def resolve_suite_path(spec: str, tinyworld_dir: Optional[str] = None) -> tuple[str, Path]:
    """``(suite name, file)`` for a path, a ``NAME=PATH`` or a ``tinyworld:NAME`` spec."""
    if spec.startswith(TINYWORLD_PREFIX):
        name = spec[len(TINYWORLD_PREFIX) :]
        known = (*TINYWORLD_SUITES, TINYWORLD_LONG_SUITE)
        if name not in known:
            raise SuiteError(f"unknown tiny-world suite {name!r}; built-in suites: {', '.join(known)}")
        if tinyworld_dir is None:
            raise SuiteError(f"suite {spec!r} needs --tinyworld DIR (a directory made by `deepspec tinyworld build`)")
        return name, Path(tinyworld_dir) / "suites" / f"{name}.jsonl"
    name, separator, named_path = spec.partition("=")
    if separator and name and not Path(spec).exists():
        return name, Path(named_path)
    path = Path(spec)
    return path.stem, path


def _parse_prompt(row: dict, where: str) -> SuitePrompt:
    prompt_id = row.get("id", row.get("question_id"))
    if prompt_id is None:
        raise SuiteError(f"{where}: no 'id' (or 'question_id')")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise SuiteError(f"{where}: 'turns' must be a non-empty list of strings")
    return SuitePrompt(id=str(prompt_id), category=str(row.get("category", "default")), turns=tuple(turns))


def read_suite_file(path: Path, name: Optional[str] = None) -> Suite:
    """Parse an MT-Bench-format JSONL file (blank lines ignored); prompt ids must be unique, and there must be
    at least one prompt."""
    if not path.is_file():
        raise SuiteError(f"suite file {path} does not exist")
    prompts = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            where = f"{path}:{line_no}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError as exc:
                # json.loads of bytes raises UnicodeDecodeError (a ValueError) for bytes that are not UTF-8.
                raise SuiteError(f"{where}: not a JSON line ({exc})") from None
            if not isinstance(row, dict):
                raise SuiteError(f"{where}: not a JSON object")
            prompts.append(_parse_prompt(row, where))
    if not prompts:
        raise SuiteError(f"suite file {path} holds no prompts: nothing to evaluate")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise SuiteError(f"{path}: duplicate prompt ids")
    return Suite(name=name or path.stem, prompts=tuple(prompts))


def load_suite(spec: str, tinyworld_dir: Optional[str] = None, max_prompts: Optional[int] = None) -> Suite:
    """The suite named by ``spec`` (a path or ``tinyworld:NAME``), cut to its first ``max_prompts`` prompts."""
    if max_prompts is not None and max_prompts < 1:
        raise SuiteError(f"--max-prompts must be at least 1, got {max_prompts}: an empty suite measures nothing")
    name, path = resolve_suite_path(spec, tinyworld_dir)
    suite = read_suite_file(path, name)
    if max_prompts is not None:
        suite = Suite(name=suite.name, prompts=suite.prompts[:max_prompts])
    return suite
