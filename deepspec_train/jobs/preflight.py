"""What a training run reads before it writes anything, checked the same way by ``--dry-run`` and by a real run.

``preflight(cfg)`` reads the target folder (readable safetensors headers, its ``config.json`` having passed
``kinds.recipe_validation.load_recipe``), ``drafter.init_from``, the first rows of every local data source (it exists,
holds rows, and they have one shape: ``data.shape_detection``) and, last because it imports transformers and torch, the
target's tokenizer. Each finding is one line: ``ok``, ``not checked`` (a datasets hub name, read only when the run
starts) or ``stops`` (what a real run would refuse). A real run raises the first ``stops`` line before it creates
its folders (``commands.train_entry``); ``--dry-run`` prints them all after the resolved config and exits 2 when
one stops the run.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.data.conversations import looks_like_a_path
from deepspec_train.data.row_shapes import accepted_shapes, field_map
from deepspec_train.data.shape_detection import DETECTION_ROWS, open_source
from deepspec_train.common.errors import UserError
from deepspec_train.common.model_folders import (
    drafter_folder_problem, loaded_or_refused, model_folder_problem, tokenizer_problem,
)

OK, NOT_CHECKED, STOPS = "ok", "not checked", "stops"


@dataclass
class Finding:
    status: str
    text: str
    # The error behind a ``stops`` finding, chained to the refusal (its traceback shows with DEEPSPEC_DEBUG=1).
    cause: Optional[Exception] = None


@dataclass
class Preflight:
    findings: list[Finding] = field(default_factory=list)

    def add(self, status: str, text: str, cause: Optional[Exception] = None) -> None:
        self.findings.append(Finding(status, text, cause))

    @property
    def stops(self) -> list[str]:
        return [f.text for f in self.findings if f.status == STOPS]

    def refusal(self, dry_run: bool) -> Optional[UserError]:
        """The one-line error for the findings that stop the run (None when none does), chained to the first's
        cause: the first finding and how many more there are."""
        stopping = [f for f in self.findings if f.status == STOPS]
        if not stopping:
            return None
        where = "listed above" if dry_run else "--dry-run lists them"
        more = f" (and {len(stopping) - 1} more, {where})" if len(stopping) > 1 else ""
        error = UserError(f"{'the run would not start: ' if dry_run else ''}{stopping[0].text}{more}")
        error.__cause__ = stopping[0].cause
        return error

    def report(self) -> str:
        """The findings as YAML comment lines (``--dry-run`` prints them after the config, which stays valid YAML)."""
        width = max(len(status) for status in (OK, NOT_CHECKED, STOPS))
        lines = ["# dry run: what the run reads before it starts"]
        lines += [f"#   {f.status:<{width}}  {f.text}" for f in self.findings]
        verdict = "no: the lines marked 'stops' stop it" if self.stops else "yes"
        lines.append(f"# would a real run start: {verdict}")
        return "\n".join(lines) + "\n"


def _is_local(source: str) -> bool:
    return Path(os.path.expanduser(source)).exists() or glob.has_magic(source) or looks_like_a_path(source)


def check_data(cfg: RecipeConfig, checks: Preflight, shapeless_stops: bool = True) -> None:
    """The first rows of every local source of ``data.train`` and ``data.validation``. Without ``shapeless_stops``
    (a real run) a source whose first rows have no known shape is left to tokenising, whose refusal counts every
    row and names the first bad one (``data.usable_rows``); the refused run then removes its folder."""
    names = field_map(cfg.data.fields)
    for setting, sources in (("data.train", cfg.data.train), ("data.validation", cfg.data.validation)):
        for source in sources:
            if not _is_local(source):
                checks.add(NOT_CHECKED, f"{setting} {source}: a datasets hub name, read when the run starts")
                continue
            try:
                shaped = open_source(source, cfg.data.split, cfg.data.format, names)
            except UserError as error:
                checks.add(STOPS, f"{error} ({setting})", error)
                continue
            if shaped.shape is None:
                if shapeless_stops:
                    checks.add(STOPS, f"{setting} {source}: none of its first {DETECTION_ROWS} rows has a row shape "
                                      f"this project reads; row shapes accepted: {accepted_shapes()}; change "
                                      "data.format, data.fields (docs/howto/data.md)")
            else:
                how = "detected" if shaped.detected else "data.format"
                checks.add(OK, f"{setting} {source}: readable, {shaped.shape.name} rows ({how})")


def check_target_files(cfg: RecipeConfig, checks: Preflight) -> None:
    """The target folder's config.json and weights (headers only); a missing folder is listed as not checked."""
    path = cfg.target.path
    if not Path(os.path.expanduser(path)).exists():
        checks.add(STOPS, f"target.path {path}: target folder not found: its config.json, tokenizer and weights "
                          "not checked")
        return
    problem = model_folder_problem(path)
    found = problem or "config.json and weights (headers) readable"
    checks.add(STOPS if problem else OK, f"target.path {path}: {found}")


def check_tokenizer(cfg: RecipeConfig, checks: Preflight) -> None:
    """The target's tokenizer, loaded as the run loads it. Last, and only while nothing stops the run: loading it
    imports transformers and torch, seconds that a run refused anyway should not wait for."""
    path = cfg.target.path
    if model_folder_problem(path) is not None:
        return  # already reported by check_target_files
    if checks.stops:
        checks.add(NOT_CHECKED, f"target.path {path}: tokenizer not loaded (the run is stopped already)")
        return
    problem, cause = tokenizer_problem(path), None
    if problem is None:
        from transformers import AutoTokenizer

        try:
            loaded_or_refused(lambda: AutoTokenizer.from_pretrained(
                path, trust_remote_code=cfg.target.trust_remote_code), "its tokenizer does not load")
        except UserError as error:
            problem, cause = str(error), error
    checks.add(STOPS if problem else OK, f"target.path {path}: {problem or 'tokenizer loads'}", cause)


def check_init_from(cfg: RecipeConfig, checks: Preflight, who: str = "") -> None:
    """``drafter.init_from`` (when set) is a drafter folder; ``who`` names the group in a run of drafter groups."""
    source = cfg.drafter.init_from
    if source is None:
        return
    problem = drafter_folder_problem(source)
    checks.add(STOPS if problem else OK, f"{who}drafter.init_from {source}: {problem or 'a drafter folder'}")


def preflight(cfg: RecipeConfig, stop_early: bool = False,
              groups: Sequence[tuple[str, RecipeConfig]] = ()) -> Preflight:
    """Every check of the module docstring, the cheap ones first; ``stop_early`` (a real run) ends at the first
    finding that stops the run. ``groups``: the (label, recipe) of each group of a run of drafter groups, which
    share ``cfg``'s target and data; each group's ``drafter.init_from`` is checked, named by its label."""
    def init_from(_: RecipeConfig, found: Preflight) -> None:
        for label, group_cfg in groups:
            check_init_from(group_cfg, found, f"group {label}: ")

    checks = Preflight()
    data = partial(check_data, shapeless_stops=not stop_early)
    for check in (check_target_files, init_from if groups else check_init_from, data, check_tokenizer):
        check(cfg, checks)
        if stop_early and checks.stops:
            break
    return checks
