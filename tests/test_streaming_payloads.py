"""Streamed payloads equal the colocated in-process features (CPU, fp32): bit for bit for 1 target feeding
2 drafters and 2 targets taking turns feeding 1 drafter; for a tensor-parallel group of 2 ranks feeding 1
drafter, every metadata tensor bit for bit and the features within 1e-5 of their scale (max |value|, at least 1:
the group's row-parallel all-reduces sum partial products in another order than one process does, and this
random target's residual stream reaches ~100).

Each world runs this module as a script (one process per rank, gloo): target ranks run the real target role,
drafter ranks receive through ``StreamedFeatureSource`` and dump every received micro-batch (training steps and
validation passes) to safetensors. The test then recomputes what each drafter index would see colocated and
compares every tensor.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.packing.batch import PackedBatch
from tests.helpers.streaming_world import read_logs, recipe_overrides, start_ranks, wait_all

# Several processes each: a few seconds per test.
pytestmark = pytest.mark.slow

STEPS = 3


def _config(world: dict[str, str], out: Path, targets: int, tp: int = 1):
    args = recipe_overrides(
        world, out, **{"topology.target_workers": targets, "topology.target_tp": tp, "train.max_steps": STEPS}
    )
    return load_recipe(args[0].split("=", 1)[1], args[1:])


def _dump(batches: list[PackedBatch], out: Path, name: str) -> None:
    for i, batch in enumerate(batches):
        save_file({k: v.contiguous() for k, v in batch.tensors().items()}, str(out / f"{name}_{i}.safetensors"))


def _worker(world_file: str, out: str, targets: int, tp: int) -> None:
    """One rank of a payload-dumping world (run as ``python -m tests.test_streaming_payloads``)."""
    from deepspec_train.streaming.roles import Topology
    from deepspec_train.jobs.streamed import serve_drafter_groups
    from deepspec_train.streaming.streamed_source import StreamedFeatureSource
    from deepspec_train.training.distributed import init_distributed, new_groups, role_context, shutdown

    cfg = _config(json.loads(Path(world_file).read_text()), Path(out), targets, tp)
    world = init_distributed(cfg.stream.timeout_s)
    topology = Topology.from_world(world.world_size, targets, tp)
    ctx = role_context(world, targets)
    group = None
    if tp > 1:
        group = new_groups([topology.group_ranks(g) for g in range(topology.num_targets)], cfg.stream.timeout_s)
    if topology.role_of(world.rank) == "target":
        serve_drafter_groups([cfg], ctx, world.rank, topology, group)
    else:
        source = StreamedFeatureSource(topology, ctx, cfg.stream.timeout_s)
        for step, step_batches in enumerate(source):
            batches = list(step_batches.batches)
            assert (step_batches.num_batches, step_batches.num_supervised) == (len(batches), sum(b.num_supervised for b in batches))
            _dump(batches, Path(out), f"d{ctx.rank}_train_{step}")
            if source.plan.validates_after(step):
                _dump(list(source.validation_batches()), Path(out), f"d{ctx.rank}_val_{step}")
    shutdown(world)


def _expected(cfg, drafters: int) -> dict[str, list[PackedBatch]]:
    from deepspec_train.target.hidden_states import TargetTap
    from deepspec_train.target.loading import load_target_model
    from deepspec_train.training.distributed import DistContext
    from deepspec_train.jobs.assembly import (
        chunk_builder, load_token_datasets, train_plan, validation_pass, validation_plan,
    )
    from deepspec_train.training.feature_source import InProcessFeatureSource, StepBatches

    single = DistContext(0, 1, 0, torch.device("cpu"), None)
    data = load_token_datasets(cfg, single)
    tap = TargetTap(load_target_model(cfg.target, single.device), cfg.target.layer_ids)
    builder = chunk_builder(cfg, tap, single.device)
    expected = {}
    for d in range(drafters):
        colocated = InProcessFeatureSource(train_plan(cfg, data["train"], d, drafters), builder)
        val = validation_pass(validation_plan(cfg, data["validation"], d, drafters), builder)
        for step, step_batches in zip(range(STEPS), colocated):
            expected[f"d{d}_train_{step}"] = step_batches.batches
            # The packing plan's per-sequence slot counts equal a recount of the built micro-batches.
            recount = StepBatches.of(list(step_batches.batches)).slot_counts
            assert step_batches.slot_counts.keys() == recount.keys()
            assert all(torch.equal(step_batches.slot_counts[k], recount[k]) for k in recount)
            if (step + 1) % cfg.train.eval_every == 0 or step + 1 == STEPS:
                expected[f"d{d}_val_{step}"] = val()
    return expected


@pytest.mark.parametrize("targets,tp,drafters", [(1, 1, 2), (2, 1, 1), (2, 2, 1)])
def test_streamed_payloads_equal_colocated(streaming_world, tmp_path, targets, tp, drafters) -> None:
    world_file = tmp_path / "world.json"
    world_file.write_text(json.dumps(streaming_world))
    out = tmp_path / "dump"
    out.mkdir()
    argv = ["-m", "tests.test_streaming_payloads", str(world_file), str(out), str(targets), str(tp)]
    procs = start_ranks(argv, targets + drafters, tmp_path / "logs")
    codes = wait_all(procs, timeout=180)
    assert codes == [0] * (targets + drafters), read_logs(tmp_path / "logs", targets + drafters)

    expected = _expected(_config(streaming_world, out, targets, tp), drafters)
    received = sorted(p.name for p in out.glob("*.safetensors"))
    assert received == sorted(f"{name}_{i}.safetensors" for name, bs in expected.items() for i in range(len(bs)))
    for name, batches in expected.items():
        for i, batch in enumerate(batches):
            got = load_file(str(out / f"{name}_{i}.safetensors"))
            for field, tensor in batch.tensors().items():
                assert got[field].dtype == tensor.dtype and got[field].shape == tensor.shape, (name, field)
                if tp > 1 and tensor.is_floating_point():
                    scale = max(1.0, float(tensor.abs().max())) if tensor.numel() else 1.0
                    difference = float((got[field] - tensor).abs().max()) if tensor.numel() else 0.0
                    assert difference <= 1e-5 * scale, (name, i, field, difference, scale)
                else:
                    assert torch.equal(got[field], tensor), (name, i, field)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
