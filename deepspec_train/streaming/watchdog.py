"""Failure detection for streamed training: no rank hangs when a peer dies or stops sending.

Two mechanisms, both bounded by ``stream.timeout_s``:

- Every point-to-point transfer waits with a deadline (``wait_for``); a closed connection or a missed deadline
  becomes a ``PeerFailure`` that names the peer's role and rank.
- A ``PeerMonitor`` thread beats a per-rank counter in the rendezvous store and watches everybody else's. A rank
  whose counter stops moving for ``timeout_s`` without having signed off as finished is reported dead. This
  catches the failures point-to-point deadlines cannot name, e.g. a drafter dying while the other drafters sit
  in a gradient all-reduce, or one rank of a tensor-parallel target group dying in the middle of a forward
  (the survivors' collective fails without saying which peer left; ``name_the_dead_peer`` waits for the
  heartbeats to say it).

On failure the process prints one line naming the dead peer and leaves with ``os._exit``: tearing down process
groups that still hold a connection to a dead peer can itself block, and a hung survivor is the one outcome
that must never happen. Two rules make every survivor name the peer that actually died rather than a survivor
that left before it: a failed transfer or collective gives the heartbeats a moment to name a dead peer before
reporting the peer it waited for (``name_the_dead_peer``), and a rank that names a dead peer lingers two beats
before leaving, so that the rendezvous store it may host stays up while the others reach the same verdict.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Callable, Optional

import torch.distributed as dist

FAILURE_EXIT_CODE = 3
_HEARTBEAT_PREFIX = "deepspec/heartbeat/"
_DONE_PREFIX = "deepspec/finished/"


class PeerFailure(RuntimeError):
    """A peer died, closed its connection or stopped sending."""


def abort(message: str, linger_s: float = 0.0) -> None:
    """Print ``message`` on stderr and end the process with a non-zero status (after ``linger_s`` seconds)."""
    sys.stderr.write(f"error: [rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(linger_s)
    os._exit(FAILURE_EXIT_CODE)


def wait_for(work: dist.Work, timeout_s: float, peer: str, action: str) -> None:
    """Wait for a point-to-point ``work`` for at most ``timeout_s``; a failure names ``peer`` (e.g. its role)."""
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        text = str(exc)
        if "imeout" in text or "timed out" in text:
            raise PeerFailure(f"{peer} did not {action} within stream.timeout_s={timeout_s:g} s (stopped or hung)") from exc
        raise PeerFailure(f"{peer} died or closed its connection while this rank waited for it to {action}: {text.splitlines()[0]}") from exc


class PeerMonitor:
    """Heartbeats through the rendezvous store; aborts when a peer that has not finished goes silent."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, describe: Callable[[int], str]):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.describe = describe
        self.interval_s = max(0.05, min(timeout_s / 5.0, 5.0))
        self._store = dist.distributed_c10d._get_default_store()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "PeerMonitor":
        # The first beat before anything else: a peer that dies early is watched, not taken as not started yet.
        self._store.set(f"{_HEARTBEAT_PREFIX}{self.rank}", "0")
        self._thread = threading.Thread(target=self._run, name="deepspec-peer-monitor", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """Sign off: from now on peers do not report this rank's silence as a failure.

        Rank 0 hosts the rendezvous store (unless the launcher does): it waits until every peer has signed off,
        still watching them, so that no rank loses the store while it writes its last files."""
        try:
            self._store.set(f"{_DONE_PREFIX}{self.rank}", "1")
            if self.rank == 0:
                keys = [f"{_DONE_PREFIX}{peer}" for peer in range(1, self.world_size)]
                while not self._store.check(keys):
                    time.sleep(self.interval_s / 5)
        except RuntimeError:
            pass  # the store host already left after finishing; there is nobody left to tell
        self._stop.set()

    def name_the_dead_peer(self, fallback: str, wait_s: Optional[float] = None) -> None:
        """After a transfer or a collective failed, let the heartbeats tell whether a peer died: the watching
        thread ends the process naming it; ``fallback`` is printed if it has not after ``wait_s`` (default: long
        enough to notice a peer that just died, ``timeout_s`` plus three beats). Never returns."""
        time.sleep(self.timeout_s + 3 * self.interval_s if wait_s is None else wait_s)
        abort(fallback)

    def _run(self) -> None:
        beats = 0
        last_value: dict[int, bytes] = {}
        last_change: dict[int, float] = {}
        peers = [r for r in range(self.world_size) if r != self.rank]
        while not self._stop.wait(self.interval_s):
            beats += 1
            try:
                self._store.set(f"{_HEARTBEAT_PREFIX}{self.rank}", str(beats))
                now = time.monotonic()
                for peer in peers:
                    if self._store.check([f"{_DONE_PREFIX}{peer}"]):
                        continue
                    if not self._store.check([f"{_HEARTBEAT_PREFIX}{peer}"]):
                        continue  # not started yet: deadlines of the first transfers cover a peer that never comes up
                    value = self._store.get(f"{_HEARTBEAT_PREFIX}{peer}")
                    if value != last_value.get(peer):
                        last_value[peer], last_change[peer] = value, now
                    elif now - last_change[peer] > self.timeout_s:
                        abort(f"{self.describe(peer)} stopped responding for {self.timeout_s:g} s (dead or hung); exiting",
                              linger_s=2 * self.interval_s)
            except RuntimeError as exc:
                if self._stop.is_set():
                    return
                abort(
                    f"lost the rendezvous store (hosted by {self.describe(0)} unless the launcher hosts it): "
                    f"{str(exc).splitlines()[0]}; exiting"
                )
