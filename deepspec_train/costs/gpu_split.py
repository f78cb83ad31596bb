"""The split of a cluster's GPUs: tensor-parallel target groups and drafter workers for streamed mode, or every GPU
running both (colocated), and the sequence rate each sustains.

Splits (``balance_workers``) follow the streamed mode's routing (``streaming.roles``) with strided, possibly uneven
drafter shares; a tensor-parallel group of ``k`` GPUs is assumed to run ``k`` times as fast as one GPU (communication
not modelled) and never spans nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.config.rules import tensor_parallel_problems
from deepspec_train.costs.training_flops import (
    target_attention_flops_per_sequence, target_attention_params, target_flops_per_sequence, target_total_params,
)
from deepspec_train.costs.worker_memory import TARGET_BYTES_PER_PARAM

# H100 SXM dense bf16 peak (989 TFLOP/s) at 40% utilisation: the assumption behind the docs' tables.
ASSUMED_FLOPS_PER_S = 0.4 * 989e12
GPUS_PER_NODE = 8
GPU_BYTES = 80e9
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class GroupPlan:
    """One replica of the target on a tensor-parallel group of ``tp`` GPUs with ``topology.target_tp_plan``
    ``plan``: bf16 weights and forward FLOPs per sequence on each of its ranks."""

    tp: int
    plan: str
    rank_weight_bytes: float
    rank_flops: float


def group_plans(hf_config: Any, seq_len: int) -> list[GroupPlan]:
    """Every group a node can hold for this target: ``tp`` in ``TP_SIZES`` with the ``auto`` plan where the heads
    split (everything sharded ``tp`` ways: transformers' plan also splits the embedding and LM head by
    vocabulary), else the ``experts`` plan where the target has experts that split (attention replicated)."""
    config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
    total = TARGET_BYTES_PER_PARAM * target_total_params(hf_config)
    flops = target_flops_per_sequence(hf_config, seq_len)
    plans = []
    for tp in TP_SIZES:
        if tp > GPUS_PER_NODE:
            continue
        if not tensor_parallel_problems(config, tp, "auto"):
            plans.append(GroupPlan(tp, "auto", total / tp, flops / tp))
        elif not tensor_parallel_problems(config, tp, "experts"):
            attention = TARGET_BYTES_PER_PARAM * target_attention_params(hf_config)
            attention_flops = target_attention_flops_per_sequence(hf_config, seq_len)
            plans.append(GroupPlan(tp, "experts", attention + (total - attention) / tp,
                                   attention_flops + (flops - attention_flops) / tp))
    return plans


def drafter_shares(global_batch: int, drafters: int) -> list[int]:
    """Sequences per step of each drafter rank (strided shares: they differ by at most one)."""
    return [len(range(i, global_batch, drafters)) for i in range(drafters)]


@dataclass(frozen=True)
class StreamedSplit:
    """``groups`` target groups of ``tp`` GPUs each and ``drafters`` drafter workers, with per-worker rates in
    sequences/s (a group: ``tp`` GPUs' worth), for a global batch of ``global_batch`` sequences per step.

    ``sequences_per_s`` follows the streamed routing (``streaming.roles``): with ``G <= D`` group ``g`` computes
    the shares of drafters ``i = g (mod G)``; with ``G > D`` drafter ``i``'s ``n_i`` groups take turns. Drafters
    step together (gradient all-reduce), so the slowest side of the slowest worker sets the step time.
    """

    group_sequences_per_s: float
    drafter_sequences_per_s: float
    groups: int
    tp: int
    drafters: int
    global_batch: int

    @property
    def label(self) -> str:
        return f"{self.groups}x{self.tp}:{self.drafters}" if self.tp > 1 else f"{self.groups}:{self.drafters}"

    @property
    def gpus(self) -> int:
        return self.groups * self.tp + self.drafters

    @property
    def step_seconds(self) -> float:
        shares = drafter_shares(self.global_batch, self.drafters)
        drafter = max(shares) / self.drafter_sequences_per_s
        if self.groups <= self.drafters:
            work = [sum(shares[g :: self.groups]) for g in range(self.groups)]
            target = max(work) / self.group_sequences_per_s
        else:
            feeders = [len(range(i, self.groups, self.drafters)) for i in range(self.drafters)]
            target = max(s / (n * self.group_sequences_per_s) for s, n in zip(shares, feeders))
        return max(drafter, target)

    @property
    def sequences_per_s(self) -> float:
        return self.global_batch / self.step_seconds


def balance_workers(
    group_rates: dict[int, float], drafter_rate: float, gpus: int, global_batch: int
) -> StreamedSplit:
    """The split of ``gpus`` into target groups and drafter workers with the highest sustained sequence rate.
    ``group_rates``: for each group size ``tp`` a node can hold, one group's sequences/s; ``drafter_rate``: one
    drafter worker's. Ties go to fewer target GPUs (less memory held by frozen weights)."""
    best: Optional[StreamedSplit] = None
    for tp, rate in sorted(group_rates.items()):
        for groups in range(1, (gpus - 1) // tp + 1):
            split = StreamedSplit(rate, drafter_rate, groups, tp, gpus - groups * tp, global_batch)
            better = best is None or split.sequences_per_s > best.sequences_per_s * (1 + 1e-9)
            tie = best is not None and abs(split.sequences_per_s - best.sequences_per_s) <= best.sequences_per_s * 1e-9
            if better or (tie and split.groups * split.tp < best.groups * best.tp):
                best = split
    if best is None:
        raise ValueError(f"no split of {gpus} GPUs leaves room for a target group of {min(group_rates)} and a drafter")
    return best


def colocated_sequences_per_s(target_flops: float, drafter_flops: float, gpus: int, flops_per_s: float,
                              global_batch: int) -> float:
    """Every GPU runs the target and its drafter share; the largest share sets the step time."""
    largest = max(drafter_shares(global_batch, gpus))
    return global_batch / (largest * (target_flops + drafter_flops) / flops_per_s)
