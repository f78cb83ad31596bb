"""Which tiers a ``pytest -m`` expression opts in to. A tier that changes the machine (the `slurm` tier installs
Slurm with apt-get when run as root and starts daemons) runs only when the expression names it, so a plain
``pytest`` never does it behind one's back."""

from __future__ import annotations

import re


def names_marker(markexpr: str, marker: str) -> bool:
    """Whether the ``-m`` expression mentions ``marker`` (``slurm``, ``slow or slurm``; ``not slurm`` too, which
    deselects the tier anyway). An expression that merely lets the tier through (``slow``, ``not gpu``) does not."""
    return marker in re.findall(r"\w+", markexpr)
