"""DeepSpeed ZeRO-2 for the drafter (``train.distributed=deepspeed``): config resolution, engine set-up over the
drafter ranks only, equal backward counts per step, and the project's checkpoint layout on top of ZeRO.

How it meets the trainer:

- The trainer builds its ``torch.optim.AdamW`` and ``LambdaLR`` warmup + cosine as on the DDP path and hands the
  optimizer to ``deepspeed.initialize``; ZeRO-2 partitions its fp32 state over the drafter ranks and the trainer
  keeps stepping the same scheduler, so the learning-rate curve is the DDP one. Clipping is DeepSpeed's
  (``gradient_clipping`` = ``train.grad_clip``, same ``max_norm / (norm + 1e-6)`` factor as torch's).
- Data parallelism runs over ``ctx.group`` through a minimal ``mpu``: in streamed mode the drafters are
  a subgroup of the world, and no ZeRO collective may involve the target workers.
- Ranks may hold different numbers of packed micro-batches in a step, but ZeRO-2 reduces gradient buckets inside
  every backward, so all drafter ranks must run the same number of backward calls. ``plan_step`` agrees on the
  maximum; a rank with fewer runs padding calls: a real forward of a recent micro-batch with its loss times
  zero, so the gradient hooks fire in the same order as for real data and contribute exact zeros. The trainer
  marks the accumulation boundary on the last call (``set_gradient_accumulation_boundary``).
- ZeRO averages gradients over the data-parallel ranks while the project's loss is already normalised by the
  global supervised count (the DDP path sums), so each backward scales its loss by the drafter count.
- bf16 (``train.mixed_precision=bf16`` on CUDA only) is DeepSpeed's: bf16 module, fp32 master weights in ZeRO.
  The drafters cast the target features to their own weight dtype; the loss keeps the target's hidden states and
  LM head in the target's dtype. After training the module gets the fp32 masters back for the export.
- Checkpoints: ``DeepSpeedTrainState`` gathers the fp32 master weights and the AdamW moments into exactly the
  files the DDP path writes (``drafter.safetensors``, a torch AdamW ``optimizer.pt``), read back with
  ``weights_only=True``; nothing of DeepSpeed's own pickled checkpoint format is used.

Limits: ZeRO stage 2 only (``zero_optimization.stage`` must be 2, no optimizer offload), and the drafter must use
every trainable parameter on every micro-batch (true of DSpark, DFlash and EAGLE-3), since a parameter that one
rank's backward skips would shift ZeRO's gradient buckets between ranks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.config.shipped_files import resolve_shipped_path
from deepspec_train.training.distributed import DistContext

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def accumulation_steps(cfg: RecipeConfig, num_drafters: int) -> int:
    """Nominal packed micro-batches per drafter rank per step (the real count varies with token-budget packing)."""
    per_rank = cfg.train.global_batch_sequences / (cfg.train.micro_batch_sequences * num_drafters)
    return max(1, math.ceil(per_rank))


def uses_bf16(cfg: RecipeConfig, device: torch.device) -> bool:
    return cfg.train.mixed_precision == "bf16" and device.type == "cuda"


def resolve_deepspeed_config(cfg: RecipeConfig, num_drafters: int, device: torch.device) -> dict:
    """The file named by ``train.deepspeed_config`` overlaid with the recipe's values."""
    base = json.loads(resolve_shipped_path(cfg.train.deepspeed_config).read_text())
    zero = base.get("zero_optimization", {})
    if zero.get("stage") != 2 or "offload_optimizer" in zero:
        raise ValueError(f"{cfg.train.deepspeed_config}: the drafter trainer supports ZeRO stage 2 without offload")
    # DeepSpeed checks train_batch_size = micro * accumulation * ranks; let it derive it from the two below.
    base.pop("train_batch_size", None)
    return base | {
        # One "sample" is one packed micro-batch.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": accumulation_steps(cfg, num_drafters),
        "gradient_clipping": cfg.train.grad_clip,
        "bf16": {"enabled": uses_bf16(cfg, device)},
        "fp16": {"enabled": False},
        # The client optimizer is torch's AdamW, which ZeRO supports; this only silences DeepSpeed's check for
        # optimizers it builds itself.
        "zero_allow_untested_optimizer": True,
    }


