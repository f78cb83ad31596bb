"""Which tiers a ``pytest -m`` expression opts in to. Two tiers run only when the expression names them: the
`slurm` tier, because it changes the machine (it installs Slurm with apt-get when run as root and starts daemons),
so a plain ``pytest`` never does it behind one's back; and the `full` tier, the cross product of production
dimensions (every production recipe and family streamed, the 36-layer copy at 8K, 32 heads at 32K) whose every
property a default-run test already guards at minimal cost (docs/contributors/testing.md), so it runs when a change
touches the paths that call for it."""

from __future__ import annotations

import re


def names_marker(markexpr: str, marker: str) -> bool:
    """Whether the ``-m`` expression mentions ``marker`` (``slurm``, ``slow or slurm``; ``not slurm`` too, which
    deselects the tier anyway). An expression that merely lets the tier through (``slow``, ``not gpu``) does not."""
    return marker in re.findall(r"\w+", markexpr)


def full_tier_selected(config) -> bool:
    """Whether this pytest run opts in to the `full` tier (``-m full``, ``-m "full or not slurm"``): module fixtures
    that start the tier's shared launches ask this, so a default run never pays for them."""
    return names_marker(config.getoption("markexpr"), "full")


def selected_params(session, function_name: str, param: str) -> list:
    """The values of ``param`` for which this run will execute the parametrized test ``function_name`` (selected
    by ``-m`` / ``-k`` and not skipped), in collection order: a shared launch of a tier's streamed runs starts
    only the runs a selected test will compare."""
    return [item.callspec.params[param] for item in session.items
            if getattr(item, "originalname", None) == function_name and item.get_closest_marker("skip") is None]
