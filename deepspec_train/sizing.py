"""Sizing arithmetic for a production run: stream payload, FLOPs per worker kind, and memory per worker.

Used by ``docs/train_qwen3_8b.md`` (its sizing table is printed by ``python -m deepspec_train.sizing``) and by
``tests/test_production_recipes.py``. Everything is computed for a *nominal packing*: ``num_sequences``
sequences of ``seq_len`` tokens, fully supervised, each with ``anchors`` anchors spread evenly over the valid
range ``0 .. seq_len-2`` (so the last anchor sits at the end, as it nearly always does with 512 anchors).

- ``payload_bytes`` is exact for the ``PackedBatch`` tensors the packer builds for that packing (the test
  checks it against ``pack_sequences``): ``K*d`` feature values per context row, ``d`` per supervised slot,
  plus the int64 metadata. The per-message header and layout of the wire format (a few hundred bytes) are
  not counted.
- FLOP counts are the usual dense-matmul estimates: ``2`` FLOPs per multiply-add, backward twice forward,
  attention ``4 * heads * head_dim`` per (query, visible key) pair forward.
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Optional

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import DrafterGeometry
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


def supervised_slots(anchor: int, seq_len: int, block_size: int, labels: str = "dspark") -> int:
    """Supervised slots of the block at ``anchor`` in a fully supervised sequence: DSpark labels supervise slots
    ``0..B-1`` (slot k predicts ``x_{a+k+1}``), z-lab labels slots ``1..B-1``, each only up to the last token."""
    if labels == "dspark":
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
    groups = [group for micro_batch in plan for group in micro_batch]
    context_rows = sum(int(group.anchors.max()) for group in groups)
    blocks = num_sequences * len(anchor_list)
    supervised = num_sequences * sum(supervised_slots(a, seq_len, block, cfg.drafter.labels) for a in anchor_list)
    value_bytes = feature_bytes_per_value(cfg)
    d = geometry.hidden_size
    feature = value_bytes * (context_rows * len(cfg.target.layer_ids) * d + supervised * d)
    metadata = INT64_BYTES * (
        _INT_FIELDS_PER_CONTEXT_ROW * context_rows
        + _INT_FIELDS_PER_SLOT * blocks * block
        + _INT_FIELDS_PER_BLOCK * blocks
        + _INT_FIELDS_PER_SEQUENCE * len(groups)
    )
    return PayloadBytes(len(plan), len(groups), context_rows, blocks, supervised, feature, metadata)


def target_decoder_params(hf_config: Any) -> int:
    """Parameters a target forward multiplies per token: decoder layers and final norm (no embedding, no LM
    head: target workers stop at the final norm; logits are computed by drafter workers, and only there)."""
    d = hf_config.hidden_size
    hd = getattr(hf_config, "head_dim", None) or d // hf_config.num_attention_heads
    q, kv = hf_config.num_attention_heads * hd, hf_config.num_key_value_heads * hd
    attention = d * q + 2 * d * kv + q * d + 2 * hd
    mlp = 3 * d * hf_config.intermediate_size
    return hf_config.num_hidden_layers * (attention + mlp + 2 * d) + d


def target_total_params(hf_config: Any) -> int:
    """All target parameters (what a target worker holds): decoder, embedding, and an untied LM head."""
    embed = hf_config.vocab_size * hf_config.hidden_size
    head = 0 if hf_config.tie_word_embeddings else embed
    return target_decoder_params(hf_config) + embed + head


def target_flops_per_sequence(hf_config: Any, seq_len: int) -> float:
    """Forward FLOPs of the target over one causal sequence (matmuls + attention scores and values)."""
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    linear = 2 * target_decoder_params(hf_config) * seq_len
    # Query i sees i+1 keys: sum over the sequence = L(L+1)/2 pairs per layer.
    pairs = seq_len * (seq_len + 1) / 2
    attention = 4 * hf_config.num_attention_heads * hd * pairs * hf_config.num_hidden_layers
    return linear + attention


def drafter_flops_per_sequence(cfg: RecipeConfig, geometry: DrafterGeometry, seq_len: int, anchors: int) -> float:
    """Forward + backward FLOPs of one drafter step's work for one nominal sequence (the kind's cost model in
    ``kinds``: layer passes, context projections, attention pairs and the heads at supervised slots)."""
    anchor_list = nominal_anchors(seq_len, anchors)
    block = cfg.drafter.block_size
    supervised = sum(supervised_slots(a, seq_len, block, cfg.drafter.labels) for a in anchor_list)
    return kind_spec(cfg.drafter.kind).flops_per_sequence(cfg, geometry, anchor_list, supervised)


@dataclass(frozen=True)
class ThroughputSplit:
    """Per-worker throughput in sequences/s and a target:drafter split of the GPUs.

    ``sequences_per_s`` follows the streamed mode's routing (``deepspec_train.streaming.roles``): with
    ``T <= D`` a target feeds ``ceil(D / T)`` drafters; with ``T > D`` drafter ``i`` takes turns between its
    ``floor`` or ``ceil(T / D)`` targets. Drafters step together (gradient all-reduce), so the slowest one sets
    the pace.
    """

    target_sequences_per_s: float
    drafter_sequences_per_s: float
    target_workers: int
    drafter_workers: int

    @property
    def sequences_per_s(self) -> float:
        t, d = self.target_workers, self.drafter_workers
        if t <= d:
            fed = self.target_sequences_per_s / math.ceil(d / t)
        else:
            fed = self.target_sequences_per_s * (t // d)
        return d * min(fed, self.drafter_sequences_per_s)


def balance_workers(
    target_flops: float, drafter_flops: float, gpus: int, flops_per_s: float, global_batch: Optional[int] = None
) -> ThroughputSplit:
    """The split of ``gpus`` into target and drafter workers with the highest sustained sequence rate; the
    drafter count must divide ``global_batch`` (sequences per step are split evenly over drafter ranks)."""
    target_rate, drafter_rate = flops_per_s / target_flops, flops_per_s / drafter_flops
    best: Optional[ThroughputSplit] = None
    for targets in range(1, gpus):
        drafters = gpus - targets
        if global_batch is not None and global_batch % drafters:
            continue
        split = ThroughputSplit(target_rate, drafter_rate, targets, drafters)
        # Ties go to fewer target workers (less memory held by frozen weights).
        if best is None or split.sequences_per_s > best.sequences_per_s * (1 + 1e-9):
            best = split
    if best is None:
        raise ValueError(f"no split of {gpus} GPUs has a drafter count dividing the global batch {global_batch}")
    return best


def drafter_worker_bytes(drafter: torch.nn.Module, target_head_params: int) -> int:
    """Persistent memory of a drafter worker: Adam state of trainable parameters, fp32 frozen copies
    (embedding, LM head), and the target LM head in bf16 (target logits at supervised slots)."""
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    return TRAINABLE_BYTES_PER_PARAM * trainable + FROZEN_BYTES_PER_PARAM * frozen + 2 * target_head_params


# H100 SXM dense bf16 peak (989 TFLOP/s) at 40% utilisation: the assumption behind the docs' tables.
ASSUMED_FLOPS_PER_S = 0.4 * 989e12
GPUS_PER_NODE = 8


def reference_target_config(cfg: RecipeConfig) -> Any:
    """The published config of the recipe's target, named by its ``target.path`` directory (``models/Qwen3-8B``)."""
    from deepspec_train.models.reference_configs import qwen3_reference_configs

    name = Path(cfg.target.path).name
    configs = qwen3_reference_configs()
    if name not in configs:
        raise KeyError(f"no reference config for target {cfg.target.path!r}; known: {sorted(configs)}")
    return configs[name]


