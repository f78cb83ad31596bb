"""The DFlash2 drafter: the DFlash backbone with dynamic depthwise convolutions inside each decoder layer, and a
low-rank pairwise candidate selector on top.

Backbone. Each decoder layer of ``ParallelDrafter`` gains two ``GroupedDynamicConv`` modules (``attention_conv``,
``mlp_conv``) wrapped around its sublayers: ``h = norm(x)``, ``h, c = conv.prepare(h)``, ``y = sublayer(h)``,
``x = x + conv.finish(y, c)``. A convolution runs along the slots of one block (never across blocks) with
``conv_kernel_size`` taps: for the row at slot ``s`` of its block and channel ``i`` of group ``g = i //
conv_group_size``, ``out[s, i] = sum_{t <= s} (base[side, t, i] + delta[s, side, t, g]) * in[s - t, i]``, where
``delta = kernel_projection(h)`` is read from the sublayer's normed input (the output row's own), side 0 convolves
the sublayer input and side 1 its output. ``base_kernel`` starts at tap 0 = 1 and ``kernel_projection`` at zero,
so a fresh layer is exactly the DFlash layer and a DFlash checkpoint warm-starts it (``jobs/drafter_init.py``).
Names, shapes and the formula are those vLLM's ``qwen3_dflash2.py`` and SGLang's ``models/dflash.py`` load
(docs/reference/file_formats.md).

Selector. Per drafted slot ``e`` the candidates are the top ``K = selector_top_k`` tokens of the slot's logits
(the frozen target head on the final-normed state ``h_e``) with their logits as unary scores; the pairwise score
of candidate ``c`` after predecessor token ``p`` is ``unary[e, c] + sum_r A[p, r] * (W_h h_e)[r] * B[c, r]``, with
``A = predecessor_codebook``, ``B = successor_codebook`` (both ``[V, r]``) and ``W_h = hidden_projection``. At
decode time the predecessor of slot 0 is the anchor and of slot ``e`` the candidate chosen at ``e - 1``
(``models.dflash2_drafting``); in training it is the true previous token (teacher forcing,
``models.dflash2_selector_loss``). ``successor_codebook`` starts at zero, so the selector starts as the plain top-K
of the DFlash logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.models.geometry import DrafterGeometry
from deepspec_train.models.parallel_drafter import ATTENTION_BRANCH, INIT_STD, ParallelDecoderLayer, ParallelDrafter

# The two convolutions of a sublayer: 0 on its (normed) input, 1 on its output.
SIDES = 2


class GroupedDynamicConv(nn.Module):
    """A causal depthwise convolution along each block's slots whose taps are a static ``base_kernel`` plus a
    per-row, per-channel-group ``delta`` projected from the sublayer input; see the module docstring."""

    def __init__(self, hidden_size: int, taps: int, group_size: int, block_size: int) -> None:
        super().__init__()
        if taps < 1 or group_size < 1 or hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} must divide hidden_size {hidden_size} (and taps "
                             f"{taps} be >= 1)")
        self.taps = taps
        self.group_size = group_size
        self.num_groups = hidden_size // group_size
        self.block_size = block_size
        self.base_kernel = nn.Parameter(torch.empty(SIDES, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, SIDES * taps * self.num_groups, bias=False)
        self.reset_to_identity()

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        """Tap 0 = 1, every other tap and the dynamic part 0: the convolution passes its input through."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """``x [..., T, d]`` (``T`` a whole number of blocks), ``delta [..., T, taps, groups]`` -> ``[..., T, d]``."""
        shape = x.shape
        blocks = x.reshape(-1, self.block_size, self.num_groups, self.group_size)
        delta = delta.reshape(blocks.shape[0], self.block_size, self.taps, self.num_groups, 1)
        base = self.base_kernel[side].view(self.taps, self.num_groups, self.group_size)
        out = (base[0] + delta[:, :, 0]) * blocks
        for tap in range(1, min(self.taps, self.block_size)):
            # Slot s reads slot s - tap of its own block; the first ``tap`` slots have no such input (zero).
            shifted = nn.functional.pad(blocks[:, :-tap], (0, 0, 0, 0, tap, 0))
            out = out + (base[tap] + delta[:, :, tap]) * shifted
        return out.reshape(shape)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolved sublayer input and the side-1 delta kept for ``finish``, both from ``x`` (the normed
        sublayer input)."""
        delta = self.kernel_projection(x).unflatten(-1, (SIDES, self.taps, self.num_groups))
        return self.convolve(x, delta[..., 0, :, :], 0), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The sublayer output ``y`` convolved with side 1 and the input's delta."""
        return self.convolve(y, delta, 1)


