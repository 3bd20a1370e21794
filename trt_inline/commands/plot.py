"""A chart of a report's per-boundary errors (``--plot FILE.png``), for those who would rather look than read.

matplotlib is an optional extra (``pip install trt-inline[plot]``): imported only
here, only when a chart is asked for, and drawn off-screen (the Agg backend of
a figure object, never pyplot's global state).
"""

from __future__ import annotations

import os
from pathlib import Path

from trt_inline.errors import VerifyInputError, printable
from trt_inline.formats import atomic_write
from trt_inline.verify.report import BoundaryRow, VerifyReport

__all__ = ["check_plot_target", "plot_boundaries"]

_FLOOR = 1e-12  # zero error on a log axis
# What one chart draws: labels (strings from a file, already escaped and cut where decoded) cut again to
# this, and at most this many boundaries, so that drawing costs the same whatever the file holds.
_LABEL = 60
_MAX_BARS = 400


def check_plot_target(path: str | os.PathLike[str]) -> Path:
    """The chart's path, refused before any work if it cannot be written or matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise VerifyInputError("--plot needs matplotlib: pip install 'trt-inline[plot]'")
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise VerifyInputError(f"--plot {target}: the chart is written as PNG, name it *.png")
    if not target.parent.is_dir():
        raise VerifyInputError(f"--plot: directory {target.parent} does not exist")
    return target


def _label(text: str, limit: int = _LABEL) -> str:
    """A label as drawn: escaped, cut, and with matplotlib's math mode (``$``) escaped."""
    clean = printable(text)
    clean = clean if len(clean) <= limit else clean[: limit - 3] + "..."
    return clean.replace("$", r"\$")


def plot_boundaries(report: VerifyReport, path: str | os.PathLike[str]) -> None:
    """Bars of each boundary's max abs error in the run and, for engine outputs, run alone; the tolerance as ticks."""
    target = check_plot_target(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = report.boundaries or [BoundaryRow("program outputs", None, report.outputs)]
    rows = rows[:_MAX_BARS]
    # Names come from the file: "$" would start matplotlib's math mode.
    labels = [_label(row.boundary) for row in rows]
    run = [max(BoundaryRow.worst(row.values) or 0.0, _FLOOR) for row in rows]
    own = [max(BoundaryRow.worst(row.own) or 0.0, _FLOOR) if row.own is not None else 0.0 for row in rows]
    tolerance = [max((v.atol for v in row.values), default=0.0) for row in rows]

    figure = Figure(figsize=(max(6.0, 0.5 * len(rows) + 3), 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = list(range(len(rows)))
    axes.bar([p - 0.2 for p in positions], run, width=0.4, label="max abs diff in the run")
    axes.bar([p + 0.2 for p in positions], own, width=0.4, label="own error (engine run alone)")
    axes.scatter(positions, [max(t, _FLOOR) for t in tolerance], marker="_", s=400, color="black", label="atol")
    axes.set_yscale("log")
    axes.set_xticks(positions, labels, rotation=60, ha="right", fontsize=7)
    axes.set_ylabel("max abs diff (0 drawn at 1e-12)")
    title = _label(report.source, 120)
    if report.divergence is not None:
        title += f"\nfirst divergence: {_label(report.divergence.where, 120)}"
    if len(report.boundaries) > _MAX_BARS:
        title += f"\n(the first {_MAX_BARS} of {len(report.boundaries)} boundaries)"
    axes.set_title(title, fontsize=8)
    axes.legend(fontsize=7)
    figure.tight_layout()
    with atomic_write(target) as tmp:
        figure.savefig(tmp, format="png", dpi=100)
