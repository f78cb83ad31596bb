"""Comparing drafters on the same prompts, shared by ``deepspec eval`` with several drafters (``comparison_eval``)
and the quality benchmark (``bench/quality.py``): interleaved exact decoding of the same prompts by several
drafters, per-prompt totals, the paired tau ratios and the draft-cost columns.

Decoding is interleaved: for each prompt every drafter decodes it in turn, so machine load (the benchmark
machine is shared) falls on all drafters alike and their measured draft times stay comparable. Each
(drafter, seed, prompt) decode gets its own generator seeded from (seed, suite, prompt index), so results do not
depend on the order of the drafters or on how many there are. At temperature 0 decoding is greedy and one seed
is enough.

Draft cost of a round:

- sequential layer passes: a parallel drafter (DSpark / DFlash) runs its ``N`` layers once over the whole block
  (the Markov head's per-slot loop is a rank-``r`` product, not a layer); EAGLE-3 runs its layer once per drafted
  token, ``1 x K``;
- measured draft time: the time of the drafter's call in each round, as CPU time of the (single) decoding thread
  (``RoundRecord.draft_cpu_seconds``: on a shared machine, wall time also counts the time other processes held the
  cores) and as wall time. Both drafters do only what an engine would: EAGLE-3 steps through its KV cache, and
  context keys / values are projected once per row and kept across the rounds of a conversation.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.block_drafting import BlockDrafter
from deepspec_train.evaluation.paired_bootstrap import (
    PromptTotals, RatioEstimate, bootstrap_mean, bootstrap_tau_ratios, prompt_totals,
)
from deepspec_train.evaluation.report import ConversationStats
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder
from deepspec_train.evaluation.suites import Suite
from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.formats.eval_traces import TraceRound
from deepspec_train.costs.gpu_specs import gpu_spec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.costs.serving_cost import REPORT_GPU, production_counterpart, round_times


@dataclass
class BenchDrafter:
    """One drafter in the benchmark: its display name, the loaded drafter and its drafting strategy."""

    name: str
    loaded: LoadedDrafter
    drafter: BlockDrafter

    @classmethod
    def of(cls, name: str, loaded: LoadedDrafter) -> "BenchDrafter":
        return cls(name, loaded, loaded.block_drafter())

    @property
    def block_size(self) -> int:
        return self.drafter.max_block_size

    def modeled_draft_us(self) -> Optional[float]:
        """Modeled draft time per round of this drafter's production counterpart (``serving_cost``: its structure
        at Qwen3-8B widths, batch 1, on an H200) in microseconds; None when its settings are not known."""
        settings = self.loaded.settings
        if settings is None:
            return None
        served = production_counterpart(settings, len(self.loaded.target_layer_ids), self.name)
        return 1e6 * round_times(served, gpu_spec(REPORT_GPU), 1).draft_s

    def sequential_layer_passes(self) -> int:
        """Decoder-layer passes one after the other per drafted block (see the module docstring), as the kind
        counts them for a drafter of this many layers drafting ``block_size`` tokens."""
        # A parallel drafter's layer stack is ``layers``; EAGLE-3 has its one ``midlayer``.
        layers = len(getattr(self.loaded.module, "layers", ())) or 1
        cfg = DrafterConfig(kind=self.loaded.kind, num_layers=layers, block_size=self.block_size,
                            ttt_steps=self.block_size)
        return kind_spec(self.loaded.kind).sequential_passes(cfg)


def decode_seed(seed: int, suite: str, prompt_index: int) -> int:
    """The generator seed of one (seed, suite, prompt) decode: independent of drafter order and count."""
    return (seed * 1_000_003 + zlib.crc32(suite.encode()) * 7_919 + prompt_index) % (2**63 - 1)


@dataclass(frozen=True)
class DecodeSettings:
    """How every prompt is decoded: the sampling temperature, the seeds (one decode of each prompt per seed) and
    the new tokens allowed per turn."""

    temperature: float
    seeds: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class _DecodeJob:
    """What every decode of one ``decode_interleaved`` call shares (saved once for the worker processes)."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    drafters: Sequence[BenchDrafter]
    suites: Sequence[Suite]
    settings: DecodeSettings

    def units(self) -> list[tuple[int, int, int]]:
        """Every (seed, suite index, prompt index) in decoding order."""
        return [(seed, s, i) for seed in self.settings.seeds for s, suite in enumerate(self.suites)
                for i in range(len(suite.prompts))]

    def decode(self, unit: tuple[int, int, int]) -> list[tuple[list[TraceRound], ConversationStats]]:
        """One prompt decoded by every drafter in turn: per drafter, its trace rounds and conversation totals."""
        seed, suite_index, index = unit
        suite = self.suites[suite_index]
        prompt = suite.prompts[index]
        out = []
        # The sampler draws on the target's device: a CPU generator cannot drive CUDA draws.
        device = next(self.target.parameters()).device
        for d in self.drafters:
            generator = torch.Generator(device=device).manual_seed(decode_seed(seed, suite.name, index))
            decoder = SpeculativeDecoder(
                self.target, self.tokenizer, d.drafter, d.loaded.target_layer_ids, d.block_size,
                self.settings.temperature, generator=generator,
                confidence_temperatures=d.loaded.confidence_temperatures,
            )
            turns, _ = decoder.decode_conversation(prompt.turns, self.settings.max_new_tokens)
            rounds = [r.trace(suite.name, prompt.category, prompt.id, seed) for turn in turns for r in turn.rounds]
            stats = ConversationStats(suite.name, prompt.category, sum(len(t.tokens) for t in turns),
                                      sum(t.seconds for t in turns))
            out.append((rounds, stats))
        return out


