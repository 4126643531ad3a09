"""Text that fits a projector: tables whose long cells fold, lines that wrap, one byte format.

Pure (no numpy, no mpi4py). Every default output of the CLI stays within
`WIDTH` columns; a cell too long for its column folds onto the next lines at a
separator (", ", ">", " "), so nothing is cut off.

    >>> print("\\n".join(fold_table(("a", "b"), [("x", "one, two, three")], width=14)))
    a  b
    x  one, two,
       three
"""
from __future__ import annotations

import re
import textwrap
from typing import Iterable, Optional, Sequence

__all__ = ["WIDTH", "MAX_WIDTH", "width_problem", "fold_table", "fold_cell", "wrap_lines", "nbytes"]

#: Columns of the default output: a 1920-pixel projector at a readable font size.
WIDTH = 100
#: Widest --width a command takes: ten times any terminal's columns, past which a width bounds nothing the
#: command prints (``spmdsim show`` cuts a --name at half the width).
MAX_WIDTH = 10_000

# Break after a comma or a space, or before ">" / "->": the pieces keep their separators.
_BREAK = re.compile(r"(?<=, )|(?<= )(?=\S)|(?=>)")
_ITEMS = re.compile(r"(?<=, )")


def width_problem(width: int, least: int) -> Optional[str]:
    """Why a command's --width `width` cannot be (one line naming the flag: under `least` columns, its drawing's
    narrowest, or over `MAX_WIDTH`), or None."""
    if width < least:
        return f"--width {width!r} is too narrow; expected at least {least} columns"
    if width > MAX_WIDTH:
        return f"--width {width:,} is too wide; expected at most {MAX_WIDTH:,} columns"
    return None


def nbytes(n: int) -> str:
    """The one byte format of every command: ``1,234 B``."""
    return f"{int(n):,} B"


def fold_cell(text: str, width: int) -> list[str]:
    """`text` cut into lines of at most `width` columns at separators (hard cut if none)."""
    if len(text) <= width or width < 1:
        return [text]
    # Items of a list ("allreduce x3, reduce_scatter x5") stay whole when each fits a line
    # (not inside brackets: "((2, 4), (4, 1))" is one value).
    pieces = [p for p in _ITEMS.split(text) if p] if "(" not in text else [text]
    if any(len(p.rstrip()) > width for p in pieces):
        pieces = [p for p in _BREAK.split(text) if p]
    lines: list[str] = []
    line = ""
    for piece in pieces:
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = piece.lstrip()
        else:
            line += piece
        while len(line.rstrip()) > width:  # one piece longer than the column
            lines.append(line[:width])
            line = line[width:]
    if line.strip():
        lines.append(line.rstrip())
    return lines or [""]


def _longest_word(cells: list[str], cap: int) -> int:
    """The longest piece between separators in `cells` that is at most `cap` long (0 if none)."""
    lengths = [len(p.strip()) for c in cells for p in _BREAK.split(c)]
    return max([n for n in lengths if n <= cap], default=0)


def _fit(columns: list[list[str]], natural: list[int], minimum: list[int], width: int,
         gap: int) -> list[int]:
    """Column widths within `width`: narrow, one column at a time, where that adds the fewest lines."""
    widths = list(natural)
    room = width - gap * (len(widths) - 1)

    def lines(i: int, w: int) -> list[int]:
        return [len(fold_cell(c, w)) for c in columns[i]]

    per_col = [lines(i, w) for i, w in enumerate(widths)]
    while sum(widths) > room:
        best = None
        for i in range(len(widths)):
            if widths[i] <= minimum[i]:
                continue
            trial = lines(i, widths[i] - 1)
            cost = sum(max([t] + [per_col[j][r] for j in range(len(widths)) if j != i])
                       for r, t in enumerate(trial))
            key = (cost, -widths[i])
            if best is None or key < best[0]:
                best = (key, i, trial)
        if best is None:
            break  # nothing left to fold: the caller asked for too many columns
        _, i, trial = best
        widths[i] -= 1
        per_col[i] = trial
    return widths


def fold_table(head: Sequence[str], rows: Iterable[Sequence[str]], *, width: int | None = WIDTH,
               right: Sequence[int] = (), keep: Sequence[int] = (), gap: int = 2) -> list[str]:
    """A left-aligned text table whose long cells fold to keep each line within `width`.

    Args:
        head: the column titles (never folded).
        rows: the cells, one sequence per row.
        width: the most columns a line may take; None: no limit (every cell on one line).
        right: indices of right-aligned columns (numbers).
        keep: indices of columns that never fold (names a reader searches for).
        gap: spaces between columns.
    Returns:
        The lines, the header first.
    """
    rows = [tuple(str(c) for c in r) for r in rows]
    natural = [max([len(head[i])] + [len(r[i]) for r in rows]) for i in range(len(head))]
    columns = [[r[i] for r in rows] for i in range(len(head))]
    # A column narrows to its title, at least 8, and keeps its longest word (up to 16) whole:
    # "reduce_scatter" is not cut to "reduce_scatt" / "er" while another column can give.
    minimum = [natural[i] if i in keep else max(len(head[i]), 8, _longest_word(columns[i], 16))
               for i in range(len(head))]
    widths = natural if width is None else _fit(columns, natural, minimum, width, gap)
    lines = []
    for r in [tuple(head)] + rows:
        cells = [fold_cell(c, w) for c, w in zip(r, widths)]
        for k in range(max(len(c) for c in cells)):
            parts = []
            for i, (c, w) in enumerate(zip(cells, widths)):
                text = c[k] if k < len(c) else ""
                parts.append(text.rjust(w) if i in right else text.ljust(w))
            lines.append((" " * gap).join(parts).rstrip())
    return lines


def wrap_lines(lines: Iterable[str], width: int = WIDTH) -> list[str]:
    """Wrap each line longer than `width`; continuation lines keep its indent plus two spaces."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent,
                                 subsequent_indent=indent + "  ", break_on_hyphens=False,
                                 break_long_words=True))
    return out
