"""Sizing arithmetic for a production run: stream payload, FLOPs and memory per worker, and the split of a
cluster's GPUs into tensor-parallel target groups and drafter workers.

Used by ``docs/howto/train_qwen3_8b.md`` (its sizing tables are printed by ``python -m deepspec_train.sizing``,
``sizing/__main__.py``) and by ``tests/test_production_recipes.py``; the accounting of drafter groups is in
``sizing/groups.py``. Everything is computed for a *nominal packing*: ``num_sequences``
sequences of ``seq_len`` tokens, fully supervised, each with ``anchors`` anchors spread evenly over the valid
range ``0 .. seq_len-2`` (so the last anchor sits at the end, as it nearly always does with 512 anchors).

- ``payload_bytes`` is exact for the ``PackedBatch`` tensors the packer builds for that packing (the test
  checks it against ``pack_sequences``): ``K*d`` feature values per context row, ``d`` per supervised slot,
  plus the int64 metadata. The per-message header and layout of the wire format (a few hundred bytes) are
  not counted.
- FLOP counts are the usual dense-matmul estimates: ``2`` FLOPs per multiply-add, backward twice forward,
  attention ``4 * heads * head_dim`` per (query, visible key) pair forward. A mixture-of-experts target
  multiplies only its routed experts (``num_experts_per_tok`` of ``num_experts``) and the router per token.
- Splits (``best_streamed_split``) follow the streamed mode's routing (``streaming.roles``) with strided,
  possibly uneven drafter shares; a tensor-parallel group of ``k`` GPUs is assumed to run ``k`` times as fast
  as one GPU (communication not modelled) and never spans nodes.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from deepspec_train.config.rules import tensor_parallel_problems
from deepspec_train.config.schema import DSPARK_LABELS, RecipeConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train import long_context_memory as lcm
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.packing.anchor_counts import anchor_count
from deepspec_train.packing.packer import plan_micro_batches

INT64_BYTES = 8
# Fields of a PackedBatch with one int64 per context row / per block slot / per block / per sequence.
_INT_FIELDS_PER_CONTEXT_ROW = 3  # ctx_tokens, ctx_seq, ctx_pos
_INT_FIELDS_PER_SLOT = 3  # block_input, block_prev, labels
_INT_FIELDS_PER_BLOCK = 2  # block_seq, block_anchor
_INT_FIELDS_PER_SEQUENCE = 1  # sample_ids
# Adam in fp32: parameter, gradient, first and second moment.
TRAINABLE_BYTES_PER_PARAM = 16
FROZEN_BYTES_PER_PARAM = 4
TARGET_BYTES_PER_PARAM = 2  # bf16 checkpoints

# H100 SXM dense bf16 peak (989 TFLOP/s) at 40% utilisation: the assumption behind the docs' tables.
ASSUMED_FLOPS_PER_S = 0.4 * 989e12
GPUS_PER_NODE = 8
GPU_BYTES = 80e9
# Rough working sets beyond persistent state (estimates, not measured): a drafter's activations for a
# 16,384-token micro-batch under bf16 autocast plus the chunked loss; a target rank's no-grad forward.
DRAFTER_ACTIVATION_BYTES = 12e9
TARGET_FORWARD_BYTES = 2e9
TP_SIZES = (1, 2, 4, 8)


def feature_bytes_per_value(cfg: RecipeConfig) -> int:
    """Bytes of one streamed feature value: the target's dtype (``auto`` = Qwen3's bf16 checkpoints)."""
    return 4 if cfg.target.dtype == "float32" else 2


def nominal_anchors(seq_len: int, anchors: int) -> list[int]:
    """``min(anchors, seq_len-1)`` anchors spread evenly over ``0 .. seq_len-2``, last one included."""
    if seq_len < 2:
        raise ValueError(f"a sequence needs at least 2 tokens to hold an anchor, got seq_len={seq_len}")
    count = min(anchors, seq_len - 1)
    if count == 1:
        return [0]
    last = seq_len - 2
    # Spacing last/(count-1) >= 1, so the floored positions are distinct.
    return [i * last // (count - 1) for i in range(count)]


def supervised_slots(anchor: int, seq_len: int, block_size: int, labels: str = DSPARK_LABELS) -> int:
    """Supervised slots of the block at ``anchor`` in a fully supervised sequence: DSpark labels supervise slots
    ``0..B-1`` (slot k predicts ``x_{a+k+1}``), z-lab labels slots ``1..B-1``, each only up to the last token."""
    if labels == DSPARK_LABELS:
        return min(block_size, seq_len - 1 - anchor)
    return min(block_size - 1, seq_len - 1 - anchor)


@dataclass(frozen=True)
class PayloadBytes:
    """What the nominal packing puts in ``PackedBatch`` tensors (and so on the wire in streamed mode)."""

    micro_batches: int
    packed_sequences: int
    context_rows: int
    blocks: int
    supervised: int
    feature_bytes: int
    metadata_bytes: int
    # The largest single micro-batch: what one stream message carries.
    largest_micro_batch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.feature_bytes + self.metadata_bytes

    @property
    def bytes_per_supervised_token(self) -> float:
        return self.total_bytes / max(self.supervised, 1)


def payload_bytes(
    cfg: RecipeConfig, geometry: DrafterGeometry, num_sequences: int, seq_len: int, anchors: int
) -> PayloadBytes:
    """Bytes of the packed micro-batches for ``num_sequences`` nominal sequences (see the module docstring).

    Packing follows the recipe: ``anchors.token_budget`` and ``train.micro_batch_sequences``; a sequence whose
    blocks exceed the budget is split into groups that each carry the context rows they need.
    """
    block = cfg.drafter.block_size
    anchor_list = nominal_anchors(seq_len, anchors)
    plan = plan_micro_batches(
        [torch.tensor(anchor_list, dtype=torch.long)] * num_sequences,
        block,
        cfg.anchors.token_budget,
        cfg.train.micro_batch_sequences,
    )
    value_bytes, taps, d = feature_bytes_per_value(cfg), len(cfg.target.layer_ids), geometry.hidden_size
    totals = [0] * 6
    largest = 0
    for micro_batch in plan:
        rows = sum(int(group.anchors.max()) for group in micro_batch)
        blocks = sum(int(group.anchors.numel()) for group in micro_batch)
        supervised = sum(
            supervised_slots(int(a), seq_len, block, cfg.drafter.labels) for group in micro_batch for a in group.anchors
        )
        feature = value_bytes * (rows * taps * d + supervised * d)
        metadata = INT64_BYTES * (
            _INT_FIELDS_PER_CONTEXT_ROW * rows + _INT_FIELDS_PER_SLOT * blocks * block
            + _INT_FIELDS_PER_BLOCK * blocks + _INT_FIELDS_PER_SEQUENCE * len(micro_batch)
        )
        for i, value in enumerate((len(micro_batch), rows, blocks, supervised, feature, metadata)):
            totals[i] += value
        largest = max(largest, feature + metadata)
    return PayloadBytes(len(plan), *totals, largest)


def stream_bytes_in_flight(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int) -> int:
    """The most a target group's send queue holds with nominal sequences: ``stream.depth`` queued micro-batches
    plus the one being sent (the queue is bounded in micro-batches, ``streaming.target_worker``)."""
    payload = payload_bytes(cfg, geometry, cfg.train.micro_batch_sequences, seq_len, nominal_anchor_count(cfg, seq_len))
    return (cfg.stream.depth + 1) * payload.largest_micro_batch_bytes


@functools.lru_cache(maxsize=32)
def _meta_param_counts(config_json: str) -> tuple[int, int, int]:
    """(decoder + final norm, routed-expert, attention) parameter counts of the causal LM a config describes,
    counted on the meta device (nothing allocated): exact for every family (MLA projections, shared experts,
    biases and attention sinks included), with no per-architecture formula."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    heads = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    decoder = [(name, p.numel()) for name, p in model.named_parameters() if id(p) not in heads]
    return (sum(n for _, n in decoder), sum(n for name, n in decoder if ".mlp.experts." in name),
            sum(n for name, n in decoder if ".self_attn." in name))