# The job of a decoding worker process, loaded once by ``_start_worker``.
_WORKER_JOB: Optional[_DecodeJob] = None


def _start_worker(job_path: str) -> None:
    global _WORKER_JOB
    # Each worker decodes on one core: tiny models gain nothing from a second thread (see ``one_torch_thread``).
    torch.set_num_threads(1)
    _WORKER_JOB = torch.load(job_path, weights_only=False)


def _worker_decode(unit: tuple[int, int, int]) -> list[tuple[list[TraceRound], ConversationStats]]:
    if _WORKER_JOB is None:
        raise RuntimeError("decoding worker started without a job")
    return _WORKER_JOB.decode(unit)


def decode_interleaved(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    drafters: Sequence[BenchDrafter],
    suites: Sequence[Suite],
    settings: DecodeSettings,
    progress: bool = True,
    conversations: Optional[dict[str, list[ConversationStats]]] = None,
    workers: int = 1,
) -> dict[str, list[TraceRound]]:
    """Trace rounds (what ``deepspec eval --save-traces`` writes, with their ``seed``) of every drafter on every
    prompt; each decoded conversation's new tokens and seconds are appended to ``conversations[drafter]`` when
    given.

    ``workers > 1`` decodes the prompts in that many worker processes of one thread each. They are spawned, not
    forked (a fork copies the locks that other threads of this process hold, such as a test runner's, and can
    hang), and each loads the models from one file this call saves. Every decode has its own seeded generator,
    so the rows are the same as with one worker, in the same order; each prompt is still decoded by every
    drafter in turn, in one worker.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    job = _DecodeJob(target, tokenizer, drafters, suites, settings)
    units = job.units()
    rows: dict[str, list[TraceRound]] = {d.name: [] for d in drafters}

    def collect(results: Iterable[list[tuple[list[TraceRound], ConversationStats]]]) -> None:
        with tqdm(total=len(units), desc=f"decode T={settings.temperature:g}", unit="prompt", disable=not progress,
                  dynamic_ncols=True) as bar:
            for per_drafter in results:
                for d, (rounds, stats) in zip(drafters, per_drafter):
                    rows[d.name].extend(rounds)
                    if conversations is not None:
                        conversations.setdefault(d.name, []).append(stats)
                bar.update(1)

    if workers == 1:
        collect(map(job.decode, units))
        return rows
    with tempfile.TemporaryDirectory(prefix="decode-job-") as scratch:
        job_path = os.path.join(scratch, "job.pt")
        torch.save(job, job_path)
        with multiprocessing.get_context("spawn").Pool(workers, _start_worker, (job_path,)) as pool:
            collect(pool.imap(_worker_decode, units))
    return rows


def totals_by_category(
    rows: dict[str, list[TraceRound]], group_of: Callable[[TraceRound], str] = lambda r: r.category
) -> dict[str, dict[str, PromptTotals]]:
    """``{category: {drafter: per-prompt totals}}``, seeds pooled per prompt, prompts aligned across drafters;
    ``group_of`` picks the grouping (``lambda r: r.suite`` groups by suite)."""
    sums: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name, drafter_rows in rows.items():
        for r in drafter_rows:
            per_prompt = sums.setdefault(group_of(r), {}).setdefault(name, {})
            entry = per_prompt.setdefault(f"{r.suite}/{r.prompt_id}", [0.0, 0.0])
            entry[0] += r.emitted
            entry[1] += 1
    out: dict[str, dict[str, PromptTotals]] = {}
    for category, by_drafter in sums.items():
        keys = sorted(set.union(*(set(p) for p in by_drafter.values())))
        missing = {name: len(keys) - len(p) for name, p in by_drafter.items() if len(p) != len(keys)}
        if missing or len(by_drafter) != len(rows):
            raise ValueError(f"category {category}: drafters did not decode the same prompts ({missing})")
        out[category] = {
            name: prompt_totals([p[k][0] for k in keys], [p[k][1] for k in keys]) for name, p in by_drafter.items()
        }
    return out


def tau_by_category(totals: dict[str, dict[str, PromptTotals]]) -> dict[str, dict[str, float]]:
    return {category: {name: float(t.tau()) for name, t in by_drafter.items()} for category, by_drafter in totals.items()}


def draft_ms_per_round(
    rows: Iterable[TraceRound], replicates: int, seed: int, field: str = "draft_cpu_seconds"
) -> RatioEstimate:
    """Mean drafter time per round in milliseconds (``field``: the thread's CPU time, or ``draft_seconds`` for
    wall time), with a bootstrap over prompts."""
    per_prompt: dict[str, list[float]] = {}
    for r in rows:
        seconds = getattr(r, field)
        if seconds is None:
            raise ValueError(f"round {r.round} of prompt {r.prompt_id} has no {field} (a trace from before timing)")
        per_prompt.setdefault(f"{r.suite}/{r.prompt_id}", []).append(1e3 * seconds)
    return bootstrap_mean([np.asarray(v) for v in per_prompt.values()], replicates, seed)


def ratio_cell(estimate: RatioEstimate) -> str:
    return f"{estimate.value:.3f} [{estimate.low:.3f}, {estimate.high:.3f}] (se {estimate.se:.3f})"


def tau_table(
    totals: dict[str, dict[str, PromptTotals]],
    names: Sequence[str],
    ratios: dict[tuple[str, str], dict[str, RatioEstimate]],
) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of one temperature's table: tau per drafter and each ratio, per category and geomean."""
    pairs = list(ratios)
    columns = ["category", *(f"tau {n}" for n in names), *(f"{a} / {b}" for a, b in pairs)]
    taus = tau_by_category(totals)
    body = []
    for category in sorted(totals):
        body.append([category, *(f"{taus[category][n]:.3f}" for n in names),
                     *(ratio_cell(ratios[p][category]) for p in pairs)])
    body.append(["geomean", *("" for _ in names), *(ratio_cell(ratios[p]["geomean"]) for p in pairs)])
    return columns, body


def markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def paired_ratios(
    totals: dict[str, dict[str, PromptTotals]], reference: str, others: Sequence[str], replicates: int, seed: int,
) -> dict[tuple[str, str], dict[str, RatioEstimate]]:
    return bootstrap_tau_ratios(totals, [(reference, o) for o in others], replicates, seed)


def expected_length(summary: Optional[dict]) -> Optional[float]:
    """Validation E[L] from a training run's ``summary.json`` contents (None when absent)."""
    if not summary:
        return None
    value = summary.get("val_metrics", {}).get("val/expected_len")
    return None if value is None else float(value)