class DrafterParallelUnit:
    """The ``mpu`` DeepSpeed consults for its groups: data parallelism over the drafter ranks, no model parallelism.

    ``None`` as the model-parallel group makes ZeRO skip its model-parallel reductions (a one-rank group would
    need a ``new_group`` call on every rank of the world, target workers included)."""

    def __init__(self, ctx: DistContext):
        self.ctx = ctx

    def get_data_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.ctx.group

    def get_data_parallel_world_size(self) -> int:
        return self.ctx.world_size

    def get_data_parallel_rank(self) -> int:
        return self.ctx.rank

    def get_data_parallel_group_ranks(self) -> list[int]:
        return dist.get_process_group_ranks(self.ctx.group)

    def get_model_parallel_group(self) -> None:
        return None

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def all_reduce_max(value: int, ctx: DistContext) -> int:
    """Largest ``value`` over the drafter ranks."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return int(t.item())


class DeepSpeedDrafterEngine:
    """A ZeRO-2 engine over the drafter ranks, driven one optimizer step at a time by the trainer (the
    ``local_engine.DrafterEngine`` interface)."""

    def __init__(self, cfg: RecipeConfig, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext,
                 run_dir: Optional[Path]):
        import deepspeed

        if ctx.device.type == "cpu":
            # On CPU, DeepSpeed's communication backend JIT-compiles a shared-memory all-reduce kernel (minutes of
            # C++ build) that only its inference all-reduce uses; training collectives go through gloo regardless.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self.ctx = ctx
        self.module = model
        self.config = resolve_deepspeed_config(cfg, ctx.world_size, ctx.device)
        if run_dir is not None and ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "deepspeed_config.json").write_text(json.dumps(self.config, indent=2))
        if not dist.is_initialized():
            # A plain single-process run: DeepSpeed needs a process group, and one rank needs no rendezvous.
            backend = "nccl" if ctx.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        # DeepSpeed insists on reading LOCAL_RANK itself; a plain `python train.py` has none (init_distributed took 0).
        os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
        # Without a drafter group (one process) DeepSpeed's default, the whole one-rank world, is the same thing.
        mpu = DrafterParallelUnit(ctx) if ctx.group is not None else None
        self.engine, self.zero_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, mpu=mpu, dist_init_required=False,
        )
        self.base_optimizer = optimizer
        # Forwards go through the engine: its hooks track each backward.
        self.forward_module = self.engine
        # DeepSpeed's bf16 runs a bf16 module with fp32 masters, so torch autocast stays off.
        self.autocast_bf16 = False
        self._planned = 0
        self._calls = 0

    def plan_step(self, local_calls: int) -> int:
        """Agree on this step's backward count (at least one); returns how many padding calls this rank adds."""
        self._planned = max(all_reduce_max(local_calls, self.ctx), 1)
        self._calls = 0
        return self._planned - local_calls

    def backward(self, loss: torch.Tensor) -> None:
        """One of the step's planned backward calls; the last one is ZeRO's accumulation boundary."""
        if self._calls >= self._planned:
            raise RuntimeError(f"backward call {self._calls + 1} exceeds the {self._planned} planned for this step")
        self._calls += 1
        self.engine.set_gradient_accumulation_boundary(self._calls == self._planned)
        # ZeRO divides the reduced gradients by the drafter count; the loss is already globally normalised.
        self.engine.backward(loss * self.ctx.world_size, scale_wrt_gas=False)

    def micro_batch(self) -> contextlib.nullcontext:
        """Nothing to set around a call: ``backward`` marks ZeRO's accumulation boundary itself."""
        return contextlib.nullcontext()

    def clip(self) -> None:
        """DeepSpeed clips inside its step; the gradient norm is known only then."""
        return None

    def step(self, skip: bool) -> tuple[float, bool]:
        """Clip and update (DeepSpeed), after exactly the planned backward calls; the pre-clip grad norm and
        whether the update was applied. ZeRO skips a step whose global gradient norm is not finite by itself (its
        norm then reads inf); ``skip`` (a non-finite loss on some rank) takes that same path."""
        if self._calls != self._planned:
            raise RuntimeError(f"step after {self._calls} backward calls, {self._planned} planned")
        if skip:
            self._step_as_overflow()
        else:
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else math.nan
        return norm, not skip and math.isfinite(norm)

    def _step_as_overflow(self) -> None:
        """DeepSpeed's step with ZeRO's overflow verdict forced: it drops the reduced gradients and its buffers
        exactly as for a non-finite norm, without an update. Every drafter rank calls it for the same step."""
        zero = self.zero_optimizer
        saved = zero.check_grad_overflow
        zero.check_grad_overflow = True
        zero.has_overflow = lambda partition_gradients=True: True
        try:
            self.engine.step()
        finally:
            del zero.has_overflow
            zero.check_grad_overflow = saved

    def train_state(self) -> "DeepSpeedTrainState":
        return DeepSpeedTrainState(self)

    def finish(self) -> None:
        """Leave the module holding the fp32 master weights (for the final export after a bf16 run)."""
        weights = {name: full for name, full in _gather_fp32_params(self.module)}
        self.module.float()
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                if name in weights:
                    p.copy_(weights[name])


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _gather_fp32_params(module: nn.Module):
    from deepspeed.utils import safe_get_full_fp32_param

    for name, p in _trainable(module):
        yield name, safe_get_full_fp32_param(p)


