"""Plain-text pictures of a layout for an 80-column terminal (needs nothing but Python).

Draws a LayoutPicture: the global tensor cut into blocks, each labelled by the
ranks holding it (``r0,1`` replicas, ``r0+1`` partial terms to add) and its
shard number (``#0``, ``#1``, ...); then the device matrix with each rank's shard number.
"""
from __future__ import annotations

import textwrap
from typing import Optional, Sequence, Union

from ...layouts.layout import TensorLayout
from ...base.validate import counted
from .model import LayoutPicture, Panel, as_picture

__all__ = ["render_layout_ascii", "tensor_lines", "grid_lines", "wrapped_grid_lines", "hstack"]

#: Gap between panels placed side by side.
_GAP = "   "


def grid_lines(
    row_headers: Sequence[str], col_headers: Sequence[str], cells: Sequence[Sequence[Sequence[str]]]
) -> list[str]:
    """A boxed grid; each cell is a list of text lines, centred in its column."""
    ncols = len(col_headers)
    height = max((len(c) for row in cells for c in row), default=1)
    widths = [
        max([len(col_headers[j])] + [len(line) for row in cells for line in row[j]]) + 2
        for j in range(ncols)
    ]
    margin = max((len(h) for h in row_headers), default=0)
    pad = " " * (margin + 1) if margin else ""
    rule = pad + "+" + "+".join("-" * w for w in widths) + "+"
    out = []
    if any(col_headers):
        out.append((pad + " " + " ".join(h.center(w) for h, w in zip(col_headers, widths))).rstrip())
    out.append(rule)
    for header, row in zip(row_headers, cells):
        for k in range(height):
            lead = (header.rjust(margin) + " ") if (margin and k == 0) else pad
            parts = [(cell[k] if k < len(cell) else "").center(w) for cell, w in zip(row, widths)]
            out.append(lead + "|" + "|".join(parts) + "|")
        out.append(rule)
    return out


