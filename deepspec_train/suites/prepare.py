"""Turn a benchmark dataset's rows into the evaluator's prompt file (``evaluation.suites``: one JSON line per
prompt with ``id``, ``category`` and ``turns``).

A prompt's category is the dataset's own ``category`` where the schema has one (MT-Bench, Arena-Hard), else the
suite's name; ``deepspec eval`` reports each suite as a whole and each category inside it. With ``sample`` the
file keeps ``sample`` prompts drawn the way DeepSpec's evaluation draws them (``random.Random(seed).shuffle`` of
the rows in file order, then the first ``sample``; DeepSpec's seed is ``DEEPSPEC_SEED``), so the same seed and
size give DeepSpec's subset of the same file.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm.auto import tqdm

from deepspec_train.common.errors import UserError
from deepspec_train.evaluation.suites import SuitePrompt
from deepspec_train.suites.benchmarks import BenchmarkSuite, SuiteRowError
from deepspec_train.suites.dataset_rows import iter_split_rows

DEEPSPEC_SEED = 980406


@dataclass(frozen=True)
class Prepared:
    """What ``prepare_suite`` wrote: the prompts, and how many rows the split held before sampling."""

    prompts: tuple[SuitePrompt, ...]
    rows: int


def build_prompts(suite: BenchmarkSuite, source: str | Path, split: str, all_turns: bool = False,
                  progress: bool = False) -> list[SuitePrompt]:
    """One prompt per row of ``split`` in ``source``; a row without the suite's fields fails naming its place."""
    prompts = []
    rows = tqdm(iter_split_rows(source, split), desc=f"read {suite.name}", unit="row", disable=not progress,
                dynamic_ncols=True)
    for index, (where, row) in enumerate(rows):
        try:
            turns = suite.build_turns(row)
        except SuiteRowError as error:
            raise SuiteRowError(f"{where}: {error}") from None
        if suite.first_turn_only and not all_turns:
            turns = turns[:1]
        category = row.get("category") if isinstance(row.get("category"), str) and row.get("category") else suite.name
        prompts.append(SuitePrompt(id=suite.prompt_id(row, index), category=category, turns=tuple(turns)))
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        # Ids must be unique for the evaluator; a file concatenating releases can repeat them.
        prompts = [SuitePrompt(f"{p.id}#{i}", p.category, p.turns) for i, p in enumerate(prompts)]
    return prompts


def draw_sample(prompts: list[SuitePrompt], size: Optional[int], seed: int = DEEPSPEC_SEED) -> list[SuitePrompt]:
    """DeepSpec's subset: the prompts shuffled by ``random.Random(seed)``, first ``size`` kept (all when the
    suite is not larger)."""
    if size is None or len(prompts) <= size:
        return prompts
    shuffled = list(prompts)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:size]


def write_suite_file(path: str | os.PathLike, prompts: list[SuitePrompt]) -> Path:
    """Write ``prompts`` as the evaluator's JSONL, through a temporary file so a failure leaves no half file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        for p in prompts:
            handle.write(json.dumps({"id": p.id, "category": p.category, "turns": list(p.turns)},
                                    ensure_ascii=False) + "\n")
    partial.replace(out)
    return out


def prepare_suite(suite: BenchmarkSuite, source: str | Path, out: str | os.PathLike, split: Optional[str] = None,
                  sample: Optional[int] = None, seed: int = DEEPSPEC_SEED, all_turns: bool = False,
                  progress: bool = False) -> Prepared:
    """Read ``source``, build the suite's prompts and write them to ``out``."""
    if sample is not None and sample < 1:
        raise UserError(f"--sample must be at least 1, got {sample}")
    prompts = build_prompts(suite, source, split or suite.split, all_turns, progress)
    if not prompts:
        raise UserError(f"{source}: split {split or suite.split!r} holds no rows")
    chosen = draw_sample(prompts, sample, seed)
    write_suite_file(out, chosen)
    return Prepared(tuple(chosen), len(prompts))
