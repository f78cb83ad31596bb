"""Free TCP ports on 127.0.0.1 for the processes of a local run (tests, the soak benchmark, the local Slurm cluster).

Asking the kernel for port 0 and handing the number on is racy: the probe closes, and until the run's master binds
the port, any outgoing connection on the machine may be given it, because port 0 draws from the same ephemeral
range the kernel uses for those (``/proc/sys/net/ipv4/ip_local_port_range``). Two test workers each starting gloo
ranks open hundreds of such connections, and a master that then fails with ``EADDRINUSE`` ends a test. So the port
is drawn at random *below* the ephemeral range, where the kernel never assigns one on its own, and checked by
binding it (with the ``span - 1`` ports after it, for a job that listens on several).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Above the well-known and registered ports that local services commonly hold.
LOWEST = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_EPHEMERAL_START = 32768
_ATTEMPTS = 200


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LINUX_EPHEMERAL_START


def unused_local_port(span: int = 1) -> int:
    """A port p such that p .. p + span - 1 are free on 127.0.0.1 now, below the ephemeral range."""
    highest = ephemeral_start() - span
    if highest <= LOWEST:
        raise RuntimeError(f"no room below the ephemeral range (it starts at {ephemeral_start()}) for {span} ports")
    draw = random.SystemRandom()
    for _ in range(_ATTEMPTS):
        port = draw.randint(LOWEST, highest)
        if all(_bindable(port + offset) for offset in range(span)):
            return port
    raise RuntimeError(f"no {span} free adjacent ports between {LOWEST} and {highest + span - 1} after {_ATTEMPTS} tries")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
