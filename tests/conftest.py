"""Shared fixtures: the session's tiny world (built once with the `test` preset) and the `gpu` skip rule.

Set DEEPSPEC_TINYWORLD_DIR to a tiny world built earlier (`deepspec tinyworld build --preset test --out DIR`)
to skip the build while iterating locally; CI always builds a fresh one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu tier); this machine has no GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a `test`-preset tiny world: target/, conversations/{train,validation}.jsonl, suites/."""
    prebuilt = os.environ.get("DEEPSPEC_TINYWORLD_DIR")
    if prebuilt:
        return Path(prebuilt)
    from deepspec_train.tinyworld.build import build_tiny_world
    from deepspec_train.tinyworld.presets import get_preset

    out = tmp_path_factory.mktemp("tinyworld")
    build_tiny_world(out, get_preset("test"), seed=0, progress=False)
    return out
