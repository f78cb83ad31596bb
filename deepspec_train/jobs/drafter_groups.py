"""Drafter groups: one run that trains several drafters (kinds, recipes or training seeds) over one target pass.

    python train.py recipe=tiny-dspark compare=[tiny-eagle3,tiny-dflash] seeds=3 [key=value ...]
                    [RECIPE:key=value ...] [--dry-run]

Each recipe named (``recipe=`` first, then ``compare=``) gives ``seeds`` groups (default 1), with ``run.seed``
= the recipe's seed + 0, 1, ... A plain ``key=value`` override applies to every group, ``RECIPE:key=value`` to
the groups of that recipe only (e.g. ``tiny-eagle3:target.layer_ids=[1,2,3]``). Every group is validated as its
own recipe before anything loads, and an error names the group (``group tiny-eagle3-seed1: ...``).

What the groups share, and what each keeps:

- one target and one data order: the ``target`` section (but ``layer_ids``: the target is tapped at the union of
  the groups' layers), the ``data``, ``topology`` and ``stream`` sections, ``train.global_batch_sequences`` and
  ``train.micro_batch_sequences`` must be equal, or the run is refused in one line; every group's epoch order is drawn from the first recipe's
  ``run.data_seed`` (or its ``run.seed``), which is set as each group's ``run.data_seed``, so a group trained
  alone with its resolved config (``<group>/resolved_config.yaml``) trains bit for bit the same;
- each group keeps its own packing plan and anchors (its ``run.seed``), loss, optimizer, learning-rate schedule,
  step count, checkpoints and W&B run: its run directory is ``<run.output_dir>/groups/<recipe>-seed<seed>/``
  (``run.output_dir`` of the first recipe after the overrides), its W&B run is named after the group and joins
  one W&B group for the comparison (``logging.wandb_group`` of the first recipe, or ``<run.name>-groups``).

A plain run of one recipe is a group of one (``plain_run``) that nothing names: its messages and files are a
run's (no ``group <label>:`` prefix, no ``groups.json``). ``jobs.run`` sets up every job, plain or grouped; the
colocated job (``jobs.colocated``) trains the groups with ``topology.target_workers = 0``; with ``T > 0`` target
workers the streamed job (``jobs.streamed``) does: the launch's drafter ranks split evenly into the groups, in the
order listed, ``D = (WORLD_SIZE - T) / N`` each (``group_world_size``: every group is checked as a streamed run of
``T + D`` processes), and the target workers feed every group from one forward per micro-batch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from deepspec_train.config.loader import ConfigError, read_recipe, resolved_yaml
from deepspec_train.config.rules import launch_problems
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.common.errors import UserError
from deepspec_train.jobs.run_directory import output_dir_problems
from deepspec_train.common.output_paths import check_output_dir, ensure_output_dir
from deepspec_train.kinds.recipe_validation import load_recipe

GROUP_USAGE = ("usage: train.py recipe=NAME compare=[NAME,...] seeds=N [dotted.key=value ...] "
               "[NAME:dotted.key=value ...] [--dry-run]")
GROUP_WORDS = ("compare=", "seeds=")
# Where the groups' run directories go, under the comparison's run.output_dir, and the file listing them.
GROUPS_DIR = "groups"
GROUPS_FILE = "groups.json"
# Settings every group must share: the target (its taps aside), the data, the sequences of a step and of a
# target forward, and the ranks and stream the target workers of a streamed run serve them through.
SHARED_SECTIONS = ("target", "data", "topology", "stream")
SHARED_KEYS = ("train.global_batch_sequences", "train.micro_batch_sequences", "run.data_seed")
TAP_KEY = "layer_ids"


@dataclass(frozen=True)
class GroupCommand:
    """The parsed command line of a grouped run: recipes in order, seeds per recipe, overrides for every group and
    for one recipe's groups."""

    recipes: list[str]
    seeds: int
    overrides: list[str]
    per_recipe: dict[str, list[str]]


