"""The ``deepspec`` console script: one verb per pipeline stage (tinyworld, regenerate, train, ...).

Each verb lives in its own module that exposes ``add_arguments(parser)`` and ``run(args) -> int``; this file only
wires them together. A verb's module is imported by an ordinary import statement inside its loader, run only when
that verb is used: ``deepspec --help`` stays fast (some verbs import torch at once), and an import checker still
sees every edge. A verb reports bad input by raising ``errors.UserError``: it is printed as ``error: <one line>``
and the command exits with status 2 (the exit statuses are listed in ``deepspec_train.common.errors``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from deepspec_train.common.errors import run_verb
from deepspec_train.common.package_version import package_version


@dataclass(frozen=True)
class Verb:
    """One verb: its one-line help and the loader of its module (``add_arguments``, ``run``)."""

    help: str
    load: Callable[[], ModuleType]


# verb -> Verb, in the order ``deepspec --help`` lists them.
VERBS: dict[str, Verb] = {}


def _verb(name: str, help_text: str) -> Callable[[Callable[[], ModuleType]], Callable[[], ModuleType]]:
    """Register the decorated loader as verb ``name``'s."""

    def register(load: Callable[[], ModuleType]) -> Callable[[], ModuleType]:
        VERBS[name] = Verb(help_text, load)
        return load

    return register


@_verb("tinyworld", "build the tiny world: corpus, tokenizer, target, conversations")
def _tinyworld() -> ModuleType:
    from deepspec_train.tinyworld import cli

    return cli


@_verb("regenerate", "rewrite a prompt set's answers with the target")
def _regenerate() -> ModuleType:
    from deepspec_train.regenerate import cli

    return cli


@_verb("realworld", "a real target from a GGUF file (SmolLM2), and its prompt sets")
def _realworld() -> ModuleType:
    from deepspec_train.realworld import cli

    return cli


@_verb("train", "train a drafter from a recipe (same as train.py)")
def _train() -> ModuleType:
    from deepspec_train.commands import train

    return train


@_verb("calibrate", "fit per-position confidence temperatures from eval traces")
def _calibrate() -> ModuleType:
    from deepspec_train.calibration import cli

    return cli


@_verb("export", "write a drafter as safetensors + config.json for serving engines")
def _export() -> ModuleType:
    from deepspec_train.export import cli

    return cli


@_verb("profile-sps", "measure target verification steps/s per batch size")
def _profile_sps() -> ModuleType:
    from deepspec_train.scheduling import profile_cli

    return profile_cli


@_verb("simulate", "replay eval traces as N users: scheduler vs fixed gamma")
def _simulate() -> ModuleType:
    from deepspec_train.scheduling import simulate_cli

    return simulate_cli


@_verb("compare", "compare drafters: markdown tables, PNG plots, optional W&B run")
def _compare() -> ModuleType:
    from deepspec_train.comparison import cli

    return cli


@_verb("suites", "prepare the paper's benchmark suites (GSM8K, ...) from local files")
def _suites() -> ModuleType:
    from deepspec_train.suites import cli

    return cli


@_verb("eval", "exact speculative decoding of prompt suites: tau, acceptance, traces")
def _eval() -> ModuleType:
    from deepspec_train.evaluation import cli

    return cli


@_verb("data", "check data sources with a target's tokenizer (no weights)")
def _data() -> ModuleType:
    from deepspec_train.commands import data_check

    return data_check


@_verb("recipes", "list the recipes, show one resolved, or copy one to edit")
def _recipes() -> ModuleType:
    from deepspec_train.commands import recipes

    return recipes


@_verb("env", "versions of python, torch and the libraries, CUDA and its devices")
def _env() -> ModuleType:
    from deepspec_train.commands import env

    return env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepspec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"deepspec_train {package_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, verb in VERBS.items():
        sub.add_parser(name, help=verb.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``deepspec ARGV`` (None: the command line); its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in VERBS:
        parser.parse_args(argv)
        return 2
    name, rest = argv[0], argv[1:]
    verb = VERBS[name]
    module = verb.load()
    return run_verb(f"deepspec {name}", verb.help, module.add_arguments, module.run, rest)


if __name__ == "__main__":
    sys.exit(main())
