"""Command-line entry of training: ``recipe=NAME`` plus ``dotted.key=value`` overrides.

The recipe is validated before anything heavy is imported or loaded (its types, the rules of ``config.rules``,
the target's config.json, the launch's process count and whether ``run.output_dir`` may take this run), so a bad
value fails in well under a second with a one-line message, before any data is tokenised or any weight is read.
Bad input found later (a data file, a checkpoint to resume) is reported the same way: ``error: <one line>`` on
stderr and exit status 2 (``deepspec_train.errors``).
"""

from __future__ import annotations

import os

from deepspec_train.config.loader import ConfigError
from deepspec_train.validation import load_recipe
from deepspec_train.config.rules import launch_problems
from deepspec_train.errors import exit_on_user_error
from deepspec_train.jobs.run_directory import output_dir_problems
from deepspec_train.output_paths import ensure_output_dir

USAGE = "usage: train.py recipe=NAME [dotted.key=value ...]"


def parse_command_line(argv: list[str]) -> tuple[str, list[str]]:
    recipe = None
    overrides = []
    for arg in argv:
        if arg in ("-h", "--help"):
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


def main(argv: list[str]) -> int:
    return exit_on_user_error(lambda: _train_from_command_line(argv))


def _train_from_command_line(argv: list[str]) -> int:
    recipe, overrides = parse_command_line(argv)
    cfg = load_recipe(recipe, overrides)
    # The launcher's process count, as torch.distributed will see it (1 for a plain `python train.py`).
    problems = launch_problems(cfg, int(os.environ.get("WORLD_SIZE", "1"))) + output_dir_problems(cfg)
    if problems:
        raise ConfigError(f"recipe {recipe}: " + "; ".join(problems))
    if cfg.data.cache_dir:
        ensure_output_dir(cfg.data.cache_dir, "data.cache_dir")
    ensure_output_dir(cfg.run.output_dir, "run.output_dir")
    from deepspec_train.jobs.run import run_training
    from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE, Preempted

    try:
        run_training(cfg)
    except Preempted:
        # Logged once by the rank that wrote the checkpoint (``training.preemption``).
        return PREEMPTED_EXIT_CODE
    return 0
