"""How the benchmarks train their drafters: every (recipe, training seed) of a comparison as a drafter group, over
as few target passes as the recipes and ``--train-jobs`` allow (``jobs.drafter_groups``).

``plan_training`` turns a comparison (recipes, training seeds, overrides) into ``train.py recipe=FIRST
compare=[...] seeds=N`` command lines, exactly as a user types them:

- recipes that may share a target pass (same target, data and batch settings: the rule of
  ``drafter_groups.shared_setting_problems``, asked of ``load_groups`` itself) go into one pass; a recipe that may
  not trains in a pass of its own, with a one-line note naming the setting;
- with ``jobs`` > 1 a pass is split by recipe (round robin in the order given, so that costliest-first orders
  balance) into up to ``jobs`` commands that run side by side; each pays its own target forward, but one-thread
  processes use two cores better than one two-thread process does on tiny models;
- every command pins ``run.data_seed`` to the comparison's (the first recipe's), so each group trains the same
  sequences in the same order however the recipes are split, and each group's run is bit for bit the one a single
  grouped command would give;
- every group's run directory is ``OUT/groups/<recipe>-seed<seed>/`` (all commands share ``run.output_dir`` =
  OUT), and ``OUT/groups.json`` lists every group of the comparison once training is over.

With ``reuse`` a comparison accumulates over invocations: ``stop_at`` (``train.stop_at_step``) ends this invocation's
runs early on the schedule of ``train.max_steps``; a later invocation with a larger ``stop_at`` continues every run
from its last checkpoint (``train.resume=auto``) instead of starting over, and a run that already reached it is not
trained again.

``train_all`` runs the commands ``jobs`` at a time and times each one; ``tokens_per_pass`` counts the target tokens
each pass forwards (the x axis of the learning curves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.config.loader import ConfigError
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.jobs.drafter_groups import (
    DrafterGroup, load_groups, parse_group_command_line, write_groups_record,
)
from deepspec_train.training.preemption import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TrainingPlan:
    """The groups of a comparison by (recipe, training seed index), the commands that still have to run (by name:
    their recipes joined with '+'), and the notes about recipes that could not share a pass."""

    groups: dict[tuple[str, int], DrafterGroup]
    commands: dict[str, list[str]]
    notes: list[str]

    def run_dir(self, recipe: str, seed: int) -> Path:
        return self.groups[(recipe, seed)].out_dir

    def command_of(self, recipe: str) -> str | None:
        """The name of the command that trains ``recipe``, or None when it is reused."""
        return next((name for name in self.commands if recipe in name.split("+")), None)

    def write_record(self) -> Path:
        """``OUT/groups.json`` listing every group of the comparison (each command wrote only its own)."""
        return write_groups_record(list(self.groups.values()))


def reached_step(run_dir: Path) -> int:
    """The last step a run directory holds: its summary's (a run that ended or stopped at ``train.stop_at_step``),
    else its newest checkpoint's (a preempted run), else 0."""
    summary = run_dir / "summary.json"
    if summary.is_file():
        return int(json.loads(summary.read_text())["steps"])
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() else []
    return int(checkpoints[-1].name.removeprefix("step_")) if checkpoints else 0


def group_words(recipes: list[str], seeds: int, shared: list[str], per_recipe: dict[str, list[str]]) -> list[str]:
    """The ``train.py`` arguments of one grouped run of ``recipes`` x ``seeds``."""
    compare = [f"compare=[{','.join(recipes[1:])}]"] if len(recipes) > 1 else []
    return [f"recipe={recipes[0]}", *compare, f"seeds={seeds}", *shared,
            *(f"{r}:{override}" for r in recipes for override in per_recipe.get(r, []))]


def _load(recipes: list[str], seeds: int, shared: list[str], per_recipe: dict[str, list[str]]) -> list[DrafterGroup]:
    return load_groups(parse_group_command_line(group_words(recipes, seeds, shared, per_recipe)))


