"""Drafter quality at matched draft cost: DSpark against DFlash, DFlash2 and EAGLE-3, trained alike, decoded alike.

    python bench/quality.py --tinyworld artifacts/tinyworld --out runs/quality
    python bench/quality.py --out runs/quality --reuse            # evaluate runs trained earlier
    python bench/quality.py --override tiny-dspark:drafter.num_layers=5 --steps 300   # an ablation

1. Trains every recipe (default ``tiny-dspark tiny-dspark-vanilla tiny-dflash tiny-dflash2 tiny-eagle3``: the
   second is DSpark with the vanilla Markov head, the one vLLM serves; the first is the reference the others are
   compared with) on the tiny world with one budget (``--steps``, default the recipes') and one data order, as
   drafter groups over one target pass (``bench/group_training.py``: ``train.py recipe=FIRST compare=[...]
   seeds=N``; a recipe whose target, data or batch settings differ trains in a pass of its own, with a note).
   ``--training-seeds N`` gives every recipe N groups (``run.seed`` 0..N-1: initialisation and anchors; the data
   order is shared), run directories ``OUT/groups/RECIPE-seedS``, listed in ``OUT/groups.json``. ``--train-jobs J``
   splits the recipes over J commands run side by side (the cores shared evenly; round robin in the order of
   ``--recipes``, whose default splits evenly in two). tau is pooled over the training seeds, and every ratio
   has an interval over training seeds and prompts together (a two-level bootstrap; with one seed, the paired
   bootstrap over prompts).
2. Decodes the built-in suites (code, prose, math) with the exact speculative decoder at each temperature
   (default 1 and 0; ``--seeds`` sampling seeds at T > 0), all drafters interleaved prompt by prompt, in
   ``--decode-workers`` one-thread processes (default one per core; the rows do not depend on the count).
3. Prints, per temperature and category, each drafter's tau and the reference's tau ratio against every other
   drafter with a bootstrap over training seeds and prompts (standard error and 95% interval; the number of
   training seeds behind each ratio is printed with it), their geometric mean over the
   categories, and each drafter's draft cost: sequential layer passes per round and measured draft ms per round.
   Beside them, the serving-cost model's columns (``bench/modeled_speedup.py``): each drafter's production
   counterpart (its structure at Qwen3-8B widths), its modeled draft time per round on an H200 and the modeled
   speedup ``tau * t_target / (t_verify + t_draft)`` at batch 1 and 32, with the tau ratios' bootstrap
   carried over to the speedup ratios. The cost rule (issue 22) compares the modeled draft time at batch 1.
4. For a reference with a confidence head: fits sequential temperature scaling on the validation conversations'
   prompts (decoded at T = 1) and reports, on the suites' T = 1 rounds (held out from the fit), ECE of cumulative
   survival and AUROC per position (``deepspec_train.calibration.heldout``).

Writes ``OUT/quality.md`` (the tables), ``OUT/quality.json`` (every number), ``OUT/traces/*.jsonl`` (every
temperature, and the calibration prompts' rounds), each first-seed run's
``OUT/groups/RECIPE-seed0/eval/{results.json,traces.jsonl}`` at the first temperature (what ``deepspec eval``
writes, so ``deepspec compare`` / ``calibrate`` / ``simulate`` read them) and a W&B run (offline unless
``WANDB_MODE`` says otherwise; group = the target's name, like the training runs).
Nothing is selected on the suites: recipes are chosen on validation data (``--on validation`` decodes the
validation conversations' prompts, one category each, instead of the suites), the suites only report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deepspec_train.calibration.cli import survival_arrays  # noqa: E402
from deepspec_train.calibration.heldout import (  # noqa: E402
    HeldOutConfidence, conditional_auroc_bound, held_out_confidence, summary_lines,
)
from deepspec_train.evaluation.drafter_comparison import (  # noqa: E402
    BenchDrafter, DecodeSettings, decode_interleaved, draft_ms_per_round, expected_length, markdown,
    tau_by_category, tau_table, totals_by_category,
)
from bench.group_training import TrainingPlan, plan_training, train_all  # noqa: E402
from bench.modeled_speedup import modeled_cost, speedup_ratios, speedup_table, trained_settings  # noqa: E402
from deepspec_train.evaluation.report import ConversationStats, build_results  # noqa: E402
from deepspec_train.costs.serving_cost import DEFAULT_CONTEXT, REPORT_BATCHES, REPORT_GPU  # noqa: E402
from deepspec_train.evaluation.suites import TINYWORLD_SUITES, Suite, SuitePrompt, load_suite  # noqa: E402
from deepspec_train.formats.drafter_loader import load_exported_drafter  # noqa: E402
from deepspec_train.formats.eval_traces import write_traces  # noqa: E402
from deepspec_train.evaluation.paired_bootstrap import prompt_totals  # noqa: E402
from deepspec_train.evaluation.seed_bootstrap import seed_and_prompt_ratios  # noqa: E402

# With two training commands the round robin split gives {DSpark, DFlash, EAGLE-3} and {DSpark vanilla, DFlash2},
# the most even split by step cost that keeps the reference first.
DEFAULT_RECIPES = ("tiny-dspark", "tiny-dspark-vanilla", "tiny-dflash", "tiny-dflash2", "tiny-eagle3")
GOAL_RATIO = 1.25
# The modeled-speedup ratio of the reference against each other drafter at batch 1 should reach this (issue 22).
GOAL_SPEEDUP_RATIO = 1.2
# The benchmark should resolve each tau ratio (per category and geomean) to this standard error.
MAX_RATIO_SE = 0.03


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tinyworld", default="artifacts/tinyworld")
    p.add_argument("--out", default="runs/quality")
    p.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES), help="the first is the reference")
    p.add_argument("--steps", type=int, default=None, help="training steps for every recipe (default: the recipes')")
    p.add_argument("--override", action="append", default=[], metavar="RECIPE:KEY=VALUE",
                   help="a recipe override for one recipe; repeatable")
    p.add_argument("--override-all", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override for every recipe (the shared budget and data); repeatable")
    p.add_argument("--reuse", action="store_true",
                   help="do not train a recipe whose every training seed has OUT/groups/RECIPE-seedS/drafter")
    p.add_argument("--on", choices=("suites", "validation"), default="suites",
                   help="report on the built-in suites, or select on the validation conversations' prompts")
    p.add_argument("--prompts", type=int, default=None, help="first N prompts of each suite (default: all)")
    p.add_argument("--new-tokens", type=int, default=96, help="new tokens per answer")
    p.add_argument("--seeds", type=int, default=6,
                   help="sampling seeds at T > 0, prompts pooled over seeds (6: tau ratios' standard errors near 0.03)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    p.add_argument("--bootstrap", type=int, default=4000, help="bootstrap replicates")
    p.add_argument("--training-seeds", type=int, default=1,
                   help="drafter groups per recipe (run.seed 0..N-1, one data order); intervals over training seeds "
                        "and prompts together (a two-level bootstrap), tau pooled over the seeds")
    p.add_argument("--calibration-prompts", type=int, default=None, help="validation prompts for the STS fit")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the main process while decoding (tiny models: 1 is fastest)")
    p.add_argument("--decode-workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="one-thread decoding processes, spawned (default: one per core)")
    p.add_argument("--train-jobs", type=int, default=1,
                   help="grouped training commands run at the same time, the recipes split between them, each on "
                        "cores / jobs threads (default 1: one target pass for every drafter)")
    p.add_argument("--no-wandb", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def recipe_overrides(args: argparse.Namespace) -> dict[str, list[str]]:
    """``--override RECIPE:KEY=VALUE`` by recipe (``--override-all`` is checked here and applies to every group)."""
    for override in args.override_all:
        if "=" not in override:
            raise SystemExit(f"--override-all {override!r}: expected KEY=VALUE")
    per_recipe: dict[str, list[str]] = {r: [] for r in args.recipes}
    for item in args.override:
        recipe, sep, override = item.partition(":")
        if not sep or recipe not in per_recipe or "=" not in override:
            raise SystemExit(f"--override {item!r}: expected RECIPE:KEY=VALUE with RECIPE one of {args.recipes}")
        per_recipe[recipe].append(override)
    return per_recipe


def shared_overrides(args: argparse.Namespace, world: Path) -> list[str]:
    """The overrides of every group: the tiny world's files, the budget, then ``--override-all``."""
    steps = [] if args.steps is None else [f"train.max_steps={args.steps}"]
    every = args.steps or 10**9
    return [
        f"target.path={world / 'target'}", f"data.train=[{world / 'conversations' / 'train.jsonl'}]",
        f"data.validation=[{world / 'conversations' / 'validation.jsonl'}]", *steps, f"train.eval_every={every}",
        f"train.checkpoint_every={every}", f"logging.progress={str(not args.no_progress).lower()}",
        *args.override_all,
    ]


