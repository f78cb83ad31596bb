"""What drafter groups save: N drafters trained in one target pass against the same N trained alone, measured on
this machine, and the GPU cost modeled at Qwen3-8B widths for 3 kinds x 3 training seeds.

    python bench/drafter_groups.py --tinyworld DIR [--steps N] [--seeds K] [--out DIR] [--json PATH]
    python bench/drafter_groups.py --model-only

Measured: ``train.py recipe=tiny-dspark compare=[tiny-dflash,tiny-eagle3] seeds=K`` on the tiny world ``DIR``
(``deepspec tinyworld build``), then each of its 3K groups as its own ``train.py`` run with the group's seed and
data order; one process at a time, one intra-op thread. Each side's wall time and CPU seconds (its child
processes' user + system time) are printed with their ratio (separate / one pass); both sides pay their process
start, data and target loading, as users would.

Modeled (``--model-only`` prints this part alone): per training sequence of ``--seq-len`` tokens, the target
forward (``costs.training_flops.target_flops_per_sequence`` on the published Qwen3-8B config) and each drafter's step
(forward + backward, its kind's FLOP model through ``costs.training_flops.drafter_flops_per_sequence``, at the recipe's
anchors) for ``qwen3-8b``, ``qwen3-8b-dflash`` and ``qwen3-8b-eagle3`` x 3 seeds: nine separate runs pay nine
target forwards, one pass pays one. Bytes: the target's bf16 weights read per forward and the features each group
receives per sequence (``costs.stream_payload.payload_bytes``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPES = ("tiny-dspark", "tiny-dflash", "tiny-eagle3")
MODEL_RECIPES = ("qwen3-8b", "qwen3-8b-dflash", "qwen3-8b-eagle3")
# The tiny world's 'test' preset has 2 decoder layers, the 'default' preset 5: taps that fit both.
TAPS = {"tiny-dspark": "[0]", "tiny-dflash": "[0]", "tiny-eagle3": "[0,0,0]"}


def _common(world: Path, out: Path, steps: int) -> list[str]:
    mask_id = json.loads((world / "build_report.json").read_text())["mask_token_id"]
    return [
        f"target.path={world / 'target'}", f"data.train=[{world / 'conversations' / 'train.jsonl'}]",
        f"data.validation=[{world / 'conversations' / 'validation.jsonl'}]", f"data.cache_dir={out / 'cache'}",
        f"drafter.mask_token_id={mask_id}", f"train.max_steps={steps}", f"train.eval_every={steps}",
        f"train.checkpoint_every={steps}", "logging.wandb=false", "logging.progress=false",
    ]


def _timed(args: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of ``train.py args`` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"train.py {' '.join(args[:3])} ... failed: {proc.stderr.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(world: Path, out: Path, steps: int, seeds: int) -> dict:
    common = _common(world, out, steps)
    taps = [f"{recipe}:target.layer_ids={TAPS[recipe]}" for recipe in TINY_RECIPES]
    grouped = [f"recipe={TINY_RECIPES[0]}", f"compare=[{','.join(TINY_RECIPES[1:])}]", f"seeds={seeds}",
               f"run.output_dir={out / 'one_pass'}", *common, *taps]
    one_wall, one_cpu = _timed(grouped)
    listed = json.loads((out / "one_pass" / "groups.json").read_text())["groups"]
    alone_wall = alone_cpu = 0.0
    for group in listed:
        wall, cpu = _timed([f"recipe={group['recipe']}", f"run.seed={group['seed']}",
                            f"run.data_seed={group['data_seed']}", f"run.output_dir={out / 'alone' / group['label']}",
                            f"target.layer_ids={TAPS[group['recipe']]}", *common])
        alone_wall, alone_cpu = alone_wall + wall, alone_cpu + cpu
    return {
        "groups": len(listed), "steps": steps, "one_pass_wall_s": one_wall, "one_pass_cpu_s": one_cpu,
        "separate_wall_s": alone_wall, "separate_cpu_s": alone_cpu,
        "wall_ratio": alone_wall / one_wall, "cpu_ratio": alone_cpu / one_cpu,
    }


def model(seeds: int = 3, seq_len: int = 2048) -> dict:
    """Modeled FLOPs and bytes per training sequence of ``MODEL_RECIPES`` x ``seeds``: separate runs and one pass."""
    from deepspec_train.models.geometry import geometry_from_target_config
    from deepspec_train.costs.reference_targets import reference_target_config
    from deepspec_train.costs.stream_payload import nominal_anchor_count, payload_bytes
    from deepspec_train.costs.training_flops import (
        drafter_flops_per_sequence, target_flops_per_sequence, target_total_params,
    )
    from deepspec_train.costs.worker_memory import TARGET_BYTES_PER_PARAM
    from deepspec_train.kinds.recipe_validation import load_recipe

    rows = []
    for recipe in MODEL_RECIPES:
        cfg = load_recipe(recipe, check_target=False)
        hf_config = reference_target_config(cfg)
        geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
        anchors = nominal_anchor_count(cfg, seq_len)
        rows.append({
            "recipe": recipe, "drafter_flops": drafter_flops_per_sequence(cfg, geometry, seq_len, anchors),
            "payload_bytes": payload_bytes(cfg, geometry, 1, seq_len, anchors).total_bytes,
        })
    target = target_flops_per_sequence(hf_config, seq_len)
    drafters = seeds * sum(r["drafter_flops"] for r in rows)
    runs = seeds * len(rows)
    separate, one_pass = runs * target + drafters, target + drafters
    return {
        "seq_len": seq_len, "seeds": seeds, "runs": runs, "target_flops": target, "kinds": rows,
        "target_weight_bytes": TARGET_BYTES_PER_PARAM * target_total_params(hf_config),
        "separate_flops": separate, "one_pass_flops": one_pass, "saving": 1 - one_pass / separate,
        "speedup": separate / one_pass,
    }


def _print_model(result: dict) -> None:
    print(f"modeled at Qwen3-8B widths, per training sequence of {result['seq_len']} tokens "
          f"({len(result['kinds'])} kinds x {result['seeds']} seeds = {result['runs']} drafters):")
    print(f"  target forward: {result['target_flops'] / 1e12:.2f} TFLOP, "
          f"{result['target_weight_bytes'] / 1e9:.1f} GB of bf16 weights read")
    for row in result["kinds"]:
        print(f"  {row['recipe']:<18} drafter step {row['drafter_flops'] / 1e12:.2f} TFLOP "
              f"({row['drafter_flops'] / result['target_flops']:.2f} of the target forward), "
              f"features {row['payload_bytes'] / 1e6:.1f} MB per group")
    print(f"  separate runs {result['separate_flops'] / 1e12:.1f} TFLOP, one pass "
          f"{result['one_pass_flops'] / 1e12:.1f} TFLOP: {result['saving']:.0%} less GPU time "
          f"({result['speedup']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinyworld", type=Path, help="a built tiny world (deepspec tinyworld build)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per tiny recipe (3 recipes)")
    parser.add_argument("--seq-len", type=int, default=2048, help="modeled sequence length")
    parser.add_argument("--out", type=Path, help="where the runs go (a temporary folder by default)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--model-only", action="store_true", help="print the modeled GPU cost alone")
    args = parser.parse_args()
    result = {"model": model(3, args.seq_len)}
    _print_model(result["model"])
    if not args.model_only:
        if args.tinyworld is None:
            parser.error("--tinyworld DIR is needed to measure (or --model-only)")
        with tempfile.TemporaryDirectory() as tmp:
            measured = measure(args.tinyworld, args.out or Path(tmp), args.steps, args.seeds)
        result["measured"] = measured
        print(f"measured on this machine, {measured['groups']} groups x {measured['steps']} steps: one pass "
              f"{measured['one_pass_wall_s']:.1f} s wall / {measured['one_pass_cpu_s']:.1f} CPU s, separately "
              f"{measured['separate_wall_s']:.1f} s / {measured['separate_cpu_s']:.1f} CPU s: "
              f"{measured['wall_ratio']:.2f}x wall, {measured['cpu_ratio']:.2f}x CPU")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
