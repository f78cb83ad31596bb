"""``bench/decode_shortcuts.py``: the table shortcuts it times compute what the drafting steps compute, and its
equality check rejects a shortcut that does not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "decode_shortcuts.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("decode_shortcuts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_equality_check_rejects_a_wrong_shortcut() -> None:
    bench = _bench_module()
    a = (torch.ones(1, 4), torch.zeros(1, 4))
    bench.check_equal("same", a, (a[0].clone(), a[1].clone()))
    with pytest.raises(AssertionError, match="differs"):
        bench.check_equal("off by 0.1", a, (a[0] + 0.1, a[1]))


def test_both_shortcuts_are_exact_at_small_and_tiny_world_ranks() -> None:
    bench = _bench_module()
    for rank in (8, 128):
        assert all(t > 0 for t in bench.rnn_step_costs(4096, 128, rank, calls=20))
    assert all(t > 0 for t in bench.eagle3_projection_costs(4096, 128, 128, 64, calls=20))


def test_the_benchmark_runs_as_a_user_runs_it() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--calls", "20", "--ranks", "16"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "vocabulary 4096, hidden 128" in done.stdout
    assert "EAGLE-3 first projections" in done.stdout
