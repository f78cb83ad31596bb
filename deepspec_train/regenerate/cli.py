"""``deepspec regenerate``: rewrite a prompt set's assistant turns with the target's answers.

Examples::

    # against running vLLM / SGLang servers (model = the served model name)
    deepspec regenerate --input prompts.jsonl --out regen.jsonl --backend http \\
        --endpoint http://node1:8000 --endpoint http://node2:8000 --model Qwen/Qwen3-8B --recipe qwen3-8b
    # a small target with transformers on this machine
    python -m deepspec_train.regenerate.cli --input prompts.jsonl --out regen.jsonl --backend local \\
        --model runs/tinyworld/target --batch-size 32

Sampling parameters come from the recipe's ``regenerate`` section (DeepSpec's defaults without one); flags
override single fields. Re-running the same command resumes. The exit status is 0 when every row is done,
1 when some failed (run again to retry them), 2 on a usage error (one line, before any request: the input is
the output, an endpoint is not an http(s) URL, a missing option). Every run appends its generation settings (and,
with the local backend, its answer tokens per second) to ``<out>.settings.json``. ``--output``, this verb's old
spelling of ``--out``, still works and prints a one-line notice on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from deepspec_train.config.loader import ConfigError, load_recipe_section
from deepspec_train.config.schema import TargetConfig
from deepspec_train.common.errors import UserError, run_verb
from deepspec_train.common.model_folders import check_target_folder
from deepspec_train.common.output_paths import ensure_output_file
from deepspec_train.regenerate.settings import SECTION, RegenerateConfig
from deepspec_train.regenerate.backend import ChatBackend
from deepspec_train.regenerate.runner import MULTI_TURN_MODES, check_output_is_not_input, regenerate_file
from deepspec_train.regenerate.sampling import SamplingParams


class _OutOrOldSpelling(argparse.Action):
    """Stores ``--out``; ``--output``, the spelling this verb had before every verb said ``--out``, still works
    (scripts written for it keep running) and prints a one-line deprecation notice on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if option_string == "--output":
            sys.stderr.write("warning: --output is deprecated: use --out, as every deepspec verb does\n")
        setattr(namespace, self.dest, values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="prompt set: JSONL / Parquet / Arrow / dataset directory")
    parser.add_argument("--out", "--output", dest="out", required=True, action=_OutOrOldSpelling,
                        help="JSONL written (and resumed) row by row (--output: the old spelling)")
    parser.add_argument("--backend", choices=("local", "http"), default="http")
    parser.add_argument("--model", default=None, help="local: model directory; http: the served model name")
    parser.add_argument("--endpoint", action="append", default=None, help="server base URL; repeat for several")
    parser.add_argument("--recipe", default=None, help="recipe name or YAML path whose 'regenerate' section to use")
    parser.add_argument(
        "--multi-turn",
        choices=MULTI_TURN_MODES,
        default="first",
        help="first: answer the first user turn only; all: regenerate every assistant turn",
    )
    parser.add_argument("--split", default="train", help="split of a dataset-directory input")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--concurrency", type=int, default=None, help="http: requests in flight")
    parser.add_argument("--retries", type=int, default=None, help="http: retries per request")
    parser.add_argument("--timeout", type=float, default=None, help="http: seconds per request")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="local: answers decoded at once (a finished one's slot goes to the next prompt)")
    parser.add_argument("--device", default="cpu", help="local: torch device")
    parser.add_argument("--seed", type=int, default=0, help="local: sampling seed")
    parser.add_argument("--chat-template", default="",
                        help="local: chat template for a model without one (built-in name: chatml; or a Jinja file)")
    parser.add_argument("--no-progress", action="store_true")


def _recipe_settings(args: argparse.Namespace) -> tuple[RegenerateConfig, str]:
    """The recipe's regenerate section and its target path (defaults when no recipe is given)."""
    if args.recipe is None:
        return RegenerateConfig(), ""
    # Only the two sections regenerate reads are validated: a recipe made for regeneration alone need not train.
    target = load_recipe_section(args.recipe, "target", TargetConfig)
    return load_recipe_section(args.recipe, SECTION, RegenerateConfig), target.path


def build_backend(args: argparse.Namespace, cfg: RegenerateConfig, target_path: str) -> ChatBackend:
    model = args.model or cfg.model or target_path
    if not model:
        raise ConfigError("--model is required (or a recipe with regenerate.model or target.path)")
    if args.backend == "local":
        from deepspec_train.regenerate.local_backend import LocalBackend

        setting = "--model" if args.model else "regenerate.model" if cfg.model else "target.path"
        check_target_folder(model, setting, tokenizer=True, allow_hub=True)

        batch_size = args.batch_size if args.batch_size is not None else cfg.batch_size
        return LocalBackend(
            model, batch_size=batch_size, device=args.device, seed=args.seed, chat_template=args.chat_template
        )
    from deepspec_train.regenerate.http_backend import OpenAIChatBackend

    endpoints = args.endpoint or cfg.endpoints
    if not endpoints:
        raise ConfigError("--endpoint is required for --backend http (or a recipe with regenerate.endpoints)")
    return OpenAIChatBackend(
        endpoints,
        model,
        concurrency=args.concurrency if args.concurrency is not None else cfg.concurrency,
        retries=args.retries if args.retries is not None else cfg.retries,
        timeout_s=args.timeout if args.timeout is not None else cfg.timeout_s,
        api_key=os.environ.get("OPENAI_API_KEY"),
    )


def run(args: argparse.Namespace) -> int:
    # Before the backend: a local one loads the model first, and nothing should wait on a command that cannot run.
    check_output_is_not_input(args.input, args.out)
    ensure_output_file(args.out, "--out")
    try:
        cfg, target_path = _recipe_settings(args)
        sampling = SamplingParams.from_recipe(cfg).with_overrides(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            enable_thinking=args.enable_thinking,
        )
        backend = build_backend(args, cfg, target_path)
    except ConfigError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    started = time.perf_counter()
    summary = regenerate_file(
        args.input,
        args.out,
        backend,
        sampling,
        progress=not args.no_progress,
        multi_turn=args.multi_turn,
        split=args.split,
    )
    print(summary.format())
    record_settings(args, sampling, backend, time.perf_counter() - started)
    return 0 if summary.failed == 0 else 1


def record_settings(args: argparse.Namespace, sampling: SamplingParams, backend: ChatBackend, seconds: float) -> None:
    """Write ``<out>.settings.json`` (how the answers were generated, appended to on every resumed run) and, for a
    backend that counts its tokens (local), print the answer tokens per second of this run."""
    tokens = getattr(backend, "completion_tokens", None)
    run_record = {"backend": args.backend, "model": getattr(backend, "model_path", args.model), "seed": args.seed,
                  "batch_size": getattr(backend, "batch_size", None), "multi_turn": args.multi_turn,
                  "sampling": dataclasses.asdict(sampling), "seconds": round(seconds, 1), "answer_tokens": tokens}
    if tokens is not None:
        run_record["tokens_per_s"] = round(tokens / max(seconds, 1e-9), 1)
        print(f"{tokens:,} answer tokens in {seconds:.1f} s: {run_record['tokens_per_s']:,.1f} tokens/s")
    path = Path(f"{args.out}.settings.json")
    runs = json.loads(path.read_text())["runs"] if path.is_file() else []
    path.write_text(json.dumps({"input": args.input, "runs": [*runs, run_record]}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    return run_verb("deepspec regenerate", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