class DFlash2DecoderLayer(ParallelDecoderLayer):
    """The DFlash decoder layer with a ``GroupedDynamicConv`` around its attention and its MLP."""

    def __init__(self, geometry: DrafterGeometry, taps: int, group_size: int, block_size: int) -> None:
        super().__init__(geometry)
        self.attention_conv = GroupedDynamicConv(geometry.hidden_size, taps, group_size, block_size)
        self.mlp_conv = GroupedDynamicConv(geometry.hidden_size, taps, group_size, block_size)

    def branch(self, index: int, h: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The sublayer between its branch's two convolutions (see the module docstring)."""
        conv = self.attention_conv if index == ATTENTION_BRANCH else self.mlp_conv
        h, delta = conv.prepare(h)
        return conv.finish(sublayer(h), delta)


class CandidateSelector(nn.Module):
    """The low-rank pairwise scores over each slot's top-K candidates; see the module docstring."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Predecessor rows and the hidden projection normal(0, 0.02), successor rows 0 (no pairwise term yet)."""
        nn.init.normal_(self.predecessor_codebook, std=INIT_STD)
        nn.init.normal_(self.hidden_projection.weight, std=INIT_STD)
        nn.init.zeros_(self.successor_codebook)

    def scores(self, hidden: torch.Tensor, predecessors: torch.Tensor, candidates: torch.Tensor,
               unary: torch.Tensor) -> torch.Tensor:
        """``hidden [..., d]``, ``predecessors [..., P]`` and ``candidates [..., C]`` (token ids), ``unary [..., C]``
        -> ``[..., P, C]``: ``unary[c] + <A[p] * W_h h, B[c]>``."""
        gate = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        left = self.predecessor_codebook[predecessors] * gate.unsqueeze(-2)
        pairwise = torch.matmul(left, self.successor_codebook[candidates].transpose(-1, -2))
        # fp32 whatever the weights: these scores are the proposal q that verification divides by.
        return unary.unsqueeze(-2).float() + pairwise.float()


class DFlash2Drafter(ParallelDrafter):
    """DFlash2: ``ParallelDrafter`` (Markov and confidence heads off) with convolved layers and a selector."""

    def __init__(self, geometry: DrafterGeometry, drafter_cfg: DrafterConfig, target_layer_ids: list[int]) -> None:
        # No draft vocabulary either: the parent is built without one (the selector ranks the target's tokens).
        if drafter_cfg.markov_rank or drafter_cfg.confidence_head:
            raise ValueError("a DFlash2 drafter has no Markov head and no confidence head")
        super().__init__(geometry, drafter_cfg, target_layer_ids)
        taps, group = drafter_cfg.conv_kernel_size, drafter_cfg.conv_group_size
        self.layers = nn.ModuleList(
            DFlash2DecoderLayer(geometry, taps, group, drafter_cfg.block_size) for _ in range(drafter_cfg.num_layers)
        )
        self.selector_top_k = drafter_cfg.selector_top_k
        self.candidate_selector = CandidateSelector(geometry.hidden_size, geometry.vocab_size,
                                                    drafter_cfg.selector_rank)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The DFlash init, then every convolution at the identity and the selector's own init."""
        super().reset_parameters()
        for module in self.modules():
            if isinstance(module, GroupedDynamicConv):
                module.reset_to_identity()
            elif isinstance(module, CandidateSelector):
                module.reset_parameters()

    @torch.no_grad()
    def candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-K candidate ids ``[..., K]`` of slot states ``hidden [..., d]`` and their logits (the unary
        scores, fp32), from the frozen head copy (the target's, which both engines use)."""
        logits = self.lm_head(hidden).float()
        values, ids = torch.topk(logits, self.selector_top_k, dim=-1)
        return ids, values
