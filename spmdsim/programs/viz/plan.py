"""Pictures of a redistribution plan, step by step: the layout before and after each step.

Reads the `spmdsim.programs.plan.Plan` value (source, target, shape, dtype, steps with
before/after layouts, axes and per-rank bytes); draws nothing it has to decide.
`render_plan_ascii` is pure; `render_plan_png` imports matplotlib when called.
"""
from __future__ import annotations

import os
from typing import Any, Sequence, Union

from ...base.validate import counted
from .ascii import tensor_lines
from .model import layout_picture
from .png import draw_layout, new_figure, picture_directory, require_matplotlib, save_figure

__all__ = ["render_plan_ascii", "render_plan_png", "format_bytes"]


def format_bytes(n: int) -> str:
    """458752 -> '458,752 B (448 KiB)': exact bytes as `spmdsim plan` prints them, then the binary unit."""
    exact = f"{n:,} B"
    if n < 1024:
        return exact
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    # The unit from the exact int (a float of n loses bytes past 2**53, not the 4 digits shown).
    power = min((n.bit_length() - 1) // 10, len(units))
    return f"{exact} ({n / 1024 ** power:.4g} {units[power - 1]})"


def _per_rank(values: Sequence[int]) -> str:
    low, high = min(values, default=0), max(values, default=0)
    if low == high:
        return format_bytes(high)
    return f"{format_bytes(low)} to {format_bytes(high)}"


def _step_lines(step: Any, index: int) -> list[str]:
    group = step.group_size if step.axes else step.before.layout.num_devices
    return [
        f"Step {index}. {step} (groups of {counted(group, 'rank')})",
        f"  per rank: sends {_per_rank(step.bytes_sent)}, "
        f"receives {_per_rank(step.bytes_received)}",
    ]


def render_plan_ascii(plan: Any, *, name: str = "x", width: int = 80) -> str:
    """The plan as text: the source layout's blocks, then each step and the blocks after it."""
    lines = [
        f"Plan for {name}: shape {tuple(plan.shape)!r} {plan.dtype} on {counted(plan.num_ranks, 'rank')}",
        f"{plan.source} -> {plan.target}: {counted(len(plan.steps), 'step')}",
        f"per rank received: {_per_rank(plan.bytes_received)}; "
        f"lower bound {_per_rank(plan.lower_bound)}",
        "",
        f"Before: {plan.source} on {plan.source.layout}",
    ]
    lines += tensor_lines(layout_picture(plan.source, plan.shape, name), width)
    for i, step in enumerate(plan.steps, 1):
        lines.append("")
        lines += _step_lines(step, i)
        lines.append(f"After step {i}: {step.after} on {step.after.layout}")
        lines += tensor_lines(layout_picture(step.after, plan.shape, name), width)
    if not plan.steps:
        lines += ["", "No step: the source layout already is the target."]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_plan_png(
    plan: Any, directory: Union[str, os.PathLike], *, name: str = "x", dpi: int = 100
) -> list[str]:
    """One picture per stage in `directory`: the source, then before/after of each step.

    Returns the paths written: ``step_00_source.png``, ``step_01_<op>.png``, ...
    """
    require_matplotlib()  # before the folder: a refusal leaves nothing behind
    directory = picture_directory(directory)
    paths = []
    source = layout_picture(plan.source, plan.shape, name)
    fig = new_figure(*_size(source, rows=1))
    draw_layout(fig, source)
    fig.text(0.99, 0.995, f"plan: source, {counted(plan.num_ranks, 'rank')}", ha="right", va="top", fontsize=9)
    paths.append(save_figure(fig, os.path.join(directory, "step_00_source.png"), dpi))
    for i, step in enumerate(plan.steps, 1):
        before = layout_picture(step.before, plan.shape, name)
        after = layout_picture(step.after, plan.shape, name)
        fig = new_figure(*_size(before, after, rows=2))
        head, top, bottom = fig.subfigures(3, 1, height_ratios=[0.1, 1, 1])
        head.text(0.5, 0.5, "\n".join(x.strip() for x in _step_lines(step, i)),
                  ha="center", va="center", fontsize=12, weight="bold")
        draw_layout(top, before, label="before")
        draw_layout(bottom, after, label="after")
        paths.append(save_figure(fig, os.path.join(directory, f"step_{i:02d}_{step.op}.png"), dpi))
    return paths


def _size(*pictures: Any, rows: int) -> tuple[float, float]:
    cols = max(p.panel_grid[1] + p.device_grid[1] for p in pictures)
    grid_rows = max(max(p.panel_grid[0], p.device_grid[0]) for p in pictures)
    return min(24.0, 1.0 + 3.4 * cols), min(22.0, rows * (2.2 + 3.0 * grid_rows) + 0.6 * (rows - 1))
