"""Which process speaks, and how it prints: the rank-0 console helpers of every entry point.

Only the main process writes to the console (``rank0_print``, and loggers from ``get_logger`` filter their records
the same way), so callers never need their own rank checks around a message.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

import torch.distributed as dist


def get_rank() -> int:
    """Global rank of this process: torch.distributed when initialised, else the launcher's ``RANK`` variable."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


_speaker: Optional[bool] = None


def speak_for_role(role_main: bool) -> None:
    """Let the console helpers speak on this process when ``role_main`` (instead of on global rank 0 only).

    Streamed training calls it with "this rank is rank 0 of its role": target worker 0 and drafter worker 0
    (global rank T) then both log their own progress and summary.
    """
    global _speaker
    _speaker = role_main


def is_main_process() -> bool:
    """Whether this process speaks: global rank 0, unless ``speak_for_role`` said otherwise."""
    if _speaker is not None:
        return _speaker
    return get_rank() == 0


def rank0_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only; flushes so that output interleaves sensibly with launcher logs."""
    if is_main_process():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


class _Rank0Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Evaluated per record (not at logger creation) because torch.distributed may be initialised later.
        return is_main_process()


def get_logger(name: str, level: int = logging.INFO) -> logging.Logger:
    """A logger that emits on rank 0 only, with a timestamped single-line format on stderr."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _Rank0Filter) for f in logger.filters):
        logger.addFilter(_Rank0Filter())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        # Our own handler already prints; letting records reach the root logger would print them twice.
        logger.propagate = False
    logger.setLevel(level)
    return logger
