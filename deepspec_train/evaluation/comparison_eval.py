"""``deepspec eval`` with several drafters: every prompt of every suite decoded by every drafter in turn, at each
temperature and seed, summarised as the paper's Table 1 (``evaluation.table1``).

    deepspec eval --target DIR --suite gsm8k=suites/gsm8k.jsonl --suite humaneval=suites/humaneval.jsonl \\
        --drafter dspark=runs/dspark/drafter --drafter eagle3=runs/eagle3/drafter --baseline eagle3 \\
        --temperature 1 0 --seed 0 1 2 --max-prompts 20 --out reports/table1 [--wandb]

Decoding is interleaved prompt by prompt (``drafter_comparison.decode_interleaved``, in ``--workers`` processes of
one thread each on the CPU), so load on a shared machine falls on all drafters alike; each (seed, suite, prompt)
decode has its own generator seed, the same for every drafter. At temperature 0 decoding is greedy and only the
first seed is decoded. Each drafter drafts its own trained block size. The output directory gets ``table1.md`` and
``table1.json`` (every temperature), ``tau_per_suite_T<t>.png``, ``conditional_acceptance_<suite>_T<t>.png`` and
``tau_by_{answer,context}_position_<suite>_T<t>.png`` (tau per position bucket, one line per drafter), per drafter
and temperature the trace rounds (``traces/<drafter>_T<t>.jsonl``) and ``deepspec eval``'s ``results.json``
(``<drafter>/results_T<t>.json``, which ``deepspec compare`` reads), and with ``--wandb`` one W&B run per drafter
(``evaluation.wandb_runs``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from deepspec_train.comparison.collect import DrafterRow
from deepspec_train.comparison.plots import acceptance_file, plot_tau_per_suite, position_file
from deepspec_train.comparison.position_plots import (
    BucketPoint, plot_conditional_acceptance, plot_tau_by_bucket, settings_title, titled,
)
from deepspec_train.common.errors import UserError
from deepspec_train.evaluation.drafter_comparison import BenchDrafter, DecodeSettings, decode_interleaved
from deepspec_train.evaluation.position_buckets import POSITION_AXES, POSITION_BUCKETS
from deepspec_train.evaluation.report import ConversationStats, build_results
from deepspec_train.evaluation.speculative_decoder import prompt_tokenizer
from deepspec_train.evaluation.suites import Suite
from deepspec_train.evaluation.table1 import Table1, TableSettings, build_table1, table1_markdown
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.formats.eval_traces import write_traces


def named_drafters(specs: list[str]) -> list[tuple[str, str]]:
    """``(name, directory)`` of each ``NAME=DIR`` (or ``DIR``, named after the directory); names must differ."""
    pairs = []
    for spec in specs:
        name, separator, directory = spec.partition("=")
        if not separator or Path(spec).exists():
            path = Path(spec)
            name, directory = (path.parent.name if path.name == "drafter" else path.name), spec
        if not name or not directory:
            raise UserError(f"--drafter {spec!r}: expected NAME=DIR")
        pairs.append((name, directory))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise UserError(f"drafter names must be distinct, got {names}: name them with --drafter NAME=DIR")
    return pairs


def temperature_tag(temperature: float) -> str:
    return f"T{temperature:g}"


def drafter_rows(table: Table1, kinds: dict[str, str], out: Path) -> list[DrafterRow]:
    """The comparison package's rows for this table, so its plots draw it (intervals and counts included)."""
    return [DrafterRow(name=d, source=out, kind=kinds[d], tau=dict(table.tau[d]),
                       tau_interval={s: (e.low, e.high) for s, e in table.tau_interval[d].items()},
                       prompts=dict(table.prompts), conditional_acceptance=dict(table.acceptance[d]),
                       acceptance_rounds=dict(table.acceptance_rounds[d]), temperature=table.temperature,
                       seeds=list(table.seeds)) for d in table.drafters]


