"""Whether a failed peer's process is gone, stopped or still running, when it runs on this machine.

A collective that fails (a gradient all-reduce over the drafter ranks) says only "Connection reset by peer"
with an address, and a silent heartbeat cannot tell a stopped process from a dead one. Each rank therefore
publishes ``hostname pid`` in the rendezvous store when its ``PeerMonitor`` starts; the monitor copies the
peers' entries as they appear, so the answer does not need the store later (the store host may be the rank
that died). For a peer on the same host, ``/proc/<pid>/stat`` gives its state; elsewhere (another node, or a
system without ``/proc``) the state is unknown and the caller reports what the error itself says.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Literal, Optional

State = Literal["gone", "stopped", "running"]
_PROCESS_PREFIX = "deepspec/process/"
# Linux process states: Z zombie and X dead mean the process has exited (its parent has not reaped it yet);
# T and t mean stopped by a signal or a tracer.
_GONE, _STOPPED = {"Z", "X", "x"}, {"T", "t"}


def key(rank: int) -> str:
    """The store key under which ``rank`` publishes its host and pid."""
    return f"{_PROCESS_PREFIX}{rank}"


def publish(store, rank: int) -> None:
    store.set(key(rank), f"{socket.gethostname()} {os.getpid()}")


def lookup(store, rank: int) -> Optional[tuple[str, int]]:
    """``(hostname, pid)`` of ``rank`` once it has published them, else None."""
    if not store.check([key(rank)]):
        return None
    host, pid = store.get(key(rank)).decode().rsplit(" ", 1)
    return host, int(pid)


def process_state(identity: Optional[tuple[str, int]]) -> Optional[State]:
    """The state of the process ``(hostname, pid)``; None when it runs on another host or cannot be read."""
    if identity is None or identity[0] != socket.gethostname():
        return None
    try:
        stat = Path(f"/proc/{identity[1]}/stat").read_text()
    except FileNotFoundError:
        return "gone" if Path("/proc/self/stat").exists() else None
    except OSError:
        return None
    # The command name in parentheses may itself hold spaces: the state is the first field after it.
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in _GONE:
        return "gone"
    return "stopped" if state in _STOPPED else "running"


def find_gone(identities: dict[int, tuple[str, int]], wait_s: float = 2.0, settle_s: float = 0.5) -> list[int]:
    """Ranks whose process is gone, polled for up to ``wait_s``: a killed process closes its sockets while it
    exits, a moment before the kernel marks it exited, so the first look can come too early. Once one is gone,
    ``settle_s`` more lets a peer that failed at the same time (or exited because of it) show up as well."""
    deadline = time.monotonic() + wait_s
    settled: float | None = None
    while True:
        gone = [rank for rank, identity in sorted(identities.items()) if process_state(identity) == "gone"]
        now = time.monotonic()
        if gone and settled is None:
            settled = now + settle_s
        if (settled is not None and now >= settled) or now >= deadline:
            return gone
        time.sleep(0.05)
