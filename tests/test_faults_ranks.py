"""Fault matrix, ranks: a user error seen by one rank of a colocated run with two ranks ends both together (the
other rank told, before its deadline), each with exit status 2, and the one-line message is printed once, by that
rank, naming it.

Real gloo processes: two plain processes with ``RANK`` / ``WORLD_SIZE`` set and no agent (as ``srun`` starts
them), and a ``torchrun`` of two. Rank 0 sees a bad data file (it tokenises first while rank 1 waits in a
barrier); rank 1 alone sees its damaged RNG file in a checkpoint without a manifest (it reads only its own).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.streaming_world import REPO, free_port, rank_env, read_logs, recipe_overrides, run_ranks, start_ranks

pytestmark = pytest.mark.slow

# Ending together means the rank without the error was told and did not wait out a deadline: its collectives'
# deadline is the overrides' stream.timeout_s (30 s). An event order (told before the deadline), not a speed: a
# loaded machine stretches the spread but not past the deadline it would otherwise take.
SECONDS_TO_END_TOGETHER = 30.0


def bad_data_args(world: dict[str, str], tmp_path: Path) -> tuple[list[str], Path]:
    bad = tmp_path / "bad.jsonl"
    good = Path(world["train"]).read_bytes().splitlines()
    bad.write_bytes(b"\n".join([*good[:6], b"{oops", *good[6:12]]) + b"\n")
    args = recipe_overrides(world, tmp_path / "run", **{
        "data.train": f"[{bad}]", "data.validation": "[]", "data.strict": "true",
        "data.cache_dir": str(tmp_path / "cache"),
    })
    return args, bad


def wait_and_time(procs: list[subprocess.Popen], timeout_s: float) -> tuple[list[int], float]:
    """Exit codes of ``procs`` and the seconds from the first exit to the last."""
    deadline = time.monotonic() + timeout_s
    ended: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if len(ended) < len(procs):
        return [proc.returncode for proc in procs], float("inf")
    return [proc.returncode for proc in procs], max(ended.values()) - min(ended.values())


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_bad_data_on_rank_0_ends_both_plain_processes(streaming_world, tmp_path) -> None:
    args, bad = bad_data_args(streaming_world, tmp_path)
    procs = start_ranks(["train.py", *args], 2, tmp_path / "logs")
    codes, spread = wait_and_time(procs, 120)
    logs = read_logs(tmp_path / "logs", 2)
    assert codes == [2, 2], logs
    assert spread < SECONDS_TO_END_TOGETHER, (spread, logs)
    lines = error_lines(logs)
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: ") and str(bad) in lines[0], logs
    assert "Traceback" not in logs, logs


def test_a_damaged_file_only_rank_1_reads_ends_both(streaming_world, tmp_path) -> None:
    out = tmp_path / "run"
    common = {"train.max_steps": 4, "train.eval_every": 1000}
    first = recipe_overrides(streaming_world, out, **common, **{"train.stop_at_step": 2})
    run_ranks(first, 2, tmp_path / "logs1", timeout=300)
    checkpoint = out / "checkpoints" / "step_00000002"
    # A checkpoint from before manifests is loaded unverified: each rank finds out about its own RNG file alone.
    (checkpoint / "manifest.json").unlink()
    (checkpoint / "rng_rank1.pt").write_bytes(b"not a torch file")
    procs = start_ranks(["train.py", *recipe_overrides(streaming_world, out, **common, **{"train.resume": "auto"})],
                        2, tmp_path / "logs2")
    codes, spread = wait_and_time(procs, 120)
    logs = read_logs(tmp_path / "logs2", 2)
    assert codes == [2, 2] and spread < SECONDS_TO_END_TOGETHER, (codes, spread, logs)
    lines = error_lines(logs)
    assert len(lines) == 1 and lines[0].startswith("error: rank 1: ") and "rng_rank1.pt" in lines[0], logs
    assert "Traceback" not in logs, logs


def test_bad_data_on_rank_0_ends_a_torchrun_of_two(streaming_world, tmp_path) -> None:
    args, bad = bad_data_args(streaming_world, tmp_path)
    env = rank_env(0, 1, free_port())
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key)
    log_dir = tmp_path / "torchrun"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         "--redirects", "3", "--log-dir", str(log_dir), "train.py", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )
    agent = proc.stdout + proc.stderr
    worker_logs = {path.parent.name: path.read_text() for path in log_dir.rglob("stderr.log")}
    assert proc.returncode != 0 and len(worker_logs) == 2, agent
    # Both workers left on their own with status 2 (the agent's summary lists each one's exit code).
    assert agent.count("exitcode  : 2") == 2, agent
    every = "\n".join(worker_logs.values())
    lines = error_lines(every)
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: ") and str(bad) in lines[0], every
    assert "Traceback" not in every, every
