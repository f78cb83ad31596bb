"""``common.local_ports``: ports for a local run's processes come from below the kernel's ephemeral range (where no
outgoing connection can be given them between the probe and the master's bind), are free with the ports after
them, and a port in use is never handed out."""

from __future__ import annotations

import socket

import pytest

from deepspec_train.common import local_ports
from deepspec_train.common.local_ports import LOWEST, ephemeral_start, unused_local_port


def test_ephemeral_start_is_the_kernel_s() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        assert ephemeral_start() == int(handle.read().split()[0])


@pytest.mark.parametrize("span", [1, 2])
def test_ports_are_below_the_ephemeral_range_and_free(span: int) -> None:
    for _ in range(20):
        port = unused_local_port(span)
        assert LOWEST <= port and port + span - 1 < ephemeral_start()
        probes = [socket.socket() for _ in range(span)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", port + offset))
        finally:
            for probe in probes:
                probe.close()


def test_a_port_in_use_or_next_to_one_is_skipped(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        # The draw offers the busy port, then the port just before it (its successor is busy), then a free one.
        offers = iter([busy, busy - 1, busy - 5])
        monkeypatch.setattr(local_ports.random.SystemRandom, "randint", lambda self, low, high: next(offers))
        monkeypatch.setattr(local_ports, "ephemeral_start", lambda: 65536)
        assert unused_local_port(span=2) == busy - 5


def test_no_room_below_the_range_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(local_ports, "ephemeral_start", lambda: LOWEST + 1)
    with pytest.raises(RuntimeError, match="no room below the ephemeral range"):
        unused_local_port()
