"""Figures: every PNG plot the verbs write (comparison curves, reliability diagrams, the scheduler frontier, the
benchmark's bars) is made with ``new_figure`` and written with ``save_png``.

Matplotlib's object API with the Agg canvas only: no pyplot state, no display needed, safe in worker processes
and tests. ``save_png`` creates the parent directory and trims the margins, so every figure of the project is
written the same way.

A plot may also record what it drew (series, intervals, counts, greyed points, limits) as a JSON text chunk of
the PNG (``save_png(..., drawn=...)``, read back by ``read_drawn``): tests check the data behind a picture from
the file a command wrote, not its pixels. ``legend_outside`` and ``distinct_colours`` are the shared rules that
keep legends off the data and lines apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DRAWN_KEY = "deepspec:drawn"
# Ten well-separated hues, then their lighter twins: enough for every drafter or curve a figure shows.
_PALETTE = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive", "cyan")] + [
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5"]


def new_figure(width: float, height: float) -> Figure:
    """A blank figure of ``width`` x ``height`` inches, attached to an Agg canvas."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike, dpi: int = 120, drawn: Mapping[str, Any] | None = None) -> Path:
    """Write ``fig`` as a PNG at ``path`` (margins trimmed), with ``drawn`` (what the plot drew) as a JSON text
    chunk when given; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = None if drawn is None else {DRAWN_KEY: json.dumps(drawn)}
    fig.savefig(out, format="png", dpi=dpi, bbox_inches="tight", metadata=metadata)
    return out


def read_drawn(path: str | os.PathLike) -> dict[str, Any]:
    """What the plot at ``path`` recorded with ``save_png(..., drawn=...)``."""
    from PIL import Image

    with Image.open(path) as image:
        text = image.text.get(DRAWN_KEY)
    if text is None:
        raise ValueError(f"{path}: no {DRAWN_KEY!r} record (not written with save_png(..., drawn=...))")
    return json.loads(text)


def distinct_colours(count: int) -> list[str]:
    """``count`` colours, all different while ``count`` is at most 18 (then the palette repeats)."""
    return [_PALETTE[i % len(_PALETTE)] for i in range(count)]


def legend_outside(ax: Axes, title: str | None = None) -> None:
    """The legend to the right of the axes, so it never covers a point; nothing when no artist is labelled."""
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, title=title,
                  title_fontsize=8)
