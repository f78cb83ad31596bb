"""The benchmark on a real model: DSpark, DFlash, DFlash2 and EAGLE-3 for SmolLM2-135M-Instruct, several training
seeds, trained at a stated budget with learning curves that say whether it converged them, and judged on GSM8K test
and HumanEval with the exact speculative decoder.

    python bench/realworld.py --target artifacts/smollm2/target --data artifacts/smollm2/data --out runs/realworld
    python bench/realworld.py ... --training-seeds 1 --steps 4 --prompts 2 --new-tokens 16   # a smoke run
    python bench/realworld.py ... --reuse                 # decode drafters trained earlier into the same --out
    python bench/realworld.py ... --steps 2400 --stop-at 1200           # half of a longer schedule now,
    python bench/realworld.py ... --steps 2400 --reuse                  # the rest later, continued from checkpoints

1. Prepares the suites with ``deepspec suites prepare`` from ``--datasets`` (default ``../shared/datasets``):
   GSM8K test and HumanEval, ``--prompts`` of each drawn as DeepSpec draws them. Nothing is tuned on them.
2. Trains ``smollm2-135m-dspark``, ``-dflash``, ``-dflash2`` and ``-eagle3`` for every training seed as drafter
   groups over one target pass (``bench/group_training.py``: ``train.py recipe=smollm2-135m-dspark
   compare=[...] seeds=N``; the seeds differ in initialisation and anchors, every group trains on the same data
   in the same order) with one budget (``--steps``; each target pass feeds ``--feature-reuse`` optimizer steps,
   the lever that paid in ``bench/learning_levers.py``), on the regenerated conversations in ``--data``
   (``train.jsonl``, ``validation.jsonl``); ``--train-jobs J`` splits the kinds over J commands side by side.
   ``--stop-at S`` ends this invocation at step S of that schedule; ``--reuse`` continues runs from their
   checkpoints, so a budget longer than one session accumulates over invocations (``bench/group_training.py``).
3. Exactness: for every drafter, greedy speculative decoding of ``--exactness-prompts`` prompts equals the
   target's ``generate(do_sample=False)``, token for token (the script stops if not); at T = 1 the first token of
   ``--distribution-samples`` speculative rounds follows the target's law (``bench/first_token_law.py``, the
   tiny world's distribution test at a real vocabulary).
4. Decodes every suite prompt with every drafter at each temperature (default 1 and 0; ``--sampling-seeds``
   at T > 0) in ``--decode-workers`` one-thread processes, and prints per suite each kind's pooled tau, the ratios
   DSpark / EAGLE-3, DSpark / DFlash and DSpark / DFlash2 with a two-level bootstrap over training seeds and prompts
   (``evaluation.seed_bootstrap``), and the modeled speedup of the kinds' production counterparts
   (``bench/modeled_speedup.py``: the same structure at Qwen3-8B widths on an H200, batch 1 and 32).

5. Shows whether the budget converged them: each kind's validation E[L] at ``--evaluations`` points of training
   against the target tokens forwarded, over its seeds, and the convergence rule's verdict (the last quarter of
   training added less than 5% of the final E[L]; ``bench/validation_curve.py``; a table and
   ``OUT/validation_expected_len.png``).

Writes ``OUT/realworld.md`` and ``OUT/realworld.json``; each run's directory is ``OUT/groups/RECIPE-seedS``
(listed in ``OUT/groups.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.first_token_law import first_token_law  # noqa: E402
from bench.modeled_speedup import modeled_cost, speedup_ratios, trained_settings  # noqa: E402
from bench.validation_curve import Curve, curve_of, curves_table, plot_curves, with_target_tokens  # noqa: E402
from bench.group_training import TrainingPlan, plan_training, tokens_per_pass, train_all  # noqa: E402
from deepspec_train.config.loader import read_recipe  # noqa: E402
from deepspec_train.evaluation.drafter_comparison import (  # noqa: E402
    BenchDrafter, DecodeSettings, decode_interleaved, markdown, ratio_cell, totals_by_category,
)
from deepspec_train.evaluation.seed_bootstrap import pooled_tau, seed_and_prompt_ratios  # noqa: E402
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder, stop_token_ids  # noqa: E402
from deepspec_train.evaluation.suites import Suite, load_suite  # noqa: E402
from deepspec_train.formats.drafter_loader import load_exported_drafter  # noqa: E402
from deepspec_train.costs.serving_cost import REPORT_BATCHES, REPORT_GPU  # noqa: E402

RECIPES = ("smollm2-135m-dspark", "smollm2-135m-dflash", "smollm2-135m-dflash2", "smollm2-135m-eagle3")
REFERENCE = RECIPES[0]
# The ratios reported, DSpark against each baseline; the earlier issue's goals where it set one (DSpark / EAGLE-3
# >= 1.25 and DSpark / DFlash >= 1.18, each interval excluding 1).
PAIRS = tuple((REFERENCE, r) for r in ("smollm2-135m-eagle3", "smollm2-135m-dflash", "smollm2-135m-dflash2"))
GOALS = {(REFERENCE, "smollm2-135m-eagle3"): 1.25, (REFERENCE, "smollm2-135m-dflash"): 1.18}
SUITES = {"gsm8k": "gsm8k", "humaneval": "humaneval"}


@dataclass(frozen=True)
class Budget:
    """What the benchmark trains and decodes: training steps, anchors per sequence and sequences per step of every
    run, prompts per suite, answer tokens and sampling seeds at T > 0."""

    steps: int
    anchors: int
    batch: int
    feature_reuse: int
    evaluations: int
    prompts: int
    new_tokens: int
    sampling_seeds: int


# The laptop budget: one working session (at most 150 minutes) on the idle 2-core machine, 2 training seeds of the
# 4 kinds, one torch thread. Each target pass of 4 sequences feeds 4 optimizer steps (on SmolLM2, reuse 4 after 10
# passes reached validation E[L] 0.398 against 0.302 after 40 passes without: docs/reference/benchmarks.md), so
# 400 steps forward 100 passes, 400 of the 716 regenerated conversations, none repeated. Measured: a step of the
# eight drafters 16.3 s on the idle machine with one thread (2026-12-07), 14.5-16.4 s with the two threads one
# grouped command gets by default (2026-12-08: steps 83-400 and 7 validations in 77.7 minutes), so 400 steps about
# 98 minutes; the exactness and law checks and decoding 10 prompts per suite at two temperatures about 37 more
# (docs/reference/benchmarks.md, section "A real model"). A longer schedule accumulates: --stop-at, then --reuse.
LAPTOP = Budget(steps=400, anchors=16, batch=4, feature_reuse=4, evaluations=8, prompts=10, new_tokens=64,
                sampling_seeds=1)
LAPTOP_SEEDS = 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="artifacts/smollm2/target", help="built by `deepspec realworld build`")
    p.add_argument("--data", default="artifacts/smollm2/data", help="regenerated train.jsonl / validation.jsonl")
    p.add_argument("--datasets", default=str(REPO.parent / "shared" / "datasets"), help="GSM8K and HumanEval")
    p.add_argument("--out", default="runs/realworld")
    p.add_argument("--training-seeds", type=int, default=LAPTOP_SEEDS,
                   help=f"drafters trained per kind (default {LAPTOP_SEEDS})")
    # The defaults are the laptop budget (LAPTOP above). `--steps 0 --anchors 0 --batch 0 --feature-reuse 0` trains
    # at the recipes' own budget instead.
    p.add_argument("--steps", type=int, default=LAPTOP.steps,
                   help="training steps of every run: the length of its schedule (0: the recipes')")
    p.add_argument("--stop-at", type=int, default=0,
                   help="end this invocation at this step of the schedule (train.stop_at_step; 0: at its end); a "
                        "later invocation with --reuse continues from there")
    p.add_argument("--feature-reuse", type=int, default=LAPTOP.feature_reuse,
                   help="optimizer steps per target pass (train.feature_reuse; 0: the recipes')")
    p.add_argument("--anchors", type=int, default=LAPTOP.anchors,
                   help="anchors per sequence (0: the recipes' 512; the drafter's LM head over them dominates a step)")
    p.add_argument("--batch", type=int, default=LAPTOP.batch, help="sequences per step (0: the recipes')")
    p.add_argument("--evaluations", type=int, default=LAPTOP.evaluations,
                   help="validation E[L] evaluations over the budget (the convergence curve; 0: the recipes')")
    p.add_argument("--override-all", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override for every run (the shared budget and data); repeatable")
    p.add_argument("--reuse", action="store_true",
                   help="keep what OUT holds: a kind whose every training seed reached the step this invocation "
                        "ends at is not trained again, one whose seeds stopped earlier continues from its checkpoints")
    p.add_argument("--prompts", type=int, default=LAPTOP.prompts, help="prompts drawn from each suite")
    p.add_argument("--new-tokens", type=int, default=LAPTOP.new_tokens)
    p.add_argument("--sampling-seeds", type=int, default=LAPTOP.sampling_seeds,
                   help="sampling seeds at T > 0, pooled per prompt")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    p.add_argument("--exactness-prompts", type=int, default=2, help="prompts of the T = 0 exactness check")
    p.add_argument("--distribution-samples", type=int, default=2000,
                   help="first rounds of the T = 1 first-token law test per drafter (0: skip)")
    p.add_argument("--bootstrap", type=int, default=4000, help="bootstrap replicates")
    p.add_argument("--decode-workers", type=int, default=len(os.sched_getaffinity(0)))
    # On a real target its forward dominates a step, so one grouped command with every core's threads beats one
    # one-thread command per core, each paying that forward: 6.76 s against 8.44 s per step for the nine SmolLM2
    # drafters (2 cores, 30 steps side by side; docs/howto/real_model.md).
    p.add_argument("--train-jobs", type=int, default=1,
                   help="grouped training commands run at the same time, the kinds split between them, each with "
                        "cores / J threads and its own target forward (default 1: one target pass for every drafter)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def prepare_suites(args: argparse.Namespace, out: Path) -> list[Suite]:
    """The suites' prompt files, written with the ``deepspec suites prepare`` command a user runs."""
    suites = []
    for name, folder in SUITES.items():
        source, written = Path(args.datasets) / folder, out / "suites" / f"{name}.jsonl"
        if not source.exists():
            raise SystemExit(f"{source}: not found (the benchmark reads GSM8K test and HumanEval from --datasets)")
        if not written.is_file():
            subprocess.run([sys.executable, "-m", "deepspec_train.commands.dispatch", "suites", "prepare", name,
                            "--input", str(source), "--out", str(written), "--sample", str(args.prompts),
                            "--no-progress"],
                           cwd=REPO, check=True)
        suites.append(load_suite(str(written), None, args.prompts))
    return suites