def training_plan(args: argparse.Namespace, world: Path, out: Path) -> TrainingPlan:
    plan = plan_training(args.recipes, args.training_seeds, shared_overrides(args, world), recipe_overrides(args),
                         out, args.train_jobs, args.reuse)
    for note in plan.notes:
        print(note, flush=True)
    return plan


def run_name(recipe: str, seed: int) -> str:
    """The run of ``recipe`` trained with ``run.seed`` = ``seed`` (the first seed keeps the recipe's name)."""
    return recipe if seed == 0 else f"{recipe}@s{seed}"


def tau_ratios(rows: dict, args: argparse.Namespace, reference: str, others: list[str]) -> tuple[dict, dict]:
    """Per-category prompt totals by recipe, pooled over its training seeds (prompts of every seed side by side),
    and the reference's tau ratios with the two-level bootstrap over training seeds and prompts
    (``evaluation.seed_bootstrap``; with one training seed it is the paired bootstrap over prompts)."""
    by_run = totals_by_category(rows)
    by_seed = [{c: {r: per[run_name(r, s)] for r in args.recipes} for c, per in by_run.items()}
               for s in range(args.training_seeds)]
    pooled = {c: {r: prompt_totals(np.concatenate([seed[c][r].emitted for seed in by_seed]),
                                   np.concatenate([seed[c][r].rounds for seed in by_seed])) for r in args.recipes}
              for c in by_run}
    return pooled, seed_and_prompt_ratios(by_seed, [(reference, o) for o in others], args.bootstrap, seed=0)