def meta_drafter(cfg: RecipeConfig, hf_config: Any) -> torch.nn.Module:
    """The recipe's drafter for ``hf_config``, on the meta device (shapes only, no memory)."""
    from deepspec_train.models.factory import build_drafter_for_geometry
    from deepspec_train.models.geometry import geometry_from_target_config

    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    with torch.device("meta"):
        return build_drafter_for_geometry(cfg, geometry)


def sizing_row(recipe: str, seq_len: int, flops_per_s: float = ASSUMED_FLOPS_PER_S) -> dict[str, float]:
    """One line of the docs' sizing table for ``recipe`` at nominal sequence length ``seq_len``."""
    from deepspec_train.config.loader import load_recipe
    from deepspec_train.models.geometry import geometry_from_target_config

    cfg = load_recipe(recipe, check_target=False)
    hf_config = reference_target_config(cfg)
    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    drafter = meta_drafter(cfg, hf_config)
    anchors = cfg.anchors.num_per_sequence
    target_flops = target_flops_per_sequence(hf_config, seq_len)
    drafter_flops = drafter_flops_per_sequence(cfg, geometry, seq_len, anchors)
    split = balance_workers(target_flops, drafter_flops, GPUS_PER_NODE, flops_per_s, cfg.train.global_batch_sequences)
    payload = payload_bytes(cfg, geometry, 1, seq_len, anchors)
    return {
        "target_tok_s": flops_per_s / target_flops * seq_len,
        "drafter_tok_s": flops_per_s / drafter_flops * seq_len,
        "drafter_per_target": drafter_flops / target_flops,
        "colocated_seq_s_node": GPUS_PER_NODE * flops_per_s / (target_flops + drafter_flops),
        "best_split": f"{split.target_workers}:{split.drafter_workers}",
        "split_seq_s_node": split.sequences_per_s,
        "target_weights_gb": 2 * target_total_params(hf_config) / 1e9,
        "drafter_state_gb": drafter_worker_bytes(drafter, hf_config.vocab_size * hf_config.hidden_size) / 1e9,
        "payload_mb_per_seq": payload.total_bytes / 1e6,
        "payload_bytes_per_supervised": payload.bytes_per_supervised_token,
    }


def main() -> None:
    """Print the docs' sizing table (markdown) for every production recipe at 1024, 2048 and 4096 tokens."""
    columns = [
        ("recipe", "recipe"), ("seq_len", "L"), ("target_tok_s", "target tok/s"), ("drafter_tok_s", "drafter tok/s"),
        ("drafter_per_target", "drafter/target FLOPs"), ("colocated_seq_s_node", "colocated seq/s/node"),
        ("best_split", "best T:D"), ("split_seq_s_node", "T:D seq/s/node"), ("target_weights_gb", "target GB"),
        ("drafter_state_gb", "drafter GB"), ("payload_mb_per_seq", "payload MB/seq"),
        ("payload_bytes_per_supervised", "B/supervised tok"),
    ]
    print("| " + " | ".join(title for _, title in columns) + " |")
    print("|" + "---|" * len(columns))
    for size in ("4b", "8b", "14b"):
        for variant in ("", "-dflash", "-eagle3"):
            for seq_len in (1024, 2048, 4096):
                row: dict[str, Any] = {"recipe": f"qwen3-{size}{variant}", "seq_len": seq_len}
                row.update(sizing_row(row["recipe"], seq_len))
                cells = [f"{row[key]:,.1f}" if isinstance(row[key], float) else str(row[key]) for key, _ in columns]
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
