"""``bench/gpu_check.sh --device cpu``: the prepared GPU check runs every phase at tiny shapes and writes its JSON
and summary, so the script a lent GPU machine runs has run here first."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.streaming_world import REPO


@pytest.mark.slow
def test_gpu_check_cpu_mode_writes_every_phase(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "bench/gpu_check.sh", str(tmp_path), "--device", "cpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    for phase in ("tiny", "deepspeed", "width", "syncs"):
        assert "error" not in report[phase], report[phase]
    assert report["tiny"]["abs_diff"] == 0.0
    assert report["syncs"]["python_reads_per_step"] <= 1
    assert report["width"]["whole_step_tokens_per_s"] > 0
    assert (tmp_path / "gpu_check.txt").read_text().startswith("tiny:")
