"""Failure detection for streamed training: no rank hangs when a peer dies or stops sending.

Two mechanisms, both bounded by ``stream.timeout_s``:

- Every point-to-point transfer waits with a deadline (``wait_for``); a missed deadline becomes a ``PeerFailure``
  that reports a timeout (the peer is stopped or hung), a closed connection one that reports a death, both
  naming the peer's role and rank.
- A ``PeerMonitor`` thread beats a per-rank counter in the rendezvous store and watches everybody else's. A rank
  whose counter stops moving for ``timeout_s`` without having signed off as finished is reported as timed out
  (the store cannot tell a stopped process from a dead one), or as stopped / dead when it runs on this host and
  its process state says so (``peer_processes``).
- A collective that fails because a peer went away (a drafter dying while the others sit in a gradient
  all-reduce, one rank of a tensor-parallel target group dying in the middle of a forward) names no rank;
  ``PeerMonitor.explain`` finds the peer whose process is gone on this host, and ``name_the_dead_peer`` waits
  for the heartbeats to name a peer on any host.
- The rank hosting the store signs off last (``finish(wait_for_peers=True)``), so the store outlives every
  drafter's final checkpoint and drafter files.

On failure the process prints one line naming the failed peer and leaves with ``os._exit``: tearing down process
groups that still hold a connection to a dead peer can itself block, and a hung survivor is the one outcome
that must never happen. Two rules make every survivor name the peer that actually died rather than a survivor
that left before it: a failed transfer or collective gives the heartbeats a moment to name a dead peer before
reporting the peer it waited for (``name_the_dead_peer``), and the rank hosting the rendezvous store lingers two
beats after naming a dead peer, so that the store stays up while the others reach the same verdict.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Callable, Optional

import torch.distributed as dist

from deepspec_train.streaming import peer_processes

FAILURE_EXIT_CODE = 3
_HEARTBEAT_PREFIX = "deepspec/heartbeat/"
_DONE_PREFIX = "deepspec/finished/"
_SIGN_OFF_POLL_S = 0.05


class PeerFailure(RuntimeError):
    """A peer died, closed its connection or stopped sending; ``timed_out`` when it missed a deadline (it is still
    there, stopped or hung) rather than went away."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def abort(message: str, linger_s: float = 0.0) -> None:
    """Print ``message`` on stderr and end the process with a non-zero status (after ``linger_s`` seconds)."""
    sys.stderr.write(f"error: [rank {os.environ.get('RANK', '0')}] {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(linger_s)
    os._exit(FAILURE_EXIT_CODE)


def is_timeout(error_text: str) -> bool:
    """Whether a backend error reports a missed deadline: gloo writes "Timed out waiting 20000ms for recv
    operation to complete", c10d and NCCL "timeout" / "Timeout"; a dead peer reads "Connection closed by peer"."""
    lowered = error_text.lower()
    return "timed out" in lowered or "timeout" in lowered


def is_peer_error(error_text: str) -> bool:
    """Whether a backend error comes from a peer that went away or went silent, not from this rank's own code."""
    lowered = error_text.lower()
    return is_timeout(error_text) or "by peer" in lowered or "broken pipe" in lowered


def first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


def wait_for(work: dist.Work, timeout_s: float, peer: str, action: str) -> None:
    """Wait for a point-to-point ``work`` for at most ``timeout_s``; a failure names ``peer`` (e.g. its role)."""
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        if is_timeout(str(exc)):
            raise PeerFailure(
                f"{peer} timed out: it did not {action} within stream.timeout_s={timeout_s:g} s (stopped or hung)",
                timed_out=True,
            ) from exc
        raise PeerFailure(
            f"{peer} died or closed its connection while this rank waited for it to {action}: {first_line(exc)}"
        ) from exc


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
        # Peer rank -> (hostname, pid), copied from the store as peers publish them.
        self.identities: dict[int, tuple[str, int]] = {}

    def start(self) -> "PeerMonitor":
        # The first beat before anything else: a peer that dies early is watched, not taken as not started yet.
        self._store.set(f"{_HEARTBEAT_PREFIX}{self.rank}", "0")
        peer_processes.publish(self._store, self.rank)
        # Every rank starts its monitor right after the same collective, so the peers' entries arrive together;
        # having them all before the first step means a failure in that step can already be explained.
        peers = [peer_processes.key(rank) for rank in range(self.world_size) if rank != self.rank]
        try:
            self._store.wait(peers, datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError:
            pass  # a peer that never comes up is caught by the point-to-point deadlines
        self._copy_identities()
        self._thread = threading.Thread(target=self._run, name="deepspec-peer-monitor", daemon=True)
        self._thread.start()
        return self

    def finish(self, wait_for_peers: bool = False) -> None:
        """Sign off: from now on peers do not report this rank's silence as a failure.

        ``wait_for_peers`` is for the rank that hosts the rendezvous store (rank 0, a target worker): it returns
        only once every peer has signed off, still beating and watching meanwhile (a peer that dies is reported
        as before). Leaving earlier takes the store down under drafters that are still writing their last
        checkpoint and drafter files, and their monitors then abort before those files exist.
        """
        try:
            self._store.set(f"{_DONE_PREFIX}{self.rank}", "1")
            if wait_for_peers:
                peers = [f"{_DONE_PREFIX}{r}" for r in range(self.world_size) if r != self.rank]
                while not self._store.check(peers):
                    time.sleep(_SIGN_OFF_POLL_S)
        except RuntimeError:
            pass  # the store host already left after finishing; there is nobody left to tell
        finally:
            self._stop.set()

    def explain(self, error: RuntimeError) -> str:
        """One line about a collective that failed with ``error``: the peers on this host whose process is
        stopped (the likely cause: a peer that timed out on it may have exited first) and those that are gone;
        with none, what the error says."""
        self._copy_identities()
        gone = peer_processes.find_gone(self.identities)
        stopped = [r for r, identity in sorted(self.identities.items())
                   if peer_processes.process_state(identity) == "stopped"]
        parts = []
        if stopped:
            parts.append(f"{self._names(stopped)} timed out: its process is stopped")
        if gone:
            parts.append(f"{self._names(gone)} died during a collective with this rank ({first_line(error)})")
        if parts:
            return "; ".join(parts) + "; exiting"
        kind = "timed out" if is_timeout(str(error)) else "closed its connection"
        return (
            f"a peer {kind} during a collective with this rank and none on this host is stopped or gone (it runs "
            f"on another node: the other ranks' logs name it): {first_line(error)}; exiting"
        )

    def _names(self, ranks: list[int]) -> str:
        return ", ".join(self.describe(rank) for rank in ranks)

    def _copy_identities(self) -> None:
        for peer in range(self.world_size):
            if peer != self.rank and peer not in self.identities:
                try:
                    identity = peer_processes.lookup(self._store, peer)
                except RuntimeError:
                    return  # the store host is gone: keep what was copied so far
                if identity is not None:
                    self.identities[peer] = identity

    def _silence_message(self, peer: int) -> str:
        me, silent = self.describe(self.rank), f"no heartbeat for stream.timeout_s={self.timeout_s:g} s"
        state = peer_processes.process_state(self.identities.get(peer))
        if state == "gone":
            return f"{me}: {self.describe(peer)} died: its process is gone ({silent}); exiting"
        if state == "stopped":
            return f"{me}: {self.describe(peer)} timed out: its process is stopped ({silent}); exiting"
        return f"{me}: {self.describe(peer)} timed out: {silent} (stopped, hung or dead); exiting"

    def _lost_store_message(self, error: RuntimeError) -> str:
        """The store host (rank 0) is gone from under this rank: named as dead when its process is gone here."""
        me, host = self.describe(self.rank), self.describe(0)
        if peer_processes.process_state(self.identities.get(0)) == "gone":
            return (f"{me}: {host} died: its process is gone, and with it the rendezvous store it hosted "
                    f"({first_line(error)}); exiting")
        return f"{me}: lost the rendezvous store (hosted by {host} unless the launcher hosts it): {first_line(error)}; exiting"

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
                self._copy_identities()
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
                        # The store host lingers so the others can still read the verdict's heartbeats from it.
                        abort(self._silence_message(peer), linger_s=2 * self.interval_s if self.rank == 0 else 0.0)
            except RuntimeError as exc:
                if self._stop.is_set():
                    return
                abort(self._lost_store_message(exc))
