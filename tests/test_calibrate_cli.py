"""``deepspec calibrate`` on synthetic evaluator traces: realised survival, fitted temperatures, outputs written.

Traces are drawn from a known model: the true conditional acceptance at position k is ``sigmoid(z_k / T_k)``
with ``T_k > 1``, so the raw confidences (T = 1) are over-confident and the fit must move every temperature
toward ``T_k`` and lower the ECE of cumulative survival.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from deepspec_train.calibration.cli import read_traces
from deepspec_train.cli import main
from deepspec_train.export.loader import load_exported_drafter
from tests.test_export import BLOCK, exported_dspark, save_tiny_target

TRUE_TEMPERATURES = [2.0, 1.5, 3.0, 2.5]


def write_traces(path, rounds: int, seed: int, temperatures=TRUE_TEMPERATURES, with_logits: bool = True) -> None:
    """One JSON line per verification round, in ``deepspec eval --save-traces`` format."""
    rng = np.random.default_rng(seed)
    k = len(temperatures)
    with open(path, "w") as f:
        for r in range(rounds):
            z = rng.normal(1.5, 2.0, size=k)
            accept = rng.random(k) < 1.0 / (1.0 + np.exp(-z / np.asarray(temperatures)))
            # Accepted draft tokens = the run of leading acceptances (the first rejection ends the round).
            accepted = int(np.argmin(accept)) if not accept.all() else k
            record = {
                "suite": "synthetic", "category": "math", "prompt_id": f"p{r % 7}", "turn": 0, "round": r,
                "drafted": k, "accepted": accepted, "emitted": accepted + 1,
                "confidence_logits": z.tolist() if with_logits else None,
                "confidences": (1.0 / (1.0 + np.exp(-z))).tolist() if with_logits else None,
            }
            f.write(json.dumps(record) + "\n")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    return save_tiny_target(tmp_path_factory.mktemp("target"))


def test_read_traces_realised_survival(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"drafted": 3, "accepted": 1, "confidence_logits": [0.1, 0.2, 0.3]},
        {"drafted": 2, "accepted": 2, "confidence_logits": [1.0, 2.0, 3.0]},
        {"drafted": 3, "accepted": 0, "confidence_logits": None},
        {"drafted": 3, "accepted": 3, "confidence_logits": [-1.0, 0.0, 1.0]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    traces = read_traces([path])
    assert traces.skipped == 1
    assert traces.valid.tolist() == [[True, True, True], [True, True, False], [True, True, True]]
    assert traces.survived.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert traces.logits[1].tolist() == [1.0, 2.0, 3.0]


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

    report = json.loads((out / "calibration.json").read_text())
    temps = report["temperatures"]
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


def test_read_traces_rejects_impossible_rounds(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"drafted": 2, "accepted": 3, "confidence_logits": [0.0, 0.0]}) + "\n")
    with pytest.raises(ValueError, match="outside 0..drafted"):
        read_traces([path])
