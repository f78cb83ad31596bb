"""Decide the row shape of each data source (``data.format``), per source, before any row is tokenised.

With ``data.format=auto`` the first ``DETECTION_ROWS`` rows of a source decide: each readable row is of the
first shape in ``row_shapes.SHAPES`` order whose fields (renamed by ``data.fields``) it carries. Rows that match
no shape do not vote (they are counted as ``missing_field`` later); when the voting rows disagree the source is
refused with one line (``MixedShapesError``), since reading it as one shape would silently skip the others; when
none matches, the source has no shape and every row is a ``missing_field`` bad row. A named format reads every row
as that shape. Reading the first rows here also surfaces a missing, empty or unreadable source at once, before
anything heavy loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice

from deepspec_train.data.conversations import BadRow, iter_records
from deepspec_train.data.row_shapes import SHAPES, FieldMap, RowShape
from deepspec_train.common.errors import UserError

AUTO = "auto"
DETECTION_ROWS = 32


class MixedShapesError(UserError):
    """A source whose first rows are of different shapes under ``data.format=auto``."""


@dataclass
class ShapedSource:
    """A source opened for reading: its rows (none consumed yet), the shape they are read as (None: no shape
    recognised) and whether ``data.format=auto`` chose it."""

    source: str
    shape: RowShape | None
    detected: bool
    rows: Iterator[tuple[str, dict | BadRow]]


def open_source(source: str, split: str, row_format: str, names: FieldMap) -> ShapedSource:
    """``source`` with its shape decided as the module docstring says; raises what ``iter_records`` raises for a
    source without rows, and ``MixedShapesError``."""
    records = iter_records(source, split)
    head = list(islice(records, DETECTION_ROWS))
    rows = chain(head, records)
    if row_format != AUTO:
        return ShapedSource(source, SHAPES[row_format], False, rows)
    return ShapedSource(source, detect_shape(source, head, names), True, rows)


def shape_of(record: dict, names: FieldMap) -> RowShape | None:
    """The first guessable shape whose fields ``record`` carries."""
    return next((shape for shape in SHAPES.values() if shape.guessed and shape.matches(record, names)), None)


def detect_shape(source: str, head: list[tuple[str, dict | BadRow]], names: FieldMap) -> RowShape | None:
    """The one shape of ``head``'s rows (None when no row matches one); ``MixedShapesError`` when they differ."""
    first_of: dict[str, str] = {}
    for where, record in head:
        if isinstance(record, BadRow):
            continue
        shape = shape_of(record, names)
        if shape is not None:
            first_of.setdefault(shape.name, where)
    if len(first_of) > 1:
        found = ", ".join(f"{where} is a {name} row" for name, where in first_of.items())
        raise MixedShapesError(
            f"data source {source!r} mixes row shapes ({found}): give each shape its own source, or set "
            f"data.format to read every row as one shape (rows of another shape are then skipped as missing_field)"
        )
    return SHAPES[next(iter(first_of))] if first_of else None
