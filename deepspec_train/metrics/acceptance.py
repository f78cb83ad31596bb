"""Drafter-quality metrics per block position: accuracy, analytic acceptance and expected acceptance length.

Both accumulators are fed once per micro-batch from quantities the loss already computed (for every supervised
row, in the row-major order of ``PackedBatch.supervised_mask``), summed locally, and combined across drafter
ranks with one ``all_reduce`` before logging. Names use 1-based positions: ``train/acc_1`` is slot 0, the token
right after the anchor.

Expected acceptance length. With ``c_k`` the probability that draft position ``k`` is accepted given that
positions ``1..k-1`` were, one verification round accepts ``E[L] = sum_j prod_{k<=j} c_k`` draft tokens; the
target then always adds one more token (the correction or bonus token), so tokens per round are
``tau = 1 + E[L]``. The paper's tau includes that token. We log ``val/expected_len`` WITHOUT the +1 and
``val/tau_analytic`` WITH it.

Mean of products versus product of means. For one block with per-slot analytic acceptance ``c*_{b,k}`` (teacher
forcing: the prefix is the true continuation, which is exactly what an accepted prefix is),
``sum_j prod_{k<=j} c*_{b,k}`` is that block's expected accepted length, so ``val/expected_len`` averages it
over blocks. Plugging per-position means into the same formula (``val/expected_len_from_means``) would equal
it only if the slots of a block were independent; in practice they are positively correlated (an easy
continuation stays easy), so the product of means usually underestimates. Both are reported: the first is the
estimate of tau, the second is what a per-position acceptance table implies. Only blocks whose every drafted slot
is supervised enter either number, because a block truncated by the end of the assistant span would count its
missing slots as rejections. Under z-lab labels (the engines' 1 + N layout) slot 0 holds the anchor: it drafts
nothing and is never supervised, so the drafted slots are ``1..B-1`` (``first_slot = 1``); counting slot 0 would
leave no full block at all.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist


def expected_accept_length(c_star_means: Sequence[float]) -> float:
    """``sum_j prod_{k<=j} c_k``: expected accepted draft tokens per round, bonus token NOT included."""
    total = 0.0
    survival = 1.0
    for c in c_star_means:
        survival *= float(c)
        total += survival
    return total


def tau_analytic(c_star_means: Sequence[float]) -> float:
    """Expected tokens per verification round including the target's guaranteed token: ``1 + E[L]``."""
    return 1.0 + expected_accept_length(c_star_means)


def block_expected_lengths(c_star_blocks: torch.Tensor) -> torch.Tensor:
    """Per-block ``sum_j prod_{k<=j} c_{b,k}`` for ``c_star_blocks [Nb, B]``; returns ``[Nb]`` (no bonus token)."""
    return torch.cumprod(c_star_blocks, dim=1).sum(dim=1)


def slot_index_of_rows(supervised_mask: torch.Tensor) -> torch.Tensor:
    """0-based block slot of every supervised row ``[Ns]``, in the row-major order the batch stores rows in."""
    return supervised_mask.nonzero()[:, 1]


def rows_to_blocks(values: torch.Tensor, supervised_mask: torch.Tensor) -> torch.Tensor:
    """Scatter per-row ``values [Ns]`` back to ``[Nb, B]``; unsupervised slots are 0."""
    out = values.new_zeros(supervised_mask.shape)
    out[supervised_mask] = values
    return out


