"""Shared helpers for the multi-process streaming, resume and failure tests (the ``streaming_world`` fixture in
``conftest.py`` is built with ``build_world``).

Builds a tiny world on disk (the random 2-layer chat model of ``tiny_chat_model`` plus a few JSONL
conversations) and launches ``train.py`` as a set of ranks the way Slurm's ``srun`` would: one plain process per
rank with ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` set and no supervising agent, so a test
can kill or stop one rank and watch how the others react (``fail_one_rank_mid_run``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from deepspec_train.common.local_ports import unused_local_port
from tests.helpers.tiny_chat_model import save_tiny_chat_model

REPO = Path(__file__).resolve().parents[2]

WORDS = "the quick brown fox jumps over lazy dog two plus three is five add numbers python help".split()


def write_conversations(path: Path, count: int, seed: int) -> str:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(count):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30)))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"id": f"{path.stem}-{i}", "messages": messages}) + "\n")
    return str(path)


def build_world(root: Path) -> dict[str, str]:
    """Target directory, train / validation JSONL and a shard cache directory under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return {
        "target": save_tiny_chat_model(root / "target"),
        "train": write_conversations(root / "train.jsonl", 48, seed=1),
        "validation": write_conversations(root / "validation.jsonl", 8, seed=2),
        "cache": str(root / "cache"),
    }


def recipe_overrides(world: dict[str, str], output_dir: Path, **extra) -> list[str]:
    """``train.py`` arguments: the tiny-dspark recipe pointed at the tiny random world, few fast steps."""
    values = {
        "target.path": world["target"],
        "target.layer_ids": "[0]",
        "data.train": f"[{world['train']}]",
        "data.validation": f"[{world['validation']}]",
        "data.cache_dir": world["cache"],
        "data.max_length": 96,
        "drafter.mask_token_id": 3,
        "drafter.num_layers": 1,
        "drafter.block_size": 4,
        "drafter.markov_rank": 8,
        "anchors.num_per_sequence": 4,
        "anchors.token_budget": 512,
        "train.max_steps": 4,
        "train.global_batch_sequences": 4,
        "train.micro_batch_sequences": 2,
        "train.eval_every": 2,
        "train.eval_sequences": 4,
        "train.checkpoint_every": 1000,
        "logging.wandb": "false",
        "logging.progress": "false",
        "logging.log_every": 1,
        "stream.timeout_s": 30,
        "run.output_dir": str(output_dir),
    }
    values.update(extra)
    return ["recipe=tiny-dspark"] + [f"{k}={v}" for k, v in values.items()]


def train_in_process(world: dict[str, str], output_dir: Path, **extra) -> Path:
    """The run of ``recipe_overrides(world, output_dir, **extra)`` trained colocated in this process (no launch of
    processes: seconds saved where a test only needs the uninterrupted run's losses and weights); ``output_dir``."""
    from deepspec_train.jobs.run import run_training
    from deepspec_train.kinds.recipe_validation import load_recipe

    overrides = recipe_overrides(world, output_dir, **extra)
    run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    return output_dir


def free_port() -> int:
    """A master port for a test's ranks (``common.local_ports``: below the ephemeral range, so no connection of the
    other test worker can take it before the master binds it)."""
    return unused_local_port()


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled", PYTHONPATH=str(REPO),
    )
    return env


def start_ranks(argv: list[str], world_size: int, log_dir: Path) -> list[subprocess.Popen]:
    """Start ``python *argv`` once per rank; rank r writes ``log_dir/rank{r}.log``."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world_size):
        # The child keeps its own copy of the descriptor, so the parent's can be closed right away.
        with open(log_dir / f"rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, *argv], cwd=REPO, env=rank_env(rank, world_size, port),
                stdout=log, stderr=subprocess.STDOUT,
            ))
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def fail_one_rank_mid_run(
    args: list[str], world_size: int, victim: int, out: Path, timeout_s: float, how: signal.Signals = signal.SIGKILL
):
    """Start ``train.py *args`` as ``world_size`` ranks writing to ``out``, send rank ``victim`` the signal ``how``
    (kill, or stop) once two steps are logged and wait for the others; returns (their exit codes, seconds from the
    signal until the last left, every rank's log)."""
    procs = start_ranks(["train.py", *args], world_size, out / "logs")
    survivors = [p for r, p in enumerate(procs) if r != victim]
    try:
        deadline = time.monotonic() + 240
        while len(step_losses(out)) < 2:
            assert time.monotonic() < deadline, read_logs(out / "logs", world_size)
            assert all(p.poll() is None for p in procs), read_logs(out / "logs", world_size)
            time.sleep(0.2)
        procs[victim].send_signal(how)
        failed_at = time.monotonic()
        codes = wait_all(survivors, timeout=timeout_s + 15)
        elapsed = time.monotonic() - failed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return codes, elapsed, read_logs(out / "logs", world_size)


def read_logs(log_dir: Path, world_size: int) -> str:
    return "\n".join(f"--- rank {r} ---\n{(log_dir / f'rank{r}.log').read_text()}" for r in range(world_size))


def run_ranks(args: list[str], world_size: int, log_dir: Path, timeout: float = 120) -> None:
    """Run a whole world to completion; fails the test with every rank's log if any rank fails."""
    codes = wait_all(start_ranks(["train.py", *args], world_size, log_dir), timeout)
    assert codes == [0] * world_size, f"exit codes {codes}\n{read_logs(log_dir, world_size)}"


def step_losses(output_dir: Path) -> dict[int, float]:
    """Per-step training loss from the run's metrics JSONL."""
    losses = {}
    for path in Path(output_dir).rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "train/loss" in record:
                losses[int(record["step"])] = float(record["train/loss"])
    return losses
