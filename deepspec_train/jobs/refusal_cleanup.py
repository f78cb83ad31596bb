"""A refused run leaves nothing behind: the folders it created are removed again when it ends with a user error.

``commands.train_entry`` checks everything it can before it creates ``run.output_dir`` and ``data.cache_dir``
(``jobs.preflight``), but some refusals only come once the run has started (a data source whose later rows are
mostly unusable, a ``drafter.init_from`` that does not fit). ``removed_if_refused`` notes whether the run folder
exists yet, counting from its highest missing parent, and removes what it created when the work inside raises
``UserError``, unless the folder by then holds a run (metrics, a checkpoint or a drafter: a user error late in
training, such as a full disk, must not take the trained steps with it). A folder that existed before (a resumed
run's) is never touched; the token cache (``data.cache_dir``) is shared between runs and left as it is; a bug (any
other exception) or a preemption keeps what was written, to be looked at or continued.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from deepspec_train.common.errors import UserError


def highest_missing(folder: str) -> Path | None:
    """The highest folder that creating ``folder`` (with its parents) would create; None when it exists."""
    path = Path(os.path.expanduser(folder)).absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


@contextmanager
def removed_if_refused(folder: str, holds_a_run: Callable[[Path], bool]) -> Iterator[None]:
    """Run the body; on ``UserError`` remove what it created of ``folder`` (see the module docstring)."""
    top = highest_missing(folder)
    try:
        yield
    except UserError:
        if top is not None and not holds_a_run(Path(os.path.expanduser(folder)).absolute()):
            shutil.rmtree(top, ignore_errors=True)
        raise