class _SummedStats:
    """Holds one float64 tensor of sums, so that combining ranks is a single ``all_reduce``."""

    def __init__(self, shape: tuple[int, ...], device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._sums = torch.zeros(shape, dtype=torch.float64, device=self.device)

    def reset(self) -> None:
        self._sums.zero_()

    def all_reduce(self, group: Optional[dist.ProcessGroup] = None) -> None:
        """Sum the accumulators over the ranks of ``group`` in place; every rank of the group must call it.

        ``device`` must suit the backend: CPU for gloo, the rank's CUDA device for NCCL.
        """
        dist.all_reduce(self._sums, op=dist.ReduceOp.SUM, group=group)

    def all_reduce_with(self, extra: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
        """``all_reduce`` and the sum of the vector ``extra`` over the same ranks, in one collective; returns the
        summed ``extra`` (float64)."""
        flat = torch.cat([self._sums.reshape(-1), extra.to(device=self.device, dtype=torch.float64).reshape(-1)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        self._sums.copy_(flat[: self._sums.numel()].view_as(self._sums))
        return flat[self._sums.numel():]

    def _as_float64(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device, dtype=torch.float64).reshape(-1)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


class PositionStats(_SummedStats):
    """Per-position accuracy, analytic acceptance ``c*`` and (optionally) predicted confidence.

    ``update`` takes, for every supervised row: ``slot_index`` (0-based slot), ``c_star`` (``sum min(p_d, p_t)``),
    ``draft_correct`` (1 when the drafter's argmax equals the label) and optionally ``conf_prob`` (the confidence
    head's sigmoid output). Accumulators stay on ``device`` so updates never synchronise with the host.
    """

    _COUNT, _CORRECT, _CSTAR, _CONF, _CONF_COUNT = range(5)

    def __init__(self, block_size: int, device: torch.device | str = "cpu") -> None:
        super().__init__((5, block_size), device)
        self.block_size = block_size

    def update(
        self,
        slot_index: torch.Tensor,
        c_star: torch.Tensor,
        draft_correct: torch.Tensor,
        conf_prob: Optional[torch.Tensor] = None,
    ) -> None:
        idx = slot_index.detach().to(device=self.device, dtype=torch.long).reshape(-1)
        ones = torch.ones(idx.shape, dtype=torch.float64, device=self.device)
        self._sums[self._COUNT].index_add_(0, idx, ones)
        self._sums[self._CORRECT].index_add_(0, idx, self._as_float64(draft_correct))
        self._sums[self._CSTAR].index_add_(0, idx, self._as_float64(c_star))
        if conf_prob is not None:
            self._sums[self._CONF].index_add_(0, idx, self._as_float64(conf_prob))
            self._sums[self._CONF_COUNT].index_add_(0, idx, ones)

    def counts(self) -> list[int]:
        return [int(c) for c in self._sums[self._COUNT].tolist()]

    def _means(self, row: int, count_row: int) -> list[float]:
        sums = self._sums.tolist()
        return [_ratio(s, n) for s, n in zip(sums[row], sums[count_row])]

    def acc_means(self) -> list[float]:
        """Mean draft accuracy per position (NaN where a position saw no rows)."""
        return self._means(self._CORRECT, self._COUNT)

    def accept_means(self) -> list[float]:
        """Mean analytic acceptance ``c*`` per position (NaN where a position saw no rows)."""
        return self._means(self._CSTAR, self._COUNT)

    def conf_means(self) -> list[float]:
        """Mean predicted confidence per position (NaN where no confidence was given)."""
        return self._means(self._CONF, self._CONF_COUNT)

    def summary(self, prefix: str = "train") -> dict[str, float]:
        """``{prefix}/acc_k``, ``{prefix}/accept_k``, ``{prefix}/count_k`` (and ``{prefix}/conf_k`` when
        confidences were given) for every position k = 1..B that saw rows, plus the all-position means
        ``{prefix}/acc`` and ``{prefix}/accept``."""
        sums = self._sums.tolist()
        out: dict[str, float] = {}
        for k in range(self.block_size):
            n = sums[self._COUNT][k]
            if n == 0:
                continue
            out[f"{prefix}/acc_{k + 1}"] = sums[self._CORRECT][k] / n
            out[f"{prefix}/accept_{k + 1}"] = sums[self._CSTAR][k] / n
            out[f"{prefix}/count_{k + 1}"] = n
            if sums[self._CONF_COUNT][k] > 0:
                out[f"{prefix}/conf_{k + 1}"] = sums[self._CONF][k] / sums[self._CONF_COUNT][k]
        total = sum(sums[self._COUNT])
        if total > 0:
            out[f"{prefix}/acc"] = sum(sums[self._CORRECT]) / total
            out[f"{prefix}/accept"] = sum(sums[self._CSTAR]) / total
        return out


class BlockLengthStats(_SummedStats):
    """Expected acceptance length over fully supervised blocks, both as mean of per-block products and as the
    product formula applied to per-position means (see the module docstring for why they differ)."""

    def __init__(self, block_size: int, device: torch.device | str = "cpu", first_slot: int = 0) -> None:
        """``first_slot``: the first block slot a draft fills (1 under z-lab labels, 0 under DSpark labels)."""
        # Layout: [number of full blocks, sum of their E[L], per-position sums of c* over the drafted slots].
        super().__init__((2 + block_size - first_slot,), device)
        self.block_size = block_size
        self.first_slot = first_slot

    def update(self, c_star: torch.Tensor, supervised_mask: torch.Tensor) -> None:
        """``c_star [Ns]`` per supervised row (row-major order of ``supervised_mask [Nb, B]``)."""
        mask = supervised_mask.to(self.device)
        blocks = rows_to_blocks(self._as_float64(c_star), mask)[:, self.first_slot:]
        full = blocks[mask[:, self.first_slot:].all(dim=1)]
        self._sums[0] += full.shape[0]
        self._sums[1] += block_expected_lengths(full).sum()
        self._sums[2:] += full.sum(dim=0)

    def summary(self, prefix: str = "val") -> dict[str, float]:
        """``{prefix}/expected_len`` (mean over blocks, no bonus token), ``{prefix}/tau_analytic`` (the same + 1),
        ``{prefix}/expected_len_from_means`` and ``{prefix}/full_blocks``; only the count when no block was full."""
        n, total_len, *c_sums = self._sums.tolist()
        out: dict[str, float] = {f"{prefix}/full_blocks": n}
        if n == 0:
            return out
        expected_len = total_len / n
        out[f"{prefix}/expected_len"] = expected_len
        out[f"{prefix}/tau_analytic"] = 1.0 + expected_len
        out[f"{prefix}/expected_len_from_means"] = expected_accept_length([s / n for s in c_sums])
        return out
