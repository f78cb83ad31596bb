"""Prompt suites for the evaluator: MT-Bench-format JSONL files and the tiny world's built-in suites.

A suite file holds one JSON object per line with an id (``id``, or MT-Bench's ``question_id``), a ``category``
and ``turns``, the list of user messages of one conversation. A suite is named on the command line either by
its path or as ``tinyworld:NAME`` (``code``, ``prose``, ``math``), which resolves to ``DIR/suites/NAME.jsonl``
of a tiny world built by ``deepspec tinyworld build --out DIR``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

TINYWORLD_PREFIX = "tinyworld:"
TINYWORLD_SUITES = ("code", "prose", "math")


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
    """``(suite name, file)`` for a path or a ``tinyworld:NAME`` spec."""
    if spec.startswith(TINYWORLD_PREFIX):
        name = spec[len(TINYWORLD_PREFIX) :]
        if name not in TINYWORLD_SUITES:
            raise ValueError(f"unknown tiny-world suite {name!r}; built-in suites: {', '.join(TINYWORLD_SUITES)}")
        if tinyworld_dir is None:
            raise ValueError(f"suite {spec!r} needs --tinyworld DIR (a directory made by `deepspec tinyworld build`)")
        return name, Path(tinyworld_dir) / "suites" / f"{name}.jsonl"
    path = Path(spec)
    return path.stem, path


def _parse_prompt(row: dict, where: str) -> SuitePrompt:
    prompt_id = row.get("id", row.get("question_id"))
    if prompt_id is None:
        raise ValueError(f"{where}: no 'id' (or 'question_id')")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
    return SuitePrompt(id=str(prompt_id), category=str(row.get("category", "default")), turns=tuple(turns))


def read_suite_file(path: Path, name: Optional[str] = None) -> Suite:
    """Parse an MT-Bench-format JSONL file (blank lines ignored); prompt ids must be unique."""
    if not path.is_file():
        raise FileNotFoundError(f"suite file {path} does not exist")
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                prompts.append(_parse_prompt(json.loads(line), f"{path}:{line_no}"))
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate prompt ids")
    return Suite(name=name or path.stem, prompts=tuple(prompts))


def load_suite(spec: str, tinyworld_dir: Optional[str] = None, max_prompts: Optional[int] = None) -> Suite:
    """The suite named by ``spec`` (a path or ``tinyworld:NAME``), cut to its first ``max_prompts`` prompts."""
    name, path = resolve_suite_path(spec, tinyworld_dir)
    suite = read_suite_file(path, name)
    if max_prompts is not None:
        suite = Suite(name=suite.name, prompts=suite.prompts[:max_prompts])
    return suite
