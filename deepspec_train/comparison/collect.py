"""Gather one comparison row per drafter from a training run directory or an evaluation results file.

A ``deepspec compare`` argument is either

- a run directory, read as the end-to-end pipeline lays it out (every file optional):
  ``resolved_config.yaml`` (``run.name``, ``drafter.kind``), ``metrics.jsonl`` (the last validation record, the
  one carrying ``val/expected_len``; ``summary.json``'s ``val_metrics`` when the log has none),
  ``eval/results.json`` (``deepspec eval --out``) and ``calibration/calibration.json`` (``deepspec calibrate
  --out``); an ``eval`` or ``calibration`` output directory itself (``results.json`` / ``calibration.json`` at
  its top) works too;
- or a ``results.json`` file, which fills only the evaluation fields.

The row's name is its ``--label`` when one is given, else the folder as the user named it: the directory's name
(the run directory's name for ``RUN/eval`` or ``RUN/calibration``), for a results file its stem unless that is
the default ``results`` or a comparison's ``results_T<t>`` (then its directory's name). Two folders of the same
name (``x/dspark``, ``y/dspark``) are named by the paths as given; names still equal get ``-2``, ``-3``, ... so
that every table row and plot line stays distinct. The recipe's ``run.name`` is not used: two runs of one recipe
share it.

ECE and AUROC "before" / "after" calibration summarise the per-position scores of ``calibration.json`` (scores
of the cumulative survival ``S_k`` at each block position) as their mean weighted by the number of rounds valid
at each position: every verification round counts once per position it reached, so a drafter is not judged
mostly on rare late positions (which the last position's score alone would do).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RESULTS_FILE = "results.json"
CALIBRATION_FILE = "calibration.json"
RELIABILITY_FILE = "reliability.png"


def _number(value: Any) -> float | None:
    """A finite float, or None for anything missing, null or non-finite (how the tables show "-")."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _numbers(values: Iterable[Any] | None) -> list[float | None]:
    return [_number(v) for v in (values or [])]


def weighted_mean(values: Sequence[float | None], counts: Sequence[int]) -> float | None:
    """``sum_k n_k v_k / sum_k n_k`` over the positions with a value and a positive count; None if there is none."""
    pairs = [(v, n) for v, n in zip(values, counts) if v is not None and n > 0]
    total = sum(n for _, n in pairs)
    if total == 0:
        return None
    return sum(v * n for v, n in pairs) / total


@dataclass
class CalibrationSummary:
    """Per-position output of ``deepspec calibrate`` (cumulative-survival scores before and after STS)."""

    temperatures: list[float | None]
    counts: list[int]
    ece_before: list[float | None]
    ece_after: list[float | None]
    auroc_before: list[float | None]
    auroc_after: list[float | None]
    # The calibrate command's per-position reliability diagrams, when they sit next to calibration.json.
    reliability_png: Path | None = None

    @property
    def mean_ece_before(self) -> float | None:
        return weighted_mean(self.ece_before, self.counts)

    @property
    def mean_ece_after(self) -> float | None:
        return weighted_mean(self.ece_after, self.counts)

    @property
    def mean_auroc_before(self) -> float | None:
        return weighted_mean(self.auroc_before, self.counts)

    @property
    def mean_auroc_after(self) -> float | None:
        return weighted_mean(self.auroc_after, self.counts)


