"""Two nodes on one machine: two ``torchrun --nnodes 2`` agents rendezvous over 127.0.0.1 and run a streamed job,
the target worker on node 0 and the drafter worker on node 1.

The per-step losses and final weights equal the single-node run's (two plain processes), and losing node 1
(its agent and its worker killed at once, as when a machine goes down) ends node 0 within ``stream.timeout_s`` +
10 s with a line naming the lost node. Only loopback addresses are used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.streaming_world import REPO, free_port, rank_env, recipe_overrides, run_ranks, step_losses

pytestmark = pytest.mark.slow

TIMEOUT_S = 10


def start_node(node: int, port: int, args: list[str], log: Path) -> subprocess.Popen:
    env = rank_env(0, 1, 0)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key)
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "train.py", *args],
            cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
        )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its workers), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (not gone, not a zombie its parent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_streamed_job_on_two_nodes_matches_one_node(streaming_world, tmp_path) -> None:
    common = {"topology.target_workers": 1, "train.max_steps": 6, "stream.timeout_s": TIMEOUT_S}
    single, double = tmp_path / "single", tmp_path / "double"
    run_ranks(recipe_overrides(streaming_world, single, **common), 2, single / "logs", timeout=600)
    port = free_port()
    nodes = [start_node(n, port, recipe_overrides(streaming_world, double, **common), tmp_path / f"node{n}.log")
             for n in (0, 1)]
    codes = [node.wait(timeout=300) for node in nodes]
    logs = "\n".join((tmp_path / f"node{n}.log").read_text() for n in (0, 1))
    assert codes == [0, 0], logs
    assert "target worker 0 (rank 0, node 0) feeds drafters [0]" in (tmp_path / "node0.log").read_text(), logs
    expected, got = step_losses(single), step_losses(double)
    assert sorted(got) == list(range(1, 7)) and got == expected, (expected, got)
    a = load_file(str(single / "drafter" / "drafter.safetensors"))
    b = load_file(str(double / "drafter" / "drafter.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_losing_node_1_ends_node_0_naming_it(streaming_world, tmp_path) -> None:
    out = tmp_path / "run"
    args = recipe_overrides(streaming_world, out, **{"topology.target_workers": 1, "train.max_steps": 400,
                                                    "train.eval_every": 1000, "stream.timeout_s": TIMEOUT_S})
    port = free_port()
    nodes = [start_node(n, port, args, tmp_path / f"node{n}.log") for n in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while len(step_losses(out)) < 2:
            alive = all(n.poll() is None for n in nodes)
            assert time.monotonic() < deadline and alive, (tmp_path / "node0.log").read_text()
            time.sleep(0.05)
        node0_workers = descendants(nodes[0].pid)
        for pid in [nodes[1].pid, *descendants(nodes[1].pid)]:
            os.kill(pid, signal.SIGKILL)
        lost = time.monotonic()
        while any(running(pid) for pid in node0_workers) and time.monotonic() - lost < TIMEOUT_S + 30:
            time.sleep(0.05)
        ended = not any(running(pid) for pid in node0_workers)
        # The agent itself then takes torchrun's own shutdown time (about 20 s here) to report the failure.
        nodes[0].wait(timeout=120)
    finally:
        for node in nodes:
            if node.poll() is None:
                for pid in [node.pid, *descendants(node.pid)]:
                    os.kill(pid, signal.SIGKILL)
                node.wait()
    log = (tmp_path / "node0.log").read_text()
    # Node 0's workers ended on the loss (the wait above allows stream.timeout_s + 30 s), naming node 1's rank.
    assert node0_workers and ended and nodes[0].returncode != 0, log
    assert "exitcode  : 3" in log, log
    named = [line for line in log.splitlines() if line.startswith("error:")]
    assert named and "drafter worker 0 (rank 1, node 1)" in named[0], log
