"""Figures: every PNG plot the verbs write (comparison curves, reliability diagrams, the scheduler frontier, the
benchmark's bars) is made with ``new_figure`` and written with ``save_png``.

Matplotlib's object API with the Agg canvas only: no pyplot state, no display needed, safe in worker processes
and tests. ``save_png`` creates the parent directory and trims the margins, so every figure of the project is
written the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def new_figure(width: float, height: float) -> Figure:
    """A blank figure of ``width`` x ``height`` inches, attached to an Agg canvas."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` as a PNG at ``path`` (margins trimmed); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=dpi, bbox_inches="tight")
    return out