def run_name(recipe: str, seed: int) -> str:
    return f"{recipe}@s{seed}"


def training_plan(args: argparse.Namespace, out: Path, data: Path, target: Path, recipes: tuple[str, ...] = RECIPES,
                  per_recipe: dict[str, list[str]] | None = None) -> TrainingPlan:
    """Every kind x training seed as a drafter group, on the regenerated data with one budget (``per_recipe``:
    overrides of one recipe's groups only)."""
    budget = []
    if args.steps:
        budget += [f"train.max_steps={args.steps}", f"train.checkpoint_every={args.steps}"]
    if args.anchors:
        budget.append(f"anchors.num_per_sequence={args.anchors}")
    if args.batch:
        budget += [f"train.global_batch_sequences={args.batch}", f"train.micro_batch_sequences={args.batch}"]
    if args.feature_reuse:
        budget.append(f"train.feature_reuse={args.feature_reuse}")
    # Several validation points make the E[L] curve that shows how far from converged the budget leaves them.
    if args.evaluations:
        steps = args.steps or read_recipe(recipes[0])[1].train.max_steps
        budget.append(f"train.eval_every={max(1, steps // args.evaluations)}")
    shared = [f"target.path={target}", f"data.train=[{data / 'train.jsonl'}]",
              f"data.validation=[{data / 'validation.jsonl'}]", f"data.cache_dir={out / 'cache'}",
              "logging.wandb=false", f"logging.progress={str(not args.no_progress).lower()}", *budget,
              *args.override_all]
    plan = plan_training(list(recipes), args.training_seeds, shared, per_recipe or {}, out, args.train_jobs,
                         args.reuse, args.stop_at or None)
    for note in plan.notes:
        print(note, flush=True)
    return plan


