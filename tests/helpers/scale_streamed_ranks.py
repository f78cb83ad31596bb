"""Test helper: one rank of the scale-model tier's streamed runs, several recipes in one process.

    python -m tests.helpers.scale_streamed_ranks RUNS.json    # RANK / WORLD_SIZE / MASTER_ADDR set, as srun would

``RUNS.json`` is a list of ``{"port": P, "argv": [...]}``; for each entry in turn the rank calls the real training
entry (``jobs.entry.main``, what ``train.py`` runs) with ``argv`` and ``MASTER_PORT=P``, so every recipe is a
full streamed launch (its own gloo process group, target worker and drafter worker) and only the interpreter's
start-up (imports of torch, transformers and the package) is shared between recipes. Stops at the first run
that fails, with its exit code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from deepspec_train.jobs.entry import main as train_main


def run_all(runs_file: str) -> int:
    for run in json.loads(Path(runs_file).read_text()):
        os.environ["MASTER_PORT"] = str(run["port"])
        print(f"=== {' '.join(run['argv'][:1])}", flush=True)
        code = train_main(run["argv"])
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run_all(sys.argv[1]))
