"""Output folders made, and proven writable, before a command does any work.

Every verb that writes calls ``ensure_output_dir`` (a folder it fills) or ``ensure_output_file`` (a file it
writes at the end) on each output path first thing, so that a path it cannot write (no permission, a file where
a folder must be, a read-only filesystem) is refused in one line, exit status 2, before minutes of profiling,
decoding or training are spent and then lost at the save. Creating the folder is not proof enough (root may
create folders it cannot fill on a read-only mount, and permission bits say nothing about a read-only
filesystem): a probe file is created and removed inside it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from deepspec_train.common.errors import UserError

# Why a path cannot be written, by errno, in the words the one-line message uses.
_REASONS = {
    errno.EACCES: "no permission to write there",
    errno.EPERM: "no permission to write there",
    errno.EROFS: "it is on a read-only filesystem",
    errno.ENOTDIR: "a file stands where a folder must be",
    errno.EEXIST: "a file stands where a folder must be",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
}


def _refusal(what: str, path: Path, error: OSError) -> UserError:
    reason = _REASONS.get(error.errno or 0, error.strerror or type(error).__name__)
    where = f" ({error.filename})" if error.filename and Path(error.filename) != path else ""
    return UserError(f"{what} {path}: cannot write there: {reason}{where}")


def _prove_writable(folder: Path) -> None:
    handle, probe = tempfile.mkstemp(prefix=".deepspec-write-probe-", dir=folder)
    os.close(handle)
    os.unlink(probe)


def ensure_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Create ``path`` (and its parents) if needed and prove a file can be written in it; returns it as a Path.
    ``what`` names the option in the refusal, e.g. ``--out`` or ``run.output_dir``."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # mkdir with exist_ok accepts an existing file only by raising; a folder reached through a symlink is fine.
        _prove_writable(folder)
    except OSError as error:
        raise _refusal(what, folder, error) from error
    return folder


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """What ``ensure_output_dir`` proves, leaving nothing behind (``train.py --dry-run``): the probe file goes into
    the nearest folder that exists, where the missing ones would be created, and is removed."""
    folder = Path(path).expanduser()
    existing = folder
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        _prove_writable(existing)
    except OSError as error:
        raise _refusal(what, folder, error) from error
    return folder


def ensure_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """Create the folder of the file ``path`` and prove it writable; refuse a folder standing at ``path`` itself
    and an existing file that may not be replaced. Nothing is written at ``path``."""
    target = Path(path).expanduser()
    ensure_output_dir(target.parent, what=f"{what} {target}: its folder")
    # Only now: looking at a path inside a folder this user may not enter fails with EACCES, refused above.
    if target.is_dir():
        raise UserError(f"{what} {target}: cannot write there: a folder stands where the file must be")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{what} {target}: cannot write there: no permission to replace it")
    return target
