"""``deepspec compare``: three fake run directories (synthetic numbers) through the CLI, checked cell by cell.

The fixture writes the files the pipeline writes (resolved_config.yaml, metrics.jsonl, summary.json,
eval/results.json, calibration/calibration.json) with hand-picked values, so every table cell has a known answer.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from deepspec_train.commands.dispatch import main
from deepspec_train.comparison.collect import collect_row, collect_rows, weighted_mean
from deepspec_train.comparison.position_plots import MIN_ROUNDS
from deepspec_train.comparison.report import main_table, markdown_table
from deepspec_train.formats.figures import read_drawn

GSM8K_DSPARK = [0.95, 0.9, 0.85]
MT_BENCH_DSPARK = [0.8, 0.7]
GSM8K_DFLASH = [0.9, 0.8, 0.75, 0.7]
CAL_COUNTS = [100, 80, 50, 0]
CAL_ECE_BEFORE = [0.08, 0.06, 0.04, math.nan]
CAL_ECE_AFTER = [0.01, 0.012, 0.02, math.nan]


def _rounds_reaching(curve: list[float]) -> list[int]:
    """Rounds behind each position of ``curve``: 120, 40, 13, 4, ... (the last ones below the plots' minimum)."""
    return [120 // 3**k for k in range(len(curve))]


def _results(kind: str, suites: dict[str, tuple[float, list[float]]]) -> dict:
    return {
        "target": "tiny-target",
        "drafter": f"exports/{kind}",
        "drafter_kind": kind,
        "block_size": 4,
        "temperature": 1.0,
        "seeds": [0, 1],
        "suites": {
            name: {"tau": tau, "rounds": 10, "prompts": 10, "new_tokens": 40, "tokens_per_s": 12.5,
                   "tau_interval": {"value": tau, "se": 0.1, "low": tau - 0.2, "high": tau + 0.3},
                   "conditional_acceptance": curve, "acceptance_rounds": _rounds_reaching(curve), "categories": {}}
            for name, (tau, curve) in suites.items()
        },
    }


def _write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # allow_nan: calibration.json stores NaN for positions no round reached, as `deepspec calibrate` does.
    path.write_text(json.dumps(data, allow_nan=True))
    return path


def _write_config(run: Path, name: str, kind: str) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "resolved_config.yaml").write_text(yaml.safe_dump({"run": {"name": name}, "drafter": {"kind": kind}}))


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    dspark = tmp_path / "runs" / "dspark"
    _write_config(dspark, "dspark-8b", "dspark")
    records = [
        {"step": 10, "train/loss": 2.0},
        {"step": 10, "val/loss": 1.9, "val/expected_len": 4.0, "val/tau_analytic": 5.0},
        {"step": 20, "table": "val/accept", "columns": ["k"], "rows": [[1]]},
        {"step": 20, "val/loss": 1.5, "val/expected_len": 5.17, "val/tau_analytic": 6.17,
         "val/accept_1": 0.97, "val/accept_2": 0.93, "val/accept_3": 0.9, "val/conf_ece": 0.05, "val/conf_auroc": 0.8,
         "val/count_1": 200, "val/count_2": 50, "val/count_3": 20},
        {"step": 30, "train/loss": 1.4},
    ]
    # The last line is cut mid-record, as when a run is killed while logging.
    (dspark / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + '\n{"step": 40, "val/exp')
    _write_json(dspark / "eval" / "results.json",
                _results("dspark", {"gsm8k": (6.17, GSM8K_DSPARK), "mt_bench": (3.72, MT_BENCH_DSPARK)}))
    _write_json(dspark / "calibration" / "calibration.json", {
        "temperatures": [0.9, 1.25, 1.5, 1.0], "counts": CAL_COUNTS,
        "ece_before": CAL_ECE_BEFORE, "ece_after": CAL_ECE_AFTER,
        "auroc_before": [0.7, 0.72, 0.74, math.nan], "auroc_after": [0.7, 0.72, 0.74, math.nan],
        "brier_before": [0.2, 0.2, 0.2, math.nan], "brier_after": [0.1, 0.1, 0.1, math.nan],
        "n_bins": 10, "num_rounds": 100, "skipped_rounds": 0, "traces": ["traces.jsonl"],
    })
    dflash = tmp_path / "runs" / "dflash"
    _write_config(dflash, "dflash-8b", "dflash")
    (dflash / "metrics.jsonl").write_text(json.dumps({"step": 5, "train/loss": 3.0}) + "\n")
    _write_json(dflash / "summary.json", {"steps": 5, "val_metrics": {"val/expected_len": 4.33, "val/accept_1": 0.9}})
    _write_json(dflash / "eval" / "results.json", _results("dflash", {"gsm8k": (5.33, GSM8K_DFLASH)}))
    eagle3 = _write_json(tmp_path / "elsewhere" / "eagle3" / "eval" / "results.json",
                         _results("eagle3", {"gsm8k": (5.30, [0.9, 0.85]), "mt_bench": (2.66, [0.6, 0.5])}))
    return {"dspark": dspark, "dflash": dflash, "eagle3": eagle3}


def _table_lines(markdown: str, header_start: str) -> list[list[str]]:
    """Cells of the markdown table whose header line starts with ``header_start`` (header and body rows)."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert set(rows[1]) == {"---"}
    return [rows[0], *rows[2:]]


def test_weighted_mean_matches_numpy_average() -> None:
    rng = np.random.default_rng(0)
    values = rng.random(7)
    counts = rng.integers(1, 50, size=7)
    expected = float(np.average(values, weights=counts))
    assert weighted_mean(list(values), list(counts)) == pytest.approx(expected, rel=1e-12)
    # Positions without a value or without rounds do not count.
    assert weighted_mean([0.5, None, 0.1], [2, 9, 0]) == pytest.approx(0.5)
    assert weighted_mean([None], [3]) is None


def test_compare_cli_tables_and_plots(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", str(runs["dspark"]), str(runs["dflash"]), str(runs["eagle3"]), "--out", str(out)]) == 0
    markdown = (out / "comparison.md").read_text()
    main_rows = _table_lines(markdown, "| drafter | kind")

    counts = [n for n in CAL_COUNTS if n > 0]
    ece_before = sum(n * e for n, e in zip(counts, CAL_ECE_BEFORE)) / sum(counts)
    ece_after = sum(n * e for n, e in zip(counts, CAL_ECE_AFTER)) / sum(counts)
    assert f"{ece_before:.4f}" == "0.0643" and f"{ece_after:.4f}" == "0.0129"
    assert main_rows == [
        ["drafter", "kind", "tau gsm8k", "tau mt_bench", "E[L]", "ECE before", "ECE after"],
        ["dspark", "dspark", "6.170", "3.720", "5.170", "0.0643", "0.0129"],
        ["dflash", "dflash", "5.330", "-", "4.330", "-", "-"],
        ["eagle3", "eagle3", "5.300", "2.660", "-", "-", "-"],
    ]
    printed = capsys.readouterr().out
    assert markdown_table(main_table(collect_rows([runs["dspark"], runs["dflash"], runs["eagle3"]]))) in printed

    gsm8k = _table_lines(markdown, "| drafter | k=1 | k=2 | k=3 | k=4 |")
    assert gsm8k[1:] == [
        ["dspark", "0.950", "0.900", "0.850", "-"],
        ["dflash", "0.900", "0.800", "0.750", "0.700"],
        ["eagle3", "0.900", "0.850", "-", "-"],
    ]
    section = markdown.split("## Conditional acceptance P(A_k | A_<k): mt_bench", 1)[1]
    assert _table_lines(section, "| drafter")[1:] == [
        ["dspark", "0.800", "0.700"],
        ["dflash", "-", "-"],
        ["eagle3", "0.600", "0.500"],
    ]
    calibration = _table_lines(markdown.split("## Confidence calibration", 1)[1], "| drafter")
    assert calibration[1] == ["dspark", "230", "0.0643", "0.0129", f"{(70 + 57.6 + 37) / 230:.4f}",
                              f"{(70 + 57.6 + 37) / 230:.4f}", "0.90, 1.25, 1.50, 1.00"]
    assert len(calibration) == 2

    for name in ("conditional_acceptance_gsm8k.png", "conditional_acceptance_mt_bench.png",
                 "tau_per_suite.png", "calibration.png", "validation_acceptance.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({name})" in markdown
    _check_drawn(out)


def _check_drawn(out: Path) -> None:
    """What each plot recorded: every value with its count, points below the minimum greyed, intervals where the
    results have them, distinct labels and colours, limits that hold the data, titles with T and seeds."""
    gsm8k = read_drawn(out / "conditional_acceptance_gsm8k.png")
    assert gsm8k["title"] == "conditional acceptance on gsm8k, T = 1, seeds 0, 1" and gsm8k["min_rounds"] == 30
    series = {s["label"]: s for s in gsm8k["series"]}
    assert list(series) == ["dspark", "dflash", "eagle3"] and len({s["colour"] for s in series.values()}) == 3
    for name, curve in (("dspark", GSM8K_DSPARK), ("dflash", GSM8K_DFLASH)):
        assert series[name]["y"] == curve and series[name]["counts"] == _rounds_reaching(curve)
        assert series[name]["greyed"] == [n < MIN_ROUNDS for n in _rounds_reaching(curve)]
    assert series["dflash"]["greyed"] == [False, False, True, True]
    low, high = gsm8k["ylim"]
    assert all(low <= v <= high for s in series.values() for v in s["y"])

    tau = read_drawn(out / "tau_per_suite.png")
    assert tau["groups"] == ["gsm8k", "mt_bench", "mean"] and "T = 1, seeds 0, 1" in tau["title"]
    bars = {s["label"]: s for s in tau["series"]}
    assert bars["dspark"]["interval"][:2] == [pytest.approx([5.97, 6.47]), pytest.approx([3.52, 4.02])]
    # No interval where there is no bar (dflash on mt_bench), and none for the mean over suites.
    assert bars["dflash"]["y"][1] is None and bars["dflash"]["interval"][1:] == [None, None]
    assert tau["ylim"][1] >= 6.47

    validation = read_drawn(out / "validation_acceptance.png")
    assert [s["label"] for s in validation["series"]] == ["dspark (step 20)", "dflash"]
    assert validation["series"][0]["counts"] == [200, 50, 20]
    assert validation["series"][0]["greyed"] == [False, False, True]


def test_collect_reads_last_validation_record(runs: dict[str, Path]) -> None:
    row = collect_row(runs["dspark"])
    assert (row.expected_len, row.tau_analytic) == (5.17, 6.17)
    assert row.val_accept == [0.97, 0.93, 0.9]
    assert (row.val_conf_ece, row.val_conf_auroc) == (0.05, 0.8)
    assert row.mean_tau == pytest.approx((6.17 + 3.72) / 2)
    # The eval output directory itself is a valid argument, named after its run directory.
    eval_row = collect_row(runs["dspark"] / "eval")
    assert (eval_row.name, eval_row.kind, eval_row.expected_len) == ("dspark", "dspark", None)


def test_results_file_only(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "only"
    assert main(["compare", str(runs["eagle3"]), "--out", str(out)]) == 0
    rows = _table_lines((out / "comparison.md").read_text(), "| drafter | kind")
    assert rows == [
        ["drafter", "kind", "tau gsm8k", "tau mt_bench", "E[L]", "ECE before", "ECE after"],
        ["eagle3", "eagle3", "5.300", "2.660", "-", "-", "-"],
    ]
    assert (out / "tau_per_suite.png").stat().st_size > 0
    # No drafter has calibration data, so there is no calibration plot.
    assert not (out / "calibration.png").exists()


def test_duplicate_names_and_bad_paths(runs: dict[str, Path], tmp_path: Path) -> None:
    rows = collect_rows([runs["eagle3"], runs["eagle3"], runs["eagle3"]])
    assert [r.name for r in rows] == ["eagle3", "eagle3-2", "eagle3-3"]
    assert main(["compare", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    not_results = _write_json(tmp_path / "other.json", {"steps": 3})
    assert main(["compare", str(not_results), "--out", str(tmp_path / "o")]) == 2


def test_wandb_offline_run_gets_tables(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb_dir = tmp_path / "wandb_files"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    out = tmp_path / "cmp"
    argv = ["compare", str(runs["dspark"]), str(runs["dflash"]), "--out", str(out), "--wandb",
            "--wandb-project", "cmp-test", "--wandb-group", "qwen3-8b"]
    assert main(argv) == 0
    run_dirs = list((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    tables = list(run_dirs[0].rglob("summary_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["drafter", "kind", "tau gsm8k", "tau mt_bench", "E[L]", "ECE before", "ECE after"]
    assert [row[:5] for row in table["data"]] == [["dspark", "dspark", 6.17, 3.72, 5.17],
                                                  ["dflash", "dflash", 5.33, None, 4.33]]
    images = {p.name.rsplit("_", 2)[0] for p in run_dirs[0].rglob("*.png")}
    assert images == {"conditional_acceptance_gsm8k", "conditional_acceptance_mt_bench", "tau_per_suite", "calibration",
                      "validation_acceptance"}
    assert list(run_dirs[0].rglob("gsm8k_table_*.table.json")), "no acceptance line plot for gsm8k"
    # The group is recorded in the run's protobuf log, which W&B's service process may still be flushing;
    # the command leaves the environment as it found it.
    log = next(run_dirs[0].glob("run-*.wandb"))
    deadline = time.monotonic() + 30
    while b"qwen3-8b" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b"qwen3-8b" in log.read_bytes()
    assert "WANDB_RUN_GROUP" not in os.environ


def _training_run(run: Path, recipe_name: str) -> Path:
    """A run directory with only what training writes: its config and one validation record."""
    _write_config(run, recipe_name, "dspark")
    record = {"step": 40, "val/expected_len": 2.9, "val/accept_1": 0.78, "val/accept_2": 0.77,
              "val/count_1": 171, "val/count_2": 163}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    return run


def test_runs_are_named_by_the_folder_given_or_their_label(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Two runs of one recipe share its run.name, as `deepspec compare runs/a runs/b` of two tiny-dspark runs.
    a, b = (_training_run(tmp_path / "runs" / name, "tiny-dspark") for name in ("a", "b"))
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    names = [row[0] for row in _table_lines((out / "comparison.md").read_text(), "| drafter | kind")[1:]]
    assert names == ["a", "b"]
    drawn = read_drawn(out / "validation_acceptance.png")
    assert [s["label"] for s in drawn["series"]] == ["a (step 40)", "b (step 40)"]
    assert [s["counts"] for s in drawn["series"]] == [[171, 163]] * 2
    assert len({s["colour"] for s in drawn["series"]}) == 2

    assert main(["compare", str(a), str(b), "--out", str(out), "--label", "dspark", "--label", "dspark-lr3"]) == 0
    drawn = read_drawn(out / "validation_acceptance.png")
    assert [s["label"] for s in drawn["series"]] == ["dspark (step 40)", "dspark-lr3 (step 40)"]

    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(out), "--label", "only-one"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--label" in error and len(error.splitlines()) == 1

    # Folders of the same name in different places are named by the paths as given.
    twins = [_training_run(tmp_path / place / "dspark", "tiny-dspark") for place in ("x", "y")]
    assert [r.name for r in collect_rows(twins)] == [str(p) for p in twins]
