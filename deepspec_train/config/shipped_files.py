"""Where the files that ship with the package are found: the recipes and the DeepSpeed configs they name.

``recipes/`` and ``launch/deepspeed/`` stay at the top of the repository, where users know them and edit them;
``deepspec_train/shipped/`` holds two links to them (``recipes -> ../../recipes``, ``launch/deepspeed ->
../../../launch/deepspeed``) and ``pyproject.toml`` names the files under it as package data. Building a wheel
follows the links and copies the files, so one path, ``deepspec_train/shipped/``, holds them in a checkout, in an
editable install and in a plain ``pip install .`` alike, and nothing here has to guess which of the three it
runs from. The links were chosen over moving the files into the package (which would move what users and
scripts know as ``recipes/``) and over ``data-files`` (installed outside the package, under a prefix that
differs between virtual environments, user installs and system installs).
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "shipped"
SHIPPED_RECIPES = SHIPPED / "recipes"


def resolve_shipped_path(path: str) -> Path:
    """A file path from a recipe: as given when it exists (or is absolute), else among the shipped files, which
    keep the repository's layout (the recipes' default ``launch/deepspeed/zero2.json``)."""
    given = Path(path)
    if given.is_file() or given.is_absolute():
        return given
    return SHIPPED / given
