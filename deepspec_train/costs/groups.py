"""Sizing of a run of drafter groups (``jobs.drafter_groups``, streamed): ``N`` groups hold ``N`` times the drafter
ranks of one group behind the same target workers, since one target forward serves every group.

``balance_grouped`` finds the split of a cluster into target groups and ``N`` equal drafter groups with the highest
sequence rate per group (``GroupedSplit``); ``grouped_row`` sets it against the same ``N`` recipes trained as
separate streamed runs on an equal share of the GPUs each (``python -m deepspec_train.costs`` prints these rows
for ``GROUPED_RECIPES``). The FLOP and split model is the one of ``deepspec_train.costs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.costs.gpu_split import ASSUMED_FLOPS_PER_S, GPUS_PER_NODE, StreamedSplit, balance_workers
from deepspec_train.costs.reference_targets import recipe_and_target
from deepspec_train.costs.stream_payload import nominal_anchor_count
from deepspec_train.costs.training_flops import drafter_flops_per_sequence, target_flops_per_sequence

# The comparison the grouped table models: DSpark, DFlash and EAGLE-3 on Qwen3-8B.
GROUPED_RECIPES = ("qwen3-8b", "qwen3-8b-dflash", "qwen3-8b-eagle3")


@dataclass(frozen=True)
class GroupedSplit:
    """A streamed run of ``drafter_groups`` drafter groups: ``split`` is one group's view of it (the target groups
    and its ``split.drafters`` drafter ranks, at the slowest group's drafter rate), since one target forward
    serves every group and the groups' drafter ranks step side by side. Every group trains
    ``split.sequences_per_s``."""

    split: StreamedSplit
    drafter_groups: int

    @property
    def label(self) -> str:
        target = f"{self.split.groups}x{self.split.tp}" if self.split.tp > 1 else str(self.split.groups)
        return f"{target}:{self.drafter_groups}x{self.split.drafters}"

    @property
    def gpus(self) -> int:
        return self.split.groups * self.split.tp + self.drafter_groups * self.split.drafters


def balance_grouped(group_rates: dict[int, float], drafter_rates: list[float], gpus: int,
                    global_batch: int) -> GroupedSplit:
    """The split of ``gpus`` into target groups and ``len(drafter_rates)`` drafter groups of equal size (the
    launch's drafter ranks split evenly, ``streaming.roles``) with the highest sequence rate per drafter group;
    ties go to fewer GPUs."""
    groups = len(drafter_rates)
    best: Optional[GroupedSplit] = None
    for tp, rate in sorted(group_rates.items()):
        for targets in range(1, (gpus - groups) // tp + 1):
            for drafters in range(1, (gpus - targets * tp) // groups + 1):
                split = GroupedSplit(StreamedSplit(rate, min(drafter_rates), targets, tp, drafters, global_batch), groups)
                rate_now = split.split.sequences_per_s
                better = best is None or rate_now > best.split.sequences_per_s * (1 + 1e-9)
                tie = best is not None and abs(rate_now - best.split.sequences_per_s) <= best.split.sequences_per_s * 1e-9
                if better or (tie and split.gpus < best.gpus):
                    best = split
    if best is None:
        raise ValueError(f"{gpus} GPUs leave no room for a target group and {groups} drafter groups")
    return best


def grouped_row(recipes: list[str], seeds: int, nodes: int, seq_len: int,
                flops_per_s: float = ASSUMED_FLOPS_PER_S) -> dict[str, Any]:
    """A comparison of ``recipes`` x ``seeds`` training seeds on ``nodes`` nodes (one target, a group of one
    target whose whole copy fits a GPU): the best grouped split (one target pass for every group) against the
    same groups as separate streamed runs, each on ``1 / groups`` of the GPUs, and the target FLOPs each pays."""
    from deepspec_train.models.geometry import geometry_from_target_config

    cfg, hf_config = recipe_and_target(recipes[0], None)
    target_flops = target_flops_per_sequence(hf_config, seq_len)
    rates = []
    for recipe in recipes:
        recipe_cfg, _ = recipe_and_target(recipe, None)
        geometry = geometry_from_target_config(hf_config, recipe_cfg.drafter.intermediate_size)
        anchors = nominal_anchor_count(recipe_cfg, seq_len)
        rates += [flops_per_s / drafter_flops_per_sequence(recipe_cfg, geometry, seq_len, anchors)] * seeds
    gpus, batch, count = nodes * GPUS_PER_NODE, cfg.train.global_batch_sequences, len(rates)
    grouped = balance_grouped({1: flops_per_s / target_flops}, rates, gpus, batch)
    row: dict[str, Any] = {
        "recipes": "+".join(recipes), "seeds": seeds, "groups": count, "nodes": nodes, "seq_len": seq_len,
        "grouped_split": grouped.label, "grouped_gpus": grouped.gpus,
        "grouped_seq_s": grouped.split.sequences_per_s, "separate_split": "does not fit", "separate_seq_s": "-",
        "speedup": "-", "target_flops_saved": 1 - 1 / count,
    }
    share = gpus // count
    if share >= 2:
        separate = [balance_workers({1: flops_per_s / target_flops}, rate, share, batch) for rate in rates]
        slowest = min(split.sequences_per_s for split in separate)
        row.update(separate_split=f"{count} x {separate[0].label}", separate_seq_s=slowest,
                   speedup=grouped.split.sequences_per_s / slowest)
    return row