def write_plots(table: Table1, kinds: dict[str, str], out: Path) -> list[Path]:
    """Tau per suite as grouped bars over the paired ratios against the baseline, each suite's acceptance curves
    and its tau per position bucket on each axis, tagged with the temperature."""
    rows = drafter_rows(table, kinds, out)
    tag = temperature_tag(table.temperature)
    ratios = {d: {s: (e.value, e.low, e.high) for s, e in by_suite.items()} for d, by_suite in table.ratios.items()}
    paths = [plot_tau_per_suite(rows, out / f"tau_per_suite_{tag}.png", ratios, table.baseline)]
    buckets = [b.name for b in POSITION_BUCKETS]
    for suite in table.suites:
        name = acceptance_file(suite).removesuffix(".png")
        paths.append(plot_conditional_acceptance(rows, suite, out / f"{name}_{tag}.png"))
        for axis in (POSITION_AXES[name] for name in table.positions):
            curves = {d: [BucketPoint(b.tau, *((b.interval.low, b.interval.high) if b.interval else (None, None)),
                                      b.rounds) for b in table.positions[axis.name][d][suite]] for d in table.drafters}
            name = position_file(axis.name, suite).removesuffix(".png")
            title = titled(f"tau by {axis.name} position on {suite}", settings_title(rows))
            paths.append(plot_tau_by_bucket(curves, buckets, axis.label, title, out / f"{name}_{tag}.png"))
    return paths


def run_comparison(args: argparse.Namespace, suites: list[Suite]) -> int:
    """The multi-drafter ``deepspec eval``; ``args`` are the verb's (``evaluation.cli``)."""
    if args.block_size is not None:
        raise UserError("--block-size applies to one drafter; in a comparison each drafter drafts its trained block")
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1 and torch.device(args.device).type != "cpu":
        raise UserError(f"--workers {args.workers} decodes in CPU processes; with --device {args.device} use 1")
    specs = named_drafters(args.drafter)
    baseline = args.baseline or specs[0][0]
    if baseline not in {n for n, _ in specs}:
        raise UserError(f"--baseline {baseline!r} is not one of the drafters {[n for n, _ in specs]}")
    out = Path(args.out)
    device = torch.device(args.device)
    tokenizer = prompt_tokenizer(args.target, args.chat_template)
    drafters = [BenchDrafter.of(name, load_exported_drafter(path, target_path=args.target, device=device))
                for name, path in specs]
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    target.requires_grad_(False)
    kinds = {d.name: d.loaded.kind for d in drafters}
    modeled = {d.name: d.modeled_draft_us() for d in drafters}
    tables, plots = [], []
    for temperature in args.temperature:
        seeds = args.seed[:1] if temperature == 0 else args.seed
        conversations: dict[str, list[ConversationStats]] = {}
        decoding = DecodeSettings(temperature, tuple(seeds), args.max_new_tokens)
        rows = decode_interleaved(target, tokenizer, drafters, suites, decoding, not args.no_progress, conversations,
                                  args.workers)
        settings = TableSettings(baseline, temperature, tuple(seeds), tuple(s.name for s in suites),
                                 args.bootstrap_replicates)
        table = build_table1(rows, {d.name: d.block_size for d in drafters},
                             {d.name: d.sequential_layer_passes() for d in drafters}, settings, modeled)
        tag = temperature_tag(temperature)
        for d in drafters:
            write_traces(out / "traces" / f"{d.name}_{tag}.jsonl", rows[d.name])
            header = {"target": args.target, "drafter": d.name, "drafter_kind": d.loaded.kind,
                      "block_size": d.block_size, "temperature": temperature, "max_new_tokens": args.max_new_tokens,
                      "seeds": list(seeds)}
            results = build_results(rows[d.name], conversations[d.name], d.block_size, header)
            (out / d.name).mkdir(exist_ok=True)
            (out / d.name / f"results_{tag}.json").write_text(json.dumps(results, indent=2))
        tables.append(table)
        plots.extend(write_plots(table, kinds, out))
    markdown = "\n\n".join(table1_markdown(t) for t in tables)
    (out / "table1.md").write_text(f"# Table 1: {', '.join(kinds)} on {', '.join(s.name for s in suites)}\n\n"
                                   f"{markdown}\n")
    (out / "table1.json").write_text(json.dumps({"target": args.target, "drafters": dict(specs), "kinds": kinds,
                                                 "tables": [t.to_dict() for t in tables]}, indent=2))
    print(markdown)
    print(f"wrote {out / 'table1.md'}, table1.json and {len(plots)} plot(s) in {out}")
    if args.wandb:
        from deepspec_train.evaluation.wandb_runs import log_drafter_runs

        run_dirs = log_drafter_runs(tables, kinds, plots, args.wandb_project, args.wandb_group or
                                    Path(args.target.rstrip("/")).name, out)
        print(f"W&B runs ({len(run_dirs)}): {', '.join(str(p) for p in run_dirs)}")
    return 0