def interval_words(training_seeds: int) -> str:
    """How a ratio's interval was drawn, with the number of training seeds behind it."""
    if training_seeds == 1:
        return "1 training seed per drafter; paired bootstrap over prompts, 95% interval"
    return (f"{training_seeds} training seeds per drafter; two-level bootstrap over training seeds and prompts, "
            "95% interval")


def calibration_suite(world: Path, limit: int | None) -> Suite:
    """The user turns of the validation conversations (held out from the suites and from training)."""
    prompts = []
    with open(world / "conversations" / "validation.jsonl", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            turns = tuple(m["content"] for m in row["messages"] if m["role"] == "user")
            prompts.append(SuitePrompt(id=str(row["id"]), category=str(row.get("category", "validation")), turns=turns))
    return Suite(name="calibration", prompts=tuple(prompts[:limit]))


def validation_suites(world: Path, limit: int | None) -> list[Suite]:
    """The validation prompts as one suite per category (for selecting recipes without touching the suites)."""
    by_category: dict[str, list[SuitePrompt]] = {}
    for prompt in calibration_suite(world, None).prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    return [Suite(name=f"validation-{c}", prompts=tuple(p[:limit])) for c, p in sorted(by_category.items())]


def confidence_report(args, target, tokenizer, reference: BenchDrafter, world: Path, out: Path, test_rows) -> dict:
    """STS fit on validation prompts at T = 1, scored on the suites' T = 1 rounds of the reference."""
    suite = calibration_suite(world, args.calibration_prompts)
    settings = DecodeSettings(1.0, tuple(range(args.seeds)), args.new_tokens)
    by_drafter = decode_interleaved(target, tokenizer, [reference], [suite], settings, not args.no_progress,
                                    workers=args.decode_workers)
    fit_rows = by_drafter[reference.name]
    write_traces(out / "traces" / f"{reference.name}_calibration.jsonl", fit_rows)
    write_traces(out / "traces" / f"{reference.name}_T1_heldout.jsonl", test_rows)
    report = held_out_confidence(survival_arrays(fit_rows), survival_arrays(test_rows))
    bound = conditional_auroc_bound(test_rows, len(report.counts))
    return report.to_dict() | {"prompts": len(suite.prompts), "auroc_bound": bound}


def log_to_wandb(args, world: Path, out: Path, report: dict, tables: dict[str, tuple[list, list]]) -> None:
    from deepspec_train.config.schema import LoggingConfig
    from deepspec_train.metrics.sinks import WandbSink, wandb_labels

    cfg = LoggingConfig()
    # The training runs' group (the target's name), so the table sits next to the runs it compares.
    group = wandb_labels(cfg, {"target": {"path": str(world / "target")}})[0]
    sink = WandbSink(cfg.wandb_project, f"quality-{'-'.join(args.recipes)}", report["settings"],
                     mode=cfg.wandb_mode, dir=out, group=group,
                     tags=["bench:quality", *(f"recipe:{r}" for r in args.recipes)], job_type="quality-bench")
    for name, (columns, rows) in tables.items():
        sink.log_table(name, columns, rows, step=0)
    sink.finish()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    world, out = Path(args.tinyworld).resolve(), Path(args.out).resolve()
    if not (world / "build_report.json").is_file():
        raise SystemExit(f"{world}: no tiny world (build one: deepspec tinyworld build --out {world})")
    out.mkdir(parents=True, exist_ok=True)
    plan = training_plan(args, world, out)
    train_seconds = train_all(plan.commands, args.train_jobs, out)
    plan.write_record()
    run_dirs = {run_name(r, s): plan.run_dir(r, s) for r in args.recipes for s in range(args.training_seeds)}

    torch.set_num_threads(args.threads)
    target_path = world / "target"
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    target.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    drafters = [BenchDrafter.of(r, load_exported_drafter(run_dirs[r] / "drafter", str(target_path)))
                for r in args.recipes]
    # The other training seeds' drafters decode beside the first seed's; only the tau ratios read them.
    other_seeds = [BenchDrafter.of(run_name(r, s), load_exported_drafter(run_dirs[run_name(r, s)] / "drafter",
                                                                         str(target_path)))
                   for s in range(1, args.training_seeds) for r in args.recipes]
    if args.on == "validation":
        suites = validation_suites(world, args.prompts)
    else:
        suites = [load_suite(f"tinyworld:{name}", str(world), args.prompts) for name in TINYWORLD_SUITES]
    reference, others = args.recipes[0], args.recipes[1:]
    costs = {r: modeled_cost(r, *trained_settings(run_dirs[r] / "drafter")) for r in args.recipes}

    report: dict = {"settings": {**vars(args), "tinyworld": str(world)}, "training_seeds": args.training_seeds,
                    "runs": {name: str(path) for name, path in run_dirs.items()}, "training_notes": plan.notes,
                    "training_commands": train_seconds, "temperatures": {}, "drafters": {}}
    tables: dict[str, tuple[list, list]] = {}
    rows_at: dict[float, dict[str, list[dict]]] = {}
    for temperature in args.temperatures:
        seeds = list(range(args.seeds)) if temperature > 0 else [0]
        conversations: dict[str, list[ConversationStats]] = {}
        settings = DecodeSettings(temperature, tuple(seeds), args.new_tokens)
        rows = decode_interleaved(target, tokenizer, drafters + other_seeds, suites, settings, not args.no_progress,
                                  conversations, args.decode_workers)
        rows_at[temperature] = rows
        for d in drafters:
            write_traces(out / "traces" / f"{d.name}_T{temperature:g}.jsonl", rows[d.name])
            if temperature == args.temperatures[0]:
                # The run's eval/results.json, as `deepspec eval` writes it: `deepspec compare RUN ...` reads it.
                header = {"target": str(target_path), "drafter": str(run_dirs[d.name] / "drafter"),
                          "drafter_kind": d.loaded.kind, "block_size": d.block_size, "temperature": temperature,
                          "max_new_tokens": args.new_tokens, "seeds": seeds}
                results = build_results(rows[d.name], conversations[d.name], d.block_size, header)
                (run_dirs[d.name] / "eval").mkdir(parents=True, exist_ok=True)
                (run_dirs[d.name] / "eval" / "results.json").write_text(json.dumps(results, indent=2))
                write_traces(run_dirs[d.name] / "eval" / "traces.jsonl", rows[d.name])
        totals, ratios = tau_ratios(rows, args, reference, others)
        tables[f"tau_T{temperature:g}"] = tau_table(totals, args.recipes, ratios)
        factors = {b: {r: costs[r].times[b].speedup_per_token for r in args.recipes} for b in REPORT_BATCHES}
        speedups = {b: speedup_ratios(ratios, factors[b]) for b in REPORT_BATCHES}
        tables[f"speedup_T{temperature:g}"] = speedup_table(totals, args.recipes, factors, speedups)
        report["temperatures"][f"{temperature:g}"] = {
            "tau": tau_by_category(totals),
            "prompts_per_category": {c: int(next(iter(t.values())).emitted.size) for c, t in totals.items()},
            "seeds": seeds,
            "training_seeds": args.training_seeds,
            "ratios": {f"{a}/{b}": {c: e.to_dict() for c, e in per.items()} for (a, b), per in ratios.items()},
            "modeled_speedup_ratios": {str(batch): {f"{a}/{b}": {c: e.to_dict() for c, e in per.items()}
                                                    for (a, b), per in by_pair.items()}
                                       for batch, by_pair in speedups.items()},
        }

    first = rows_at[args.temperatures[0]]
    cost_rows = []
    for d in drafters:
        summary_path = run_dirs[d.name] / "summary.json"
        command = plan.command_of(d.name)
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
        timing = draft_ms_per_round(first[d.name], args.bootstrap, seed=1)
        wall = draft_ms_per_round(first[d.name], args.bootstrap, seed=1, field="draft_seconds")
        entry = {"kind": d.loaded.kind, "sequential_layer_passes": d.sequential_layer_passes(),
                 "draft_cpu_ms_per_round": timing.to_dict(), "draft_wall_ms_per_round": wall.to_dict(),
                 "val_expected_len": expected_length(summary),
                 "train": None if command is None else {"command": command, **train_seconds[command]},
                 "modeled": costs[d.name].to_dict()}
        report["drafters"][d.name] = entry
        el, trained = entry["val_expected_len"], entry["train"]
        modeled = costs[d.name].times
        cost_rows.append([d.name, d.loaded.kind, str(entry["sequential_layer_passes"]),
                          " / ".join(f"{1e6 * modeled[b].draft_s:,.0f}" for b in REPORT_BATCHES),
                          " / ".join(f"{modeled[b].speedup_per_token:.3f}" for b in REPORT_BATCHES),
                          f"{timing.value:.3f} [{timing.low:.3f}, {timing.high:.3f}]",
                          f"{wall.value:.3f} [{wall.low:.3f}, {wall.high:.3f}]", "-" if el is None else f"{el:.3f}",
                          "-" if trained is None else f"{trained['wall_s']:.0f} / {trained['cpu_s']:.0f}"])
    batches = "/".join(str(b) for b in REPORT_BATCHES)
    tables["draft_cost"] = (["drafter", "kind", "sequential layer passes / round",
                             f"modeled draft us / round at Qwen3-8B widths ({REPORT_GPU}, batch {batches})",
                             f"t_target / (t_verify + t_draft) (batch {batches})",
                             f"draft CPU ms / round (T={args.temperatures[0]:g}) [95% CI]", "draft wall ms / round",
                             "val E[L]", "training wall / CPU s (of its grouped command)"], cost_rows)

    ref = drafters[0]
    if getattr(ref.loaded.module, "confidence_head", None) is not None and 1.0 in rows_at and args.on == "suites":
        report["confidence"] = confidence_report(args, target, tokenizer, ref, world, out, rows_at[1.0][ref.name])

    text = render(args, report, tables)
    (out / "quality.md").write_text(text + "\n")
    (out / "quality.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(text)
    if not args.no_wandb and os.environ.get("WANDB_MODE", "offline") != "disabled":
        log_to_wandb(args, world, out, report, tables)
    return 0


def render(args: argparse.Namespace, report: dict, tables: dict[str, tuple[list, list]]) -> str:
    ref = args.recipes[0]
    lines = [f"# Drafter quality: {ref} against {', '.join(args.recipes[1:])} (on the {args.on} prompts)", ""]
    for t in args.temperatures:
        info = report["temperatures"][f"{t:g}"]
        counts = ", ".join(f"{c} {n}" for c, n in sorted(info["prompts_per_category"].items()))
        lines += [f"## tau at T = {t:g} ({counts} prompts x {len(info['seeds'])} sampling seed(s), {args.new_tokens} "
                  f"new tokens; {interval_words(args.training_seeds)})", "", markdown(*tables[f"tau_T{t:g}"]), "",
                  f"Modeled speedup at T = {t:g}: tau x t_target / (t_verify + t_draft) of the Qwen3-8B production "
                  f"counterparts on an {REPORT_GPU} (context {DEFAULT_CONTEXT}; "
                  "`python -m deepspec_train.costs.serving_cost`)",
                  "", markdown(*tables[f"speedup_T{t:g}"]), ""]
    lines += ["## Draft cost (the first training seed's drafters)", "", markdown(*tables["draft_cost"]), ""]
    lines += [*report["training_notes"], ""] if report["training_notes"] else []
    first = report["temperatures"][f"{args.temperatures[0]:g}"]["ratios"]
    ref_cost = report["drafters"][ref]
    for other in args.recipes[1:]:
        g = first[f"{ref}/{other}"]["geomean"]
        o_cost = report["drafters"][other]
        # The cost rule: layer passes and the modeled draft time at batch 1 of the production counterparts.
        matched = (ref_cost["sequential_layer_passes"] <= o_cost["sequential_layer_passes"]
                   and ref_cost["modeled"]["batches"]["1"]["draft_us"] <= o_cost["modeled"]["batches"]["1"]["draft_us"])
        cpu_matched = ref_cost["draft_cpu_ms_per_round"]["value"] <= o_cost["draft_cpu_ms_per_round"]["value"]
        speedup = report["temperatures"][f"{args.temperatures[0]:g}"]["modeled_speedup_ratios"]["1"][f"{ref}/{other}"]
        s = speedup["geomean"]
        goal = g["value"] >= GOAL_RATIO and (g["low"] > 1.0 or g["high"] < 1.0)
        largest_se = max(e["se"] for e in first[f"{ref}/{other}"].values())
        lines.append(f"- {ref} / {other} at T = {args.temperatures[0]:g} ({args.training_seeds} training seed(s) "
                     "each): geomean "
                     f"{g['value']:.3f} [{g['low']:.3f}, {g['high']:.3f}]; >= {GOAL_RATIO} with the interval "
                     f"excluding 1: {'yes' if goal else 'no'}; largest standard error {largest_se:.3f} (target "
                     f"{MAX_RATIO_SE}); draft cost at most {other}'s (layer passes and modeled draft time at "
                     f"batch 1): {'yes' if matched else 'no'} (measured CPU ms: {'yes' if cpu_matched else 'no'}); "
                     f"modeled speedup ratio at batch 1 {s['value']:.3f} [{s['low']:.3f}, {s['high']:.3f}], >= "
                     f"{GOAL_SPEEDUP_RATIO}: {'yes' if s['value'] >= GOAL_SPEEDUP_RATIO else 'no'}")
    if "confidence" in report:
        c = report["confidence"]
        lines += ["", f"## Confidence head of {ref} (STS fit on {c['fit_rounds']} rounds of {c['prompts']} validation "
                  f"prompts, scored on {c['test_rounds']} held-out suite rounds at T = 1)", "", "```",
                  *summary_lines(HeldOutConfidence(**{k: v for k, v in c.items()
                                                      if k not in ("prompts", "auroc_bound")})),
                  "```", "", "AUROC ceiling per position (c*_k of the drafted prefix against acceptance, same rounds): "
                  + " ".join(f"{b:.3f}" for b in c["auroc_bound"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
