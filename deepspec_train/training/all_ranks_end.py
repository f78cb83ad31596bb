"""One rank's user error ends every rank of the run within a second, each with exit status 2.

A user error often shows on one rank only: rank 0 tokenises the data first while the others wait in a barrier,
so a bad data file is seen by rank 0 alone. Under ``torchrun`` the agent then kills the others, which print
tracebacks; with one plain process per rank (``srun``, no agent) they would wait in the barrier until the gloo
timeout. Instead, the rank that sees the error posts it in the rendezvous store and every other rank's
``EndTogether`` thread, polling that store, leaves at once with the same status, printing nothing: the one-line
message (``error: rank R: ...``) is printed once, by the rank that saw it.

The rank that posts waits (a few seconds at most) until every other rank has read the post before it leaves:
without an agent, rank 0 hosts the store, and its exit would take the post down with it. For the same reason
rank 0 leaves only once every other rank is done with the store: it has read the post, or posted and finished
waiting (each rank's read key marks that; rank 0 marks its own first, since a first poster waits for it).
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
from types import TracebackType
from typing import Optional

import torch.distributed as dist

from deepspec_train.common.errors import USER_ERROR_EXIT_CODE, UserError, report_user_error

_POSTED = "deepspec/user_error/rank"
_POSTERS = "deepspec/user_error/posters"
_READ_PREFIX = "deepspec/user_error/read/"
POLL_S = 0.2
# How long the posting rank keeps the store up for the others to read the post.
READ_WAIT_S = 5.0


class EndTogether:
    """Context manager around a distributed job: a ``UserError`` raised inside on any rank ends every rank with
    status 2. Does nothing for a single process (nor when no process group is up)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = dist.distributed_c10d._get_default_store() if world_size > 1 and dist.is_initialized() else None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "EndTogether":
        if self._store is not None:
            self._thread = threading.Thread(target=self._watch, name="deepspec-end-together", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: Optional[type], error: Optional[BaseException], trace: Optional[TracebackType]
    ) -> bool:
        self._stop.set()
        if self._store is not None and isinstance(error, UserError):
            self._post_and_exit(error)
        if self._thread is not None:
            # Not left inside a store call: a process that exits while a thread uses the store aborts.
            self._thread.join(timeout=2 * POLL_S + 1.0)
        return False

    def _post_and_exit(self, error: UserError) -> None:
        """Post ``error`` for the other ranks and leave with status 2; only the first rank to post prints."""
        first = True
        try:
            # A rank's read key says it is done with the store. Rank 0 hosts it, so it marks itself first (a first
            # poster elsewhere waits for it) and leaves last; every other rank marks itself after its last store call.
            if self.rank == 0:
                self._store.set(f"{_READ_PREFIX}{self.rank}", "1")
            first = self._store.add(_POSTERS, 1) == 1
            if first:
                self._store.set(_POSTED, str(self.rank))
            if first or self.rank == 0:
                self._store.wait(self._other_read_keys(), datetime.timedelta(seconds=READ_WAIT_S))
            if self.rank != 0:
                self._store.set(f"{_READ_PREFIX}{self.rank}", "1")
        except RuntimeError:
            # The store is gone (its host left) or a rank did not read the post in time: it still ends on its own
            # (its watcher, its collectives' timeouts).
            pass
        if first:
            report_user_error(UserError(f"rank {self.rank}: {error}"))
        sys.stdout.flush()
        # Not a normal return: tearing down process groups whose peers have left can block.
        os._exit(USER_ERROR_EXIT_CODE)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if not self._store.check([_POSTED]):
                    continue
                self._store.set(f"{_READ_PREFIX}{self.rank}", "1")
            except RuntimeError:
                return  # the store's host left: the peer watchdogs and collective timeouts take over
            if self._stop.is_set():
                return  # this rank is posting an error of its own
            if self.rank == 0:
                self._wait_for_readers()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(USER_ERROR_EXIT_CODE)

    def _other_read_keys(self) -> list[str]:
        return [f"{_READ_PREFIX}{r}" for r in range(self.world_size) if r != self.rank]

    def _wait_for_readers(self) -> None:
        """Rank 0 hosts the store without an agent: leaving before the other ranks have read the post would take it
        down under them, and a rank that then loses the store reports a failure instead of the user error."""
        try:
            self._store.wait(self._other_read_keys(), datetime.timedelta(seconds=READ_WAIT_S))
        except RuntimeError:
            pass  # a rank that did not read in time ends on its own (its watchdog, its collectives' timeouts)
