"""The version of ``deepspec_train`` that ``deepspec --version`` and ``deepspec env`` report.

The installed distribution's metadata is the answer for any install (editable or not); a checkout run without
installing (``PYTHONPATH=.``) has no metadata, so the version is read from its ``pyproject.toml`` instead.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "deepspec_train"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# The first ``version = "..."`` at the start of a line: the [project] table's, the only one pyproject.toml has.
_VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)


def package_version() -> str:
    """The installed version, else the checkout's pyproject.toml version, else ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        found = _VERSION_LINE.search(PYPROJECT.read_text())
    except OSError:
        # No checkout there, or one the running user may not read (a verb run as another user from a private
        # folder): no version to report, which must not stop the verb.
        return "unknown"
    return found.group(1) if found else "unknown"
