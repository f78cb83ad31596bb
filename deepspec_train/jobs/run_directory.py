"""One run per output directory: what a run directory holds, who may write into it, and how a run is identified.

A run writes ``run_identity.json`` into ``run.output_dir`` when it starts: the fields of the resolved recipe that
change the model or the data (``IDENTITY_KEYS``: the drafter but its activation checkpointing, its target and taps, the data files and their
rendering, anchors, seed, how sequences are batched, and the loss's distance term and normaliser), a hash of them and of the whole resolved config, and the
start time. Before anything loads, every rank checks the directory the same way (``output_dir_problems``,
read-only, so all ranks reach the same verdict):

- a fresh run (``train.resume=none``) into a directory that already holds a run (its metrics, checkpoints or
  trained drafter; an identity alone is a start that failed before its first step, and is replaced) is refused:
  ``train.resume=auto`` continues that run, ``run.overwrite=true`` starts over after moving the old run aside to
  ``<output_dir>.replaced-<time>`` (nothing is deleted);
- ``train.resume=auto`` or a checkpoint path continues only a run whose identity fields equal this recipe's (a
  field the recorded identity predates counts as its default, so older runs still resume); a difference (e.g. ``drafter.num_layers``) is refused with the fields and both values. Fields outside the
  identity (optimisation schedule and step count, loss weights, logging, checkpoint and evaluation cadence,
  ``train.stop_at_step``, topology, engine) may change;
- ``train.resume=auto`` into a directory whose run left no checkpoint is refused as well: there is nothing to
  continue, and starting over would append to that run's metrics.

Rank 0 then claims the directory (``claim_output_dir``) before any rank writes into it. A resumed run redoes the
steps after its checkpoint; their earlier records are moved from ``metrics.jsonl`` to ``metrics.superseded.jsonl``
(``set_aside_metrics_after``), so the log holds each step once and nothing is lost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from deepspec_train.config.schema import RecipeConfig

IDENTITY_FILE = "run_identity.json"
# Dotted recipe keys whose values make a different model or different training data.
IDENTITY_KEYS = (
    "drafter", "target.path", "target.layer_ids", "data.train", "data.validation", "data.max_length", "data.split",
    "data.enable_thinking", "data.supervise_reasoning", "anchors", "run.seed", "run.data_seed",
    "train.global_batch_sequences", "train.micro_batch_sequences", "train.feature_reuse", "loss.distance",
    "loss.normalizer",
)
# Identity keys that change only how the same training is computed (memory against time), not its result.
IDENTITY_EXEMPT = ("drafter.activation_checkpointing", "drafter.compile")
# What a directory holds once a run has trained in it (checkpoints are checked separately).
RUN_MARKERS = ("metrics.jsonl", "summary.json", "drafter")


def _flatten(data: Any, prefix: str) -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}.{key}"))
        return flat
    return {prefix: data}


def identity_fields(cfg: RecipeConfig) -> dict[str, Any]:
    """The identity fields of ``cfg`` as dotted key -> value."""
    resolved = dataclasses.asdict(cfg)
    fields: dict[str, Any] = {}
    for key in IDENTITY_KEYS:
        node: Any = resolved
        for part in key.split("."):
            node = node[part]
        fields.update(_flatten(node, key))
    return {key: value for key, value in fields.items() if key not in IDENTITY_EXEMPT}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def identity_record(cfg: RecipeConfig) -> dict[str, Any]:
    fields = identity_fields(cfg)
    return {
        "identity": _digest(fields),
        "config_sha256": _digest(dataclasses.asdict(cfg)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fields": fields,
    }


def holds_a_run(out_dir: Path) -> bool:
    return any((out_dir / marker).exists() for marker in RUN_MARKERS) or _has_checkpoints(out_dir)


def _has_checkpoints(out_dir: Path) -> bool:
    root = out_dir / "checkpoints"
    return root.is_dir() and any(p.name.startswith("step_") for p in root.iterdir())


def _recorded_fields(run_dir: Path) -> Optional[dict[str, Any]]:
    path = run_dir / IDENTITY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("fields")


def _identity_mismatch(recorded: dict[str, Any], cfg: RecipeConfig, run_dir: Path) -> list[str]:
    current = identity_fields(cfg)
    # Identity fields added after the run started held their default value in that run.
    recorded = identity_fields(RecipeConfig()) | recorded
    differences = [
        f"{key}: {recorded.get(key, '(unset)')!r} there, {current.get(key, '(unset)')!r} here"
        for key in sorted(set(recorded) | set(current))
        if recorded.get(key) != current.get(key)
    ]
    if not differences:
        return []
    return [
        f"train.resume={cfg.train.resume}: {run_dir} holds a run with other settings that change the model or data "
        f"({'; '.join(differences)}); resume with its settings, or use another run.output_dir or run.overwrite=true"
    ]


def output_dir_problems(cfg: RecipeConfig) -> list[str]:
    """Why this run may not start in ``run.output_dir`` as asked (empty when it may); reads, never writes."""
    out = Path(cfg.run.output_dir)
    resume = cfg.train.resume
    if cfg.run.overwrite:
        # (combined with a resume it is a recipe error, refused by config.rules)
        return []
    if resume == "none":
        if holds_a_run(out):
            return [
                f"run.output_dir={out} already holds a run: train.resume=auto continues it, run.overwrite=true starts "
                f"over (the old run is moved to {out}.replaced-<time>), or choose another run.output_dir"
            ]
        return []
    if resume == "auto":
        if not holds_a_run(out):
            return []
        if not _has_checkpoints(out):
            return [
                f"train.resume=auto: run.output_dir={out} holds a run that left no checkpoint to continue; "
                "run.overwrite=true starts over (the old run is moved aside)"
            ]
        recorded = _recorded_fields(out)
        return [] if recorded is None else _identity_mismatch(recorded, cfg, out)
    # An explicit checkpoint directory <run>/checkpoints/step_N: its run's identity sits two levels up.
    source_run = Path(resume).resolve().parent.parent
    recorded = _recorded_fields(source_run)
    return [] if recorded is None else _identity_mismatch(recorded, cfg, source_run)


def claim_output_dir(cfg: RecipeConfig) -> Optional[Path]:
    """On rank 0, before anything is written: move an old run aside when ``run.overwrite`` asks for it, then write
    this run's identity. Returns where an old run went."""
    out = Path(cfg.run.output_dir)
    moved = None
    if cfg.run.overwrite and holds_a_run(out):
        moved = out.with_name(f"{out.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(str(out), str(moved))
    out.mkdir(parents=True, exist_ok=True)
    identity = out / IDENTITY_FILE
    # A resumed run keeps the identity it started with; a fresh one replaces an identity left by a failed start.
    if cfg.train.resume == "none" or not identity.is_file():
        tmp = identity.with_name(identity.name + ".tmp")
        tmp.write_text(json.dumps(identity_record(cfg), indent=2) + "\n")
        tmp.replace(identity)
    return moved


def set_aside_metrics_after(out_dir: str | Path, step: int) -> int:
    """Move the records of steps after ``step`` from ``metrics.jsonl`` to ``metrics.superseded.jsonl`` (appended);
    returns how many moved."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, superseded = [], []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.strip():
            continue
        record_step = json.loads(line).get("step")
        (superseded if isinstance(record_step, int) and record_step > step else kept).append(line)
    if superseded:
        with open(path.with_name("metrics.superseded.jsonl"), "a", encoding="utf-8") as handle:
            handle.writelines(superseded)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(path)
    return len(superseded)