def _counts(hf_config: Any) -> tuple[int, int, int]:
    return _meta_param_counts(json.dumps(hf_config.to_dict(), sort_keys=True, default=str))


def _decoder_params(hf_config: Any, active: bool) -> int:
    decoder, experts, _ = _counts(hf_config)
    if not active or not experts:
        return decoder
    routed = (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
              or getattr(hf_config, "n_routed_experts"))
    # A token is multiplied with num_experts_per_tok of the routed experts (shared experts sit outside .experts.).
    return decoder - experts + experts * hf_config.num_experts_per_tok // routed


def target_decoder_params(hf_config: Any) -> int:
    """Parameters of the decoder layers and final norm (every expert of a MoE target): what a target holds
    besides its embedding and LM head (target workers stop at the final norm; logits are computed by drafter
    workers, and only there)."""
    return _decoder_params(hf_config, active=False)


def target_active_decoder_params(hf_config: Any) -> int:
    """Decoder parameters one token is multiplied with: a MoE layer counts its router and routed experts only."""
    return _decoder_params(hf_config, active=True)


def target_total_params(hf_config: Any) -> int:
    """All target parameters: decoder, embedding, and an untied LM head."""
    embed = hf_config.vocab_size * hf_config.hidden_size
    head = 0 if hf_config.tie_word_embeddings else embed
    return target_decoder_params(hf_config) + embed + head