def check_exactness(target, tokenizer, drafters: list[BenchDrafter], suites: list[Suite], count: int,
                    new_tokens: int) -> int:
    """Greedy speculative decoding equals ``generate(do_sample=False)`` for every drafter on ``count`` prompts of
    each suite; returns the number of (drafter, prompt) pairs checked."""
    stops = sorted(stop_token_ids(target, tokenizer))
    checked = 0
    for suite in suites:
        for prompt in suite.prompts[:count]:
            messages = [{"role": "user", "content": prompt.turns[0]}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"].to(target.device)
            plain = target.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=stops,
                                    pad_token_id=stops[0])[0, ids.shape[1]:].tolist()
            for d in drafters:
                decoder = SpeculativeDecoder(target, tokenizer, d.drafter, d.loaded.target_layer_ids,
                                             d.block_size, 0.0)
                (turn,), _ = decoder.decode_conversation([prompt.turns[0]], new_tokens)
                if turn.tokens != plain:
                    raise SystemExit(f"exactness: {d.name} on {suite.name}/{prompt.id} differs from greedy decoding")
                checked += 1
    return checked


def distribution_lines(target, tokenizer, drafters: list[BenchDrafter], suite: Suite, samples: int) -> list[str]:
    """The T = 1 first-token law test (``bench/first_token_law.py``) for the first training seed's drafters, on
    the suite's first prompt; one line each."""
    messages = [{"role": "user", "content": suite.prompts[0].turns[0]}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"][0]
    lines = []
    for d in drafters:
        law = first_token_law(target, d.drafter, d.loaded.target_layer_ids, ids, samples)
        verdict = "consistent with the target's law" if law.p_value > 0.01 else "NOT the target's law"
        lines.append(f"- {d.name}: first token of {samples} rounds at T = 1, chi-square p = {law.p_value:.3f} over "
                     f"{law.cells} cells ({verdict}); first-round acceptance {law.acceptance:.3f}")
    return lines


def trained_drafters(plan: TrainingPlan, recipes: tuple[str, ...], seeds: int, target_path: Path,
                     device: str | torch.device = "cpu") -> list[BenchDrafter]:
    """Every trained (recipe, training seed) drafter, named ``run_name``, seed by seed."""
    return [BenchDrafter.of(run_name(r, s), load_exported_drafter(plan.run_dir(r, s) / "drafter", str(target_path),
                                                                  device=device))
            for s in range(seeds) for r in recipes]


def modeled_factors(plan: TrainingPlan, recipes: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """Per reported batch, each recipe's modeled ``t_target / (t_verify + t_draft)`` (its production counterpart,
    from the first training seed's settings)."""
    costs = {r: modeled_cost(r, *trained_settings(plan.run_dir(r, 0) / "drafter")) for r in recipes}
    return {b: {r: costs[r].times[b].speedup_per_token for r in recipes} for b in REPORT_BATCHES}


def validation_curves(plan: TrainingPlan, recipes: tuple[str, ...], seeds: int) -> dict[str, Curve]:
    """Each kind's validation E[L] curve over its training seeds, keyed by the kind's short name, with the target
    tokens forwarded up to each evaluated step (every group trains the same sequences in the same order)."""
    curves = {r: curve_of([plan.run_dir(r, s) for s in range(seeds)]) for r in recipes}
    cfg = plan.groups[(recipes[0], 0)].cfg
    last = max((c.steps[-1] for c in curves.values() if c.steps), default=0)
    reuse = cfg.train.feature_reuse
    tokens = tokens_per_pass(cfg, -(-last // reuse)) if last else []
    return {r.removeprefix("smollm2-135m-"): with_target_tokens(c, tokens, reuse) for r, c in curves.items()}


def tables_at(temperature: float, rows, args: argparse.Namespace, factors, recipes: tuple[str, ...] = RECIPES,
              goals: dict[tuple[str, str], float] = GOALS,
              pairs: tuple[tuple[str, str], ...] = PAIRS) -> tuple[str, dict]:
    """The markdown and the JSON of one temperature: tau per suite of ``recipes``, the ratios of ``pairs`` (those
    of them in ``recipes``), modeled speedups, and whether each of ``goals`` is met."""
    by_seed: list[dict] = []
    for seed in range(args.training_seeds):
        names = {run_name(r, seed): r for r in recipes}
        totals = totals_by_category({n: rows[n] for n in names}, group_of=lambda r: r.suite)
        by_seed.append({suite: {names[n]: t for n, t in per.items()} for suite, per in totals.items()})
    taus = pooled_tau(by_seed)
    pairs = [p for p in pairs if set(p) <= set(recipes)]
    ratios = seed_and_prompt_ratios(by_seed, pairs, args.bootstrap, seed=0)
    speedups = {b: speedup_ratios(ratios, factors[b]) for b in REPORT_BATCHES}
    suites = sorted(taus)
    columns = ["suite", *(f"tau {r.removeprefix('smollm2-135m-')}" for r in recipes),
               *(f"{a.removeprefix('smollm2-135m-')} / {b.removeprefix('smollm2-135m-')}" for a, b in pairs),
               *(f"modeled speedup ratio {b.removeprefix('smollm2-135m-')} b={n}" for n in REPORT_BATCHES
                 for _, b in pairs)]
    body = [[s, *(f"{taus[s][r]:.3f}" for r in recipes), *(ratio_cell(ratios[p][s]) for p in pairs),
             *(ratio_cell(speedups[n][p][s]) for n in REPORT_BATCHES for p in pairs)] for s in suites]
    body.append(["geomean", *("" for _ in recipes), *(ratio_cell(ratios[p]["geomean"]) for p in pairs),
                 *(ratio_cell(speedups[n][p]["geomean"]) for n in REPORT_BATCHES for p in pairs)])
    lines = [markdown(columns, body), ""]
    for pair, goal in goals.items():
        if pair not in ratios:
            continue
        g = ratios[pair]["geomean"]
        met = g.value >= goal and g.excludes_one()
        lines.append(f"- {pair[0]} / {pair[1]} ({args.training_seeds} training seed(s) each): geomean "
                     f"{g.value:.3f} [{g.low:.3f}, {g.high:.3f}]; goal >= {goal} with the interval excluding 1: "
                     f"{'met' if met else 'not met'}")
    report = {"tau": taus,
              "ratios": {f"{a}/{b}": {c: e.to_dict() for c, e in per.items()} for (a, b), per in ratios.items()},
              "modeled_speedup_ratios": {str(n): {f"{a}/{b}": {c: e.to_dict() for c, e in per.items()}
                                                  for (a, b), per in by.items()} for n, by in speedups.items()}}
    return "\n".join(lines), report


def write_report(out: Path, text: list[str], report: dict) -> None:
    """``OUT/realworld.md`` and ``OUT/realworld.json`` as far as the run has got (rewritten after each phase, so a
    run cut short keeps its curves)."""
    (out / "realworld.md").write_text("\n".join(text) + "\n")
    (out / "realworld.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.time()
    out, data, target_path = Path(args.out).resolve(), Path(args.data).resolve(), Path(args.target).resolve()
    for needed in (target_path / "config.json", data / "train.jsonl", data / "validation.jsonl"):
        if not needed.is_file():
            raise SystemExit(f"{needed}: missing (docs/howto/real_model.md builds the target and its data)")
    out.mkdir(parents=True, exist_ok=True)
    suites = prepare_suites(args, out)
    plan = training_plan(args, out, data, target_path)
    train_seconds = train_all(plan.commands, args.train_jobs, out)
    plan.write_record()
    phases = {"training": time.time() - started}

    curves = validation_curves(plan, RECIPES, args.training_seeds)
    plot = plot_curves(curves, out / "validation_expected_len.png", args.training_seeds)
    evaluated = plan.groups[(RECIPES[0], 0)].cfg.train.eval_sequences
    prompts = ", ".join(f"{s.name} {len(s.prompts)}" for s in suites)
    steps = args.stop_at or args.steps or "recipe"
    text = [f"# SmolLM2-135M-Instruct: DSpark against EAGLE-3, DFlash and DFlash2 ({args.training_seeds} training "
            f"seed(s) per kind, {steps} steps of {args.batch or 'recipe'} sequences (schedule of "
            f"{args.steps or 'recipe'}), feature reuse {args.feature_reuse or 'recipe'}, {args.anchors or 'recipe'} "
            f"anchors per sequence; {prompts} prompts; {args.new_tokens} new tokens)", "", *plan.notes, "",
            f"Validation E[L] by training step (up to {evaluated} validation conversations; mean [lowest, highest] "
            f"over {args.training_seeds} training seed(s); converged: the last quarter of training added less than "
            f"5% of the final E[L]; plot against target tokens: {plot.name}):", "", curves_table(curves), ""]
    report: dict = {"settings": vars(args), "training_seeds": args.training_seeds, "train_seconds": train_seconds,
                    "training_notes": plan.notes, "phase_seconds": phases,
                    "validation_expected_len": {k: vars(c) for k, c in curves.items()},
                    "converged": {k: c.converged for k, c in curves.items()}, "temperatures": {}}
    write_report(out, text, report)

    checks_started = time.time()
    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    target.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    drafters = trained_drafters(plan, RECIPES, args.training_seeds, target_path)
    checked = check_exactness(target, tokenizer, drafters, suites, args.exactness_prompts, args.new_tokens)
    factors = modeled_factors(plan, RECIPES)
    text += [f"Exactness: greedy speculative decoding equals generate(do_sample=False) for {checked} "
             "(drafter, prompt) pairs.", ""]
    report["exactness_pairs"] = checked
    if args.distribution_samples:
        first_seed = [d for d in drafters if d.name.endswith("@s0")]
        text += [f"T = 1 distribution test ({suites[0].name}'s first prompt):",
                 *distribution_lines(target, tokenizer, first_seed, suites[0], args.distribution_samples), ""]
    phases["checks"] = time.time() - checks_started
    write_report(out, text, report)
    for temperature in args.temperatures:
        decode_started = time.time()
        seeds = tuple(range(args.sampling_seeds)) if temperature > 0 else (0,)
        settings = DecodeSettings(temperature, seeds, args.new_tokens)
        rows = decode_interleaved(target, tokenizer, drafters, suites, settings, not args.no_progress,
                                  workers=args.decode_workers)
        table, report["temperatures"][f"{temperature:g}"] = tables_at(temperature, rows, args, factors)
        text += [f"## T = {temperature:g} ({len(seeds)} sampling seed(s); {args.training_seeds} training seed(s) "
                 "behind every tau and ratio; tau pooled over rounds; intervals: "
                 "two-level bootstrap over training seeds and prompts, 95%; modeled speedup: production "
                 f"counterparts at Qwen3-8B widths on an {REPORT_GPU})", "", table, ""]
        phases[f"decoding T={temperature:g}"] = time.time() - decode_started
        write_report(out, text, report)
    minutes = (time.time() - started) / 60
    text.append(f"Wall time {minutes:.1f} min end to end in this invocation ("
                + ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in phases.items()) + ").")
    report["wall_minutes"] = minutes
    write_report(out, text, report)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
