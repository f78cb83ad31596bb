"""The ``deepspec profile-sps`` verb: profile a target's verification speed and write the SPS tables.

    deepspec profile-sps --target DIR --max-batch-tokens 256 [--context-len 512] [--repeats 10] [--warmup 3] \
        [--tokens-per-request 8] --out sps.json [--sglang-out sps.sglang.json]
    deepspec profile-sps --target DIR --batch-sizes 1,2,4,8,16,32,64,128,256 --out sps.json

Writes ``--out``, the ``SPSTable`` the scheduler simulation reads (``{"batch_sizes", "steps_per_s"}``), and, for
dense probes (every batch size ``1..--max-batch-tokens``, the default), SGLang's SPS table
(``{"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}``, strict JSON) at ``--sglang-out``
(default: ``--out`` with ``.sglang.json``) for ``--speculative-dspark-sps-table-path``. SGLang reads its table at
the largest probe <= B without interpolation, so sparse ``--batch-sizes`` write only the first table. vLLM
profiles its own cost curves at start-up and takes no table. Run it on the machine (and with the dtype) the
target will serve on: the tables are only meaningful there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deepspec_train.common.errors import UserError
from deepspec_train.common.model_folders import check_target_folder
from deepspec_train.common.output_paths import ensure_output_file


def parse_int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (argparse type for the list options of ``profile-sps`` and ``simulate``)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model directory (from_pretrained)")
    parser.add_argument("--out", required=True, help="where to write the SPS table JSON")
    probes = parser.add_mutually_exclusive_group()
    probes.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="probe every batch size 1..N tokens and write SGLang's table too (default 256)",
    )
    probes.add_argument(
        "--batch-sizes",
        type=parse_int_list,
        default=None,
        help="sparse verification batch sizes in tokens, strictly increasing (the simulation table only)",
    )
    parser.add_argument("--sglang-out", default=None, help="SGLang SPS table path (default: --out as .sglang.json)")
    parser.add_argument("--context-len", type=int, default=512, help="KV-cache length of every request (default 512)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per batch size (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before timing (default 3)")
    parser.add_argument(
        "--tokens-per-request",
        type=int,
        default=8,
        help="most new tokens one request verifies in a step: drafted block + 1 (default 8, for block 7)",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="target dtype (default auto: bf16 on GPU, fp32 on CPU)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--no-monotone",
        action="store_true",
        help="write the raw medians instead of raising each speed to the best at any larger batch size",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")


def run(args: argparse.Namespace) -> int:
    """Profile, print the table, write the JSON; returns the process exit status."""
    # The outputs first, then the target's folder, both before the imports of torch and transformers (here so that
    # `deepspec --help` does not pay for them either): a wrong path is refused at once.
    ensure_output_file(args.out, "--out")
    dense = args.batch_sizes is None
    if dense:
        ensure_output_file(args.sglang_out or Path(args.out).with_suffix(".sglang.json"), "--sglang-out")
    check_target_folder(args.target, "--target", allow_hub=True)
    import torch

    from deepspec_train.config.schema import TargetConfig
    from deepspec_train.export.engine_files import write_strict_json
    from deepspec_train.scheduling.profile_sps import (
        dense_batch_sizes,
        format_measurements,
        measurements_to_table,
        profile_target,
        sglang_sps_table,
        validated_batch_sizes,
    )
    from deepspec_train.target.loading import load_target_model

    max_tokens = args.max_batch_tokens if args.max_batch_tokens is not None else 256
    try:
        sizes = dense_batch_sizes(max_tokens) if dense else validated_batch_sizes(args.batch_sizes)
        if args.context_len < 0 or args.repeats < 1 or args.warmup < 0 or args.tokens_per_request < 1:
            raise ValueError("need --context-len >= 0, --repeats >= 1, --warmup >= 0, --tokens-per-request >= 1")
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_target_model(TargetConfig(path=args.target, dtype=args.dtype), device)
    measurements = profile_target(
        model, sizes, args.context_len, args.repeats, args.warmup, args.tokens_per_request, args.seed
    )
    table = measurements_to_table(measurements, monotone=not args.no_monotone)
    dtype = next(model.parameters()).dtype
    print(f"target {args.target} on {device} ({str(dtype).removeprefix('torch.')}), context {args.context_len} tokens")
    print("\n".join(format_measurements(measurements, table)))
    table.save(args.out)
    print(f"SPS table written to {args.out}")
    if dense:
        sglang_out = args.sglang_out or str(Path(args.out).with_suffix(".sglang.json"))
        write_strict_json(sglang_out, sglang_sps_table(table, max_tokens))
        print(f"SGLang SPS table ({max_tokens} probes) written to {sglang_out}")
    else:
        print("no SGLang table: it needs dense probes (--max-batch-tokens), it does not interpolate between them")
    return 0