@dataclass(frozen=True)
class DrafterGroup:
    """One group: its label (``<recipe>-seed<seed>``), the recipe it comes from and its validated config;
    ``alone``: the group of one of a plain run (label and recipe: its ``run.name``), which nothing names."""

    label: str
    recipe: str
    cfg: RecipeConfig
    alone: bool = False

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.run.output_dir)

    def moved_aside(self, moved: Path) -> str:
        """The warning that ``run.overwrite=true`` moved the previous run in this group's directory to ``moved``."""
        if self.alone:
            return f"run.overwrite=true: the previous run in {self.out_dir} was moved to {moved}"
        return f"group {self.label}: run.overwrite=true: the previous run was moved to {moved}"


def plain_run(cfg: RecipeConfig) -> DrafterGroup:
    """The group of one that a plain run of ``cfg`` trains as."""
    return DrafterGroup(cfg.run.name, cfg.run.name, cfg, alone=True)


@contextmanager
def naming_errors(group: DrafterGroup) -> Iterator[None]:
    """A user error met while assembling or stepping ``group`` names the group in its one line (a plain run's
    error is its own, unchanged)."""
    try:
        yield
    except UserError as exc:
        if group.alone:
            raise
        raise UserError(f"group {group.label}: {exc}") from None


def is_group_command_line(argv: list[str]) -> bool:
    return any(arg.startswith(GROUP_WORDS) for arg in argv)


def parse_group_command_line(argv: list[str]) -> GroupCommand:
    recipe, compare, seeds = None, [], 1
    overrides: list[str] = []
    per_recipe: dict[str, list[str]] = {}
    for arg in argv:
        if arg.startswith("--"):
            raise ConfigError(f"unexpected option '{arg}'; {GROUP_USAGE}")
        if arg.startswith("recipe="):
            recipe = arg.split("=", 1)[1]
        elif arg.startswith("compare="):
            compare = _names(arg.split("=", 1)[1])
        elif arg.startswith("seeds="):
            seeds = _seed_count(arg.split("=", 1)[1])
        elif ":" in arg.split("=", 1)[0]:
            name, override = arg.split(":", 1)
            per_recipe.setdefault(name, []).append(override)
        else:
            overrides.append(arg)
    if not recipe:
        raise ConfigError(f"no recipe given; {GROUP_USAGE}")
    recipes = [recipe, *compare]
    unknown = sorted(set(per_recipe) - set(recipes))
    if unknown:
        raise ConfigError(f"override for '{unknown[0]}', which is not a compared recipe ({', '.join(recipes)})")
    return GroupCommand(recipes, seeds, overrides, per_recipe)


def _names(raw: str) -> list[str]:
    value = yaml.safe_load(raw) if raw else []
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"compare={raw}: expected recipe names, e.g. compare=[qwen3-8b-dflash,qwen3-8b-eagle3]")
    return names


def _seed_count(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"seeds={raw}: expected a whole number of training seeds per recipe, at least 1")
    return int(raw)


def recipe_label(recipe: str) -> str:
    return Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else recipe


def load_groups(command: GroupCommand) -> list[DrafterGroup]:
    """Every group's validated config, each in its own run directory; ``ConfigError`` naming the group on the
    first problem, or naming the setting the groups do not share."""
    first = _typed(command.recipes[0], command.overrides + command.per_recipe.get(command.recipes[0], []))
    root = Path(first.run.output_dir)
    data_seed = first.run.seed if first.run.data_seed is None else first.run.data_seed
    wandb_group = first.logging.wandb_group or f"{first.run.name}-groups"
    groups: list[DrafterGroup] = []
    for recipe in command.recipes:
        overrides = command.overrides + command.per_recipe.get(recipe, [])
        base_seed = _typed(recipe, overrides).run.seed
        for k in range(command.seeds):
            label = f"{recipe_label(recipe)}-seed{base_seed + k}"
            if any(g.label == label for g in groups):
                raise ConfigError(f"group {label} is named twice: compare each recipe once")
            layout = [f"run.seed={base_seed + k}", f"run.data_seed={data_seed}", f"run.name={label}",
                      f"run.output_dir={root / GROUPS_DIR / label}", f"logging.wandb_group={wandb_group}"]
            try:
                cfg = load_recipe(recipe, overrides + layout)
            except ConfigError as exc:
                raise ConfigError(f"group {label}: {exc}") from None
            groups.append(DrafterGroup(label, recipe, cfg))
    problems = shared_setting_problems(groups)
    if problems:
        raise ConfigError(problems[0])
    return groups


