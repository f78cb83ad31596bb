"""On a real single-node Slurm: ``launch/slurm/train.sbatch`` trains a tiny drafter with 2 processes on CPU.

The test installs Debian's ``slurm-wlm`` and ``munge`` when missing (root and apt-get needed; about a minute),
starts a private cluster with ``launch/slurm/local_cluster.sh`` (all state under a temp dir), submits the job
script exactly as a user would (``sbatch launch/slurm/train.sbatch recipe=... overrides...``), waits for the
job, and checks its exit code and the run's ``metrics.jsonl``. The daemons are stopped however the test ends.
Runs only with ``-m slurm`` (``tests/conftest.py`` skips it otherwise); ``launch/quickstart/test.sh`` passes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepspec_train.common.local_ports import unused_local_port
from tests.helpers.tiny_chat_model import save_tiny_chat_model

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "launch" / "slurm" / "local_cluster.sh"
TRAIN_SCRIPT = REPO / "launch" / "slurm" / "train.sbatch"
JOB_TIMEOUT_S = 240
MAX_STEPS = 3


def _install_or_skip() -> None:
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0:
        pytest.skip("Slurm is not installed and installing slurm-wlm + munge needs root")
    if shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    subprocess.run([str(CLUSTER_SCRIPT), "install"], check=True, timeout=600)


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory):
    """Environment (``SLURM_CONF`` set) of a running single-node cluster; stopped at the end of the module."""
    if os.geteuid() != 0:
        pytest.skip("the local test cluster runs slurmctld / slurmd / munged as root")
    _install_or_skip()
    state = tmp_path_factory.mktemp("slurm")
    # slurmctld and slurmd listen on the port and the next one.
    env = dict(os.environ, LOCAL_SLURM_CPUS="2", LOCAL_SLURM_PORT=str(unused_local_port(span=2)))
    try:
        subprocess.run([str(CLUSTER_SCRIPT), "start", str(state)], check=True, env=env, timeout=120)
        env["SLURM_CONF"] = str(state / "slurm.conf")
        yield env
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "stop", str(state)], env=env, timeout=60)


def _write_conversations(path: Path, count: int) -> None:
    words = ["alpha", "beta", "gamma", "delta", "quick", "brown", "fox", "number", "answer", "python"]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            question = f"What comes after {words[i % len(words)]} number {i}?"
            answer = " ".join(words[(i + j) % len(words)] for j in range(12 + i % 7))
            row = {"id": f"c{i}", "messages": [{"role": "user", "content": question},
                                               {"role": "assistant", "content": answer}]}
            handle.write(json.dumps(row) + "\n")


def _job_fields(job_id: str, env: dict) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S+)", shown.stdout))


def _wait_for_job(job_id: str, env: dict, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fields = _job_fields(job_id, env)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return fields
        time.sleep(2)
    subprocess.run(["scancel", job_id], env=env, timeout=30)
    raise AssertionError(f"job {job_id} did not finish within {timeout_s:.0f} s: {_job_fields(job_id, env)}")


def test_train_sbatch_runs_two_cpu_processes(slurm_env: dict, tmp_path: Path) -> None:
    target = save_tiny_chat_model(tmp_path / "target")
    data = tmp_path / "train.jsonl"
    _write_conversations(data, 24)
    out_dir = tmp_path / "run"
    log = tmp_path / "job.out"
    overrides = [
        "recipe=tiny-dspark",
        f"run.output_dir={out_dir}",
        "run.name=slurm-test",
        f"target.path={target}",
        "target.layer_ids=[0]",
        f"data.train=[{data}]",
        "data.validation=[]",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.max_length=128",
        "drafter.num_layers=1",
        "drafter.markov_rank=8",
        "anchors.num_per_sequence=4",
        "anchors.token_budget=1024",
        f"train.max_steps={MAX_STEPS}",
        "train.global_batch_sequences=4",
        "train.micro_batch_sequences=2",
        "train.checkpoint_every=1000",
        "train.eval_every=1000",
        "logging.wandb=false",
        "logging.progress=false",
        "logging.log_every=1",
    ]
    env = dict(slurm_env, NPROC_PER_NODE="2", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", str(TRAIN_SCRIPT), *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    fields = _wait_for_job(job_id, env, JOB_TIMEOUT_S)
    output = log.read_text() if log.exists() else "(no job output)"
    print(output[-4000:])
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", f"{fields}\n{output[-4000:]}"
    assert "2 process(es)" in output

    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in records if "step" in r]
    assert steps and max(steps) == MAX_STEPS, records[-3:]
    assert (out_dir / "drafter" / "drafter.safetensors").is_file()


PREEMPT_STEPS = 40
# Three launches of two processes each, one of them requeued by Slurm.
PREEMPT_TIMEOUT_S = 600


def _preemption_overrides(out_dir: Path, target: str, data: Path, cache: Path) -> list[str]:
    return [
        "recipe=tiny-dspark", f"run.output_dir={out_dir}", f"target.path={target}", "target.layer_ids=[0]",
        f"data.train=[{data}]", "data.validation=[]", f"data.cache_dir={cache}", "data.max_length=128",
        "drafter.num_layers=1", "drafter.markov_rank=8", "anchors.num_per_sequence=4", "anchors.token_budget=1024",
        f"train.max_steps={PREEMPT_STEPS}", "train.global_batch_sequences=4", "train.micro_batch_sequences=2",
        "train.checkpoint_every=1000", "train.eval_every=1000", "logging.wandb=false", "logging.progress=false",
        "logging.log_every=1",
    ]


def test_usr1_checkpoints_requeues_and_resumes_exactly(slurm_env: dict, tmp_path: Path) -> None:
    """``scancel --signal=USR1`` (what ``--signal=USR1@120`` sends before the time limit): the job checkpoints,
    requeues itself and continues with ``train.resume=auto``; its per-step losses and final weights equal an
    uninterrupted run's (two plain processes, no Slurm) bit for bit."""
    from safetensors.torch import load_file

    from tests.helpers.streaming_world import run_ranks, step_losses

    target = save_tiny_chat_model(tmp_path / "target")
    data = tmp_path / "train.jsonl"
    _write_conversations(data, 24)
    full, out_dir, log = tmp_path / "full", tmp_path / "run", tmp_path / "job.out"
    run_ranks(_preemption_overrides(full, target, data, tmp_path / "cache"), 2, full / "logs", timeout=PREEMPT_TIMEOUT_S)

    env = dict(slurm_env, NPROC_PER_NODE="2", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", str(TRAIN_SCRIPT),
         *_preemption_overrides(out_dir, target, data, tmp_path / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + PREEMPT_TIMEOUT_S
    while len(step_losses(out_dir)) < 3:
        assert time.monotonic() < deadline, _job_fields(job_id, env)
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job_id], env=env, check=True, timeout=30)

    fields = _wait_for_job(job_id, env, PREEMPT_TIMEOUT_S)
    output = log.read_text() if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED" and fields.get("Restarts") == "1", f"{fields}\n{output[-4000:]}"
    assert "requeueing job" in output and "continuing with train.resume=auto" in output, output[-4000:]
    assert "preempted by SIGUSR1" in output, output[-4000:]
    expected, got = step_losses(full), step_losses(out_dir)
    assert sorted(got) == list(range(1, PREEMPT_STEPS + 1)) and got == expected, (expected, got)
    a = load_file(str(full / "drafter" / "drafter.safetensors"))
    b = load_file(str(out_dir / "drafter" / "drafter.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
