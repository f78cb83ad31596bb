"""Prompt sets shipped inside the package, so that a fresh clone (or a plain ``pip install``) can make training
data for a real target without downloading a dataset: ``deepspec realworld prompts --source builtin:NAME``.

Each set is a JSONL file under ``deepspec_train/shipped/prompts/`` (package data) written once by
``data/ship_gsm8k_prompts.py`` from a public dataset's training split; that folder's README names the source, its
license and the SHA-256 of the files it was drawn from. The benchmark suites (GSM8K test, HumanEval) are never
drawn from: the script drops any question whose fingerprint (``prompt_fingerprint``) a benchmark prompt shares,
and ``tests/test_laptop_path.py`` checks the shipped file against the benchmarks' fingerprints kept in the tests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.config.shipped_files import SHIPPED
from deepspec_train.common.errors import UserError

BUILTIN_PREFIX = "builtin:"
SHIPPED_PROMPTS = SHIPPED / "prompts"


@dataclass(frozen=True)
class BuiltinPromptSet:
    """One shipped prompt set: its name after ``builtin:``, its file and where its rows come from."""

    name: str
    file_name: str
    source: str

    @property
    def path(self) -> Path:
        return SHIPPED_PROMPTS / self.file_name


BUILTIN_PROMPT_SETS = {
    "gsm8k-train": BuiltinPromptSet("gsm8k-train", "gsm8k-train.jsonl",
                                    "128 questions of GSM8K's train split (openai/grade-school-math, MIT)"),
}


def resolve_prompt_source(source: str | Path) -> Path:
    """The file behind a ``--source``: a shipped set for ``builtin:NAME``, else the path as given."""
    text = str(source)
    if not text.startswith(BUILTIN_PREFIX):
        return Path(source)
    name = text[len(BUILTIN_PREFIX):]
    if name not in BUILTIN_PROMPT_SETS:
        raise UserError(f"--source {text}: no such built-in prompt set; built-in: "
                        + ", ".join(BUILTIN_PREFIX + known for known in BUILTIN_PROMPT_SETS))
    return BUILTIN_PROMPT_SETS[name].path


def prompt_fingerprint(text: str) -> str:
    """A short hash of a prompt with case and whitespace folded, so a benchmark prompt is recognised whatever its
    spacing; 16 hex digits keep 1,500 benchmark prompts free of accidental collisions."""
    folded = " ".join(text.lower().split())
    return hashlib.sha256(folded.encode("utf-8")).hexdigest()[:16]
