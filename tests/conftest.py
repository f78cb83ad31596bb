"""Shared fixtures: the session's tiny world (built once with the `test` preset), the random-weight worlds of the
multi-process streaming tests and of the mixture-of-experts tests, one torch thread for the modules that decode
with tiny models, the scripted HTTP servers of the regeneration tests, and the skip rules of the `gpu` tier
(without CUDA), the `slurm` tier (unless ``-m slurm``) and the `full` tier (unless ``-m full``).

Set DEEPSPEC_TINYWORLD_DIR to a tiny world built earlier (`deepspec tinyworld build --preset test --out DIR`)
to skip the build while iterating locally; CI always builds a fresh one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.opt_in_markers import full_tier_selected, names_marker

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the `gpu` tier without CUDA, the `slurm` tier unless ``-m`` names it (it installs and starts Slurm), and
    the `full` tier unless ``-m`` names it (the cross product behind the default run's checks)."""
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs CUDA (gpu tier); this machine has no GPU")
    if not names_marker(config.getoption("markexpr"), "slurm"):
        skips["slurm"] = pytest.mark.skip(reason="Slurm tier (installs and starts Slurm): opt in with -m slurm")
    if not full_tier_selected(config):
        skips["full"] = pytest.mark.skip(reason="full tier (the cross product of production dimensions): opt in "
                                                "with -m full or test.sh --full")
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests: tiny models decode in thousands of small ops, where a second
    thread only adds hand-offs, and on a busy 2-core CI machine it makes generation an order of magnitude slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a `test`-preset tiny world: target/, conversations/{train,validation}.jsonl, suites/.

    Built once per session through the command line, as a user builds it (one thread: the tiny model gains
    nothing from more, and spinning threads are slow on a shared CI machine). The command's wall time is left
    in ``command_seconds.txt`` beside the build report.
    """
    prebuilt = os.environ.get("DEEPSPEC_TINYWORLD_DIR")
    if prebuilt:
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("tinyworld")
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "deepspec_train.tinyworld.cli", "build", "--out", str(out), "--preset", "test",
         "--threads", "1", "--no-progress"],
        cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    (out / "command_seconds.txt").write_text(f"{time.perf_counter() - start:.1f}")
    return out


@pytest.fixture(scope="session")
def streaming_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Target, train / validation JSONL and shard cache of the streaming, resume and failure tests (see
    ``tests/helpers/streaming_world.py``)."""
    from tests.helpers.streaming_world import build_world

    return build_world(tmp_path_factory.mktemp("streaming_world"))


@pytest.fixture(scope="session")
def moe_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The Qwen3-30B-A3B scale target, train / validation JSONL and shard cache of the mixture-of-experts tests
    (see ``tests/helpers/moe_world.py``)."""
    from tests.helpers.moe_world import build_moe_world

    return build_moe_world(tmp_path_factory.mktemp("moe_world"))


@pytest.fixture(scope="session")
def shallow_moe_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``moe_world`` with a 4-layer target: the multi-process tests load it once per rank."""
    from tests.helpers.moe_world import build_moe_world

    return build_moe_world(tmp_path_factory.mktemp("shallow_moe_world"), num_hidden_layers=4)


@pytest.fixture
def scripted():
    """Starts scripted HTTP servers (``scripted(script, answer)``, see ``tests/helpers/regeneration.py``) and
    stops them after the test."""
    from tests.helpers.regeneration import ScriptedServer

    started: list[ScriptedServer] = []

    def start(script: list[int | bytes], answer: str = "fine") -> ScriptedServer:
        started.append(ScriptedServer(script, answer))
        return started[-1]

    yield start
    for s in started:
        s.stop()
