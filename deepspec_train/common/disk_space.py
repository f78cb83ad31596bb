"""A write that fills the disk: removed, and reported in one line naming the path and the bytes it needed.

Checkpoints, exports and the token cache are written under a temporary name and renamed into place, so a write
cut short never sits under the name a reader opens. ``whole_or_nothing`` wraps such a write: when it fails
because the disk (or the quota) is full, the partial files are removed and the failure becomes a ``DiskFull``
(a ``UserError``: one ``error:`` line, exit status 2) that names the path, the bytes the write needed and the
bytes free once the partial files are gone; nothing that was there before is touched, so the previous checkpoint
stays valid. Other failures pass through unchanged (after the same clean-up).

Libraries word a full disk differently: Python and pyarrow raise ``OSError`` with errno ENOSPC, safetensors
names ``StorageFull``, and ``torch.save`` only says that a write failed. The last is recognised by its
consequence: the disk now has less room than the write needed.
"""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from deepspec_train.common.errors import UserError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("no space left on device", "storagefull", "disk quota exceeded")


class DiskFull(UserError):
    """A write ran out of disk space; the message names the path and the bytes needed and free."""


def tensor_bytes(value: Any) -> int:
    """Bytes held by the tensors in ``value`` (a tensor, or dicts / lists / tuples of them): what writing them
    takes at least."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    return 0


def free_bytes(path: Path) -> int:
    """Bytes free on the filesystem holding ``path`` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def _says_full(error: BaseException) -> bool:
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if any(word in str(current).lower() for word in _FULL_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def whole_or_nothing(path: Path, needed: int | Callable[[], int], discard: Callable[[], None]) -> Iterator[None]:
    """Run the write of ``path`` inside; on failure call ``discard`` (removes what the write left) and turn a full
    disk into ``DiskFull``. ``needed`` is the write's size in bytes, or a function giving it once it failed
    (for a write whose size is only known as it goes)."""
    try:
        yield
    except Exception as error:
        size = needed() if callable(needed) else needed
        discard()
        free = free_bytes(path)
        if _says_full(error) or free < size:
            raise DiskFull(
                f"{path}: the disk is full: writing it needs {size:,} bytes{' or more' if callable(needed) else ''}, "
                f"{free:,} are free there ({type(error).__name__}); free some space or write elsewhere"
            ) from error
        raise


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it is gone)."""
    if not folder.is_dir():
        return 0
    return sum(item.stat().st_size for item in folder.rglob("*") if item.is_file())
