"""User errors: bad input that the user can fix, reported as one line instead of a traceback.

Anything the user controls (a recipe value, a data file, a checkpoint to resume, a suite, an export to refuse)
is checked where it is used, and a failed check raises ``UserError`` (or a subclass such as
``config.loader.ConfigError``) with a one-line message that names the key, file or value and says what is
allowed. The entry points (``deepspec`` verbs, ``train.py``) run their work through ``exit_on_user_error``,
which prints ``error: <message>`` on stderr and returns ``USER_ERROR_EXIT_CODE``; with ``DEEPSPEC_DEBUG=1``
the traceback is printed first. Any other exception is a bug and keeps Python's traceback and exit status 1.

Exit statuses of every command: 0 done; 1 a bug (traceback), or ``deepspec regenerate`` left rows that failed
(run it again to retry them); 2 a user error (nothing trained, written or exported; also a full disk, and, in
a run of several ranks, every rank when one of them met the error: ``training.all_ranks_end``; and
``train.py --dry-run`` when a real run would not start: ``jobs.preflight``); 3 streamed
training stopped because a peer died or timed out (``streaming.watchdog``); 4 training stopped by SIGTERM or
SIGUSR1 after its current step and one checkpoint, to be continued with ``train.resume=auto``
(``training.preemption``).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Optional

USER_ERROR_EXIT_CODE = 2
DEBUG_ENV = "DEEPSPEC_DEBUG"


class UserError(Exception):
    """Input the user has to fix; ``str()`` is the message shown to them (kept to one line when printed)."""


def one_line(message: str) -> str:
    """``message`` with its lines joined by ``; `` so that a report never spans several lines."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def report_user_error(error: BaseException) -> int:
    """Print ``error`` as ``error: <one line>`` on stderr (after its traceback when debugging); the exit status."""
    if debug_enabled():
        traceback.print_exception(error, file=sys.stderr)
    sys.stderr.write(f"error: {one_line(str(error))}\n")
    sys.stderr.flush()
    return USER_ERROR_EXIT_CODE


def exit_on_user_error(work: Callable[[], Optional[int]]) -> int:
    """Run ``work``; its exit status (``None`` counts as 0), or ``USER_ERROR_EXIT_CODE`` after a ``UserError``."""
    try:
        return int(work() or 0)
    except UserError as error:
        return report_user_error(error)


def run_verb(prog: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int], argv: Optional[list[str]]) -> int:
    """Parse ``argv`` (None: the command line) with a verb's ``add_arguments`` and run it through
    ``exit_on_user_error``: the ``deepspec`` console script and a verb module run as ``python -m`` alike."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return exit_on_user_error(lambda: run(args))
