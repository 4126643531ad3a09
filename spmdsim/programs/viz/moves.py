"""Which piece of the tensor moves from which rank to which, step by step (pure), and its pictures.

A redistribution step's moves are boxes of the global tensor: for every rank,
the part of its new block it lacks, cut by the ranks of its group that hold it
(or hold addends of it, for a step that sums). An Exchange lists its boxes
itself. `step_moves` decides; `render_moves_png` and `render_byte_matrix_png`
draw (matplotlib imported when called), at 1920x1080 pixels so that a slide
shows every label.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from typing import Any, Sequence, Union

from ..plan.steps import Allreduce, Exchange, ReduceScatter, Step
from .model import compact_ranks
from .why import step_groups, step_text, step_why
from .png import new_figure, save_figure, shard_colour

__all__ = ["Move", "step_moves", "render_moves_png", "render_byte_matrix_png"]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Move:
    """One box of the tensor reaching rank `dst` from `sources` (summed when `summed`)."""

    box: Box
    sources: tuple[int, ...]
    dst: int
    summed: bool = False


def _cut(a: Box, b: Box) -> Box | None:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def step_moves(step: Step, shape: Sequence[int]) -> tuple[Move, ...]:
    """Every box that reaches a rank from another in `step` (none for a local step)."""
    if isinstance(step, Exchange):
        return tuple(Move(tuple(t.piece), (t.src,), t.dst) for t in step.transfers)
    if not any(step.bytes_received):
        return ()
    summed = isinstance(step, (Allreduce, ReduceScatter))
    moves = []
    for group in step_groups(step):
        for dst in group:
            want = step.after.bounds(dst, shape)
            if summed:
                box = _cut(want, step.before.bounds(dst, shape))
                if box:
                    moves.append(Move(box, tuple(r for r in group if r != dst), dst, True))
                continue
            have = step.before.bounds(dst, shape)
            for src in group:
                box = _cut(want, step.before.bounds(src, shape)) if src != dst else None
                if box and _cut(box, have) != box:
                    moves.append(Move(box, (src,), dst))
    return tuple(moves)


def _label(moves: Sequence[Move]) -> str:
    """``r1 -> r0,2,3`` for one box's moves (grouped by source); ``sum r1,2,3 -> r0`` for sums."""
    by_src: dict[tuple[int, ...], list[int]] = {}
    for m in moves:
        by_src.setdefault(m.sources, []).append(m.dst)
    parts = []
    for sources, dsts in by_src.items():
        src = ("+".join(f"r{s}" for s in sources) + " (sum)") if moves[0].summed else f"r{sources[0]}"
        parts.append(f"{src} -> r{compact_ranks(dsts)}")
    return "\n".join(parts)


def render_moves_png(plan: Any, directory: Union[str, os.PathLike], *, name: str = "x",
                     dialect: str = "sbp") -> list[str]:
    """One 1920x1080 picture per step that moves data: the tensor cut into the pieces that move.

    Each piece is drawn where it lies in the (2-D) global tensor, coloured by
    its source rank and labelled ``r1 -> r0,2,3``. Other tensors than 2-D and
    local steps get no picture. Returns the paths written (``moves_01.png``, ...).
    """
    paths = []
    if len(plan.shape) != 2:
        return paths
    rows, cols = plan.shape
    for index, step in enumerate(plan.steps, 1):
        moves = step_moves(step, plan.shape)
        if not moves:
            continue
        boxes: dict[Box, list[Move]] = {}
        for m in moves:
            boxes.setdefault(m.box, []).append(m)
        fig = new_figure(19.2, 10.8)
        ax = fig.add_axes((0.06, 0.1, 0.62, 0.72))
        ax.set_xlim(0, float(cols))  # floats: matplotlib cannot place ints past int64
        ax.set_ylim(float(rows), 0)
        ax.set_xlabel("dim 1", fontsize=14)
        ax.set_ylabel("dim 0", fontsize=14)
        ax.tick_params(labelsize=12)
        labels = {box: _label(group) for box, group in boxes.items()}
        size = _font(boxes, labels, plan.shape)
        for box, group in boxes.items():
            (r0, r1), (c0, c1) = (tuple(map(float, pair)) for pair in box)
            # A sum is coloured by the rank it lands on (it leaves several), a copy by its source.
            who = group[0].dst if group[0].summed else group[0].sources[0]
            ax.add_patch(_rect(c0, r0, c1 - c0, r1 - r0, shard_colour(who, plan.num_ranks),
                               group[0].summed))
            if size:
                ax.text((c0 + c1) / 2, (r0 + r1) / 2, labels[box], ha="center", va="center",
                        fontsize=size, bbox={"facecolor": "white", "alpha": 0.85, "linewidth": 0})
        sent = max(step.bytes_sent)
        fig.suptitle(f"step {index}: {step_text(step, dialect)}", fontsize=22, weight="bold", y=0.97)
        fig.text(0.72, 0.8, _wrap(f"why: {step_why(step)}", 44), fontsize=15, va="top")
        how = ("each piece says whose addends are summed into it and which rank gets the sum "
               "(coloured by that rank)" if moves[0].summed else
               "each piece is coloured by the rank it leaves and says where it goes")
        if not size:
            how += f"; {len(boxes)} pieces: too many to label, see --explain for the bytes"
        fig.text(0.72, 0.45, _wrap(f"{name} {tuple(plan.shape)} {plan.dtype}; {how}", 44),
                 fontsize=14, va="top")
        fig.text(0.72, 0.2, f"most bytes one rank sends: {sent:,} B", fontsize=15, va="top")
        paths.append(save_figure(fig, os.path.join(os.fspath(directory), f"moves_{index:02d}.png"), 100))
    return paths


