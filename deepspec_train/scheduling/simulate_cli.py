"""The ``deepspec simulate`` verb: replay evaluator traces as N concurrent users under the confidence scheduler,
its asynchronous variant and fixed-gamma verification, and draw the throughput frontier.

    deepspec simulate --traces TRACES.jsonl [MORE.jsonl ...] --sps sps.json --concurrency 1,2,4,8,16,32,64 \
        [--gammas 1,2,3,4,5,6,7] [--calibration calibration.json] [--max-steps S] [--full-scan] [--oracle] --out DIR

Writes ``DIR/simulation.json`` (every run and the scheduler's gains over the best fixed gamma) and
``DIR/frontier.png``, and prints a table. With ``--calibration``, the scheduler runs twice, on uncalibrated
(``sigmoid(z)``) and calibrated (``sigmoid(z / T)``) confidences recomputed from the traces' confidence logits;
without it, on the confidences the traces recorded; ``--oracle`` adds confidences that know the outcome (an
upper bound, not a policy a server can run). How to read the output: ``docs/explanation/scheduler.md``.
"""

from __future__ import annotations

import argparse
import json

from deepspec_train.common.errors import UserError
from deepspec_train.common.output_paths import ensure_output_dir
from deepspec_train.scheduling.profile_cli import parse_int_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", nargs="+", required=True, help="trace files from `deepspec eval --save-traces`")
    parser.add_argument("--sps", required=True, help="SPS table JSON from `deepspec profile-sps`")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--concurrency",
        type=parse_int_list,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="numbers of concurrent users (default 1,2,4,8,16,32,64)",
    )
    parser.add_argument(
        "--gammas", type=parse_int_list, default=None, help="fixed verification lengths to compare (default 1..K)"
    )
    parser.add_argument(
        "--calibration",
        default=None,
        help="calibration JSON (`temperatures`) or exported DSpark config (`confidence_temperatures`): simulate "
        "uncalibrated and calibrated confidences side by side",
    )
    parser.add_argument("--async-delay", type=int, default=2, help="steps of lag of the async capacity (default 2)")
    parser.add_argument(
        "--base-tokens", type=int, default=1, help="batch tokens every request costs besides its drafts (default 1)"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="simulated steps (default: one pass per user)")
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="also simulate the scheduler with oracle confidences (1 on accepted drafts, 0 after): an upper bound",
    )
    parser.add_argument(
        "--full-scan",
        action="store_true",
        help="also simulate the scheduler that takes the best point of the whole greedy path (no early stop)",
    )


def run(args: argparse.Namespace) -> int:
    """Simulate, print the table, write the JSON and the plot; returns the process exit status."""
    from deepspec_train.formats.eval_traces import read_traces
    from deepspec_train.scheduling.frontier_plot import plot_frontier
    from deepspec_train.scheduling.simulation_tables import format_table, results_document
    from deepspec_train.scheduling.simulator import run_grid
    from deepspec_train.scheduling.sps_table import SPSTable
    from deepspec_train.scheduling.workload import build_workload, group_requests, load_temperatures

    out = ensure_output_dir(args.out, "--out")
    try:
        requests = group_requests(read_traces(args.traces))
        sps = SPSTable.load(args.sps)
        temperatures = load_temperatures(args.calibration) if args.calibration else None
        sources = ["uncalibrated", "calibrated"] if temperatures else ["trace"]
        if args.oracle:
            sources.append("oracle")
        workloads = {s: build_workload(requests, s, temperatures) for s in sources}
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(str(exc)) from exc
    rounds = [r for request in requests for r in request.rounds]
    if not rounds:
        raise UserError("the traces hold no rounds")
    block = max(r.drafted for r in rounds)
    gammas = args.gammas or list(range(1, block + 1))
    usable = [s for s, w in workloads.items() if all(r.confidences is not None for req in w for r in req)]
    if not usable:
        print("note: the traces carry no confidences (no confidence head): only fixed gamma is simulated")

    results = run_grid(
        workloads, gammas, args.concurrency, sps, args.base_tokens, args.async_delay, args.max_steps, args.full_scan
    )
    categories: dict[str, int] = {}
    for request in requests:
        categories[request.category] = categories.get(request.category, 0) + 1
    settings = {
        "traces": [str(p) for p in args.traces],
        "sps": str(args.sps),
        "calibration": args.calibration,
        "temperatures": temperatures,
        "confidence_sources": usable,
        "concurrency": args.concurrency,
        "gammas": gammas,
        "async_delay": args.async_delay,
        "base_tokens_per_request": args.base_tokens,
        "max_steps": args.max_steps,
        "full_scan": args.full_scan,
        "requests": len(requests),
        "rounds": len(rounds),
        "requests_per_category": categories,
    }
    (out / "simulation.json").write_text(json.dumps(results_document(results, sps, settings), indent=2) + "\n")
    plot_frontier(results, out / "frontier.png")
    print(f"{len(requests)} requests, {len(rounds)} rounds, block {block}; categories {categories}")
    print("\n".join(format_table(results)))
    print(f"wrote {out / 'simulation.json'} and {out / 'frontier.png'}")
    return 0
