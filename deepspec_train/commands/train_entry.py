"""Command-line entry of training (``train.py``, ``deepspec train``): ``recipe=NAME`` plus ``dotted.key=value``
overrides.

The recipe is validated before anything heavy is imported or loaded (its types, the rules of ``config.rules``,
the target's config.json, the launch's process count and whether ``run.output_dir`` may take this run), so a bad
value fails in well under a second with a one-line message, before any data is tokenised or any weight is read.
Bad input found later (a data file, a checkpoint to resume) is reported the same way: ``error: <one line>`` on
stderr and exit status 2 (``deepspec_train.common.errors``).

``compare=`` / ``seeds=`` make a run of drafter groups (``jobs.drafter_groups``): every group is validated the same
way before anything loads.

Then ``jobs.preflight`` reads what the run reads first (the target's weight headers and tokenizer, the data
sources' first rows, ``drafter.init_from``); only when all of it passes are the output folders created, and a
refusal met once the run has started removes the run folder it created (``jobs.refusal_cleanup``).

``--dry-run`` makes every one of these checks and trains nothing: it prints the resolved config (YAML) and then
the findings as comment lines (``ok``, ``not checked``, ``stops``), and exits 0 only when a real run would start,
2 otherwise with one stderr line naming the first finding that stops it. A target folder that is not there yet
is listed rather than refused before the config is printed. Torch is imported only to load the tokenizer, when
nothing else stops the run, and no folder is left behind (the output folders are proven writable where they
would be created). ``--help`` prints the usage, the recipes found and where recipe keys are documented, and
exits 0.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

from deepspec_train.config.loader import ConfigError, available_recipes, recipe_dirs, resolved_yaml
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.rules import launch_problems
from deepspec_train.common.errors import exit_on_user_error
from deepspec_train.jobs.drafter_groups import (
    dry_run_text, is_group_command_line, launch_and_output_problems, load_groups, parse_group_command_line,
    prepare_directories,
)
from deepspec_train.jobs.preflight import Preflight, preflight
from deepspec_train.jobs.refusal_cleanup import removed_if_refused
from deepspec_train.jobs.run_directory import holds_a_run, output_dir_problems
from deepspec_train.common.output_paths import check_output_dir, ensure_output_dir

USAGE = "usage: train.py recipe=NAME [dotted.key=value ...] [--dry-run]"
HELP_OPTIONS = ("-h", "--help")
DRY_RUN = "--dry-run"


def parse_command_line(argv: list[str]) -> tuple[str, list[str]]:
    """The recipe named by ``recipe=`` and the overrides, in order; ``ConfigError`` (with the usage) otherwise."""
    recipe = None
    overrides = []
    for arg in argv:
        if arg in HELP_OPTIONS:
            raise ConfigError(USAGE)
        if arg.startswith("recipe="):
            recipe = arg.split("=", 1)[1]
        elif arg.startswith("--"):
            raise ConfigError(f"unexpected option '{arg}'; {USAGE}")
        else:
            overrides.append(arg)
    if not recipe:
        raise ConfigError(f"no recipe given; {USAGE}")
    return recipe, overrides


def help_text() -> str:
    """What ``train.py --help`` prints: the usage, the recipes found, where recipe keys are documented."""
    where = "".join(f"\n  {folder}" for folder in recipe_dirs())
    names = textwrap.fill(", ".join(available_recipes()), width=110, initial_indent="  ", subsequent_indent="  ",
                          break_on_hyphens=False)
    return f"""{USAGE}
       (the same after `deepspec train`, `torchrun ... train.py` or `accelerate launch train.py`)

