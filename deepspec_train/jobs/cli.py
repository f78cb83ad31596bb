"""The ``deepspec`` console script: one verb per pipeline stage (tinyworld, regenerate, train, ...).

Each verb lives in its own module that exposes ``add_arguments(parser)`` and ``run(args) -> int``; this file only
wires them together and imports a verb's module when that verb is used, so ``deepspec --help`` stays fast.
A verb reports bad input by raising ``errors.UserError``: it is printed as ``error: <one line>`` and the command
exits with status 2 (the exit statuses are listed in ``deepspec_train.common.errors``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from deepspec_train.common.errors import run_verb
from deepspec_train.common.package_version import package_version

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "tinyworld": ("deepspec_train.tinyworld.cli", "build the tiny world: corpus, tokenizer, target, conversations"),
    "regenerate": ("deepspec_train.regenerate.cli", "rewrite a prompt set's answers with the target"),
    "realworld": ("deepspec_train.realworld.cli", "a real target from a GGUF file (SmolLM2), and its prompt sets"),
    "train": ("deepspec_train.jobs.train_cli", "train a drafter from a recipe (same as train.py)"),
    "calibrate": ("deepspec_train.calibration.cli", "fit per-position confidence temperatures from eval traces"),
    "export": ("deepspec_train.export.cli", "write a drafter as safetensors + config.json for serving engines"),
    "profile-sps": ("deepspec_train.scheduling.profile_cli", "measure target verification steps/s per batch size"),
    "simulate": ("deepspec_train.scheduling.simulate_cli", "replay eval traces as N users: scheduler vs fixed gamma"),
    "compare": ("deepspec_train.comparison.cli", "compare drafters: markdown tables, PNG plots, optional W&B run"),
    "suites": ("deepspec_train.suites.cli", "prepare the paper's benchmark suites (GSM8K, ...) from local files"),
    "eval": ("deepspec_train.evaluation.cli", "exact speculative decoding of prompt suites: tau, acceptance, traces"),
    "data": ("deepspec_train.jobs.data_check_cli", "check data sources with a target's tokenizer (no weights)"),
    "recipes": ("deepspec_train.jobs.recipes_cli", "list the recipes, show one resolved, or copy one to edit"),
    "env": ("deepspec_train.jobs.env_cli", "versions of python, torch and the libraries, CUDA and its devices"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepspec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"deepspec_train {package_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (_, help_text) in VERBS.items():
        sub.add_parser(verb, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in VERBS:
        parser.parse_args(argv)
        return 2
    verb, rest = argv[0], argv[1:]
    module = importlib.import_module(VERBS[verb][0])
    return run_verb(f"deepspec {verb}", VERBS[verb][1], module.add_arguments, module.run, rest)


if __name__ == "__main__":
    sys.exit(main())
