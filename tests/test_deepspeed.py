"""``train.distributed=deepspeed`` (ZeRO-2, gloo, CPU fp32) against the DDP path, with real multi-process launches.

Colocated, 2 drafter ranks: the same data and init give per-step losses within 1e-5 of DDP's (the only
difference is where fp32 sums are re-associated: ZeRO reduces every backward then accumulates, DDP accumulates
then reduces; measured identical to 1e-7 here), the checkpoint files match DDP's layout and values, and a run
stopped at step 2 and resumed with ``train.resume=auto`` continues on the same curve. The packing here (16
anchors, 100-token budget, one sequence per micro-batch) splits sequences unevenly, so ranks get different
micro-batch counts and the zero-loss padding calls run (``train/padding_calls``).

Single process with DeepSpeed's bf16 forced on (production enables it on CUDA only): the module trains in bf16,
ZeRO keeps fp32 masters, and checkpoints and the exported drafter carry those fp32 weights.

Streamed, 1 target worker + 1 drafter: ZeRO runs over the drafter group only (a collective over the whole world
would hang the target worker) and matches a single-process colocated DDP run of the same recipe.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.training import deepspeed_engine
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.deepspeed_engine import resolve_deepspeed_config
from deepspec_train.jobs.run import run_training
from tests.helpers.streaming_world import (
    REPO, read_logs, recipe_overrides, run_ranks, start_ranks, step_losses, wait_all,
)

UNEVEN_PACKING = {
    "anchors.num_per_sequence": 16,
    "anchors.token_budget": 100,
    "train.micro_batch_sequences": 1,
    "train.eval_every": 4,
}
LOSS_TOLERANCE = 1e-5
STATE_TOLERANCE = 1e-6
LAUNCH_TIMEOUT_S = 300


def run_worlds(worlds: list[tuple[list[str], Path]]) -> None:
    """Run several 2-rank ``train.py`` worlds at the same time; fails with the logs of any world that fails."""
    started = [(start_ranks(["train.py", *args], 2, log_dir), log_dir) for args, log_dir in worlds]
    for procs, log_dir in started:
        codes = wait_all(procs, LAUNCH_TIMEOUT_S)
        assert codes == [0, 0], f"exit codes {codes}\n{read_logs(log_dir, 2)}"


def metric_values(output_dir, key: str) -> list[float]:
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in records if key in r]


def assert_close_losses(expected: dict[int, float], got: dict[int, float], steps: list[int]) -> None:
    assert sorted(expected) == steps and sorted(got) == steps, (expected, got)
    for step in steps:
        assert abs(expected[step] - got[step]) <= LOSS_TOLERANCE, (step, expected[step], got[step])


def assert_same_tensors(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert sorted(expected) == sorted(got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=STATE_TOLERANCE, rtol=1e-5, msg=name)


def test_resolved_config_overlays_recipe_on_launch_file(tmp_path) -> None:
    cfg = load_recipe("tiny-dspark", ["train.grad_clip=0.5", "train.global_batch_sequences=12",
                                      "train.micro_batch_sequences=2", "train.mixed_precision=bf16"],
                      check_target=False)
    resolved = resolve_deepspeed_config(cfg, 4, torch.device("cpu"))
    launch = json.loads((REPO / "launch" / "deepspeed" / "zero2.json").read_text())
    assert resolved["zero_optimization"] == launch["zero_optimization"]
    # 12 sequences over 4 ranks at 2 per micro-batch: 2 packed micro-batches per rank (nominal; packing varies).
    assert resolved["gradient_accumulation_steps"] == 2 and resolved["train_micro_batch_size_per_gpu"] == 1
    assert resolved["gradient_clipping"] == 0.5
    assert resolved["bf16"] == {"enabled": False}, "bf16 is for CUDA only"
    assert resolve_deepspeed_config(cfg, 4, torch.device("cuda", 0))["bf16"] == {"enabled": True}

    stage3 = tmp_path / "zero3.json"
    stage3.write_text(json.dumps(launch | {"zero_optimization": {"stage": 3}}))
    cfg.train.deepspeed_config = str(stage3)
    with pytest.raises(ValueError, match="ZeRO stage 2"):
        resolve_deepspeed_config(cfg, 4, torch.device("cpu"))


@pytest.mark.slow
def test_zero2_matches_ddp_checkpoints_and_resumes(streaming_world, tmp_path) -> None:
    ddp, ds = tmp_path / "ddp", tmp_path / "ds"
    common = UNEVEN_PACKING | {"train.max_steps": 4, "train.checkpoint_every": 2}
    ds_args = common | {"train.distributed": "deepspeed"}
    # Independent worlds, launched together: most of a launch is imports and rendezvous, which overlap well.
    run_worlds([
        (recipe_overrides(streaming_world, ddp, **common), ddp / "logs"),
        (recipe_overrides(streaming_world, ds, **ds_args, **{"train.stop_at_step": 2}), ds / "logs1"),
    ])

    # The step-2 checkpoint gathered from ZeRO's partitions is the DDP path's, file for file.
    (ds_ckpt,) = list_checkpoints(ds)
    ddp_ckpt = next(p for p in list_checkpoints(ddp) if p.name == ds_ckpt.name == "step_00000002")
    assert_same_tensors(load_file(ddp_ckpt / "drafter.safetensors"), load_file(ds_ckpt / "drafter.safetensors"))
    ddp_opt = torch.load(ddp_ckpt / "optimizer.pt", weights_only=True)
    ds_opt = torch.load(ds_ckpt / "optimizer.pt", weights_only=True)
    assert ds_opt["param_groups"] == ddp_opt["param_groups"]
    assert sorted(ds_opt["state"]) == sorted(ddp_opt["state"])
    for index, entry in ddp_opt["state"].items():
        assert_same_tensors(entry, ds_opt["state"][index])

    run_ranks(recipe_overrides(streaming_world, ds, **ds_args, **{"train.resume": "auto"}), 2, ds / "logs2",
              LAUNCH_TIMEOUT_S)
    assert_close_losses(step_losses(ddp), step_losses(ds), [1, 2, 3, 4])
    assert_same_tensors(load_file(ddp / "drafter" / "drafter.safetensors"),
                        load_file(ds / "drafter" / "drafter.safetensors"))
    assert sum(metric_values(ds, "train/padding_calls")) > 0, "the packing was meant to need padding calls"
    assert metric_values(ds, "train/lr") == metric_values(ddp, "train/lr")

    resolved = json.loads((ds / "deepspeed_config.json").read_text())
    assert resolved["zero_optimization"]["stage"] == 2
    assert resolved["train_micro_batch_size_per_gpu"] == 1 and resolved["gradient_clipping"] == 1.0
    assert resolved["bf16"] == {"enabled": False}


@pytest.mark.slow
def test_streamed_deepspeed_drafter_matches_colocated(streaming_world, tmp_path) -> None:
    streamed, colocated = tmp_path / "streamed", tmp_path / "colocated"
    args = {"topology.target_workers": 1, "train.distributed": "deepspeed", "train.eval_every": 4}
    run_ranks(recipe_overrides(streaming_world, streamed, **args), 2, streamed / "logs", LAUNCH_TIMEOUT_S)
    assert (streamed / "drafter" / "drafter.safetensors").is_file()

    overrides = recipe_overrides(streaming_world, colocated, **{"train.eval_every": 4})
    run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    got = step_losses(streamed)
    assert all(math.isfinite(v) for v in got.values())
    assert_close_losses(step_losses(colocated), got, [1, 2, 3, 4])


def test_bf16_engine_checkpoints_and_exports_fp32_masters(streaming_world, tmp_path, monkeypatch) -> None:
    # In-process: DeepSpeed caches its world group in module state, so keep this the suite's only in-process
    # DeepSpeed run. LOCAL_RANK is what DeepSpeed reads; monkeypatch restores the environment afterwards.
    monkeypatch.setattr(deepspeed_engine, "uses_bf16", lambda cfg, device: True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    bf16, fp32 = tmp_path / "bf16", tmp_path / "fp32"
    extra = {"train.eval_every": 4, "train.checkpoint_every": 2}
    for out, mode in ((bf16, "deepspeed"), (fp32, "ddp")):
        overrides = recipe_overrides(streaming_world, out, **extra, **{"train.distributed": mode})
        run_training(load_recipe(overrides[0].split("=", 1)[1], overrides[1:]))
    assert json.loads((bf16 / "deepspeed_config.json").read_text())["bf16"] == {"enabled": True}
    expected, got = step_losses(fp32), step_losses(bf16)
    assert sorted(got) == [1, 2, 3, 4]
    # bf16 forward rounding (8-bit mantissa) moves a loss of about 2 by a few 1e-4 at most here.
    assert all(abs(expected[s] - got[s]) < 1e-2 for s in got), (expected, got)
    for path in (bf16 / "drafter" / "drafter.safetensors", bf16 / "checkpoints" / "step_00000004" / "drafter.safetensors"):
        weights = load_file(path)
        assert all(w.dtype == torch.float32 for w in weights.values())
        # Values off the bf16 grid: these are the fp32 masters, not the bf16 module copy.
        assert any(bool((w != w.bfloat16().float()).any()) for w in weights.values())
