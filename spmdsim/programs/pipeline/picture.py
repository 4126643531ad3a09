"""Pictures of a pipeline timeline: the stage x time grid as text (within 100 columns) and as PNG/SVG.

The text grid has one row per stage and one column per time unit (`F3` a forward, `B3` a
backward, `F3.5` through chunk 5 when stages hold several chunks, `.` idle); when the time axis
does not fit the width it continues in bands below. A summary follows: the measured bubble
beside the paper's formula, and the microbatches in flight per stage.
"""
from __future__ import annotations

import os
from typing import Any, Union

from ..viz.table import WIDTH, wrap_lines
from .records import Schedule
from .schedule import SCHEDULES
from .timeline import Timeline, bubble_formula, formula_text, in_flight, timeline
from ..viz.png import check_picture_path, new_figure, save_figure

__all__ = ["render", "plot", "summary"]

_IDLE = "."


def _timeline(what: Union[Schedule, Timeline]) -> Timeline:
    return what if isinstance(what, Timeline) else timeline(what)


def _formula_name(t: Timeline) -> str:
    """The schedule whose formula a timeline is compared with: its own, else the flushed pipeline's."""
    if t.name in SCHEDULES:
        return t.name
    return "interleaved" if t.virtual > 1 else "1f1b"


def _percent(value: Any) -> str:
    return f"{float(value):.1%}"


def summary(what: Union[Schedule, Timeline], width: int = WIDTH) -> list[str]:
    """The figures under a grid: length, bubble against its formula, in flight per stage."""
    t = _timeline(what)
    name = _formula_name(t)
    formula = bubble_formula(name, t.stages, max(t.microbatches, 1), t.virtual)
    bubble = t.bubble
    lines = [f"length {t.length} units ({_n(t.stages, 'stage')} x {t.length} = {t.stages * t.length} cells, "
             f"{t.busy} busy)",
             f"bubble {t.idle}/{t.stages * t.length} = {bubble} = {_percent(bubble)} idle; "
             f"formula {formula_text(name)} = {formula} = {_percent(formula)}"
             + ("" if t.name in SCHEDULES else f" (as {name})")]
    unit = "(microbatch, chunk) pairs" if t.virtual > 1 else "microbatches"
    flight = " ".join(str(n) for n in in_flight(t))
    lines.append(f"in flight per stage, most {unit} forward but not yet backward: {flight}")
    return wrap_lines(lines, width)


def render(what: Union[Schedule, Timeline], width: int = WIDTH) -> str:
    """The stage x time grid as text, folded into bands of columns to fit `width`, then `summary`.

    Args:
        what: a Schedule (its unit-cost timeline is drawn) or a Timeline.
        width: the most columns a line may take (at least the stage label and one cell).
    """
    t = _timeline(what)
    grid = t.grid()
    labels = [[_IDLE if cell is None else cell.label(t.virtual) for cell in row] for row in grid]
    cell = max([2] + [len(label) for row in labels for label in row])
    lead = len(f"stage {t.stages - 1}") + 2
    per_band = max(1, (width - lead + 1) // (cell + 1))
    step = _tick_step(cell + 1, len(str(max(t.length - 1, 0))))
    if t.virtual > 1:
        key = "F3.5: forward of microbatch 3 through chunk 5, B3.5: its backward, .: idle; one time unit each"
    else:
        key = "F3: forward of microbatch 3, B3: its backward, .: idle; one time unit each"
    lines = wrap_lines([_title(t), key], width)
    for first in range(0, max(t.length, 1), per_band):
        times = range(first, min(first + per_band, t.length))
        lines.append("")
        ticks = "".join((str(k) if k % step == 0 else "").ljust(cell + 1) for k in times)
        lines.append(("time".ljust(lead) + ticks).rstrip())
        for s, row in enumerate(labels):
            cells = " ".join(row[k].ljust(cell) for k in times)
            lines.append((f"stage {s}".ljust(lead) + cells).rstrip())
    lines.append("")
    lines.extend(summary(t, width))
    return "\n".join(lines) + "\n"


def _title(t: Timeline) -> str:
    chunks = f", {t.virtual} chunks per stage" if t.virtual > 1 else ""
    return f"{t.name or 'pipeline'} ({_n(t.stages, 'stage')}, {_n(t.microbatches, 'microbatch')}{chunks})"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("h") else "s")


def _tick_step(column: int, digits: int) -> int:
    """Label every time unit when its number fits a column, else every 2, 5, 10, ... units."""
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if step * column >= digits + 1:
            return step
    return 10_000


#: Inches a character of the plot's title (9 points, DejaVu Sans) takes, on average with some room.
_TITLE_INCHES = 0.075


def plot(what: Union[Schedule, Timeline], path: Union[str, os.PathLike], dpi: int = 120) -> str:
    """Draw the grid with matplotlib (.png, .svg or .pdf by suffix); returns the path written.

    Forwards and backwards in two colours, each cell labelled with its microbatch (and chunk),
    idle time left blank. Without matplotlib: one SpmdsimError line saying how to install it.
    """
    check_picture_path(path)
    t = _timeline(what)
    colours = {"F": "#9ecae1", "B": "#fdae6b"}
    name = _formula_name(t)
    title = (f"{_title(t)}; bubble {_percent(t.bubble)} (formula {formula_text(name)} = "
             f"{_percent(bubble_formula(name, t.stages, max(t.microbatches, 1), t.virtual))})")
    # Wide enough for the title beside the legend, not only for the cells: a short schedule's figure (1 stage,
    # 2.7 inches) cut its title and its time axis's label off at the edges.
    fig = new_figure(min(24.0, max(2.0 + 0.35 * t.length, _TITLE_INCHES * len(title) + 2.6)),
                     min(18.0, max(2.2, 1.4 + 0.45 * t.stages)))
    ax = fig.add_subplot(1, 1, 1)
    labels = max(1, t.length) <= 160 and t.stages <= 64
    size = max(4.0, min(9.0, 240.0 / max(t.length, 1)))
    for s, row in enumerate(t.cells):
        # One collection per stage and kind: a call per cell made 131,072 collections at the largest schedule
        # (64 x 256 x 4), more than 10 minutes of matplotlib; the cells are the same rectangles.
        for kind in ("F", "B"):
            spans = [(start, 1) for start, cell in row if cell.kind == kind]
            if spans:
                ax.broken_barh(spans, (s - 0.4, 0.8), facecolors=colours[kind], edgecolors="black", linewidth=0.4)
        if labels:
            for start, cell in row:
                ax.text(start + 0.5, s, cell.label(t.virtual)[1:], ha="center", va="center", fontsize=size)
    ax.set_xlim(0, max(t.length, 1))
    ax.set_ylim(t.stages - 0.5, -0.5)  # stage 0 on top, as in the text grid
    ax.set_yticks(range(t.stages), [f"stage {s}" for s in range(t.stages)], fontsize=8)
    ax.set_xlabel("time (one unit per forward or backward of one chunk)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=colours["F"], label="forward"), Patch(facecolor=colours["B"], label="backward")],
              loc="upper right", fontsize=7, ncol=2, bbox_to_anchor=(1.0, 1.16))
    ax.set_title(title, fontsize=9, loc="left", pad=18)
    fig.tight_layout()
    return save_figure(fig, path, dpi)
