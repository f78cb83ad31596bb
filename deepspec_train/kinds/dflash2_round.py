"""The serving round of the DFlash2 drafter kind (``kinds.dflash2``): the DFlash round (``kinds.parallel_round``)
extended, kernel group by kernel group, from the building blocks of ``kinds.serving_kernels`` (its docstring has the
accounting)."""

from __future__ import annotations

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.kinds.parallel_round import parallel_round
from deepspec_train.kinds.serving_kernels import (
    ACTIVATION_BYTES, INDEX_BYTES, LOGIT_BYTES, GroupBuilder, GroupRole, KernelGroup, RoundShape, ServingRound, Weight,
)
from deepspec_train.models.geometry import DrafterGeometry


def dflash2_round(cfg: DrafterConfig, geometry: DrafterGeometry, taps: int, shape: RoundShape) -> ServingRound:
    """DFlash2: the DFlash round (``parallel_round``) with, in each backbone layer, the two convolutions'
    ``kernel_projection`` over the block's rows and their ``base_kernel``; instead of sampling from the whole
    vocabulary, the top-K candidates of each drafted slot's logits, the selector's lattice (``hidden_projection``,
    the predecessor rows of the anchor and of the previous slot's candidates, the successor rows of the slot's
    candidates, one ``[K, r] x [r, K]`` product per slot) and the walk, which reads one row of K scores per slot
    and writes q over the K candidates (vLLM walks all slots in one kernel: one group). The convolutions'
    products themselves are elementwise (no matmul FLOPs)."""
    d, vocab, b, block = geometry.hidden_size, geometry.vocab_size, shape.batch, cfg.block_size
    top_k, rank = cfg.selector_top_k, cfg.selector_rank
    base = parallel_round(cfg, geometry, taps, shape)
    groups, layer = [], 0
    for group in base.groups:
        if group.role is GroupRole.BACKBONE_LAYER:
            extra = GroupBuilder("")
            for conv in ("attention_conv", "mlp_conv"):
                prefix = f"layers.{layer}.{conv}."
                extra.matmul(prefix + "kernel_projection.weight", b * block, d,
                             2 * cfg.conv_kernel_size * (d // cfg.conv_group_size))
                extra.weights.append(Weight(prefix + "base_kernel", 2 * cfg.conv_kernel_size * d,
                                            2 * cfg.conv_kernel_size * d))
                # Each convolution reads its rows and writes them back, once per side.
                extra.activations += 2 * 2 * ACTIVATION_BYTES * b * block * d
            groups.append(KernelGroup(group.name, group.weights + tuple(extra.weights),
                                      group.activation_bytes + extra.activations, group.flops + extra.flops,
                                      group.role))
            layer += 1
        elif group.role is not GroupRole.SAMPLING:
            groups.append(group)
    slots = b * base.drafts
    select = GroupBuilder("top-K candidates")
    select.sample(slots, vocab)
    select.activations += slots * top_k * (LOGIT_BYTES + INDEX_BYTES)
    groups.append(select.done())
    lattice = GroupBuilder("selector lattice")
    lattice.matmul("candidate_selector.hidden_projection.weight", slots, d, rank)
    lattice.gather("candidate_selector.predecessor_codebook", vocab, rank, slots * top_k)
    lattice.gather("candidate_selector.successor_codebook", vocab, rank, slots * top_k)
    lattice.flops += 2 * slots * top_k * top_k * rank
    lattice.activations += LOGIT_BYTES * slots * top_k * top_k
    groups.append(lattice.done())
    walk = GroupBuilder("selector walk")
    walk.activations += slots * top_k * (2 * LOGIT_BYTES + INDEX_BYTES)
    groups.append(walk.done())
    return ServingRound(base.drafts, tuple(groups))
