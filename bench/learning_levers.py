"""What each lever that learns more per target token buys on a real model: DSpark for SmolLM2-135M-Instruct
trained with today's laptop settings and with each lever, side by side in one run, on several training seeds, judged
by validation E[L] at equal target tokens and at equal wall time.

    python bench/learning_levers.py --target artifacts/smollm2/target --data artifacts/smollm2/data --out runs/levers
    python bench/learning_levers.py ... --seeds 1 --passes 4 --evaluations 2 --probe-passes 1   # a smoke run

1. Writes one recipe per variant (``OUT/recipes/lever-NAME.yaml``: ``smollm2-135m-dspark`` at the laptop batch
   with the variant's settings) and trains them all, every training seed of every variant, as drafter groups of
   one ``train.py`` command (``bench/group_training.py``): every variant sees the same sequences in the same order,
   ``--passes`` target passes each (a variant that reuses each pass R times takes R times as many optimizer steps),
   and evaluates validation E[L] ``--evaluations`` times (never the benchmark suites).
2. Times each variant alone for ``--probe-passes`` passes after one warm-up pass (``train.py`` with
   ``logging.log_every`` = its steps per pass, so each logged window is one pass): seconds per target pass, the
   target forward and that pass's optimizer steps together, measured one variant after the other in this run.
3. Counts the target tokens of every pass from the plan (the exact sequences), and draws each variant's validation
   E[L] against target tokens and against wall time (passes x the probe's seconds per pass), seeds' range shaded.

Writes ``OUT/levers.md`` (the table), ``OUT/levers.json`` and ``OUT/levers_curves.png``. The convergence rule: a
variant has converged when its last quarter of target passes added less than 5% to its E[L].
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.group_training import plan_training, tokens_per_pass, train_all  # noqa: E402
from bench.validation_curve import CONVERGED_GAIN, linear_from_zero, logged_values  # noqa: E402
from deepspec_train.formats.figures import new_figure, save_png  # noqa: E402

BASE_RECIPE = "smollm2-135m-dspark"
# The laptop budget of bench/realworld.py: 4 sequences a step, 16 anchors a sequence.
BATCH = 4


@dataclass(frozen=True)
class Variant:
    """One way of training: recipe overrides on the laptop settings and its optimizer steps per target pass."""

    name: str
    overrides: tuple[str, ...]
    reuse: int = 1

    @property
    def recipe(self) -> str:
        return f"lever-{self.name}"


# SmolLM2's last five decoder layers: the drafter's five layers predict the next tokens from target states, as the
# target's last layers do.
LAST_LAYERS = "[25,26,27,28,29]"
VARIANTS = (
    Variant("today", ("anchors.num_per_sequence=16",)),
    Variant("anchors-64", ("anchors.num_per_sequence=64",)),
    Variant("reuse-4", ("anchors.num_per_sequence=16",), reuse=4),
    Variant("target-init", ("anchors.num_per_sequence=16", f"drafter.init_from_target_layers={LAST_LAYERS}")),
    Variant("init-reuse-4", ("anchors.num_per_sequence=16", f"drafter.init_from_target_layers={LAST_LAYERS}"),
            reuse=4),
)
REFERENCE = VARIANTS[0].name


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="artifacts/smollm2/target")
    p.add_argument("--data", default="artifacts/smollm2/data", help="train.jsonl and validation.jsonl")
    p.add_argument("--out", default="runs/levers")
    p.add_argument("--variants", nargs="+", default=[v.name for v in VARIANTS], choices=[v.name for v in VARIANTS])
    p.add_argument("--seeds", type=int, default=2, help="training seeds per variant")
    p.add_argument("--passes", type=int, default=100, help="target passes of every variant")
    p.add_argument("--evaluations", type=int, default=5, help="validation E[L] evaluations over the passes")
    p.add_argument("--eval-sequences", type=int, default=32, help="validation conversations per evaluation")
    p.add_argument("--probe-passes", type=int, default=3, help="timed passes per variant after one warm-up")
    p.add_argument("--reuse", action="store_true", help="keep trained runs and probes found in --out")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the evaluations the runs in --out logged so far (a run cut short)")
    return p.parse_args(argv)


def write_recipes(variants: list[Variant], out: Path, passes: int, evaluations: int, eval_sequences: int) -> Path:
    """One recipe file per variant under ``out / 'recipes'`` (a ``DEEPSPEC_RECIPES`` folder)."""
    folder = out / "recipes"
    folder.mkdir(parents=True, exist_ok=True)
    every = max(1, passes // evaluations)
    for v in variants:
        settings = [f"run.name={v.recipe}", f"train.feature_reuse={v.reuse}", f"train.max_steps={passes * v.reuse}",
                    f"train.eval_every={every * v.reuse}", f"train.checkpoint_every={passes * v.reuse}",
                    f"train.eval_sequences={eval_sequences}", f"train.global_batch_sequences={BATCH}",
                    f"train.micro_batch_sequences={BATCH}", *v.overrides]
        (folder / f"{v.recipe}.yaml").write_text(f"base: {BASE_RECIPE}\n" + _yaml(settings))
    return folder


def _yaml(settings: list[str]) -> str:
    """``section.key=value`` settings as a YAML mapping of sections."""
    sections: dict[str, list[str]] = {}
    for setting in settings:
        key, value = setting.split("=", 1)
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"  {name}: {value}")
    return "".join(f"{section}:\n" + "\n".join(lines) + "\n" for section, lines in sections.items())


def shared_overrides(args: argparse.Namespace, out: Path) -> list[str]:
    data = Path(args.data)
    return [f"target.path={args.target}", f"data.train=[{data / 'train.jsonl'}]",
            f"data.validation=[{data / 'validation.jsonl'}]", f"data.cache_dir={out / 'cache'}",
            "logging.wandb=false", "logging.progress=false"]


def probe_seconds_per_pass(variant: Variant, shared: list[str], out: Path, passes: int, reuse: bool) -> float:
    """Median wall seconds of one target pass with its optimizer steps, ``variant`` trained alone."""
    run_dir = out / "probes" / variant.name
    record = run_dir / "seconds_per_pass.json"
    if reuse and record.is_file():
        return json.loads(record.read_text())["seconds_per_pass"]
    steps = (passes + 1) * variant.reuse
    command = [sys.executable, str(REPO / "train.py"), f"recipe={variant.recipe}", *shared,
               f"run.output_dir={run_dir}", "run.overwrite=true", f"train.max_steps={steps}",
               f"logging.log_every={variant.reuse}", f"train.eval_every={steps + 1}", "data.validation=[]",
               f"train.checkpoint_every={steps + 1}"]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    windows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/samples_per_s" in row and row["step"] > variant.reuse:
            windows.append(BATCH * variant.reuse / row["train/samples_per_s"])
    windows.sort()
    seconds = windows[len(windows) // 2]
    record.write_text(json.dumps({"seconds_per_pass": seconds, "windows": windows}))
    return seconds


def tokens_of_passes(args: argparse.Namespace, out: Path, passes: int) -> list[int]:
    """The target tokens of each pass, from the plan's own sequences."""
    from deepspec_train.kinds.recipe_validation import load_recipe

    return tokens_per_pass(load_recipe(VARIANTS[0].recipe, shared_overrides(args, out)), passes)


