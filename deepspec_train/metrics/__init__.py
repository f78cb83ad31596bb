"""Drafter-quality metrics (per-position acceptance and expected length, confidence calibration) and the sinks
metrics are recorded to (``metrics.sinks``: JSONL, W&B, no-op)."""

from deepspec_train.metrics.acceptance import (
    BlockLengthStats,
    PositionStats,
    block_expected_lengths,
    expected_accept_length,
    rows_to_blocks,
    slot_index_of_rows,
    tau_analytic,
)
from deepspec_train.metrics.calibration import (
    ReliabilityCurve, auroc, auroc_expected, auroc_soft, brier, ece, reliability_curve,
)

__all__ = [
    "BlockLengthStats",
    "PositionStats",
    "ReliabilityCurve",
    "auroc",
    "auroc_expected",
    "auroc_soft",
    "block_expected_lengths",
    "brier",
    "ece",
    "expected_accept_length",
    "reliability_curve",
    "rows_to_blocks",
    "slot_index_of_rows",
    "tau_analytic",
]
