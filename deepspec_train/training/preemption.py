"""Preemption: on SIGTERM or SIGUSR1 the run finishes its optimizer step, writes one checkpoint and exits with
status ``PREEMPTED_EXIT_CODE`` (4), so that a scheduler can requeue it and ``train.resume=auto`` continue it
exactly.

What each rank does:

- The signal only raises a flag (``install``); a second one restores the default action and re-sends itself,
  so a stuck checkpoint write can still be killed. A checkpoint is written under a temporary name and renamed
  with its manifest (``training.checkpoint``), so a kill mid-write never leaves one that verifies.
- A ``StopWatch`` thread posts a raised flag in the rendezvous store and raises the flag of every rank that
  reads a post there: a signal sent to one process (a target worker, a single ``srun`` task) reaches all.
- Before each optimizer update the drafter ranks (the colocated ranks) agree on their flags in the collective of
  ``training.step_guard`` (one max all-reduce, shared with the non-finite guard), so they all stop after the same
  step, checkpoint it and raise ``Preempted``.
- Streamed: drafter worker 0 posts the step it stopped after; target workers then drop what they still had
  queued or were computing (the checkpoint holds the drafters' data position, and a resumed drafter tells its
  target which step to start from), acknowledge, sign off and exit with the same status. The drafters leave
  after the acknowledgements, so no target worker mistakes their exit for a death. With drafter groups
  (``jobs.drafter_groups``) each group stops after its own step and posts under its index; a target worker
  acknowledges each group's post at once and from then on drops what it would send that group
  (``stopped_drafter_groups``), and leaves once every group has posted.

The rank that writes the checkpoint logs one line. When ``DEEPSPEC_PREEMPTED_FILE`` is set (``train.sbatch``
sets it), that rank also writes the step there: a launcher such as ``torchrun`` reports its own status, not the
workers', so the job script learns from the file that the run was preempted and requeues it.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Optional

import torch.distributed as dist

PREEMPTED_EXIT_CODE = 4
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
MARKER_ENV = "DEEPSPEC_PREEMPTED_FILE"
_REQUESTED = "deepspec/preempt/requested"
_STOPPED_AT = "deepspec/preempt/stopped_at"
_ACK_PREFIX = "deepspec/preempt/ack/"
POLL_S = 0.2
# How long drafters wait for the target workers to acknowledge their stop before leaving anyway.
ACK_WAIT_S = 30.0

_requested = threading.Event()
_signal_name: list[str] = []
# Set on a target worker once the drafters stopped: its sends may fail from now on, and that is no failure.
drafters_stopped = threading.Event()
# On a target worker, the drafter groups that have stopped so far (a single run is drafter group 0).
stopped_drafter_groups: set[int] = set()


class Preempted(Exception):
    """Raised by the trainer once every drafter rank has checkpointed ``step`` after a preemption signal."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(f"preempted after step {step}")
        self.step = step
        self.checkpoint = checkpoint


def _on_signal(signum: int, frame) -> None:
    if _requested.is_set():
        # The second signal: leave now, by that signal's default action.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _signal_name.append(signal.Signals(signum).name)
    _requested.set()


def install() -> None:
    """Catch SIGTERM and SIGUSR1 in this process (main thread only; a launcher may have set them to ignore)."""
    _requested.clear()
    _signal_name.clear()
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)


def requested() -> bool:
    return _requested.is_set()


def announce(step: int, checkpoint: Path, log: Callable[[str], None]) -> None:
    """The one log line of a preempted run (and the marker file for the job script when asked for)."""
    cause = _signal_name[0] if _signal_name else "a preemption signal on another rank"
    log(f"preempted by {cause}: stopped after step {step}, checkpoint {checkpoint}; exit status "
        f"{PREEMPTED_EXIT_CODE} (continue with train.resume=auto)")
    marker = os.environ.get(MARKER_ENV)
    if marker:
        Path(marker).write_text(json.dumps({"step": step, "checkpoint": str(checkpoint)}) + "\n")


def drafter_group_stopped(drafter_group: int) -> bool:
    """Target side: whether drafter group ``drafter_group`` has stopped after a preemption signal."""
    return drafters_stopped.is_set() or drafter_group in stopped_drafter_groups


class StopWatch:
    """The thread that carries stop requests through the rendezvous store (see the module docstring); a
    streamed target worker passes ``on_drafters_stopped``, called once the drafters of every one of
    ``drafter_groups`` have stopped."""

    def __init__(self, rank: int, on_drafters_stopped: Optional[Callable[[], None]] = None,
                 drafter_groups: int = 1) -> None:
        self.rank = rank
        self.on_drafters_stopped = on_drafters_stopped
        self.drafter_groups = drafter_groups
        self._store = dist.distributed_c10d._get_default_store()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deepspec-stop-watch", daemon=True)

    def start(self) -> "StopWatch":
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop watching; returns once the thread is out of any store call (a process that exits while a thread
        uses the store aborts)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S + 1.0)

    def _run(self) -> None:
        posted = False
        while not self._stop.wait(POLL_S):
            try:
                if _requested.is_set() and not posted:
                    self._store.set(_REQUESTED, str(self.rank))
                    posted = True
                elif not _requested.is_set() and self._store.check([_REQUESTED]):
                    _requested.set()
                if self.on_drafters_stopped is not None and self._acknowledge_stops():
                    drafters_stopped.set()
                    self.on_drafters_stopped()
                    return
            except RuntimeError:
                return  # the store's host left: the peer watchdog reports that


    def _acknowledge_stops(self) -> bool:
        """Acknowledge every drafter group's new stop post; whether all groups have stopped."""
        for group in range(self.drafter_groups):
            if group not in stopped_drafter_groups and self._store.check([f"{_STOPPED_AT}/{group}"]):
                stopped_drafter_groups.add(group)
                self._store.set(f"{_ACK_PREFIX}{group}/{self.rank}", "1")
        return len(stopped_drafter_groups) == self.drafter_groups


def tell_target_workers(num_target_ranks: int, drafter_group: int = 0) -> None:
    """Drafter side, streamed: post that the drafters of ``drafter_group`` stopped (each has checkpointed), then
    wait (bounded) until every target worker (global ranks ``0 .. num_target_ranks - 1``) has read it, so that
    none of them takes the drafters' exit for a failure."""
    store = dist.distributed_c10d._get_default_store()
    try:
        store.set(f"{_STOPPED_AT}/{drafter_group}", "1")
        acks = [f"{_ACK_PREFIX}{drafter_group}/{rank}" for rank in range(num_target_ranks)]
        store.wait(acks, datetime.timedelta(seconds=ACK_WAIT_S))
    except RuntimeError:
        pass  # a target worker that is gone or silent: the drafters' checkpoint is already whole