@dataclass
class DrafterRow:
    """Everything the comparison shows about one drafter; fields the inputs lack stay None / empty."""

    name: str
    source: Path
    kind: str | None = None
    # Evaluation (speculative decoding): tokens per verification round, bonus token included, per suite, with
    # its bootstrap interval over prompts (low, high) and the number of prompts, where the results carry them.
    tau: dict[str, float | None] = field(default_factory=dict)
    tau_interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    prompts: dict[str, int] = field(default_factory=dict)
    # Evaluation: P(position k accepted | positions < k accepted), k = 1..K, per suite, and the rounds behind each.
    conditional_acceptance: dict[str, list[float | None]] = field(default_factory=dict)
    acceptance_rounds: dict[str, list[int]] = field(default_factory=dict)
    # Evaluation settings: sampling temperature and seeds.
    temperature: float | None = None
    seeds: list[int] = field(default_factory=list)
    # Training validation (teacher forcing): expected accepted drafts per block, bonus NOT included, and 1 + that.
    expected_len: float | None = None
    tau_analytic: float | None = None
    # Training validation: mean analytic acceptance c*_k per position over val_counts[k-1] blocks, the step and
    # training seed, and the confidence head's ECE / AUROC vs c*.
    val_accept: list[float | None] = field(default_factory=list)
    val_counts: list[int] = field(default_factory=list)
    val_step: int | None = None
    train_seed: int | None = None
    val_conf_ece: float | None = None
    val_conf_auroc: float | None = None
    calibration: CalibrationSummary | None = None

    @property
    def mean_tau(self) -> float | None:
        """Unweighted mean of tau over the suites that have one (each suite counts the same)."""
        values = [v for v in self.tau.values() if v is not None]
        return sum(values) / len(values) if values else None


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def last_validation_record(metrics_path: Path) -> dict[str, Any] | None:
    """The last ``metrics.jsonl`` record that carries ``val/expected_len``; None if there is none."""
    last = None
    with open(metrics_path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # A run killed mid-write leaves a truncated last line; the records before it are still valid.
                continue
            if isinstance(record, dict) and "val/expected_len" in record:
                last = record
    return last


def _per_position(record: dict[str, Any], prefix: str) -> list[float | None]:
    """``record[prefix_1], record[prefix_2], ...`` up to the last position present (gaps become None)."""
    suffixes = [key[len(prefix) + 1 :] for key in record if key.startswith(prefix + "_")]
    positions = [int(s) for s in suffixes if s.isdigit()]
    return [_number(record.get(f"{prefix}_{k}")) for k in range(1, max(positions, default=0) + 1)]


def apply_validation(row: DrafterRow, record: dict[str, Any]) -> None:
    """Fill the training-validation fields of ``row`` from one validation metrics record."""
    row.expected_len = _number(record.get("val/expected_len"))
    row.tau_analytic = _number(record.get("val/tau_analytic"))
    row.val_accept = _per_position(record, "val/accept")
    row.val_counts = [int(n or 0) for n in _per_position(record, "val/count")]
    row.val_step = record.get("step") if isinstance(record.get("step"), int) else None
    row.val_conf_ece = _number(record.get("val/conf_ece"))
    row.val_conf_auroc = _number(record.get("val/conf_auroc"))


def apply_results(row: DrafterRow, results: dict[str, Any], path: Path) -> None:
    """Fill the evaluation fields of ``row`` from a ``deepspec eval`` results object."""
    suites = results.get("suites")
    if not isinstance(suites, dict):
        raise ValueError(f"{path}: not an evaluation results file (no 'suites' object)")
    for suite, stats in suites.items():
        row.tau[suite] = _number(stats.get("tau"))
        row.conditional_acceptance[suite] = _numbers(stats.get("conditional_acceptance"))
        if isinstance(stats.get("acceptance_rounds"), list):
            row.acceptance_rounds[suite] = [int(n) for n in stats["acceptance_rounds"]]
        if isinstance(stats.get("prompts"), int):
            row.prompts[suite] = stats["prompts"]
        interval = stats.get("tau_interval") or {}
        low, high = _number(interval.get("low")), _number(interval.get("high"))
        if low is not None and high is not None:
            row.tau_interval[suite] = (low, high)
    if row.kind is None and results.get("drafter_kind"):
        row.kind = str(results["drafter_kind"])
    row.temperature = _number(results.get("temperature"))
    # A comparison's results list its seeds; a single-drafter eval records its one seed.
    seeds = results.get("seeds", [results["seed"]] if isinstance(results.get("seed"), int) else [])
    row.seeds = [int(s) for s in seeds]


def read_calibration(path: Path) -> CalibrationSummary:
    """A ``CalibrationSummary`` from ``deepspec calibrate``'s ``calibration.json``."""
    data = read_json(path)
    reliability = path.parent / RELIABILITY_FILE
    return CalibrationSummary(
        temperatures=_numbers(data.get("temperatures")),
        counts=[int(n) for n in data.get("counts", [])],
        ece_before=_numbers(data.get("ece_before")),
        ece_after=_numbers(data.get("ece_after")),
        auroc_before=_numbers(data.get("auroc_before")),
        auroc_after=_numbers(data.get("auroc_after")),
        reliability_png=reliability if reliability.is_file() else None,
    )


def _first_existing(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def _directory_name(directory: Path) -> str:
    directory = directory.resolve()
    # RUN/eval and RUN/calibration are named after their run, not after the step that wrote them.
    if directory.name in ("eval", "calibration") and directory.parent.name:
        return directory.parent.name
    return directory.name


def collect_results_file(path: Path) -> DrafterRow:
    """A row with only the evaluation fields, from a ``results.json`` file."""
    # results.json, and a comparison's per-temperature results_T<t>.json, are named after their folder.
    default = Path(RESULTS_FILE).stem
    name = _directory_name(path.parent) if path.stem == default or path.stem.startswith(f"{default}_T") else path.stem
    row = DrafterRow(name=name, source=path)
    apply_results(row, read_json(path), path)
    return row


def collect_run_dir(run_dir: Path) -> DrafterRow:
    """A row from a run directory (or an eval / calibration output directory); missing files leave fields empty."""
    config_path = run_dir / "resolved_config.yaml"
    metrics_path = run_dir / "metrics.jsonl"
    summary_path = run_dir / "summary.json"
    results_path = _first_existing(run_dir / "eval" / RESULTS_FILE, run_dir / RESULTS_FILE)
    calibration_path = _first_existing(run_dir / "calibration" / CALIBRATION_FILE, run_dir / CALIBRATION_FILE)
    found = [p for p in (config_path, metrics_path, summary_path) if p.is_file()] + [
        p for p in (results_path, calibration_path) if p is not None
    ]
    if not found:
        raise ValueError(f"{run_dir}: no run files (resolved_config.yaml, metrics.jsonl, summary.json, "
                         f"eval/{RESULTS_FILE}, calibration/{CALIBRATION_FILE})")
    row = DrafterRow(name=_directory_name(run_dir), source=run_dir)
    if config_path.is_file():
        config = yaml.safe_load(config_path.read_text()) or {}
        row.kind = (config.get("drafter") or {}).get("kind")
        seed = (config.get("run") or {}).get("seed")
        row.train_seed = seed if isinstance(seed, int) else None
    record = last_validation_record(metrics_path) if metrics_path.is_file() else None
    if record is None and summary_path.is_file():
        val_metrics = read_json(summary_path).get("val_metrics") or {}
        record = val_metrics if "val/expected_len" in val_metrics else None
    if record is not None:
        apply_validation(row, record)
    if results_path is not None:
        apply_results(row, read_json(results_path), results_path)
    if calibration_path is not None:
        row.calibration = read_calibration(calibration_path)
    return row


def collect_row(path: str | os.PathLike) -> DrafterRow:
    """One drafter's row from a run directory or a results file (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        return collect_run_dir(path)
    if path.is_file():
        return collect_results_file(path)
    raise FileNotFoundError(f"{path}: no such run directory or results file")


def collect_rows(paths: Sequence[str | os.PathLike], labels: Sequence[str] = ()) -> list[DrafterRow]:
    """Rows for ``paths`` in the order given, named by ``labels`` (one per path) when given, else as the module
    docstring says, with duplicate names made unique (``name-2``, ``name-3``, ...)."""
    if labels and len(labels) != len(paths):
        raise ValueError(f"--label: {len(labels)} label(s) for {len(paths)} run(s); give one per run or none")
    rows = [collect_row(p) for p in paths]
    if labels:
        for row, label in zip(rows, labels):
            row.name = label
    else:
        given = [str(p).rstrip("/") or str(p) for p in paths]
        twins = {row.name: {g for r, g in zip(rows, given) if r.name == row.name} for row in rows}
        for row, path in zip(rows, given):
            # Only different paths tell folders apart; one path given twice keeps its name and gets "-2" below.
            if len(twins[row.name]) > 1:
                row.name = path
    taken: set[str] = set()
    for row in rows:
        base, n = row.name, 1
        while row.name in taken:
            n += 1
            row.name = f"{base}-{n}"
        taken.add(row.name)
    return rows


def suites_of(rows: Sequence[DrafterRow]) -> list[str]:
    """Every suite any row was evaluated on, in order of first appearance."""
    suites: list[str] = []
    for row in rows:
        suites.extend(s for s in list(row.tau) + list(row.conditional_acceptance) if s not in suites)
    return suites
