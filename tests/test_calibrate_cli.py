"""``deepspec calibrate`` on synthetic evaluator traces: realised survival, fitted temperatures, outputs written.

Traces are drawn from a known model: the true conditional acceptance at position k is ``sigmoid(z_k / T_k)``
with ``T_k > 1``, so the raw confidences (T = 1) are over-confident and the fit must move every temperature
toward ``T_k`` and lower the ECE of cumulative survival.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from deepspec_train.calibration.cli import survival_arrays
from deepspec_train.commands.dispatch import main
from deepspec_train.export.engine_files import STS_FILENAME, read_sts, strict_json_loads, sts_payload
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.formats.eval_traces import TraceRound, read_traces
from deepspec_train.formats.eval_traces import write_traces as write_trace_file
from tests.helpers.tiny_geometry import BLOCK
from tests.helpers.trained_drafters import exported_dspark, save_tiny_target

TRUE_TEMPERATURES = [2.0, 1.5, 3.0, 2.5]


def trace(drafted: int, accepted: int, logits, r: int = 0) -> TraceRound:
    return TraceRound(
        suite="synthetic", category="math", prompt_id=f"p{r % 7}", turn=0, round=r, drafted=drafted,
        accepted=accepted, emitted=accepted + 1,
        confidence_logits=None if logits is None else tuple(float(z) for z in logits),
        confidences=None if logits is None else tuple(float(1.0 / (1.0 + np.exp(-z))) for z in logits),
        target_accept_probs=(1.0,) * drafted,
    )


def write_traces(path, rounds: int, seed: int, temperatures=TRUE_TEMPERATURES, with_logits: bool = True) -> None:
    """``rounds`` verification rounds in ``deepspec eval --save-traces`` format."""
    rng = np.random.default_rng(seed)
    k = len(temperatures)
    records = []
    for r in range(rounds):
        z = rng.normal(1.5, 2.0, size=k)
        accept = rng.random(k) < 1.0 / (1.0 + np.exp(-z / np.asarray(temperatures)))
        # Accepted draft tokens = the run of leading acceptances (the first rejection ends the round).
        accepted = int(np.argmin(accept)) if not accept.all() else k
        records.append(trace(k, accepted, z if with_logits else None, r))
    write_trace_file(path, records)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    return save_tiny_target(tmp_path_factory.mktemp("target"))


def test_survival_arrays_of_traces(tmp_path):
    path = tmp_path / "t.jsonl"
    rounds = [trace(3, 1, [0.1, 0.2, 0.3]), trace(2, 2, [1.0, 2.0]), trace(3, 0, None), trace(3, 3, [-1.0, 0.0, 1.0])]
    write_trace_file(path, rounds)
    assert read_traces([path]) == rounds
    traces = survival_arrays(read_traces([path]))
    assert traces.skipped == 1
    assert traces.valid.tolist() == [[True, True, True], [True, True, False], [True, True, True]]
    assert traces.survived.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert traces.logits[1].tolist() == [1.0, 2.0, 0.0]


def test_calibrate_writes_temperatures_into_export(tmp_path, target_dir, capsys):
    export_dir, _ = exported_dspark(tmp_path / "drafter", target_dir)
    write_traces(tmp_path / "a.jsonl", 3000, seed=1)
    write_traces(tmp_path / "b.jsonl", 3000, seed=2)
    write_traces(tmp_path / "none.jsonl", 5, seed=3, with_logits=False)
    out = tmp_path / "calib"
    argv = ["calibrate", "--out", str(out), "--drafter", str(export_dir)]
    for name in ("a.jsonl", "b.jsonl", "none.jsonl"):
        argv += ["--traces", str(tmp_path / name)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "6000 rounds (5 without confidence logits skipped)" in printed and "ECE before" in printed

    report = strict_json_loads((out / "calibration.json").read_text())
    temps = report["temperatures"]
    sts = read_sts(out / STS_FILENAME)
    assert sts == {"temperatures": temps, "num_samples": 6000, "ece_before": report["ece_before"],
                   "ece_after": report["ece_after"], "dataset": "synthetic"}
    assert read_sts(export_dir / STS_FILENAME) == sts
    assert len(temps) == BLOCK and report["n_bins"] == 10
    for k in range(BLOCK):
        assert report["ece_after"][k] < report["ece_before"][k]
        assert 1.0 < temps[k] and abs(np.log(temps[k] / TRUE_TEMPERATURES[k])) < 0.35
    assert report["ece_after"][0] < 0.03 < report["ece_before"][0]
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    config = json.loads((export_dir / "config.json").read_text())
    assert config["confidence_temperatures"] == temps
    assert load_exported_drafter(export_dir).confidence_temperatures == temps


def test_calibrate_refuses_mismatched_block_and_missing_logits(tmp_path, target_dir):
    export_dir, _ = exported_dspark(tmp_path / "drafter", target_dir)
    before = (export_dir / "config.json").read_text()
    write_traces(tmp_path / "short.jsonl", 200, seed=4, temperatures=[2.0, 2.0, 2.0])
    assert main(["calibrate", "--traces", str(tmp_path / "short.jsonl"), "--out", str(tmp_path / "c"),
                 "--drafter", str(export_dir)]) == 2
    assert (export_dir / "config.json").read_text() == before
    write_traces(tmp_path / "none.jsonl", 10, seed=5, with_logits=False)
    assert main(["calibrate", "--traces", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "d")]) == 2


def test_read_traces_rejects_impossible_rounds_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(trace(2, 1, [0.0, 0.0]).__dict__)
    bad = json.dumps({**trace(2, 1, [0.0, 0.0]).__dict__, "accepted": 3})
    path.write_text(good + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: bad trace round: accepted 3 outside 0..drafted \(2\)"):
        read_traces([path])
    path.write_text(json.dumps({**trace(2, 1, [0.0, 0.0]).__dict__, "confidences": [0.5]}) + "\n")
    with pytest.raises(ValueError, match="confidences has 1 entries for 2 drafted tokens"):
        read_traces([path])


def test_positions_without_data_stay_strict_json(tmp_path):
    """Every round accepts position 1, so its AUROC is undefined: NaN metrics become null in calibration.json, an
    ECE list with a position without data is left out of the STS file, and both parse strictly."""
    path = tmp_path / "t.jsonl"
    rng = np.random.default_rng(7)
    write_trace_file(path, [trace(3, int(rng.integers(1, 4)), rng.normal(1.0, 1.5, size=3), r) for r in range(300)])
    out = tmp_path / "calib"
    assert main(["calibrate", "--traces", str(path), "--out", str(out), "--dataset", "gsm8k"]) == 0
    text = (out / "calibration.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    report = strict_json_loads(text)
    assert report["auroc_before"][0] is None and report["counts"][0] == 300
    sts = strict_json_loads((out / STS_FILENAME).read_text())
    assert sts == {"temperatures": report["temperatures"], "num_samples": 300, "dataset": "gsm8k",
                   "ece_before": report["ece_before"], "ece_after": report["ece_after"]}
    assert all(t > 0 for t in sts["temperatures"])
    partial = sts_payload([1.0, 2.0], 10, ece_before=[0.1, float("nan")], ece_after=[0.05, 0.02])
    assert partial == {"temperatures": [1.0, 2.0], "num_samples": 10, "ece_after": [0.05, 0.02]}
    with pytest.raises(ValueError, match="non-standard JSON constant NaN"):
        strict_json_loads('{"temperatures": [NaN]}')


@pytest.mark.parametrize(
    "sts, message",
    [
        ({"temperatures": []}, "non-empty list of positive numbers"),
        ({"temperatures": [1.0, 0.0]}, "non-empty list of positive numbers"),
        ({"temperatures": [1.0], "num_samples": 2.5}, "num_samples"),
        ({"temperatures": [1.0], "ece_before": [None]}, "ece_before"),
        ({"temperatures": [1.0], "dataset": 3}, "dataset"),
        ({"temperatures": [1.0], "gamma": 7}, "unknown keys"),
    ],
)
def test_sts_schema_is_enforced(sts, message):
    from deepspec_train.export.engine_files import check_sts

    with pytest.raises(ValueError, match=message):
        check_sts(sts)