Train a drafter from a recipe: a name from the folders below or a path to a YAML file, then dotted.key=value
overrides (e.g. train.lr=3e-4 drafter.num_layers=3). Every value is checked before anything loads.

  --dry-run   make every check a run makes (recipe, target files and tokenizer, the data's first rows), print
              the resolved config (YAML) and what was found, train nothing; exit 0 only if a run would start
  -h, --help  print this help

Drafter groups, several drafters over one target pass (docs/reference/training.md, "Drafter groups"):
  train.py recipe=NAME compare=[NAME,...] seeds=N [dotted.key=value ...] [NAME:dotted.key=value ...]

recipes (`deepspec recipes list` describes each):
{names}
looked up, in this order, in:{where}

recipe keys: docs/reference/recipe_keys.md (each key's type, default and rules); `deepspec recipes show
NAME` prints a recipe with every key filled in; docs/reference/training.md explains the checks and what a run writes."""


def main(argv: list[str]) -> int:
    """Check and run ``train.py ARGV``; its exit status (``deepspec_train.common.errors``)."""
    return exit_on_user_error(lambda: _train_from_command_line(argv))


def _train_from_command_line(argv: list[str]) -> int:
    if any(arg in HELP_OPTIONS for arg in argv):
        print(help_text())
        return 0
    dry_run = DRY_RUN in argv
    if is_group_command_line(argv):
        return _train_groups(argv, dry_run)
    recipe, overrides = parse_command_line([arg for arg in argv if arg != DRY_RUN])
    cfg = _load(recipe, overrides, dry_run)
    # The launcher's process count, as torch.distributed will see it (1 for a plain `python train.py`).
    problems = launch_problems(cfg, int(os.environ.get("WORLD_SIZE", "1"))) + output_dir_problems(cfg)
    if problems:
        raise ConfigError(f"recipe {recipe}: " + "; ".join(problems))
    if cfg.data.cache_dir:
        check_output_dir(cfg.data.cache_dir, "data.cache_dir")
    check_output_dir(cfg.run.output_dir, "run.output_dir")
    checks = preflight(cfg, stop_early=not dry_run)
    if dry_run:
        print(resolved_yaml(cfg) + checks.report(), end="")
        _refuse_if_stopped(checks, dry_run=True)
        return 0
    _refuse_if_stopped(checks, dry_run=False)
    # Every check passed: only now are the folders created, and a refusal met later removes the run folder again.
    with removed_if_refused(cfg.run.output_dir, holds_a_run):
        if cfg.data.cache_dir:
            ensure_output_dir(cfg.data.cache_dir, "data.cache_dir")
        ensure_output_dir(cfg.run.output_dir, "run.output_dir")
        from deepspec_train.jobs.run import run_training

        return _until_preempted(lambda: run_training(cfg))


def _load(recipe: str, overrides: list[str], dry_run: bool) -> RecipeConfig:
    """The validated recipe; a dry run whose target folder is not there yet skips the checks that read the target
    (``jobs.preflight`` lists it as stopping the run) so that it can still print the config."""
    if dry_run:
        cfg = load_recipe(recipe, overrides, check_target=False)
        if not Path(cfg.target.path).expanduser().exists():
            return cfg
    return load_recipe(recipe, overrides)


def _refuse_if_stopped(checks: Preflight, dry_run: bool) -> None:
    refusal = checks.refusal(dry_run)
    if refusal is not None:
        raise refusal


def _train_groups(argv: list[str], dry_run: bool) -> int:
    """A run of drafter groups (``compare=`` / ``seeds=``, ``jobs.drafter_groups``): every group validated, its
    directory checked and prepared, then one job trains them all (``jobs.run``)."""
    groups = load_groups(parse_group_command_line([arg for arg in argv if arg != DRY_RUN]))
    problems = launch_and_output_problems(groups)
    if problems:
        raise ConfigError(problems[0])
    prepare_directories(groups, dry_run=True)
    # The groups share one target and one data order (``drafter_groups.shared_setting_problems``).
    checks = preflight(groups[0].cfg, stop_early=not dry_run, groups=[(g.label, g.cfg) for g in groups])
    if dry_run:
        print(dry_run_text(groups) + checks.report(), end="")
        _refuse_if_stopped(checks, dry_run=True)
        return 0
    _refuse_if_stopped(checks, dry_run=False)
    prepare_directories(groups, dry_run=False)
    from deepspec_train.jobs.run import run_drafter_groups

    return _until_preempted(lambda: run_drafter_groups(groups))


def _until_preempted(train: Callable[[], object]) -> int:
    """Run ``train``; exit status 0, or ``PREEMPTED_EXIT_CODE`` when it stopped at a preemption signal after its
    checkpoint (logged once by the rank that wrote it, ``training.preemption``)."""
    from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE, Preempted

    try:
        train()
    except Preempted:
        return PREEMPTED_EXIT_CODE
    return 0
