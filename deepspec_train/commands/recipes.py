"""``deepspec recipes list|show|copy``: the recipes this install finds, one resolved, or a copy to edit.

    deepspec recipes list                          # every recipe: drafter kind, target, sequence length
    deepspec recipes show qwen3-8b                 # its resolved config (base merged, every default), as YAML
    deepspec recipes copy qwen3-8b --out mine.yaml # its file, comments included; then: train.py recipe=mine.yaml

Recipes are looked up as training looks them up (``config.loader.recipe_dirs``: $DEEPSPEC_RECIPES, ./recipes,
then the package's own). Only keys and types are checked here; ``train.py ... --dry-run`` runs every rule,
including those that need the target's config.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deepspec_train.config.loader import (
    RECIPE_SUFFIXES, ConfigError, available_recipes, find_recipe, read_recipe, resolved_yaml,
)
from deepspec_train.common.errors import UserError, one_line
from deepspec_train.common.output_paths import ensure_output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every recipe with its drafter kind, target and sequence length")
    show = actions.add_parser("show", help="a recipe resolved: its base merged, every default filled in (YAML)")
    show.add_argument("name", help="a recipe name (deepspec recipes list) or a path to a YAML file")
    copy = actions.add_parser("copy", help="write a recipe's file (comments included) to edit")
    copy.add_argument("name", help="a recipe name (deepspec recipes list) or a path to a YAML file")
    copy.add_argument("--out", required=True, help="the .yaml file written; an existing file is never replaced")


def describe(name: str) -> str:
    """One line for ``name``: drafter kind, target and sequence length, or why the recipe does not load."""
    try:
        _, cfg = read_recipe(name)
    except ConfigError as error:
        return f"does not load: {one_line(str(error))}"
    return f"{cfg.drafter.kind:<6}  target {cfg.target.path}  length {cfg.data.max_length}"


def list_recipes() -> str:
    names = available_recipes()
    width = max((len(name) for name in names), default=0)
    return "\n".join(f"{name:<{width}}  {describe(name)}" for name in names)


def show_recipe(name: str) -> str:
    """The resolved config as YAML, after a comment naming the file it came from."""
    path, cfg = read_recipe(name)
    return f"# {path.resolve()}\n{resolved_yaml(cfg)}"


def copy_recipe(name: str, out: str) -> Path:
    """Copy the recipe file of ``name`` to ``out``; refuses an existing ``out`` and a name train.py cannot read."""
    source = find_recipe(name)
    target = Path(out).expanduser()
    if target.suffix not in RECIPE_SUFFIXES:
        raise UserError(f"--out {out}: name the copy *.yaml or *.yml, so that train.py recipe={out} reads it")
    if target.exists():
        raise UserError(f"--out {out} already exists; copy to another file or remove it first")
    ensure_output_file(target, "--out")
    target.write_text(source.read_text())
    return source


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        print(list_recipes())
    elif args.action == "show":
        print(show_recipe(args.name), end="")
    else:
        source = copy_recipe(args.name, args.out)
        print(f"wrote {args.out} (a copy of {source.resolve()}); train it with: python train.py recipe={args.out}")
    return 0
