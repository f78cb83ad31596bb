"""``train.distributed=ddp`` is torch's DistributedDataParallel (``training.local_engine``): on 2 gloo ranks with
uneven micro-batch counts (3 and 1, then 2 and 0: a padding call) it gives the losses and weights of the flat
all-reduce it replaced, which the reference below reimplements (local accumulation, one flat fp32 sum of every
gradient after the step's backward calls, torch clipping and AdamW). Gradients are summed, not averaged. Two ranks
add the same two numbers in either scheme, so the weights are equal bit for bit and the losses to 1e-6.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepspec_train.metrics.acceptance import PositionStats
from deepspec_train.metrics.sinks import NoOpSink
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.feature_source import StepBatches
from deepspec_train.training.trainer import DrafterTrainer
from tests.helpers.listed_source import ListedSource
from tests.helpers.step_trainers import target_head, tiny_recipe
from tests.helpers.streaming_world import free_port
from tests.helpers.tiny_drafter import random_item, tiny_drafter
from tests.helpers.tiny_geometry import BLOCK, MASK_ID

STEPS = 3


def _steps(rank: int) -> list[list]:
    """Rank 0: 3 then 2 micro-batches; rank 1: 1 then 0 (its padding call reuses its last batch)."""
    generator = torch.Generator().manual_seed(10 + rank)
    items = [random_item(40, i, generator) for i in range(6)]
    anchors = [sample_anchors(item.loss_mask, 6, generator) for item in items]
    batches = [b for b in pack_sequences(items, anchors, BLOCK, 64, MASK_ID) if b.target_hidden.shape[0] > 0]
    return [batches[:3], batches[3:5]] if rank == 0 else [batches[:1], []]


def _trainer(cfg, ctx: DistContext, source) -> DrafterTrainer:
    loss = DrafterLoss.for_recipe(cfg, target_head(), "sdpa")
    return DrafterTrainer(cfg, tiny_drafter("dspark").train(), loss, source, None, NoOpSink(), ctx, STEPS)


def _flat_reference(cfg, ctx: DistContext, steps: list[list]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The replaced engine: plain backward per micro-batch, then one flat all-reduce of every gradient."""
    trainer = _trainer(cfg, ctx, None)
    stats = PositionStats(BLOCK)
    losses = []
    for index in range(STEPS):
        batches = steps[index % len(steps)]
        _, parts = trainer._accumulate(StepBatches.of(batches), stats)
        losses.append(parts.reduced(ctx)["train/loss"])
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainer.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=ctx.group)
        offset = 0
        for p, g in zip(trainer.params, grads):
            p.grad = flat[offset: offset + g.numel()].view_as(g).clone()
            offset += g.numel()
        torch.nn.utils.clip_grad_norm_(trainer.params, cfg.train.grad_clip)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.scheduler.step()
    return losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _worker(rank: int, port: int, out: str, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ctx = DistContext(rank, 2, rank, torch.device("cpu"), dist.group.WORLD)
    steps = _steps(rank)
    cfg = tiny_recipe()
    cfg = dataclasses.replace(
        cfg, run=dataclasses.replace(cfg.run, output_dir=out),
        train=dataclasses.replace(cfg.train, checkpoint_every=10**6, global_batch_sequences=12),
        logging=dataclasses.replace(cfg.logging, wandb=False, progress=False, log_every=1),
    )
    ref_losses, ref_weights = _flat_reference(cfg, ctx, steps)
    logged: dict[int, float] = {}

    class Sink(NoOpSink):
        def log(self, metrics, step):
            logged[step] = metrics["train/loss"]

    trainer = _trainer(cfg, ctx, ListedSource(steps))
    trainer.sink = Sink()
    trainer.fit()
    assert type(trainer.engine.forward_module).__name__ == "DistributedDataParallel"
    weights = trainer.model.state_dict()
    results[rank] = {
        "losses": [logged[s] for s in range(1, STEPS + 1)], "ref_losses": ref_losses,
        "equal": all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights),
    }
    dist.destroy_process_group()


def test_ddp_engine_matches_the_flat_all_reduce_on_uneven_ranks(tmp_path) -> None:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(free_port(), str(tmp_path), results), nprocs=2, join=True)
        results = dict(results)
    for rank in (0, 1):
        got, expected = results[rank]["losses"], results[rank]["ref_losses"]
        assert all(abs(a - b) <= 1e-6 for a, b in zip(got, expected)), (got, expected)
        assert results[rank]["equal"]
    assert results[0]["losses"] == results[1]["losses"]
