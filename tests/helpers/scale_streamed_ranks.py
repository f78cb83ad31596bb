"""Test helper: one rank of the scale-model tier's streamed runs, several recipes in one process.

    python -m tests.helpers.scale_streamed_ranks RUNS.json    # RANK / WORLD_SIZE / MASTER_ADDR set, as srun would

``RUNS.json`` is a list of ``{"port": P, "argv": [...]}``; for each entry in turn the rank calls the real training
entry (``commands.train_entry.main``, what ``train.py`` runs) with ``argv`` and ``MASTER_PORT=P``, so every recipe is a
full streamed launch (its own gloo process group, target worker and drafter worker) and only the interpreter's
start-up (imports of torch, transformers and the package) is shared between recipes. Stops at the first run
that fails, with its exit code.

``launch_streamed(runs, root)`` starts the two ranks of such a launch from a test (``StreamedLaunch``): the scale
tier and the long-context tier run their streamed runs this way, while their colocated runs train in the test's
own process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from deepspec_train.commands.train_entry import main as train_main
from tests.helpers.streaming_world import read_logs, start_ranks, wait_all

STREAMED_TIMEOUT_S = 900


class StreamedLaunch:
    """The one 2-process launch that runs every listed recipe streamed; ``output_dir`` waits for it to finish."""

    def __init__(self, procs, outputs: dict[str, Path], log_dir: Path, timeout_s: float) -> None:
        self.procs, self.outputs, self.log_dir, self.timeout_s = procs, outputs, log_dir, timeout_s
        self.codes: list[int] | None = None

    def output_dir(self, name: str) -> Path:
        if self.codes is None:
            self.codes = wait_all(self.procs, self.timeout_s)
        assert self.codes == [0, 0], f"exit codes {self.codes}\n{read_logs(self.log_dir, 2)[-6000:]}"
        return self.outputs[name]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def launch_streamed(runs: dict[str, dict], root: Path, timeout_s: float = STREAMED_TIMEOUT_S) -> StreamedLaunch:
    """Start the ranks of one launch of ``runs`` (name -> ``{"port": P, "argv": [...], "output_dir": D}``, ``D``
    the run's ``run.output_dir``), with its runs file and logs under ``root``; ``timeout_s`` bounds the whole
    launch."""
    runs_file = root / "streamed_runs.json"
    runs_file.write_text(json.dumps([{"port": run["port"], "argv": run["argv"]} for run in runs.values()]))
    log_dir = root / "streamed_logs"
    procs = start_ranks(["-m", "tests.helpers.scale_streamed_ranks", str(runs_file)], 2, log_dir)
    return StreamedLaunch(procs, {name: Path(run["output_dir"]) for name, run in runs.items()}, log_dir, timeout_s)


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