def _typed(recipe: str, overrides: list[str]) -> RecipeConfig:
    """The recipe with its overrides, types checked only (what the groups' layout is derived from)."""
    try:
        return read_recipe(recipe, overrides)[1]
    except ConfigError as exc:
        raise ConfigError(f"group {recipe_label(recipe)}: {exc}") from None


def _flat(data: Any, prefix: str) -> dict[str, Any]:
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}.{key}").items()}
    return {prefix: data}


def shared_settings(cfg: RecipeConfig) -> dict[str, Any]:
    """The settings every group of a run must share, as dotted key -> value."""
    resolved = dataclasses.asdict(cfg)
    shared: dict[str, Any] = {}
    for section in SHARED_SECTIONS:
        shared.update(_flat(resolved[section], section))
    shared.pop(f"target.{TAP_KEY}")
    for key in SHARED_KEYS:
        section, name = key.split(".")
        shared[key] = resolved[section][name]
    return shared


def shared_setting_problems(groups: list[DrafterGroup]) -> list[str]:
    """One line per group whose shared settings differ from the first group's."""
    reference = shared_settings(groups[0].cfg)
    problems = []
    for group in groups:
        mine = shared_settings(group.cfg)
        differing = [key for key in reference if mine[key] != reference[key]]
        if differing:
            key = differing[0]
            problems.append(
                f"group {group.label}: drafter groups share one target and one data order, but {key} = {mine[key]!r} "
                f"here and {reference[key]!r} in group {groups[0].label}"
                + (f" (and {len(differing) - 1} more settings)" if len(differing) > 1 else "")
            )
    return problems


def launch_and_output_problems(groups: list[DrafterGroup]) -> list[str]:
    """The launch's process count and every group's run directory, checked as a single run checks its own: a
    streamed group as a run with the target workers and its share of the drafter ranks (``group_world_size``)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    targets = groups[0].cfg.topology.target_workers
    drafter_ranks = world_size - targets
    if targets > 0 and drafter_ranks > 0 and drafter_ranks % len(groups):
        return [f"topology.target_workers = {targets} leaves {drafter_ranks} drafter ranks of the launch's "
                f"{world_size} processes, which do not split evenly into {len(groups)} drafter groups (launch "
                f"{targets} + {len(groups)} x D processes, D drafter ranks per group)"]
    group_world = group_world_size(groups[0].cfg, world_size, len(groups))
    return [f"group {g.label}: {problem}" for g in groups
            for problem in launch_problems(g.cfg, group_world) + output_dir_problems(g.cfg)]


def group_world_size(cfg: RecipeConfig, world_size: int, num_groups: int) -> int:
    """The processes a single run of one group's recipe would have: colocated, all of them (every process trains
    every group); streamed, the target workers and the group's ``(world_size - T) / num_groups`` drafter ranks."""
    targets = cfg.topology.target_workers
    if targets == 0:
        return world_size
    return targets + (world_size - targets) // num_groups


def prepare_directories(groups: list[DrafterGroup], dry_run: bool) -> None:
    """Prove (dry run) or make every folder the groups write writable, as a single run does for its own."""
    prepare = check_output_dir if dry_run else ensure_output_dir
    for group in groups:
        if group.cfg.data.cache_dir:
            prepare(group.cfg.data.cache_dir, "data.cache_dir")
        prepare(group.cfg.run.output_dir, f"run.output_dir of group {group.label}")


def groups_record(groups: list[DrafterGroup]) -> dict:
    """What ``<run.output_dir>/groups.json`` lists: every group's label, recipe, kind, seeds and directory."""
    return {"groups": [
        {"label": g.label, "recipe": g.recipe, "kind": g.cfg.drafter.kind, "seed": g.cfg.run.seed,
         "data_seed": g.cfg.run.data_seed, "output_dir": str(g.out_dir)} for g in groups
    ]}


def write_groups_record(groups: list[DrafterGroup]) -> Path:
    path = groups[0].out_dir.parent.parent / GROUPS_FILE
    path.write_text(json.dumps(groups_record(groups), indent=2) + "\n")
    return path


def dry_run_text(groups: list[DrafterGroup]) -> str:
    """What ``--dry-run`` prints for a grouped run: each group's resolved config, one YAML document each."""
    return "".join(f"---\n# group {g.label} ({g.cfg.run.output_dir})\n{resolved_yaml(g.cfg)}" for g in groups)