def plan_training(recipes: list[str], seeds: int, shared: list[str], per_recipe: dict[str, list[str]], out: Path,
                  jobs: int, reuse: bool, stop_at: int | None = None) -> TrainingPlan:
    """The plan of a comparison (see the module docstring). ``shared`` are the overrides of every group (paths,
    budget), ``per_recipe`` those of one recipe's groups; a recipe that does not validate ends the benchmark with
    its one-line error. With ``reuse`` a recipe whose every training seed has a drafter at ``stop_at`` (or at the
    end of its schedule) is not trained again, and one whose every seed left a checkpoint short of it continues."""
    if jobs < 1:
        raise SystemExit(f"--train-jobs must be at least 1, got {jobs}")
    shared = [*shared, f"run.output_dir={out}"]
    if stop_at is not None:
        shared.append(f"train.stop_at_step={stop_at}")
    try:
        for recipe in recipes:
            _load([recipe], 1, shared, per_recipe)
        data_seed = _load(recipes[:1], 1, shared, per_recipe)[0].cfg.run.data_seed
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    shared.append(f"run.data_seed={data_seed}")
    passes: list[list[str]] = []
    notes: list[str] = []
    for recipe in recipes:
        refusals = []
        for members in passes:
            try:
                _load([members[0], recipe], 1, shared, per_recipe)
            except ConfigError as exc:
                refusals.append(str(exc))
                continue
            members.append(recipe)
            break
        else:
            if refusals:
                notes.append(f"note: {recipe} trains in a target pass of its own ({refusals[0]})")
            passes.append([recipe])
    groups: dict[tuple[str, int], DrafterGroup] = {}
    commands: dict[str, list[str]] = {}
    for members in passes:
        loaded = _load(members, seeds, shared, per_recipe)
        for index, group in enumerate(loaded):
            groups[(members[index // seeds], index % seeds)] = group
        reached = {r: [reached_step(groups[(r, s)].out_dir) if reuse else 0 for s in range(seeds)] for r in members}
        fresh = [r for r in members if min(reached[r]) == 0]
        # A schedule of train.epochs has no step count known here: a run of it that ended is done.
        end = stop_at or groups[(members[0], 0)].cfg.train.max_steps
        continued = [r for r in members if 0 < min(reached[r]) and end is not None and min(reached[r]) < end]
        for todo, start in ((fresh, "run.overwrite=true"), (continued, "train.resume=auto")):
            parts = min(jobs, len(todo))
            for k in range(parts):
                chunk = todo[k::parts]
                commands["+".join(chunk)] = [sys.executable, str(REPO / "train.py"),
                                             *group_words(chunk, seeds, [*shared, start], per_recipe)]
        for r in continued:
            notes.append(f"note: {r} continues from step {min(reached[r])} to {end} (train.resume=auto)")
    return TrainingPlan(groups, commands, notes)


def tokens_per_pass(cfg: RecipeConfig, passes: int) -> list[int]:
    """The target tokens of each of the first ``passes`` target passes of ``cfg``'s run, from its plan's own
    sequences (every group of a comparison trains the same ones: ``run.data_seed`` is pinned)."""
    from deepspec_train.data.token_shards import build_token_dataset
    from deepspec_train.jobs.assembly import conversation_renderer, train_plan

    rows, _ = build_token_dataset(cfg.data.train, conversation_renderer(cfg), cfg.data.cache_dir, progress=False)
    plan = train_plan(cfg, rows, 0, 1)
    return [sum(len(rows[i]["input_ids"]) for i in plan.sequence_indices(p)) for p in range(passes)]


def train_all(commands: dict[str, list[str]], jobs: int, log_dir: Path) -> dict[str, dict[str, float]]:
    """Run the training commands ``jobs`` at a time, each with ``cores // jobs`` torch threads; per command, its
    wall seconds and CPU seconds (user + system of its process tree: on a shared machine the better guide to its
    time alone). With more than one job each command's output goes to ``log_dir / NAME.log``."""
    if jobs < 1:
        raise SystemExit(f"--train-jobs must be at least 1, got {jobs}")
    threads = max(1, len(os.sched_getaffinity(0)) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if jobs > 1 else None
    pending, running, seconds = list(commands), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            print("train:", " ".join(commands[name][1:]), flush=True)
            log = open(log_dir / f"{name}.log", "w") if jobs > 1 else None
            process = subprocess.Popen(commands[name], cwd=REPO, env=env, stdout=log, stderr=log)
            running[process.pid] = (name, process, log, time.time())
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, process, log, start = running.pop(pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        if log is not None:
            log.close()
        if process.returncode != 0:
            for _, other, _, _ in running.values():
                other.terminate()
            where = f" (log: {log_dir / f'{name}.log'})" if log is not None else ""
            if process.returncode == PREEMPTED_EXIT_CODE:
                raise SystemExit(f"training {name} was stopped by a signal after writing its checkpoints{where}: "
                                 "run the same command with --reuse to continue it")
            raise SystemExit(f"training {name} failed with exit code {process.returncode}{where}")
        seconds[name] = {"wall_s": time.time() - start, "cpu_s": usage.ru_utime + usage.ru_stime}
    return seconds
