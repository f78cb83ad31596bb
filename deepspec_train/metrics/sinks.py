"""One metrics interface for training and evaluation, with JSONL, W&B, no-op and fan-out backends.

The trainer and the evaluators only ever talk to a ``MetricsSink``; ``make_sink`` picks the backends from the
recipe's ``logging`` section. Only the main process writes metrics: every other rank gets a ``NoOpSink``, so
callers never need their own rank checks around ``log``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from deepspec_train.config.schema import LoggingConfig

WandbMode = Literal["offline", "online", "disabled"]


class MetricsSink:
    """Where scalar metrics, tables and images go. The base class accepts everything and stores nothing."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record scalar ``metrics`` at optimizer step ``step``."""

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """Record a small table (e.g. per-position acceptance of several drafters)."""

    def log_image(self, name: str, path: str | os.PathLike, step: int) -> None:
        """Record an image already written to ``path`` (e.g. a reliability diagram PNG)."""

    def finish(self) -> None:
        """Flush and close; the sink must not be used afterwards."""


class NoOpSink(MetricsSink):
    """Discards everything: used on non-main ranks and when logging is switched off."""


def _json_value(value: Any) -> Any:
    """Turn tensors / numpy scalars into plain Python; non-finite floats become ``null`` to keep strict JSON."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink(MetricsSink):
    """Appends one JSON object per event to ``path``; flushes every write so a crash loses nothing.

    Scalar events look like ``{"step": 10, "time": 1712345678.9, "train/loss": 2.3, ...}``; table events carry
    ``"table"``, ``"columns"``, ``"rows"``; image events carry ``"image"`` and ``"path"``. The file is opened in
    append mode so that a resumed run continues the same log.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": int(step), "time": time.time()}
        record.update({k: _json_value(v) for k, v in metrics.items()})
        self._write(record)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self._write(
            {
                "step": int(step),
                "time": time.time(),
                "table": name,
                "columns": list(columns),
                "rows": [[_json_value(v) for v in row] for row in rows],
            }
        )

    def log_image(self, name: str, path: str | os.PathLike, step: int) -> None:
        self._write({"step": int(step), "time": time.time(), "image": name, "path": str(path)})

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


class WandbSink(MetricsSink):
    """Weights & Biases backend; offline by default so that training never depends on the network.

    A ``WANDB_MODE`` environment variable overrides ``mode``: on a cluster an operator can force ``offline``
    (and ``wandb sync`` later) without editing the recipe.
    """

    def __init__(
        self,
        project: str,
        run_name: str,
        config: dict[str, Any],
        mode: WandbMode = "offline",
        dir: str | os.PathLike | None = None,
        group: Optional[str] = None,
        tags: Sequence[str] = (),
        job_type: Optional[str] = None,
    ) -> None:
        # Imported here: wandb takes about a second to import and most code paths (tests, non-main ranks) never
        # need it.
        import wandb

        self._wandb = wandb
        resolved_mode = os.environ.get("WANDB_MODE", mode)
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=run_name,
            config=config,
            mode=resolved_mode,
            dir=None if dir is None else str(dir),
            group=group,
            tags=list(tags),
            job_type=job_type,
            # Drafter groups (``jobs.colocated``) keep one W&B run per group open in one process; the
            # default would hand every later group the first group's run.
            reinit="create_new",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({k: _json_value(v) for k, v in metrics.items()}, step=int(step))

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        data = [[_json_value(v) for v in row] for row in rows]
        self.run.log({name: self._wandb.Table(columns=list(columns), data=data)}, step=int(step))

    def log_image(self, name: str, path: str | os.PathLike, step: int) -> None:
        self.run.log({name: self._wandb.Image(str(path))}, step=int(step))

    def finish(self) -> None:
        self.run.finish()


class FanoutSink(MetricsSink):
    """Forwards every call to each of ``sinks`` in order."""

    def __init__(self, sinks: Sequence[MetricsSink]) -> None:
        self.sinks = list(sinks)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        for sink in self.sinks:
            sink.log_table(name, columns, rows, step)

    def log_image(self, name: str, path: str | os.PathLike, step: int) -> None:
        for sink in self.sinks:
            sink.log_image(name, path, step)

    def finish(self) -> None:
        for sink in self.sinks:
            sink.finish()


def wandb_labels(logging_cfg: LoggingConfig, config: dict[str, Any]) -> tuple[Optional[str], list[str], dict[str, str]]:
    """``(group, tags, flat config)`` of a training run, from its resolved recipe dict: the group is
    ``logging.wandb_group`` or the target's directory name, so a drafter and its baselines for one target sit
    together in the W&B UI; tags and flat config name the drafter kind, the target and the recipe (``run.name``)."""
    target_path = str((config.get("target") or {}).get("path") or "")
    labels = {
        "drafter_kind": str((config.get("drafter") or {}).get("kind") or ""),
        "target_name": Path(target_path.rstrip("/")).name if target_path else "",
        "recipe": str((config.get("run") or {}).get("name") or ""),
    }
    labels = {key: value for key, value in labels.items() if value}
    group = logging_cfg.wandb_group or labels.get("target_name")
    # W&B caps a tag at 64 characters.
    tags = [f"{key.split('_')[0]}:{value}"[:64] for key, value in labels.items()]
    return group, tags, labels


def make_sink(
    output_dir: str | os.PathLike,
    logging_cfg: LoggingConfig,
    run_name: str,
    config_dict: Optional[dict[str, Any]],
    is_main: bool,
) -> MetricsSink:
    """The sink a run logs to: ``NoOpSink`` off the main rank; otherwise JSONL in ``output_dir/metrics.jsonl``
    always, plus W&B (files under ``output_dir``) when the recipe enables it and its mode is not ``disabled``."""
    if not is_main:
        return NoOpSink()
    sinks: list[MetricsSink] = [JsonlSink(Path(output_dir) / "metrics.jsonl")]
    if logging_cfg.wandb and logging_cfg.wandb_mode != "disabled":
        group, tags, labels = wandb_labels(logging_cfg, config_dict or {})
        sinks.append(
            WandbSink(
                project=logging_cfg.wandb_project,
                run_name=run_name,
                config=(config_dict or {}) | labels,
                mode=logging_cfg.wandb_mode,
                dir=output_dir,
                group=group,
                tags=tags,
                job_type="train",
            )
        )
    return FanoutSink(sinks)
