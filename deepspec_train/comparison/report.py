"""Markdown report of a drafter comparison: the main table, per-position acceptance tables and calibration detail.

Tables are built twice from the same cells: as raw values (numbers, None for missing) for W&B tables, and as
text for ``comparison.md`` and the console, where a missing value is "-". Rows keep the order the drafters were
given on the command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.comparison.collect import DrafterRow, suites_of

MISSING = "-"
REPORT_FILE = "comparison.md"

Cell = float | str | None


@dataclass
class Table:
    """Column names and raw cell values; ``digits[i]`` is how many decimals column ``i`` shows (None: text)."""

    columns: list[str]
    rows: list[list[Cell]]
    digits: list[int | None]

    def text_rows(self) -> list[list[str]]:
        return [[format_cell(v, d) for v, d in zip(row, self.digits)] for row in self.rows]


def format_cell(value: Cell, digits: int | None) -> str:
    if value is None:
        return MISSING
    if digits is None or isinstance(value, str):
        return str(value)
    return f"{value:.{digits}f}"


def _row_cells(rows: Sequence[DrafterRow], getters: Sequence[Callable[[DrafterRow], Cell]]) -> list[list[Cell]]:
    return [[get(row) for get in getters] for row in rows]


def main_table(rows: Sequence[DrafterRow]) -> Table:
    """``drafter | kind | tau <suite>... | E[L] | ECE before | ECE after``, one row per drafter."""
    suites = suites_of(rows)

    def tau_of(suite: str) -> Callable[[DrafterRow], Cell]:
        return lambda row: row.tau.get(suite)

    getters: list[Callable[[DrafterRow], Cell]] = [lambda r: r.name, lambda r: r.kind]
    getters += [tau_of(s) for s in suites]
    getters += [
        lambda r: r.expected_len,
        lambda r: r.calibration.mean_ece_before if r.calibration else None,
        lambda r: r.calibration.mean_ece_after if r.calibration else None,
    ]
    columns = ["drafter", "kind", *[f"tau {s}" for s in suites], "E[L]", "ECE before", "ECE after"]
    digits: list[int | None] = [None, None, *[3] * len(suites), 3, 4, 4]
    return Table(columns, _row_cells(rows, getters), digits)


def _position_table(rows: Sequence[DrafterRow], curve: Callable[[DrafterRow], list[float | None]]) -> Table:
    """``drafter | k=1 | ... | k=K`` with K the longest curve; shorter curves end in "-"."""
    width = max((len(curve(r)) for r in rows), default=0)
    cells = [[r.name, *curve(r), *[None] * (width - len(curve(r)))] for r in rows]
    return Table(["drafter", *[f"k={k}" for k in range(1, width + 1)]], cells, [None, *[3] * width])


def acceptance_table(rows: Sequence[DrafterRow], suite: str) -> Table:
    """Measured conditional acceptance ``P(A_k | A_<k)`` per position on ``suite``."""
    return _position_table(rows, lambda r: r.conditional_acceptance.get(suite, []))


def validation_acceptance_table(rows: Sequence[DrafterRow]) -> Table:
    """Teacher-forced mean ``c*_k`` per position from each run's last validation."""
    return _position_table(rows, lambda r: r.val_accept)


def calibration_table(rows: Sequence[DrafterRow]) -> Table:
    """Count-weighted ECE / AUROC before and after STS, and the fitted temperatures, for calibrated drafters."""
    cells: list[list[Cell]] = []
    for r in rows:
        c = r.calibration
        if c is None:
            continue
        temperatures = ", ".join(format_cell(t, 2) for t in c.temperatures)
        cells.append([
            r.name, sum(c.counts), c.mean_ece_before, c.mean_ece_after, c.mean_auroc_before, c.mean_auroc_after,
            temperatures or None,
        ])
    columns = ["drafter", "rounds", "ECE before", "ECE after", "AUROC before", "AUROC after", "temperatures"]
    return Table(columns, cells, [None, 0, 4, 4, 4, 4, None])


def markdown_table(table: Table) -> str:
    def line(cells: Sequence[str]) -> str:
        # A "|" inside a cell (e.g. in a run name) would split the column.
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [line(table.columns), line(["---"] * len(table.columns))]
    lines += [line(cells) for cells in table.text_rows()]
    return "\n".join(lines)


_NOTES = (
    "tau: tokens per verification round on the suite, bonus token included (`deepspec eval`). "
    "E[L]: teacher-forced expected accepted drafts per block at the last validation, bonus not included "
    "(`val/expected_len`). ECE before / after: ECE of cumulative survival per block position before and after "
    "sequential temperature scaling (`deepspec calibrate`), averaged over positions weighted by the rounds "
    "reaching each position. \"-\": not available for that drafter."
)


def render_markdown(rows: Sequence[DrafterRow], plot_files: Sequence[str | os.PathLike] = ()) -> str:
    """The whole ``comparison.md``: main table, per-suite acceptance, validation acceptance, calibration, plots."""
    parts = ["# Drafter comparison", markdown_table(main_table(rows)), _NOTES]
    for suite in suites_of(rows):
        parts += [f"## Conditional acceptance P(A_k | A_<k): {suite}", markdown_table(acceptance_table(rows, suite))]
    if any(r.val_accept for r in rows):
        parts += [
            "## Teacher-forced acceptance c*_k (training validation)",
            markdown_table(validation_acceptance_table(rows)),
        ]
    if any(r.calibration is not None for r in rows):
        parts += ["## Confidence calibration", markdown_table(calibration_table(rows))]
        parts += [f"- {r.name}: reliability diagrams in `{r.calibration.reliability_png}`"
                  for r in rows if r.calibration is not None and r.calibration.reliability_png is not None]
    if plot_files:
        parts += ["## Plots", *[f"![{Path(p).stem}]({Path(p).name})" for p in plot_files]]
    return "\n\n".join(parts) + "\n"


def write_report(rows: Sequence[DrafterRow], out_dir: str | os.PathLike,
                 plot_files: Sequence[str | os.PathLike] = ()) -> Path:
    """Write ``out_dir/comparison.md`` and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_FILE
    path.write_text(render_markdown(rows, plot_files))
    return path

