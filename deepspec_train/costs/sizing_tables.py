"""The rows of the docs' sizing tables (``python -m deepspec_train.costs`` prints them; used by
``docs/howto/train_qwen3_8b.md`` and ``tests/test_production_recipes.py``): per recipe on one node, colocated against
streamed splits with tensor-parallel groups on several nodes, and the long-context memory terms."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from deepspec_train.costs import long_context_memory as lcm
from deepspec_train.costs.gpu_split import (
    ASSUMED_FLOPS_PER_S, GPU_BYTES, GPUS_PER_NODE, balance_workers, colocated_sequences_per_s, group_plans,
)
from deepspec_train.costs.reference_targets import meta_drafter, recipe_and_target, reference_target_config
from deepspec_train.costs.stream_payload import nominal_anchor_count, payload_bytes, stream_bytes_in_flight
from deepspec_train.costs.training_flops import (
    drafter_flops_per_sequence, target_flops_per_sequence, target_total_params,
)
from deepspec_train.costs.worker_memory import (
    DRAFTER_ACTIVATION_BYTES, TARGET_BYTES_PER_PARAM, drafter_worker_bytes, long_context_memory, long_context_recipe,
    target_working_bytes,
)


def sizing_row(recipe: str, seq_len: int, flops_per_s: float = ASSUMED_FLOPS_PER_S) -> dict[str, Any]:
    """One line of the docs' per-recipe table for ``recipe`` at nominal sequence length ``seq_len`` (one node)."""
    from deepspec_train.models.geometry import geometry_from_target_config

    cfg, hf_config = recipe_and_target(recipe, None)
    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    drafter = meta_drafter(cfg, hf_config)
    anchors = nominal_anchor_count(cfg, seq_len)
    target_flops = target_flops_per_sequence(hf_config, seq_len)
    drafter_flops = drafter_flops_per_sequence(cfg, geometry, seq_len, anchors)
    batch = cfg.train.global_batch_sequences
    split = balance_workers({1: flops_per_s / target_flops}, flops_per_s / drafter_flops, GPUS_PER_NODE, batch)
    payload = payload_bytes(cfg, geometry, 1, seq_len, anchors)
    return {
        "target_tok_s": flops_per_s / target_flops * seq_len,
        "drafter_tok_s": flops_per_s / drafter_flops * seq_len,
        "drafter_per_target": drafter_flops / target_flops,
        "colocated_seq_s_node": colocated_sequences_per_s(target_flops, drafter_flops, GPUS_PER_NODE, flops_per_s, batch),
        "best_split": split.label,
        "split_seq_s_node": split.sequences_per_s,
        "target_weights_gb": TARGET_BYTES_PER_PARAM * target_total_params(hf_config) / 1e9,
        "drafter_state_gb": drafter_worker_bytes(drafter, hf_config.vocab_size * hf_config.hidden_size) / 1e9,
        "payload_mb_per_seq": payload.total_bytes / 1e6,
        "payload_bytes_per_supervised": payload.bytes_per_supervised_token,
    }


def cluster_row(recipe: str, target: Optional[str], nodes: int, seq_len: int,
                flops_per_s: float = ASSUMED_FLOPS_PER_S) -> dict[str, Any]:
    """Colocated against the best streamed split with tensor-parallel target groups, on ``nodes`` nodes of
    ``GPUS_PER_NODE`` 80 GB GPUs, with the memory each needs per GPU (``target``: a target without a recipe,
    trained with ``recipe``'s drafter)."""
    from deepspec_train.models.geometry import geometry_from_target_config

    cfg, hf_config = recipe_and_target(recipe, target)
    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    drafter_gb = drafter_worker_bytes(meta_drafter(cfg, hf_config), hf_config.vocab_size * hf_config.hidden_size)
    drafter_need = drafter_gb + DRAFTER_ACTIVATION_BYTES
    target_work = target_working_bytes(cfg, geometry, seq_len)
    target_flops = target_flops_per_sequence(hf_config, seq_len)
    drafter_flops = drafter_flops_per_sequence(cfg, geometry, seq_len, nominal_anchor_count(cfg, seq_len))
    gpus, batch = nodes * GPUS_PER_NODE, cfg.train.global_batch_sequences
    weights = TARGET_BYTES_PER_PARAM * target_total_params(hf_config)
    colocated_need = weights + target_work + drafter_need
    row: dict[str, Any] = {
        "target": target or Path(cfg.target.path).name, "nodes": nodes, "seq_len": seq_len,
        "target_weights_gb": weights / 1e9, "drafter_gb": drafter_need / 1e9, "colocated_gb": colocated_need / 1e9,
        "colocated_seq_s_node": "does not fit",
        "best_split": "none fits", "plan": "-", "split_seq_s_node": "-", "target_rank_gb": "-",
        "in_flight_mb": stream_bytes_in_flight(cfg, geometry, seq_len) / 1e6,
    }
    if colocated_need <= GPU_BYTES:
        row["colocated_seq_s_node"] = colocated_sequences_per_s(target_flops, drafter_flops, gpus, flops_per_s, batch) / nodes
    # The fastest plan of each group size whose ranks fit (groups of one hold the whole target).
    plans = {}
    for plan in group_plans(hf_config, seq_len):
        if plan.rank_weight_bytes + target_work <= GPU_BYTES and plan.tp < gpus:
            plans.setdefault(plan.tp, plan)
    if plans and drafter_need <= GPU_BYTES:
        split = balance_workers(
            {tp: flops_per_s / plan.rank_flops for tp, plan in plans.items()}, flops_per_s / drafter_flops, gpus, batch
        )
        chosen = plans[split.tp]
        row.update(best_split=split.label, plan=chosen.plan, split_seq_s_node=split.sequences_per_s / nodes,
                   target_rank_gb=(chosen.rank_weight_bytes + target_work) / 1e9)
    return row


def long_context_rows() -> list[dict[str, Any]]:
    """The docs' long-context table: every term of both ranks (GB) for Qwen3-8B and 14B at 8K, 32K and 128K."""
    rows = []
    for recipe, name in lcm.LONG_CONTEXT_TARGETS:
        for seq_len in lcm.LONG_CONTEXT_LENGTHS:
            cfg = long_context_recipe(recipe, seq_len)
            target, drafter = long_context_memory(cfg, reference_target_config(cfg, name), seq_len)
            row: dict[str, Any] = {"target": name, "seq_len": seq_len}
            row |= {f"target {t.name}": t.bytes / 1e9 for t in target.terms()}
            row |= {"target peak": target.peak_bytes() / 1e9, "target peak streamed": target.peak_bytes(True) / 1e9,
                    "target peak eager": target.peak_bytes(eager=True) / 1e9}
            row |= {f"drafter {t.name}": t.bytes / 1e9 for t in drafter.terms()}
            row |= {"drafter peak": drafter.peak_bytes(False) / 1e9,
                    "drafter peak checkpointed": drafter.peak_bytes(True) / 1e9}
            rows.append(row)
    return rows
