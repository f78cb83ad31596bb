"""The rank hosting the rendezvous store signs off last: a drafter still writing its final files after the target
worker finished keeps its store, so its peer monitor does not abort.

Regression found by the scale-model tier: at production shapes a drafter's final checkpoint takes seconds to
write, the target worker (rank 0, the store's host) had already left, and the drafter's monitor aborted with
"lost the rendezvous store" before ``drafter/`` existed. The test runs this module as a 2-rank gloo world
(``python -m tests.test_watchdog_sign_off``): rank 0 signs off at once, rank 1 works for several heartbeat
intervals before signing off and prints a line when it gets there. Without the wait (``finish()`` on rank 0),
rank 1 exits with code 3 and "lost the rendezvous store".
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.streaming_world import read_logs, start_ranks, wait_all

TIMEOUT_S = 1.0  # heartbeat every 0.2 s
LATE_WORK_S = 2.0
DONE_LINE = "rank 1 wrote its final files"


# Two processes: a few seconds.
pytestmark = pytest.mark.slow


def _rank() -> None:
    from deepspec_train.streaming.watchdog import PeerMonitor
    from deepspec_train.training.distributed import init_distributed, shutdown

    ctx = init_distributed(30.0)
    monitor = PeerMonitor(ctx.rank, ctx.world_size, TIMEOUT_S, lambda r: f"rank {r}").start()
    if ctx.rank == 1:
        time.sleep(LATE_WORK_S)  # the final checkpoint and drafter files
        print(DONE_LINE, flush=True)
    monitor.finish(wait_for_peers=ctx.rank == 0)
    shutdown(ctx)


def test_store_host_waits_for_late_peers(tmp_path) -> None:
    codes = wait_all(start_ranks(["-m", "tests.test_watchdog_sign_off"], 2, tmp_path), 60)
    logs = read_logs(tmp_path, 2)
    assert codes == [0, 0] and DONE_LINE in logs, logs


if __name__ == "__main__":
    _rank()