def target_attention_params(hf_config: Any) -> int:
    """Parameters of the attention blocks (projections, q/k norms, sinks) of all decoder layers."""
    return _counts(hf_config)[2]


def target_flops_per_sequence(hf_config: Any, seq_len: int) -> float:
    """Forward FLOPs of the target over one causal sequence (matmuls + attention scores and values)."""
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    linear = 2 * target_active_decoder_params(hf_config) * seq_len
    # Query i sees i+1 keys: sum over the sequence = L(L+1)/2 pairs per layer.
    pairs = seq_len * (seq_len + 1) / 2
    attention = 4 * hf_config.num_attention_heads * hd * pairs * hf_config.num_hidden_layers
    return linear + attention


def target_attention_flops_per_sequence(hf_config: Any, seq_len: int) -> float:
    """The part of ``target_flops_per_sequence`` spent in attention (projections, scores and values)."""
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    pairs = seq_len * (seq_len + 1) / 2
    scores = 4 * hf_config.num_attention_heads * hd * pairs * hf_config.num_hidden_layers
    return 2 * target_attention_params(hf_config) * seq_len + scores


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


def drafter_flops_per_sequence(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int, anchors: int) -> float:
    """Forward + backward FLOPs of one drafter step's work for one nominal sequence (the kind's cost model in
    ``kinds``: layer passes, context projections, attention pairs and the heads at supervised slots)."""
    anchor_list = nominal_anchors(seq_len, anchors)
    block = cfg.drafter.block_size
    supervised = sum(supervised_slots(a, seq_len, block, cfg.drafter.labels) for a in anchor_list)
    return kind_spec(cfg.drafter.kind).flops_per_sequence(cfg, geometry, anchor_list, supervised)


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


def drafter_worker_bytes(drafter: torch.nn.Module, target_head_params: int) -> int:
    """Persistent memory of a drafter worker: Adam state of trainable parameters, fp32 frozen copies
    (embedding, LM head), and the target LM head in bf16 (target logits at supervised slots)."""
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    return TRAINABLE_BYTES_PER_PARAM * trainable + FROZEN_BYTES_PER_PARAM * frozen + 2 * target_head_params


def target_working_bytes(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int) -> float:
    """A target rank's memory beyond its weights: the forward, the tapped features of one chunk of
    ``train.micro_batch_sequences`` sequences, and the stream's micro-batches in flight."""
    features = cfg.train.micro_batch_sequences * seq_len * (len(cfg.target.layer_ids) + 1) * geometry.hidden_size
    return TARGET_FORWARD_BYTES + feature_bytes_per_value(cfg) * features + stream_bytes_in_flight(cfg, geometry, seq_len)


def reference_target_config(cfg: RecipeConfig, name: Optional[str] = None) -> Any:
    """The published config of the recipe's target (named by its ``target.path`` directory, ``models/Qwen3-8B``),
    or of the target ``name``."""
    from deepspec_train.models.family_configs import family_reference_configs
    from deepspec_train.models.reference_configs import reference_configs

    name = name or Path(cfg.target.path).name
    configs = reference_configs() | family_reference_configs()
    if name not in configs:
        raise KeyError(f"no reference config for target {name!r}; known: {sorted(configs)}")
    return configs[name]


def meta_drafter(cfg: RecipeConfig, hf_config: Any) -> torch.nn.Module:
    """The recipe's drafter for ``hf_config``, on the meta device (shapes only, no memory)."""
    from deepspec_train.kinds.builder import build_drafter_for_geometry
    from deepspec_train.models.geometry import geometry_from_target_config

    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    with torch.device("meta"):
        return build_drafter_for_geometry(cfg, geometry)


def recipe_and_target(recipe: str, target: Optional[str]) -> tuple[RecipeConfig, Any]:
    """The recipe, its taps moved to ``target``'s (when given, for a target without a recipe), and the config."""
    import dataclasses

    from deepspec_train.validation import load_recipe
    from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS

    cfg = load_recipe(recipe, check_target=False)
    if target is not None:
        cfg = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, layer_ids=REFERENCE_LAYER_IDS[target]))
    return cfg, reference_target_config(cfg, target)


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


# Whose anchor rule (128 per 1K valid positions over a floor of 512) the long-context rows give every target.
LONG_CONTEXT_ANCHOR_RECIPE = "qwen3-8b-32k"


def nominal_anchor_count(cfg: RecipeConfig, seq_len: int) -> int:
    """Anchors of a fully supervised nominal sequence of ``seq_len`` tokens under ``cfg``'s anchor rule."""
    return anchor_count(seq_len - 1, cfg.anchors.num_per_sequence, cfg.anchors.per_1k_tokens)