@dataclass(frozen=True)
class LeverCurve:
    """One variant's validation E[L] after each evaluated number of target passes, per training seed."""

    passes: list[int]
    per_seed: list[list[float]]

    @property
    def mean(self) -> list[float]:
        return [sum(v) / len(v) for v in zip(*self.per_seed)]

    @property
    def per_seed_last(self) -> list[float]:
        return [seed[-1] for seed in self.per_seed]

    def at(self, passes: float) -> list[float]:
        """Per seed, E[L] at ``passes`` (``linear_from_zero``)."""
        return [linear_from_zero(self.passes, seed, passes) for seed in self.per_seed]

    def last_quarter_gain(self) -> float:
        """The share of its final mean E[L] that the last quarter of its passes added."""
        final = sum(self.at(self.passes[-1])) / len(self.per_seed)
        before = sum(self.at(0.75 * self.passes[-1])) / len(self.per_seed)
        return (final - before) / final if final > 0 else float("inf")


def lever_curve(run_dirs: list[Path], reuse: int) -> LeverCurve:
    per_run = [logged_values(d) for d in run_dirs]
    steps = sorted(set.intersection(*(set(v) for v in per_run)))
    return LeverCurve([-(-s // reuse) for s in steps], [[v[s] for s in steps] for v in per_run])


def _cell(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.3f} [{min(values):.3f}, {max(values):.3f}]" if len(values) > 1 else f"{mean:.3f}"


def report(curves: dict[str, LeverCurve], seconds: dict[str, float], tokens: list[int], seeds: int) -> tuple[str, dict]:
    """The table: E[L] at equal target tokens (the most passes every variant evaluated) and at equal wall time (the
    time those passes take with the reference's settings), with each seed's ratio to the reference (seeds paired:
    same data order and seed), and each variant's last evaluation."""
    reference = curves[REFERENCE]
    budget_passes = min(curve.passes[-1] for curve in curves.values())
    wall = budget_passes * seconds[REFERENCE]
    rows, record = [], {}
    for name, curve in curves.items():
        at_tokens = curve.at(budget_passes)
        at_wall = curve.at(wall / seconds[name])
        ratio_tokens = [a / b for a, b in zip(at_tokens, reference.at(budget_passes))]
        ratio_wall = [a / b for a, b in zip(at_wall, reference.at(budget_passes))]
        gain = curve.last_quarter_gain()
        rows.append(f"| {name} | {seconds[name]:.1f} | {_cell(at_tokens)} | {_cell(ratio_tokens)} | "
                    f"{_cell(at_wall)} | {_cell(ratio_wall)} | {_cell(curve.per_seed_last)} after "
                    f"{curve.passes[-1]} | {gain:+.1%} ({'yes' if gain < CONVERGED_GAIN else 'no'}) |")
        record[name] = {"seconds_per_pass": seconds[name], "passes": curve.passes, "per_seed": curve.per_seed,
                        "at_equal_tokens": at_tokens, "at_equal_wall": at_wall, "ratio_tokens": ratio_tokens,
                        "ratio_wall": ratio_wall, "last_quarter_gain": gain}
    head = [f"Validation E[L] after {budget_passes} target passes ({sum(tokens[:budget_passes]):,} target tokens) "
            f"and at the wall time those take with today's settings ({wall / 60:.1f} min); mean [lowest, highest] "
            f"over {seeds} training seed(s); ratios per seed against `{REFERENCE}` at its budget. Converged: the last "
            f"quarter of passes added less than {CONVERGED_GAIN:.0%}.", "",
            "| variant | s / pass | E[L], equal tokens | / today | E[L], equal wall time | / today | last evaluation "
            "(passes) | last quarter (converged) |", "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows), record


def plot(curves: dict[str, LeverCurve], seconds: dict[str, float], tokens: list[int], path: Path) -> Path:
    """Two panels: E[L] against target tokens and against wall time, each variant's seeds' range shaded."""
    fig = new_figure(11.0, 4.0)
    cumulative = [sum(tokens[:p]) / 1e3 for p in range(len(tokens) + 1)]
    for index, (label, x_of) in enumerate((
            ("target tokens (thousands)", lambda name, p: cumulative[min(p, len(tokens))]),
            ("wall time (minutes, measured seconds per pass)", lambda name, p: p * seconds[name] / 60))):
        ax = fig.add_subplot(1, 2, index + 1)
        for name, curve in curves.items():
            xs = [x_of(name, p) for p in curve.passes]
            lows, highs = [min(v) for v in zip(*curve.per_seed)], [max(v) for v in zip(*curve.per_seed)]
            line, = ax.plot(xs, curve.mean, marker="o", label=name)
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2)
        ax.set_xlabel(label)
        ax.set_ylabel("validation E[L]")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(loc="lower right", fontsize=8)
    seeds = len(next(iter(curves.values())).per_seed)
    fig.suptitle(f"DSpark on SmolLM2-135M-Instruct: validation E[L] by lever ({seeds} training seed(s), range shaded)")
    return save_png(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out).resolve()
    variants = [v for v in VARIANTS if v.name in args.variants]
    if REFERENCE not in args.variants:
        raise SystemExit(f"--variants must include {REFERENCE}, the reference every ratio is taken against")
    start = time.time()
    os.environ["DEEPSPEC_RECIPES"] = str(write_recipes(variants, out, args.passes, args.evaluations,
                                                       args.eval_sequences))
    shared = shared_overrides(args, out)
    plan = plan_training([v.recipe for v in variants], args.seeds, shared, {}, out, 1, args.reuse)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    trained = {} if args.report_only else train_all(plan.commands, 1, out / "logs")
    plan.write_record()
    seconds = {v.name: probe_seconds_per_pass(v, shared, out, args.probe_passes, args.reuse) for v in variants}
    tokens = tokens_of_passes(args, out, args.passes)
    curves = {v.name: lever_curve([plan.run_dir(v.recipe, s) for s in range(args.seeds)], v.reuse) for v in variants}
    table, record = report(curves, seconds, tokens, args.seeds)
    picture = plot(curves, seconds, tokens, out / "levers_curves.png")
    elapsed = time.time() - start
    done = ("Reported with --report-only from the evaluations logged so far." if args.report_only else
            f"Training {sum(t['wall_s'] for t in trained.values()) / 60:.1f} min.")
    text = f"{table}\n\n{done} {elapsed / 60:.1f} min in all.\n"
    (out / "levers.md").write_text(text)
    (out / "levers.json").write_text(json.dumps({"variants": record, "tokens_per_pass": tokens,
                                                 "training": trained, "seconds": elapsed}, indent=1))
    print(text + f"wrote {out / 'levers.md'}, {out / 'levers.json'}, {picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
