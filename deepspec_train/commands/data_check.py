"""``deepspec data check``: what a training run would make of data sources, read with a target's tokenizer.

    deepspec data check ../shared/datasets/gsm8k/train.jsonl --target artifacts/tinyworld/target [--json]

Reads the sources exactly as training does (the same renderer, ``jobs.assembly.conversation_renderer``'s
settings given as options: ``--format``, ``--field``, ``--chat-template``, ``--max-length``,
``--enable-thinking``) and prints per source the row shape detected, rows kept and skipped by reason with the
first offending ``file:line``, tokens and supervised tokens, the length distribution against ``--max-length``,
whether a run would refuse the source (``data.max_skipped_fraction``), and one rendered example with its
supervised spans marked ``[[...]]``. ``--json`` prints the same as one JSON object for scripts. It loads the
tokenizer only, never model weights; the token shards go to a temporary directory unless ``--cache-dir`` names
training's (``data.cache_dir``), which a run then reuses.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any, get_args

import numpy as np

from deepspec_train.config.schema import DataConfig, RowFormatName
from deepspec_train.data.chat_templates import with_chat_template
from deepspec_train.data.data_summary import DataSummary
from deepspec_train.data.usable_rows import describe_source
from deepspec_train.common.errors import UserError
from deepspec_train.common.model_folders import check_target_folder, loaded_or_refused

SUPERVISED_OPEN, SUPERVISED_CLOSE = "[[", "]]"
# Rendered characters of the example shown (the rest is cut, and says so).
EXAMPLE_CHARS = 1500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="report what a run would read from data sources (no model weights)")
    defaults = DataConfig()
    check.add_argument("sources", nargs="+", help="data sources, as data.train lists them")
    check.add_argument("--target", required=True, help="target model directory (its tokenizer is read)")
    check.add_argument("--format", default=defaults.format, choices=get_args(RowFormatName), help="data.format")
    check.add_argument("--field", action="append", default=[], metavar="NAME=FIELD",
                       help="data.fields entry, e.g. prompt=query (repeat for several)")
    check.add_argument("--chat-template", default=defaults.chat_template, help="data.chat_template")
    check.add_argument("--max-length", type=int, default=defaults.max_length, help="data.max_length")
    check.add_argument("--enable-thinking", action="store_true", help="data.enable_thinking")
    check.add_argument("--max-skipped-fraction", type=float, default=defaults.max_skipped_fraction,
                       help="data.max_skipped_fraction")
    check.add_argument("--split", default=defaults.split, help="data.split")
    check.add_argument("--cache-dir", default=None, help="data.cache_dir to fill (default: a temporary one)")
    check.add_argument("--json", action="store_true", help="print one JSON object")


def parse_fields(entries: list[str]) -> dict[str, str]:
    """``["prompt=query"]`` -> ``{"prompt": "query"}``, each name one ``data.fields`` knows."""
    known = DataConfig().fields.__dataclass_fields__
    fields = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not sep or name not in known or not value:
            raise UserError(f"--field {entry!r} must be NAME=FIELD with NAME one of {', '.join(known)}")
        fields[name] = value
    return fields


def run(args: argparse.Namespace) -> int:
    # Before the heavy imports, so a wrong path is refused at once. Only the tokenizer is read: the weights need not
    # be there, and a hub id is fetched when the hub answers.
    check_target_folder(args.target, "--target", weights=False, tokenizer=True, allow_hub=True)
    from transformers import AutoTokenizer

    from deepspec_train.data.token_shards import ConversationRenderer, build_token_dataset

    loaded = loaded_or_refused(lambda: AutoTokenizer.from_pretrained(args.target), f"--target {args.target}: its "
                               "tokenizer does not load")
    tokenizer = with_chat_template(loaded, args.chat_template)
    renderer = ConversationRenderer(
        tokenizer, args.max_length, {"enable_thinking": args.enable_thinking}, True, args.format,
        parse_fields(args.field),
    )
    with tempfile.TemporaryDirectory(prefix="deepspec-data-check-") as scratch:
        dataset, summary = build_token_dataset(
            args.sources, renderer, args.cache_dir or scratch, split=args.split, progress=False
        )
        report = check_report(summary, dataset, tokenizer, args.max_length, args.max_skipped_fraction)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def check_report(
    summary: DataSummary, dataset: Any, tokenizer: Any, max_length: int, max_skipped_fraction: float
) -> dict:
    """What a run would use, as a JSON-ready mapping (``format_report`` prints it for people)."""
    lengths = np.asarray(dataset["length"], dtype=np.int64)
    sources = []
    for source in summary.sources:
        mostly_skipped = source.read > 0 and source.skipped_count() > max_skipped_fraction * source.read
        sources.append({
            "source": source.source, "shape": source.shape, "detected": source.detected, "rows_read": source.read,
            "kept": source.kept, "skipped": dict(sorted(source.skipped.items())), "first_bad": source.first_bad,
            "tokens": source.total_tokens, "supervised_tokens": source.supervised_tokens,
            "refused_by_a_run": mostly_skipped or source.kept == 0, "summary": describe_source(source),
        })
    return {
        "sources": sources,
        "kept": summary.kept,
        "tokens": summary.total_tokens,
        "supervised_tokens": summary.supervised_tokens,
        "lengths": _length_distribution(lengths, max_length, summary.skipped.get("too_long", 0)),
        "example": _marked_example(dataset, tokenizer) if len(dataset) else None,
    }


def _length_distribution(lengths: np.ndarray, max_length: int, too_long: int) -> dict:
    shown = {"max_length": max_length, "too_long_skipped": too_long}
    if lengths.size == 0:
        return shown
    quantiles = np.percentile(lengths, [0, 50, 90, 99, 100]).round().astype(int).tolist()
    shown.update(zip(("min", "median", "p90", "p99", "max"), quantiles))
    shown["over_half_max_length"] = int((lengths > max_length // 2).sum())
    return shown


def _marked_example(dataset: Any, tokenizer: Any) -> str:
    """The first kept row decoded, each run of supervised tokens inside ``[[`` ``]]``."""
    row = dataset[0]
    pieces, run_ids, run_mask = [], [], None
    for token, supervised in zip(row["input_ids"], row["loss_mask"]):
        if run_mask is not None and supervised != run_mask:
            pieces.append(_decoded(tokenizer, run_ids, run_mask))
            run_ids = []
        run_ids.append(token)
        run_mask = supervised
    pieces.append(_decoded(tokenizer, run_ids, run_mask))
    text = "".join(pieces)
    if len(text) <= EXAMPLE_CHARS:
        return text
    return text[:EXAMPLE_CHARS] + f" ... ({len(text) - EXAMPLE_CHARS} more characters)"


def _decoded(tokenizer: Any, ids: list[int], supervised: int) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return f"{SUPERVISED_OPEN}{text}{SUPERVISED_CLOSE}" if supervised else text


def format_report(report: dict) -> str:
    """The report for people: one paragraph per source, the totals, the lengths and the example."""
    lines = []
    for source in report["sources"]:
        verdict = "a run would refuse it (see docs/howto/data.md)" if source["refused_by_a_run"] else "usable"
        lines.append(f"{source['summary']}; {source['tokens']} tokens, {source['supervised_tokens']} supervised; "
                     f"{verdict}")
    lengths = report["lengths"]
    lines.append(f"kept {report['kept']} rows, {report['tokens']} tokens, {report['supervised_tokens']} supervised")
    lines.append("lengths (tokens): " + ", ".join(f"{name} {value}" for name, value in lengths.items()))
    if report["example"] is not None:
        lines.append(f"example (supervised tokens in {SUPERVISED_OPEN} {SUPERVISED_CLOSE}):")
        lines.append(report["example"])
    return "\n".join(lines)