def wrapped_grid_lines(
    row_headers: Sequence[str],
    col_headers: Sequence[str],
    cells: Sequence[Sequence[Sequence[str]]],
    width: int,
) -> list[str]:
    """grid_lines, cut into column chunks stacked top to bottom when wider than `width`."""
    ncols = len(col_headers)
    # A grid's widest line is its rule: margin, then each column's width and one border.
    widths = [max([len(col_headers[j])] + [len(line) for row in cells for line in row[j]]) + 2
              for j in range(ncols)]
    margin = max((len(h) for h in row_headers), default=0)
    fixed = (margin + 1 if margin else 0) + 1
    # Fewer chunks than this cannot fit (some chunk is at least the average wide):
    # starting here keeps thousands of columns from being drawn thousands of times.
    first = max(1, -(-(sum(widths) + ncols) // max(1, width - fixed)))
    # Fewest chunks that fit, with columns spread evenly over them (8 -> 4 + 4, not 7 + 1).
    for pieces in range(min(first, ncols), ncols + 1):
        chunk = -(-ncols // pieces)
        starts = range(0, ncols, chunk)
        if chunk > 1 and any(fixed + sum(widths[i:i + chunk]) + len(widths[i:i + chunk]) > width
                             for i in starts):
            continue
        out: list[str] = []
        for start in starts:
            cols = slice(start, start + chunk)
            part = grid_lines(row_headers, col_headers[cols], [row[cols] for row in cells])
            out += ([""] if out else []) + part
        return out
    raise AssertionError("unreachable")


def hstack(blocks: Sequence[list[str]], width: int) -> list[str]:
    """Place text blocks side by side, wrapping onto new lines past `width` columns."""
    out: list[str] = []
    line_group: list[list[str]] = []

    def flush() -> None:
        if not line_group:
            return
        widths = [max(len(x) for x in b) for b in line_group]
        height = max(len(b) for b in line_group)
        for k in range(height):
            parts = [(b[k] if k < len(b) else "").ljust(w) for b, w in zip(line_group, widths)]
            out.append(_GAP.join(parts).rstrip())
        line_group.clear()

    used = 0
    for block in blocks:
        w = max((len(x) for x in block), default=0)
        if line_group and used + len(_GAP) + w > width:
            flush()
            out.append("")
            used = 0
        used = w if not line_group else used + len(_GAP) + w
        line_group.append(block)
    flush()
    return out


def _panel_lines(panel: Panel, short: bool, width: int) -> list[str]:
    spans = [f"{a}:{b}" for a, b in zip(panel.row_edges, panel.row_edges[1:])]
    rows = [""] if panel.row_dim is None else spans
    spans = [f"{a}:{b}" for a, b in zip(panel.col_edges, panel.col_edges[1:])]
    cols = ["scalar"] if panel.col_dim < 0 else spans
    cells = [
        [[f"#{b.shard_number}"] if short else [b.label, f"#{b.shard_number}"] for b in row]
        for row in panel.blocks
    ]
    return [panel.title] + wrapped_grid_lines(rows, cols, cells, width)


def _tensor_lines(pic: LayoutPicture, width: int) -> tuple[list[str], bool]:
    for short in (False, True):
        lines: list[str] = []
        for gi in range(pic.panel_grid[0]):
            row = [p for p in pic.panels if p.grid_pos[0] == gi]
            if lines:
                lines.append("")
            lines += hstack([_panel_lines(p, short, width) for p in row], width)
        if max(len(x) for x in lines) <= width or short:
            return lines, short
    raise AssertionError("unreachable")


def _device_lines(pic: LayoutPicture, width: int) -> list[str]:
    lines: list[str] = []
    for gi in range(pic.device_grid[0]):
        row = []
        for p in (p for p in pic.device_panels if p.grid_pos[0] == gi):
            cells = [[[c.label, f"#{c.shard_number}"] for c in r] for r in p.cells]
            row.append(
                ([p.title] if p.title else [])
                + wrapped_grid_lines(p.row_labels, p.col_labels, cells, width)
            )
        if lines:
            lines.append("")
        lines += hstack(row, width)
    return lines


def tensor_lines(picture: LayoutPicture, width: int = 80) -> list[str]:
    """The tensor part alone: a heading line, the panels, and a legend when labels were cut."""
    tensor, short = _tensor_lines(picture, width)
    first = picture.panels[0]
    if first.col_dim < 0:
        where = "a 0-d tensor"
    elif first.row_dim is not None:
        where = f"rows dim {first.row_dim}, columns dim {first.col_dim}"
    else:
        where = f"columns dim {first.col_dim}"
    what = "#: shard number of each block" if short else "ranks holding each block, #: shard number"
    lines = [f"Tensor: {what} ({where})"] + tensor
    if short:
        lines.append("")
        for b in picture.blocks:
            lines += textwrap.wrap(
                f"#{b.shard_number}: {b.label}".replace(",", ", "), width=width - 2,
                initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False,
            )
    return lines


def _wrapped(line: str, width: int) -> list[str]:
    """A heading kept within `width` (a 5-axis device matrix names every axis)."""
    return textwrap.wrap(line, width=width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def render_layout_ascii(
    picture: Union[LayoutPicture, TensorLayout],
    shape: Optional[Sequence[int]] = None,
    *,
    name: str = "x",
    width: int = 80,
) -> str:
    """Text picture of a layout: tensor blocks with their ranks, then the device matrix.

    Pass a LayoutPicture, or a TensorLayout and a shape.
    """
    picture = as_picture(picture, shape, name, "render_layout_ascii(tensor_layout, shape)")
    tl = picture.tensor_layout
    layout = tl.layout
    axes = ", ".join(f"{a}={n}" for a, n in zip(layout.alias_name, layout.device_matrix))
    cut = "" if layout.cut == "even" else f", cut={layout.cut}"
    lines = _wrapped(picture.title, width) + _wrapped(f"on Layout({axes}{cut}), "
                                                      f"{counted(layout.num_devices, 'rank')}", width)
    for note in picture.notes:
        lines += textwrap.wrap(note, width=width, initial_indent="  ", subsequent_indent="    ",
                               break_on_hyphens=False)
    lines.append("")
    lines += tensor_lines(picture, width)
    lines.append("")
    lines += _wrapped(f"Device matrix ({axes}): each rank and the shard number it holds", width)
    lines += _device_lines(picture, width)
    return "\n".join(line.rstrip() for line in lines) + "\n"
