"""Kill-and-resume soak: a streamed run (2 target + 2 drafter processes) killed N times and resumed each time
must end exactly where an uninterrupted run ends.

    PYTHONPATH=. python bench/kill_resume_soak.py --faults 20 --out /tmp/soak -- recipe=tiny-dspark [key=value ...]

The arguments after ``--`` are ``train.py``'s (the run's output directory is set by the script). Each rank is a
plain process with ``RANK`` / ``WORLD_SIZE`` set, as ``srun`` starts them, so any one can be killed. The script
first trains without faults, then trains again and, N times, waits for a random step past the newest checkpoint,
sends SIGKILL or SIGTERM (chosen at random) to a random rank, waits for the run to end, checks how each rank
ended (SIGTERM: all exit 4 after one checkpoint; SIGKILL: the others exit 3, naming the lost peer) and resumes
with ``train.resume=auto``. At the end the per-step losses and the final drafter weights are compared with the
uninterrupted run's: every step's loss and every byte of the weights must be equal. It prints one row per fault
(rank, signal, step reached, checkpoint resumed from, steps redone) and the totals, and writes them as JSON
(``--out/soak.json``); exit status 0 only when everything matched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from deepspec_train.common.local_ports import unused_local_port
from deepspec_train.training.checkpoint import checkpoint_step, list_checkpoints
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE
from deepspec_train.streaming.watchdog import FAILURE_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 4
TARGET_WORKERS = 2
# Faults land at least this many steps before the end: a SIGTERM takes a few steps to reach every rank (the store
# is polled every 0.2 s), and one that lands after the last step lets the run finish instead.
END_MARGIN = 8


def start_world(train_args: list[str], logs: Path) -> list[subprocess.Popen]:
    """One ``train.py`` process per rank on 127.0.0.1, each logging to ``logs/rank{r}.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    port = unused_local_port()
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        with open(logs / f"rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, "train.py", *train_args], cwd=REPO, env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait_world(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


def logged_losses(out: Path) -> dict[int, float]:
    """Step -> training loss from the run's ``metrics.jsonl`` (superseded records excluded)."""
    path = out / "metrics.jsonl"
    losses = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if "train/loss" in record:
                losses[int(record["step"])] = float(record["train/loss"])
    return losses


def newest_checkpoint_step(out: Path) -> int:
    kept = list_checkpoints(out)
    return checkpoint_step(kept[-1]) if kept else 0


def expected_codes(victim: int, how: signal.Signals) -> list[int]:
    if how == signal.SIGTERM:
        return [PREEMPTED_EXIT_CODE] * WORLD_SIZE
    return [-signal.SIGKILL if rank == victim else FAILURE_EXIT_CODE for rank in range(WORLD_SIZE)]


def differing_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    """Bytes that differ between two sets of named tensors (a tensor only one side has, or of another shape or
    dtype, counts whole)."""
    total = 0
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            total += max(t.numel() * t.element_size() for t in (x, y) if t is not None)
            continue
        total += int((x.contiguous().view(-1).view(torch.uint8) != y.contiguous().view(-1).view(torch.uint8)).sum())
    return total


def soak(train_args: list[str], out: Path, faults: int, seed: int, steps: int, checkpoint_every: int,
         timeout_s: float) -> dict:
    rng = random.Random(seed)
    common = [*train_args, f"topology.target_workers={TARGET_WORKERS}", f"train.max_steps={steps}",
              f"train.checkpoint_every={checkpoint_every}", "train.keep_last=2"]
    reference, run = out / "uninterrupted", out / "soaked"
    started = time.monotonic()
    codes = wait_world(start_world([*common, f"run.output_dir={reference}"], reference / "logs"), timeout_s)
    if codes != [0] * WORLD_SIZE:
        raise SystemExit(f"the uninterrupted run failed: exit codes {codes} (logs in {reference / 'logs'})")
    reference_s = time.monotonic() - started

    rows: list[dict] = []
    attempt = 0
    while True:
        resume = ["train.resume=auto"] if attempt else []
        procs = start_world([*common, f"run.output_dir={run}", *resume], run / "logs" / f"attempt{attempt}")
        attempt += 1
        # A step past everything logged so far (records after the checkpoint are set aside only once the resumed
        # run starts) and past the first checkpoint, so that there is something to resume from.
        floor = max(max(logged_losses(run), default=0), newest_checkpoint_step(run), checkpoint_every) + 1
        if len(rows) == faults or floor > steps - END_MARGIN:
            codes = wait_world(procs, timeout_s)
            if codes != [0] * WORLD_SIZE:
                raise SystemExit(f"the last resume failed: exit codes {codes} (logs in {run / 'logs'})")
            break
        kill_at = rng.randint(floor, min(steps - END_MARGIN, floor + 2 * checkpoint_every))
        victim, how = rng.randrange(WORLD_SIZE), rng.choice([signal.SIGKILL, signal.SIGTERM])
        deadline = time.monotonic() + timeout_s
        while max(logged_losses(run), default=0) < kill_at:
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
                wait_world(procs, 1)
                raise SystemExit(f"attempt {attempt} ended before step {kill_at} (logs in {run / 'logs'})")
            time.sleep(0.02)
        reached = max(logged_losses(run))
        procs[victim].send_signal(how)
        signalled = time.monotonic()
        codes = wait_world(procs, timeout_s)
        resumed_from = newest_checkpoint_step(run)
        # A target worker may already have sent its last step (small messages sit in socket buffers, so it can
        # run far ahead) and wait in the end-of-run sign-off, where a signal handler runs only once the drafters
        # are done: the run then completes, which is what a requeueing scheduler needs too.
        completed = how == signal.SIGTERM and codes == [0] * WORLD_SIZE and max(logged_losses(run)) == steps
        row = {
            "fault": len(rows) + 1, "rank": victim, "signal": how.name, "step_reached": reached,
            "checkpoint": resumed_from, "steps_redone": max(0, max(logged_losses(run)) - resumed_from),
            "exit_codes": codes, "expected_codes": [0] * WORLD_SIZE if completed else expected_codes(victim, how),
            "seconds_to_end": round(time.monotonic() - signalled, 1),
        }
        rows.append(row)
        print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
        if codes != row["expected_codes"]:
            raise SystemExit(f"fault {row['fault']}: exit codes {codes}, expected {row['expected_codes']}")
        if completed:
            print(f"fault {row['fault']}: the run completed before the signal reached every rank", flush=True)
            break

    expected, got = logged_losses(reference), logged_losses(run)
    losses_equal = sorted(got) == sorted(expected) == list(range(1, steps + 1)) and got == expected
    differing = differing_bytes(load_file(str(reference / "drafter" / "drafter.safetensors")),
                                load_file(str(run / "drafter" / "drafter.safetensors")))
    return {
        "faults": len(rows), "steps": steps, "checkpoint_every": checkpoint_every, "seed": seed,
        "steps_redone": sum(row["steps_redone"] for row in rows),
        "sigkill": sum(row["signal"] == "SIGKILL" for row in rows),
        "sigterm": sum(row["signal"] == "SIGTERM" for row in rows),
        "losses_equal": losses_equal, "weight_bytes_differing": differing,
        "uninterrupted_seconds": round(reference_s, 1),
        "soak_seconds": round(time.monotonic() - started - reference_s, 1),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=3, help="how many kills (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill schedule")
    parser.add_argument("--steps", type=int, default=30,
                        help="optimizer steps of the run (faults stop 8 steps before the end; N = 20 needs about 120)")
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds one launch may take")
    parser.add_argument("--out", required=True, help="folder for both runs and soak.json")
    args = parser.parse_args(argv[:split])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = soak(argv[split + 1:], out, args.faults, args.seed, args.steps, args.checkpoint_every, args.timeout)
    (out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['faults']} faults survived ({report['sigkill']} SIGKILL, {report['sigterm']} SIGTERM); "
          f"{report['steps_redone']} steps redone; per-step losses equal: {report['losses_equal']}; weight bytes "
          f"differing: {report['weight_bytes_differing']}; {report['soak_seconds']} s soaked "
          f"({report['uninterrupted_seconds']} s uninterrupted)")
    return 0 if report["losses_equal"] and report["weight_bytes_differing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
