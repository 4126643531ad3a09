"""A MatMul strategy in one picture: x, w and out side by side, and the partial sums with numbers.

    spmdsim show --strategy "((1,2),(2,1))" --operand all --shape 2,4,2
    spmdsim show --strategy "((1,2),(2,1))" --operand all --shape 2,4,2 --png matmul.png

At small sizes the inputs are the integers 0, 1, 2, ... row by row, so every
number can be checked by hand: each rank's addend (its x block @ its w block)
and, for an output split over the contraction dim, their sum. Pure numpy;
`render_matmul_png` imports matplotlib when called.
"""
from __future__ import annotations

import os
from typing import Any, Sequence, Union

import numpy as np

from ...layouts.holdings import bounds_text
from .model import compact_ranks, layout_picture
from .ascii import tensor_lines
from .png import draw_tensor_panel, new_figure, save_figure

__all__ = ["matmul_sum_lines", "matmul_ascii", "render_matmul_png", "MAX_NUMBERS"]

#: The largest output block (elements) and contraction (K) whose numbers are printed.
MAX_NUMBERS = (16, 16)


def _block(bounds: Sequence[tuple[int, int]], cols: int) -> np.ndarray:
    """The block `bounds` of arange(rows * cols) as (rows, cols), built alone: the whole input is never
    built (a --shape 20000,20000,2 would allocate 3.2 GB only to print that its numbers are left out)."""
    (r0, r1), (c0, c1) = bounds
    return np.arange(r0, r1, dtype=np.int64)[:, None] * cols + np.arange(c0, c1, dtype=np.int64)


def _matrix(a: np.ndarray) -> str:
    return "[" + ", ".join("[" + ", ".join(f"{int(v)}" for v in row) + "]" for row in a) + "]"


def matmul_sum_lines(layouts: Any, mkn: Sequence[int]) -> list[str]:
    """Each output block: every rank's addend x_blk @ w_blk with numbers, and their sum.

    Args:
        layouts: a `MatMulLayouts` (x, w, out over one device matrix, no transposes).
        mkn: (M, K, N).
    """
    m, k, n = (int(v) for v in mkn)
    out, world = layouts.out, layouts.layout.num_devices
    lines = [f"x = arange({m * k}) as ({m}, {k}), w = arange({k * n}) as ({k}, {n}):"]
    by_block: dict[tuple, dict[tuple, list[int]]] = {}
    for rank in range(world):
        xb, wb = layouts.x.bounds(rank, (m, k)), layouts.w.bounds(rank, (k, n))
        by_block.setdefault(out.bounds(rank, (m, n)), {}).setdefault((xb, wb), []).append(rank)
    big = []
    for block, addends in by_block.items():
        rows, cols = block[0][1] - block[0][0], block[1][1] - block[1][0]
        if rows * cols > MAX_NUMBERS[0] or k > MAX_NUMBERS[1]:
            big.append(block)
            continue
        lines.append(f"out{bounds_text(block)}" + (" is a pending sum over k:" if len(addends) > 1 else ":"))
        total = np.zeros((rows, cols), dtype=np.int64)
        for (xb, wb), ranks in addends.items():
            part = _block(xb, k) @ _block(wb, n)
            total += part
            lines.append(f"  r{compact_ranks(ranks):<6} x{bounds_text(xb)} @ w{bounds_text(wb)} "
                         f"= {_matrix(part)}")
        if len(addends) > 1:
            check = _block((block[0], (0, k)), k) @ _block(((0, k), block[1]), n)
            assert (check == total).all()  # the sum of the addends is the block: spmdsim's rule
            lines.append(f"  {'sum':<7} = {_matrix(total)}  (= x[{block[0][0]}:{block[0][1]}, :] @ "
                         f"w[:, {block[1][0]}:{block[1][1]}])")
    if big:
        lines.append(f"({len(big)} output block(s) larger than {MAX_NUMBERS[0]} elements or K over "
                     f"{MAX_NUMBERS[1]}: numbers left out; try --shape 2,4,2)")
    return lines


def matmul_ascii(layouts: Any, mkn: Sequence[int], width: int = 80) -> str:
    """x, w and out drawn one after another (ASCII), then the partial sums with numbers."""
    m, k, n = mkn
    lines = [f"MatMul {layouts.strategy!r} on {layouts.layout}: x ({m}, {k}) @ w ({k}, {n})", ""]
    for name, tl, shape in (("x", layouts.x, (m, k)), ("w", layouts.w, (k, n)), ("out", layouts.out, (m, n))):
        lines.append(f"{name}: tensor map {tl}")
        lines += tensor_lines(layout_picture(tl, shape, name), width)
        lines.append("")
    lines += matmul_sum_lines(layouts, mkn)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_matmul_png(layouts: Any, mkn: Sequence[int], path: Union[str, os.PathLike]) -> str:
    """x, w and out side by side at 1920x1080, the partial sums with numbers below them."""
    m, k, n = mkn
    fig = new_figure(19.2, 10.8)
    fig.suptitle(f"MatMul {layouts.strategy!r} on {layouts.layout}", fontsize=22, weight="bold",
                 y=0.985)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.4, 1])
    parts = (("x", layouts.x, (m, k)), ("w", layouts.w, (k, n)), ("out", layouts.out, (m, n)))
    for sub, (name, tl, shape) in zip(top.subfigures(1, 3), parts):
        picture = layout_picture(tl, shape, name)
        ax = sub.add_axes((0.12, 0.06, 0.8, 0.62))
        draw_tensor_panel(ax, picture.panels[0], picture, scale=1.6)
        sub.text(0.5, 0.86, f"{name} {tuple(shape)}: {tl}", ha="center", va="top", fontsize=15)
    text = "\n".join(matmul_sum_lines(layouts, mkn))
    bottom.text(0.03, 0.95, text, ha="left", va="top", fontsize=_text_size(text), family="monospace")
    return save_figure(fig, path, 100)


def _text_size(text: str) -> float:
    lines = text.split("\n")
    widest = max(len(line) for line in lines)
    # 1900 px wide, 450 px high: a monospace character is 0.6 em, a line 1.25 em (1 pt = 100/72 px).
    return max(6.0, min(20.0, 1850 / (0.6 * widest * 100 / 72), 440 / (1.25 * len(lines) * 100 / 72)))
