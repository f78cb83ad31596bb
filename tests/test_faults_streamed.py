"""Fault matrix, streamed mode, the pieces under the multi-process tests of ``test_failures`` and ``test_resume``:
how backend errors are classified (the texts are gloo's own), how a peer's process state is read (real processes
stopped and killed here), and which rank speaks for its role."""

from __future__ import annotations

import datetime
import signal
import socket
import subprocess
import sys
import time

import pytest

from deepspec_train.common import console
from deepspec_train.streaming import peer_processes
from deepspec_train.streaming.watchdog import PeerFailure, is_peer_error, is_timeout, wait_for

# Verbatim from gloo (torch 2.13): a stopped peer, a killed peer seen on a read, a killed peer seen on a pair.
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "20000ms for recv operation to complete")
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:18817: "
              "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:24806. This is typically caused by a remote worker crashing.")


class FailingWork:
    """Stands in for a ``dist.Work`` whose ``wait`` fails with a given gloo error: producing each error for real
    takes a multi-process run, which ``test_failures`` does end to end."""

    def __init__(self, text: str) -> None:
        self.text = text

    def wait(self, timeout: datetime.timedelta) -> None:
        raise RuntimeError(self.text)


def test_gloo_timeouts_and_deaths_are_told_apart() -> None:
    assert is_timeout(GLOO_TIMEOUT) and not is_timeout(GLOO_RESET) and not is_timeout(GLOO_CLOSED)
    assert all(is_peer_error(text) for text in (GLOO_TIMEOUT, GLOO_RESET, GLOO_CLOSED))
    assert not is_peer_error("CUDA out of memory") and not is_peer_error("shape mismatch")
    with pytest.raises(PeerFailure, match=r"^target worker 0 \(rank 0\) timed out: it did not send"):
        wait_for(FailingWork(GLOO_TIMEOUT), 20, "target worker 0 (rank 0)", "send a stream message")
    with pytest.raises(PeerFailure, match=r"^target worker 0 \(rank 0\) died or closed its connection .* closed by"):
        wait_for(FailingWork(GLOO_CLOSED), 20, "target worker 0 (rank 0)", "send a stream message")


def test_process_state_of_a_running_stopped_and_killed_peer() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = (socket.gethostname(), proc.pid)
    try:
        assert peer_processes.process_state(identity) == "running"
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while peer_processes.process_state(identity) != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peer_processes.process_state(identity) == "stopped"
        proc.kill()
        # Killed but not reaped (a zombie), as a peer launched by another process looks to this rank.
        assert peer_processes.find_gone({3: identity}) == [3]
    finally:
        proc.kill()
        proc.wait()
    assert peer_processes.process_state(identity) == "gone"
    assert peer_processes.process_state(("some-other-node", proc.pid)) is None
    assert peer_processes.process_state(None) is None


def test_each_roles_rank_zero_speaks(monkeypatch) -> None:
    monkeypatch.setattr(console, "_speaker", None)
    monkeypatch.setenv("RANK", "1")
    assert not console.is_main_process()
    console.speak_for_role(True)
    assert console.is_main_process()
    monkeypatch.setenv("RANK", "0")
    console.speak_for_role(False)
    assert not console.is_main_process()