class DeepSpeedTrainState:
    """``checkpoint.TrainState`` over ZeRO-2: full fp32 weights and AdamW moments in the DDP path's layout.

    Gathers are collective over the drafter ranks (one all-reduce per tensor, so peak extra memory is one
    parameter); the main rank moves the results to CPU and keeps them, the others drop them."""

    def __init__(self, engine: DeepSpeedDrafterEngine):
        self.engine = engine
        self.module = engine.module
        self.is_main = engine.ctx.is_main

    def trainable_weights(self) -> Optional[dict[str, torch.Tensor]]:
        weights = {}
        for name, full in _gather_fp32_params(self.module):
            if self.is_main:
                weights[name] = full.detach().cpu().contiguous()
        return weights if self.is_main else None

    def optimizer_state(self) -> Optional[dict]:
        from deepspeed.utils import safe_get_full_optimizer_state

        step = self._step_count()
        state = {}
        for index, (_, p) in enumerate(_trainable(self.module)):
            moments = {key: safe_get_full_optimizer_state(p, key) for key in ADAM_MOMENTS} if step is not None else {}
            if self.is_main and moments:
                state[index] = {"step": step.clone().cpu()} | {k: v.detach().cpu() for k, v in moments.items()}
        if not self.is_main:
            return None
        return {"state": state, "param_groups": self._param_groups()}

    def load_trainable_weights(self, weights: dict[str, torch.Tensor]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param

        with torch.no_grad():
            for name, p in _trainable(self.module):
                value = weights[name].to(device=p.device, dtype=torch.float32)
                # The module copy (bf16 under DeepSpeed's bf16) is what forwards; the fp32 master is what updates.
                p.copy_(value.to(p.dtype))
                safe_set_full_fp32_param(p, value)

    def load_optimizer_state(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        saved_groups = state["param_groups"]
        if len(saved_groups) != len(self.engine.base_optimizer.param_groups):
            raise ValueError(f"optimizer.pt has {len(saved_groups)} parameter groups, the optimizer has "
                             f"{len(self.engine.base_optimizer.param_groups)}")
        for group, saved in zip(self.engine.base_optimizer.param_groups, saved_groups):
            group.update({key: value for key, value in saved.items() if key != "params"})
        entries = state["state"]
        if not entries:
            return
        step = next(iter(entries.values()))["step"]
        self._create_partition_state(step)
        for index, (_, p) in enumerate(_trainable(self.module)):
            entry = entries.get(index, entries.get(str(index)))
            for key in ADAM_MOMENTS:
                value = entry[key] if entry is not None else torch.zeros_like(p, dtype=torch.float32)
                safe_set_full_optimizer_state(p, value.to(device=p.device, dtype=torch.float32), key)

    def _step_count(self) -> Optional[torch.Tensor]:
        """AdamW's step counter (one per flat ZeRO partition, all equal); None before the first update."""
        zero = self.engine.zero_optimizer
        entry = self.engine.base_optimizer.state.get(zero.single_partition_of_fp32_groups[0])
        return None if not entry else entry["step"]

    def _create_partition_state(self, step: torch.Tensor) -> None:
        """AdamW state for this rank's flat fp32 partitions (torch creates it lazily at the first update), then
        ZeRO's links from each parameter's fragment to it, so ``safe_set_full_optimizer_state`` can fill it."""
        zero = self.engine.zero_optimizer
        for partition in zero.single_partition_of_fp32_groups:
            self.engine.base_optimizer.state[partition] = {
                "step": step.detach().clone().to(dtype=torch.float32, device="cpu"),
                **{key: torch.zeros_like(partition) for key in ADAM_MOMENTS},
            }
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()

    def _param_groups(self) -> list[dict]:
        """The optimizer's hyperparameters with parameter indices, as ``torch.optim.Optimizer.state_dict`` has."""
        count = len(_trainable(self.module))
        groups = self.engine.base_optimizer.param_groups
        if len(groups) != 1:
            raise ValueError(f"expected the trainer's single AdamW parameter group, found {len(groups)}")
        return [{key: value for key, value in groups[0].items() if key != "params"} | {"params": list(range(count))}]
