"""Metrics sinks (JSONL, W&B offline, no-op, fan-out, make_sink), rank-0 console helpers and the progress bar."""

from __future__ import annotations

import io
import json
import logging
import math

import numpy as np
import pytest
import torch

from deepspec_train.config.schema import LoggingConfig
from deepspec_train.common.console import get_logger, rank0_print
from deepspec_train.metrics.sinks import (
    FanoutSink, JsonlSink, MetricsSink, NoOpSink, WandbSink, make_sink, wandb_labels,
)
from deepspec_train.training.progress import TrainProgress


class RecordingSink(MetricsSink):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, metrics, step):
        self.calls.append(("log", dict(metrics), step))

    def log_table(self, name, columns, rows, step):
        self.calls.append(("table", name, list(columns), [list(r) for r in rows], step))

    def log_image(self, name, path, step):
        self.calls.append(("image", name, str(path), step))

    def finish(self):
        self.calls.append(("finish",))


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_sink_writes_flushed_records_and_appends_on_reopen(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log({"train/loss": 1.5, "train/acc_1": torch.tensor(0.25), "lr": np.float32(1e-3)}, step=3)
    # Readable before finish(): every write is flushed.
    first = _read_jsonl(path)
    assert len(first) == 1
    assert first[0]["step"] == 3 and first[0]["train/loss"] == 1.5 and first[0]["train/acc_1"] == 0.25
    assert first[0]["lr"] == pytest.approx(1e-3)
    assert isinstance(first[0]["time"], float)

    sink.log({"train/loss": math.nan, "grad_norm": math.inf}, step=4)
    sink.log_table("val/per_position", ["k", "accept"], [[1, 0.9], [2, torch.tensor(0.8)]], step=4)
    sink.log_image("val/reliability", tmp_path / "r.png", step=4)
    sink.finish()

    again = JsonlSink(path)
    again.log({"train/loss": 0.5}, step=5)
    again.finish()

    records = _read_jsonl(path)
    assert [r["step"] for r in records] == [3, 4, 4, 4, 5]
    assert records[1]["train/loss"] is None and records[1]["grad_norm"] is None
    assert records[2]["table"] == "val/per_position"
    assert records[2]["columns"] == ["k", "accept"]
    assert records[2]["rows"] == [[1, 0.9], [2, pytest.approx(0.8)]]
    assert records[3]["image"] == "val/reliability" and records[3]["path"] == str(tmp_path / "r.png")
    assert records[4]["train/loss"] == 0.5


def test_fanout_forwards_every_call_in_order():
    a, b = RecordingSink(), RecordingSink()
    sink = FanoutSink([a, NoOpSink(), b])
    sink.log({"x": 1.0}, 1)
    sink.log_table("t", ["c"], [[1]], 2)
    sink.log_image("i", "p.png", 3)
    sink.finish()
    expected = [("log", {"x": 1.0}, 1), ("table", "t", ["c"], [[1]], 2), ("image", "i", "p.png", 3), ("finish",)]
    assert a.calls == expected and b.calls == expected


def test_make_sink_noop_off_main_and_jsonl_only_without_wandb(tmp_path):
    cfg = LoggingConfig(wandb=True)
    assert type(make_sink(tmp_path / "other", cfg, "run", {}, is_main=False)) is NoOpSink
    assert not (tmp_path / "other").exists()

    for cfg in (LoggingConfig(wandb=False), LoggingConfig(wandb=True, wandb_mode="disabled")):
        sink = make_sink(tmp_path, cfg, "run", {"lr": 1e-3}, is_main=True)
        assert isinstance(sink, FanoutSink) and [type(s) for s in sink.sinks] == [JsonlSink]
        sink.log({"a": 1.0}, 0)
        sink.finish()
    assert len(_read_jsonl(tmp_path / "metrics.jsonl")) == 2


def test_wandb_offline_run_through_make_sink(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # The recipe asks for online; the WANDB_MODE environment variable must win (no network here).
    cfg = LoggingConfig(wandb=True, wandb_project="deepspec_train_test", wandb_mode="online")
    recipe = {"drafter": {"kind": "dspark"}, "target": {"path": "artifacts/tinyworld/target/"},
              "run": {"name": "tiny-dspark"}}
    sink = make_sink(tmp_path, cfg, "tiny-run", recipe, is_main=True)
    wandb_sink = sink.sinks[1]
    assert isinstance(wandb_sink, WandbSink)
    assert wandb_sink.run.settings.mode == "offline"
    assert wandb_sink.run.config["drafter"] == {"kind": "dspark"}
    assert wandb_sink.run.group == "target"
    assert set(wandb_sink.run.tags) == {"drafter:dspark", "target:target", "recipe:tiny-dspark"}
    assert (wandb_sink.run.config["drafter_kind"], wandb_sink.run.config["recipe"]) == ("dspark", "tiny-dspark")
    sink.log({"train/loss": 2.0, "train/acc_1": 0.5}, step=1)
    sink.log_table("val/per_position", ["k", "accept"], [[1, 0.9], [2, 0.8]], step=2)
    png = tmp_path / "img.png"
    from deepspec_train.comparison.plots import plot_per_position

    plot_per_position({"dspark": [0.9, 0.8]}, "accept_k", png)
    sink.log_image("val/accept_plot", png, step=2)
    sink.finish()

    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    assert list(run_dirs[0].glob("*.wandb")), "offline run wrote no .wandb log"
    assert [r["step"] for r in _read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 2]


def test_wandb_group_defaults_to_the_target_and_can_be_set():
    recipe = {"drafter": {"kind": "eagle3"}, "target": {"path": "/models/Qwen3-8B"}, "run": {"name": "qwen3-8b-eagle3"}}
    group, tags, labels = wandb_labels(LoggingConfig(), recipe)
    assert group == "Qwen3-8B" and labels["target_name"] == "Qwen3-8B"
    assert tags == ["drafter:eagle3", "target:Qwen3-8B", "recipe:qwen3-8b-eagle3"]
    assert wandb_labels(LoggingConfig(wandb_group="sweep-7"), recipe)[0] == "sweep-7"
    assert wandb_labels(LoggingConfig(), {}) == (None, [], {})


def test_rank0_print_and_logger_only_on_rank_zero(monkeypatch, capsys):
    logger = get_logger("deepspec_train.test_rank0")
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger.addHandler(Collect())
    assert get_logger("deepspec_train.test_rank0") is logger
    assert len(logger.handlers) == 2  # asking again adds no duplicate handler

    monkeypatch.setenv("RANK", "1")
    rank0_print("hidden")
    logger.info("hidden")
    monkeypatch.setenv("RANK", "0")
    rank0_print("shown")
    logger.info("shown")
    assert capsys.readouterr().out == "shown\n"
    assert records == ["shown"]


def test_train_progress_shows_step_throughput_and_eta(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    out = io.StringIO()
    with TrainProgress(total_steps=100, enabled=True, initial_step=10, file=out) as progress:
        assert progress.active
        progress.update(12, samples_per_s=8.0, sup_tokens_per_s=1234.0, loss=2.5)
        progress.update(15, samples_per_s=9.5, sup_tokens_per_s=2000.0, loss=2.25)
    text = out.getvalue()
    assert "15/100" in text
    assert "loss=2.2500" in text and "samples/s=9.5" in text and "sup_tok/s=2000" in text
    # tqdm's "elapsed<remaining" field is the ETA.
    assert "<" in text

    monkeypatch.setenv("RANK", "1")
    silent = io.StringIO()
    off_main = TrainProgress(total_steps=10, enabled=True, file=silent)
    disabled = TrainProgress(total_steps=10, enabled=False, file=silent)
    for bar in (off_main, disabled):
        assert not bar.active
        bar.update(1, 1.0, 1.0, 1.0)
        bar.close()
    assert silent.getvalue() == ""
