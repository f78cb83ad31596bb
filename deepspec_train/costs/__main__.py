"""``python -m deepspec_train.costs``: print the docs' sizing tables (markdown) from
``deepspec_train.costs.sizing_tables`` and ``deepspec_train.costs.groups``; ``python -m deepspec_train.costs levers
[recipe] [key=value ...]``: the modeled cost of anchor density and feature reuse (``deepspec_train.costs.levers``). A
module of its own so that the grouped accounting can build on the sizing model while the table printer reads both (no
import cycle)."""

from __future__ import annotations

import argparse
from typing import Any

from deepspec_train.common.errors import UserError, one_line
from deepspec_train.costs import levers as levers_module
from deepspec_train.costs.gpu_specs import GPUS
from deepspec_train.costs.groups import GROUPED_RECIPES, grouped_row
from deepspec_train.costs.reference_targets import FAMILY_RECIPES
from deepspec_train.costs.sizing_tables import cluster_row, long_context_rows, sizing_row


def _print_table(columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
    print("| " + " | ".join(title for _, title in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[key]:,.1f}" if isinstance(row[key], float) else str(row[key]) for key, _ in columns]
        print("| " + " | ".join(cells) + " |")


# The cluster table's targets: (recipe whose drafter trains, target without a recipe of its own or None).
CLUSTER_TARGETS = [
    ("qwen3-8b", None), ("qwen3-14b", None), ("qwen3-8b", "Qwen3-32B"), ("qwen3-30b-a3b", None),
    ("qwen3-235b-a22b", None),
]


def main() -> None:
    """Print the docs' sizing tables (markdown): every dense production recipe on one node at 1024, 2048 and
    4096 tokens and every other family's recipe at 2048, then colocated against streamed splits with TP groups
    for the large targets on 1, 2, 4 nodes, then drafter groups against separate runs on 2 and 4 nodes, then the
    long-context memory terms of a target rank and a drafter rank."""
    columns = [
        ("recipe", "recipe"), ("seq_len", "L"), ("target_tok_s", "target tok/s"), ("drafter_tok_s", "drafter tok/s"),
        ("drafter_per_target", "drafter/target FLOPs"), ("colocated_seq_s_node", "colocated seq/s/node"),
        ("best_split", "best T:D"), ("split_seq_s_node", "T:D seq/s/node"), ("target_weights_gb", "target GB"),
        ("drafter_state_gb", "drafter GB"), ("payload_mb_per_seq", "payload MB/seq"),
        ("payload_bytes_per_supervised", "B/supervised tok"),
    ]
    qwen3 = [f"qwen3-{size}{variant}" for size in ("4b", "8b", "14b") for variant in ("", "-dflash", "-eagle3")]
    rows = [{"recipe": r, "seq_len": n} | sizing_row(r, n) for r in qwen3 for n in (1024, 2048, 4096)]
    rows += [{"recipe": recipe, "seq_len": 2048} | sizing_row(recipe, 2048) for recipe in FAMILY_RECIPES]
    _print_table(columns, rows)
    print()
    columns = [
        ("target", "target"), ("nodes", "nodes"), ("seq_len", "L"), ("target_weights_gb", "target GB"),
        ("colocated_gb", "colocated GB/GPU"), ("colocated_seq_s_node", "colocated seq/s/node"),
        ("best_split", "best G x TP : D"), ("plan", "TP plan"), ("split_seq_s_node", "streamed seq/s/node"),
        ("target_rank_gb", "target rank GB"), ("drafter_gb", "drafter GB"), ("in_flight_mb", "stream MB in flight"),
    ]
    _print_table(columns, [
        cluster_row(recipe, target, nodes, 2048) for recipe, target in CLUSTER_TARGETS for nodes in (1, 2, 4)
    ])
    print("\n### Drafter groups: one target pass for 3 kinds x 3 seeds, against separate runs on equal GPU shares\n")
    columns = [
        ("recipes", "recipes"), ("seeds", "seeds"), ("nodes", "nodes"), ("seq_len", "L"),
        ("grouped_split", "grouped T:N x D"), ("grouped_gpus", "GPUs used"), ("grouped_seq_s", "seq/s per group"),
        ("separate_split", "separate runs"), ("separate_seq_s", "seq/s per run"), ("speedup", "speedup"),
        ("target_flops_saved", "target FLOPs saved"),
    ]
    _print_table(columns, [grouped_row(list(GROUPED_RECIPES), 3, nodes, 2048) for nodes in (2, 4)])
    print("\n### Long context: GB per GPU of a target rank and a drafter rank (one sequence per target forward)\n")
    rows = long_context_rows()
    _print_table([(key, key) for key in rows[0]], rows)


if __name__ == "__main__":
    # The tables take no option (``levers`` takes a recipe and overrides): parsing answers --help (exit 0) and
    # refuses anything else before the work starts.
    parser = argparse.ArgumentParser(prog="python -m deepspec_train.costs", description=main.__doc__)
    commands = parser.add_subparsers(dest="command")
    levers = commands.add_parser("levers", help="the modeled cost of anchor density and feature reuse",
                                 description=levers_module.__doc__.split("\n\n")[0])
    levers.add_argument("recipe", nargs="?", default=levers_module.DEFAULT_RECIPE)
    levers.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. train.feature_reuse=4")
    levers.add_argument("--seq-len", type=int, default=levers_module.DEFAULT_SEQ_LEN, help="tokens per sequence")
    levers.add_argument("--gpu", choices=sorted(GPUS), default=levers_module.DEFAULT_GPU)
    args = parser.parse_args()
    if args.command != "levers":
        main()
    else:
        try:
            levers_module.print_levers(args.recipe, args.overrides, args.seq_len, args.gpu)
        except (UserError, ValueError) as error:  # a bad recipe, override or --seq-len: one line, status 2
            levers.error(one_line(str(error)))