def _font(boxes: dict, labels: dict, shape: Sequence[int]) -> float:
    """The largest font (points, 10 to 18) at which every label fits its piece; 0: none fits."""
    rows, cols = shape
    width_px, height_px = 0.62 * 1920, 0.72 * 1080  # the tensor's axes at 100 dpi
    size = 18.0
    for box, text in labels.items():
        (r0, r1), (c0, c1) = box
        lines = text.split("\n")
        chars = max(len(line) for line in lines)
        # A character is about 0.6 em wide, a line 1.3 em high; 1 pt = 100/72 px.
        fit_w = (c1 - c0) / cols * width_px / (0.6 * chars * 100 / 72)
        fit_h = (r1 - r0) / rows * height_px / (1.3 * len(lines) * 100 / 72)
        size = min(size, fit_w, fit_h)
    return round(size, 1) if size >= 10 else 0.0


def _rect(x: float, y: float, w: float, h: float, colour: Any, summed: bool) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=colour, edgecolor="black", linewidth=1.5,
                     hatch="///" if summed else None)


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


def render_byte_matrix_png(matrix: Sequence[Sequence[int]], path: Union[str, os.PathLike],
                           title: str) -> str:
    """A 1920x1080 heatmap of matrix[src][dst] bytes, each cell numbered when there is room."""
    n = len(matrix)
    fig = new_figure(19.2, 10.8)
    ax = fig.add_axes((0.12, 0.1, 0.62, 0.78))
    # Floats for the colours: byte counts past int64 make an object array matplotlib cannot draw.
    image = ax.imshow([[float(v) for v in row] for row in matrix], cmap="Blues", vmin=0)
    ax.set_xlabel("to rank", fontsize=16)
    ax.set_ylabel("from rank", fontsize=16)
    step = max(1, n // 16)
    ax.set_xticks(range(0, n, step))
    ax.set_yticks(range(0, n, step))
    ax.tick_params(labelsize=13)
    if n <= 16:
        peak = max((v for row in matrix for v in row), default=0) or 1
        for src in range(n):
            for dst in range(n):
                value = matrix[src][dst]
                ax.text(dst, src, f"{value:,}" if value else ".", ha="center", va="center",
                        fontsize=max(10, 18 - n // 2), color="white" if value > peak / 2 else "black")
    bar = fig.colorbar(image, ax=ax, fraction=0.04)
    bar.set_label("bytes", fontsize=14)
    fig.suptitle(title, fontsize=20, weight="bold")
    totals = [sum(row) for row in matrix]
    spread = f"{min(totals):,} B" if min(totals) == max(totals) else f"{min(totals):,} to {max(totals):,} B"
    fig.text(0.78, 0.5, _wrap(f"each rank sends {spread} in all; a row is what one rank sends, "
                              "a column what one rank receives", 30), fontsize=15, va="center")
    return save_figure(fig, path, 100)
