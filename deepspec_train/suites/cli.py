"""``deepspec suites``: prepare the published benchmark suites from local dataset files.

    deepspec suites list
    deepspec suites prepare gsm8k --input ~/data/gsm8k --out suites/gsm8k.jsonl [--split test] \\
        [--sample 500 [--sample-seed 980406]] [--all-turns]

``--input`` is a file (JSONL, JSON, Parquet, Arrow, gzipped or not), a ``datasets.save_to_disk`` directory, a
``datasets`` cache directory or a folder of downloaded files, in the dataset's published schema
(``suites.dataset_rows``). The written file is what ``deepspec eval --suite NAME=FILE`` reads. A missing or
wrong file fails in one line.
"""

from __future__ import annotations

import argparse

from deepspec_train.suites.benchmarks import BENCHMARK_SUITES, benchmark_suite
from deepspec_train.suites.prepare import DEEPSPEC_SEED, prepare_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("list", help="the suites, their published source and split, and DeepSpec's sample size")
    prepare = sub.add_parser("prepare", help="write a suite's prompt file from a local copy of its dataset")
    prepare.add_argument("name", help=f"one of: {', '.join(BENCHMARK_SUITES)}")
    prepare.add_argument("--input", required=True, help="dataset file or directory, in the published schema")
    prepare.add_argument("--out", required=True, help="prompt file to write (JSONL)")
    prepare.add_argument("--split", default=None, help="split to read (default: the one DeepSpec evaluates)")
    prepare.add_argument("--sample", type=int, default=None,
                         help="keep this many prompts, drawn as DeepSpec draws them (see `deepspec suites list`)")
    prepare.add_argument("--sample-seed", type=int, default=DEEPSPEC_SEED, help="seed of the draw (DeepSpec's)")
    prepare.add_argument("--all-turns", action="store_true",
                         help="keep every user turn (MT-Bench's second); DeepSpec decodes the first only")
    prepare.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _list() -> None:
    print(f"{'suite':<14} {'domain':<6} {'split':<6} {'paper n':>7}  source")
    for suite in BENCHMARK_SUITES.values():
        print(f"{suite.name:<14} {suite.domain:<6} {suite.split:<6} {suite.paper_prompts:>7}  {suite.source}")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        _list()
        return 0
    suite = benchmark_suite(args.name)
    prepared = prepare_suite(suite, args.input, args.out, args.split, args.sample, args.sample_seed,
                             args.all_turns, progress=not args.no_progress)
    kept = len(prepared.prompts)
    sampled = f" (sampled from {prepared.rows})" if kept < prepared.rows else ""
    print(f"{suite.name}: {kept} prompts{sampled} -> {args.out}")
    return 0
