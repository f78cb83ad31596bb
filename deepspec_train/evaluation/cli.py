"""``deepspec eval``: exact speculative decoding of prompt suites with an HF target and a trained drafter.

    deepspec eval --target DIR --drafter DIR --suite tinyworld:math --tinyworld WORLD \\
        [--suite FILE.jsonl ...] [--block-size K] [--temperature T] [--max-new-tokens N] [--max-prompts N] \\
        [--seed S] --out results.json [--save-traces TRACES.jsonl]

    deepspec eval --target DIR --suite gsm8k=FILE --suite humaneval=FILE ... --drafter NAME=DIR --drafter ... \\
        [--baseline NAME] [--temperature T ...] [--seed S ...] [--max-prompts N] --out OUT_DIR [--wandb]

``--drafter`` is an export directory, a training output (``<run>/drafter``) or a published drafter. With several
drafters, or one given as ``NAME=DIR``, the command compares them on the paper's Table-1 layout in ``OUT_DIR``
(``evaluation.comparison_eval``, which always writes the traces); with one plain ``--drafter`` it writes
``results.json`` as below. Each prompt of each suite is decoded as one conversation (all its turns); an empty
suite (no prompts, or ``--max-prompts 0``) is refused before any model loads, and so is a target other than the
one the drafter was trained for. ``results.json`` holds tau, conditional acceptance per position and tokens/s per
suite and category (``deepspec_train.evaluation.report``); ``--save-traces`` writes the per-round traces
(``deepspec_train.formats.eval_traces``), the input of ``deepspec calibrate`` and ``deepspec simulate``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import ensure_output_dir, ensure_output_file
from deepspec_train.evaluation.report import ConversationStats, build_results, summary_table
from deepspec_train.evaluation.suites import Suite, load_suite
from deepspec_train.formats.eval_traces import TraceRound, write_traces
from deepspec_train.common.model_folders import check_drafter_folder, check_target_folder

if TYPE_CHECKING:
    from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model directory (from_pretrained)")
    parser.add_argument("--drafter", action="append", required=True,
                        help="exported drafter or a training run's drafter directory; NAME=DIR, repeated, compares")
    parser.add_argument("--suite", action="append", required=True,
                        help="suite JSONL file, NAME=FILE (from `deepspec suites prepare`) or tinyworld:NAME")
    parser.add_argument("--tinyworld", default=None, help="tiny world directory for tinyworld:NAME suites")
    parser.add_argument("--chat-template", default="",
                        help="chat template for a target without one (built-in name: chatml; or a Jinja file)")
    parser.add_argument(
        "--block-size", type=int, default=None, help="drafted tokens per round (default: the drafter's maximum)"
    )
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0],
                        help="sampling temperature(s); 0 means greedy (several: a comparison only)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn")
    parser.add_argument("--max-prompts", type=int, default=None, help="first N prompts of each suite")
    parser.add_argument("--seed", type=int, nargs="+", default=[0],
                        help="sampling seed(s) (several: a comparison only)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True, help="results.json path; a directory for a comparison")
    parser.add_argument("--save-traces", default=None, help="write per-round traces (JSONL) here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--baseline", default=None, help="comparison: the drafter of the ratios' denominator "
                        "(default: the first --drafter)")
    parser.add_argument("--bootstrap-replicates", type=int, default=2000, help="comparison: paired bootstrap draws")
    parser.add_argument("--workers", type=int, default=1,
                        help="comparison: decoding processes of one thread each, on the CPU (the rows do not depend "
                        "on the count)")
    parser.add_argument("--wandb", action="store_true", help="comparison: one W&B run per drafter (offline unless "
                        "WANDB_MODE says otherwise)")
    parser.add_argument("--wandb-project", default="deepspec", help="comparison: W&B project")
    parser.add_argument("--wandb-group", default=None,
                        help="comparison: W&B group (default: the target's directory name, as the training runs')")


def is_comparison(args: argparse.Namespace) -> bool:
    """Several drafters, or one named ``NAME=DIR``: the Table-1 comparison rather than one ``results.json``."""
    return len(args.drafter) > 1 or any(_is_named(d) for d in args.drafter)


def _is_named(spec: str) -> bool:
    return "=" in spec and not Path(spec).exists()


def drafter_directory(spec: str) -> str:
    """The directory a ``--drafter`` value names: ``DIR`` or the part after ``NAME=``."""
    return spec.partition("=")[2] if _is_named(spec) else spec


def evaluate_suites(decoder: SpeculativeDecoder, suites: list[Suite], max_new_tokens: int, progress: bool = True):
    """Decode every prompt of every suite; returns (trace rows, per-conversation stats)."""
    from tqdm.auto import tqdm

    traces: list[TraceRound] = []
    stats: list[ConversationStats] = []
    total = sum(len(s.prompts) for s in suites)
    with tqdm(total=total, desc="eval", unit="prompt", disable=not progress, dynamic_ncols=True) as bar:
        for suite in suites:
            for prompt in suite.prompts:
                turns, _ = decoder.decode_conversation(prompt.turns, max_new_tokens)
                for turn in turns:
                    for record in turn.rounds:
                        traces.append(record.trace(suite.name, prompt.category, prompt.id))
                stats.append(
                    ConversationStats(
                        suite=suite.name,
                        category=prompt.category,
                        new_tokens=sum(len(t.tokens) for t in turns),
                        seconds=sum(t.seconds for t in turns),
                    )
                )
                bar.update(1)
    return traces, stats


def run(args: argparse.Namespace) -> int:
    # Outputs are checked before anything is read: a comparison writes a folder, a single drafter one file.
    comparison = is_comparison(args)
    out = ensure_output_dir(args.out, "--out") if comparison else ensure_output_file(args.out, "--out")
    if args.save_traces and not comparison:
        ensure_output_file(args.save_traces, "--save-traces")
    suites = [load_suite(spec, args.tinyworld, args.max_prompts) for spec in args.suite]
    names = [s.name for s in suites]
    if len(set(names)) != len(names):
        raise UserError(f"suite names must be distinct, got {names}")
    # The models' folders (headers only, nothing fetched) before torch and transformers are imported, so that a
    # wrong path is refused at once.
    check_target_folder(args.target, "--target", tokenizer=True)
    for spec in args.drafter:
        check_drafter_folder(drafter_directory(spec), "--drafter")
    import torch
    from transformers import AutoModelForCausalLM

    from deepspec_train.evaluation.comparison_eval import run_comparison
    from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder, prompt_tokenizer
    from deepspec_train.formats.drafter_loader import load_exported_drafter

    if comparison:
        return run_comparison(args, suites)
    if len(args.temperature) > 1 or len(args.seed) > 1:
        raise UserError("several --temperature or --seed values need a comparison: name the drafter(s) NAME=DIR")
    args.drafter, args.temperature, args.seed = args.drafter[0], args.temperature[0], args.seed[0]
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    tokenizer = prompt_tokenizer(args.target, args.chat_template)
    loaded = load_exported_drafter(args.drafter, target_path=args.target, device=device)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    target.requires_grad_(False)
    drafter = loaded.block_drafter()
    block_size = args.block_size or drafter.max_block_size
    decoder = SpeculativeDecoder(
        target,
        tokenizer,
        drafter,
        loaded.target_layer_ids,
        block_size,
        args.temperature,
        generator=torch.Generator(device=device).manual_seed(args.seed),
        confidence_temperatures=loaded.confidence_temperatures,
    )
    traces, stats = evaluate_suites(decoder, suites, args.max_new_tokens, progress=not args.no_progress)
    header = {
        "target": args.target,
        "drafter": args.drafter,
        "drafter_kind": loaded.kind,
        "block_size": block_size,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }
    results = build_results(traces, stats, block_size, header)
    out.write_text(json.dumps(results, indent=2))
    if args.save_traces:
        write_traces(args.save_traces, traces)
    print(summary_table(results))
    print(f"results: {out}" + (f"; traces: {args.save_traces}" if args.save_traces else ""))
    return 0
