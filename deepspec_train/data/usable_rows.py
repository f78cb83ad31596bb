"""Refuse, in one line and before the target loads, data that a run cannot use.

Two checks on a split's token-shard summary (``data_summary``), made as soon as the rows are tokenised (which
needs only the tokenizer): the kept rows must fill one training step (``train.global_batch_sequences``) or one
validation pass (a row per drafter rank), and no source may have more than ``data.max_skipped_fraction`` of its
rows skipped, which nearly always means the rows are read with the wrong shape, fields, template or length.
The line names each source, the shape it was read as, its rows read, kept and skipped per reason with the first
offending ``file:line``, the shapes accepted, and the settings that fix what was skipped.
"""

from __future__ import annotations

from deepspec_train.data.data_summary import DataSummary, SourceSummary
from deepspec_train.data.row_shapes import accepted_shapes
from deepspec_train.common.errors import UserError

# The settings that change whether rows with a skip reason are read; a reason not listed is in the data itself.
SETTINGS_FOR_REASON = {
    "missing_field": ("data.format", "data.fields"),
    "nothing_to_supervise": ("data.format",),
    "too_long": ("data.max_length",),
    "template_mismatch": ("data.chat_template", "data.enable_thinking"),
    "reasoning_not_rendered": ("data.chat_template",),
}
SKIPPED_SETTING = "data.max_skipped_fraction"


class UnusableDataError(UserError):
    """Kept rows that cannot fill one step or one validation pass, or a source mostly skipped."""


def require_usable_rows(
    summary: DataSummary, split: str, needed: int, needed_what: str, max_skipped_fraction: float
) -> None:
    """Raise ``UnusableDataError`` when ``summary`` keeps fewer than ``needed`` rows (``needed_what`` says what
    needs them) or one of its sources skips more than ``max_skipped_fraction`` of its rows."""
    if summary.kept < needed:
        raise UnusableDataError(
            f"data.{split}: {summary.kept} usable rows, fewer than {needed_what}; "
            + _diagnosis(summary.sources, summary.sources)
        )
    mostly_skipped = [s for s in summary.sources if s.read and s.skipped_count() > max_skipped_fraction * s.read]
    if mostly_skipped:
        raise UnusableDataError(
            f"data.{split}: more than {max_skipped_fraction:.0%} of a source's rows skipped "
            f"({SKIPPED_SETTING} = {max_skipped_fraction:g}; raise it up to 1 to train on the rest); "
            + _diagnosis(mostly_skipped, summary.sources)
        )


def describe_source(source: SourceSummary) -> str:
    """``SOURCE: N rows read as SHAPE (data.format=...), K kept, skipped C REASON, ... (first: FILE:LINE ...)``."""
    text = f"{source.source}: {source.read} rows read as {source.how_read()}, {source.kept} kept"
    if source.skipped:
        counts = ", ".join(f"{count} {reason}" for reason, count in sorted(source.skipped.items()))
        text += f", skipped {counts}"
    if source.first_bad is not None:
        bad = source.first_bad
        detail = f" ({bad['detail']})" if bad.get("detail") else ""
        text += f" (first: {bad['where']}: {bad['reason']}{detail})"
    return text


def _diagnosis(shown: list[SourceSummary], every: list[SourceSummary]) -> str:
    reasons = sorted({reason for source in every for reason in source.skipped})
    settings = dict.fromkeys(setting for reason in reasons for setting in SETTINGS_FOR_REASON.get(reason, ()))
    if not settings:
        settings = dict.fromkeys(("data.format", "data.fields"))
    return (
        "; ".join(describe_source(source) for source in shown)
        + f"; row shapes accepted: {accepted_shapes()}; change {', '.join(settings)} (docs/howto/data.md)"
    )