def long_context_recipe(recipe: str, seq_len: int) -> RecipeConfig:
    """``recipe`` at ``seq_len`` tokens with the long-context recipes' anchor rule (``LONG_CONTEXT_ANCHOR_RECIPE``):
    one sequence per target forward (``train.micro_batch_sequences=1``) and a token budget that packs a whole
    nominal sequence's blocks in one micro-batch (``L + anchors * B``); a budget of only ``L + B`` splits it into
    several micro-batches that each carry most of the context again."""
    import dataclasses

    from deepspec_train.validation import load_recipe

    cfg = load_recipe(recipe, check_target=False)
    rate = load_recipe(LONG_CONTEXT_ANCHOR_RECIPE, check_target=False).anchors.per_1k_tokens
    cfg = dataclasses.replace(cfg, anchors=dataclasses.replace(cfg.anchors, per_1k_tokens=rate))
    budget = max(cfg.anchors.token_budget, seq_len + nominal_anchor_count(cfg, seq_len) * cfg.drafter.block_size)
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, max_length=seq_len),
        anchors=dataclasses.replace(cfg.anchors, token_budget=budget),
        train=dataclasses.replace(cfg.train, micro_batch_sequences=1))


def long_context_memory(
    cfg: RecipeConfig, hf_config: Any, seq_len: int, drafter: Optional[torch.nn.Module] = None
) -> tuple[lcm.TargetRankMemory, lcm.DrafterRankMemory]:
    """The target rank's and the drafter rank's memory terms for one nominal sequence of ``seq_len`` tokens
    (``drafter``: the recipe's drafter, built on the meta device when not given)."""
    from deepspec_train.models.activation_checkpointing import CONTEXT_CHUNK_ROWS
    from deepspec_train.models.geometry import geometry_from_target_config

    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    value_bytes, taps, d = feature_bytes_per_value(cfg), len(cfg.target.layer_ids), geometry.hidden_size
    payload = payload_bytes(cfg, geometry, 1, seq_len, nominal_anchor_count(cfg, seq_len))
    if payload.micro_batches != 1:
        raise ValueError(f"a nominal {seq_len}-token sequence takes {payload.micro_batches} micro-batches")
    ctx_rows, slots = payload.context_rows, payload.blocks * cfg.drafter.block_size
    target = lcm.TargetRankMemory(
        seq_len, value_bytes * target_total_params(hf_config),
        lcm.target_layer_transient_bytes(hf_config, seq_len, value_bytes),
        lcm.eager_attention_bytes(hf_config, seq_len, value_bytes),
        taps * lcm.kept_states_bytes(0, d, seq_len, value_bytes), lcm.kept_states_bytes(0, d, seq_len, value_bytes),
        lcm.packed_build_bytes(taps, d, ctx_rows, payload.supervised, value_bytes),
        stream_bytes_in_flight(cfg, geometry, seq_len))
    drafter = drafter if drafter is not None else meta_drafter(cfg, hf_config)
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    layers = cfg.drafter.num_layers
    saved = [lcm.drafter_shared_saved_bytes(geometry, taps, ctx_rows, slots, ckpt)
             + lcm.drafter_saved_bytes(geometry, layers, ctx_rows, slots, ckpt) for ckpt in (False, True)]
    state = drafter_worker_bytes(drafter, hf_config.vocab_size * d) + lcm.BF16 * trainable
    # Bytes per context row while the context projection runs (fc reads the bf16 features in place under
    # autocast): fc's bf16 output, then hidden_norm's fp32 upcast, its square, the normalised rows, their cast back
    # to bf16 and the fp32 product with the norm's weight.
    projection = d * (2 * lcm.BF16 + 4 * lcm.FP32)
    drafter_memory = lcm.DrafterRankMemory(
        seq_len, state, payload.largest_micro_batch_bytes, projection * ctx_rows,
        projection * min(ctx_rows, CONTEXT_CHUNK_ROWS),
        saved[0], saved[1], lcm.dense_mask_bytes(ctx_rows, slots, layers, False),
        lcm.dense_mask_bytes(ctx_rows, slots, layers, True), lcm.block_mask_bytes(ctx_rows, slots),
        lcm.loss_chunk_bytes(min(cfg.loss.chunk_size, payload.supervised), geometry.vocab_size, d,
                             cfg.drafter.markov_rank))
    return target, drafter_memory


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


# The production recipes of the target families beyond Qwen3 (Llama 3, Gemma 3, GPT-OSS, DeepSeek-V3 / Kimi-K2).
FAMILY_RECIPES = (
    "llama-3.1-8b", "llama-3.1-8b-dflash", "llama-3.1-8b-eagle3", "llama-3.3-70b", "gemma-3-12b", "gpt-oss-20b",
    "gpt-oss-120b", "deepseek-v3", "kimi-k2",
)
