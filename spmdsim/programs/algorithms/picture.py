"""Matplotlib pictures of a schedule: each rank's slots after every round, with the round's messages.

Pure until called (matplotlib is imported by spmdsim.programs.viz.png when drawing).
A panel shows one column per rank and one box per work slot. A box's text
says what it holds (as `format_states`: the ranks summed in, the owner of a
block, ``j>k`` or ``bK``); its colour is the piece it holds, paler while a sum
still lacks terms; arrows are the round's messages (red: added on arrival,
blue: copied).
"""
from __future__ import annotations

import os
from typing import Any, Union

from ...errors import SpmdsimError
from ...base.validate import counted
from .schedule import Schedule
from .symbolic import leaves, states
from .table import cell_text, describe_round
from ..viz.png import new_figure, picture_directory, require_matplotlib, save_figure, shard_colour

__all__ = ["render_rounds_png", "draw_round", "MAX_PICTURE_RANKS", "check_picture_ranks"]

_PER_ROW = 4  # panels per row of the overview picture
#: Most ranks drawn: a panel holds a box per slot per rank, a picture per round, and the overview all of
#: them: 8 ranks took 14 s, 16 ranks 126 s (a 36-megapixel overview) on a loaded 2-core machine; 64 ranks,
#: 4,096 boxes a panel in 70 panels, would draw for hours into a picture of a billion pixels.
MAX_PICTURE_RANKS = 16


def check_picture_ranks(p: int, what: str = "pictures") -> None:
    """SpmdsimError naming `p` when a schedule on p ranks is too large to draw (MAX_PICTURE_RANKS)."""
    if p > MAX_PICTURE_RANKS:
        raise SpmdsimError(f"{what} draw the rounds of up to {MAX_PICTURE_RANKS} ranks, not {p}: leave it out "
                           "(--show prints the rounds as a table, --json lists every transfer)")


def _title(schedule: Schedule, index: int) -> str:
    if index == 0:
        return "before round 1"
    rnd = schedule.rounds[index - 1]
    rule = describe_round(schedule, index - 1)
    text = rule[0][0] if len(rule) == 1 else f"{len(rnd.transfers)} messages"
    return f"round {index} ({rnd.phase})\n{text}"


def draw_round(ax: Any, schedule: Schedule, snapshot: list, index: int) -> None:
    """Draw the state after round `index` (0: the start) and that round's messages on `ax`."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    p, slots = schedule.group_size, len(schedule.slot_counts)
    size = max(5.0, min(9.0, 40.0 / max(p, slots)))
    for rank in range(p):
        for s in range(slots):
            term = snapshot[rank][s]
            face = _fill(schedule, term, s)
            ax.add_patch(Rectangle((rank + 0.08, slots - s - 0.92), 0.84, 0.84, facecolor=face,
                                   edgecolor="0.3", linewidth=0.6))
            ax.text(rank + 0.5, slots - s - 0.5, cell_text(schedule, term), ha="center", va="center",
                    fontsize=size)
    if index:
        for t in schedule.rounds[index - 1].transfers:
            for a, b in zip(t.piece, t.landing):  # one arrow per slot moved
                ax.add_patch(FancyArrowPatch((t.src + 0.5, slots - a - 0.5), (t.dst + 0.5, slots - b - 0.5),
                                             connectionstyle="arc3,rad=0.25", arrowstyle="-|>",
                                             mutation_scale=9, linewidth=1.1, alpha=0.75,
                                             color="tab:red" if t.reduce else "tab:blue"))
    ax.set_xlim(0, p)
    ax.set_ylim(0, slots)
    ax.set_xticks([r + 0.5 for r in range(p)], [f"r{r}" for r in range(p)], fontsize=size)
    ax.set_yticks([slots - s - 0.5 for s in range(slots)], [f"s{s}" for s in range(slots)], fontsize=size)
    ax.tick_params(length=0)
    ax.set_title(_title(schedule, index), fontsize=8)
    for side in ax.spines.values():
        side.set_visible(False)


def _colour(index: int, count: int) -> tuple:
    """Ten well-separated colours while they last (tab10), then the layout pictures' palette."""
    import matplotlib

    if count <= 10:
        return tuple(matplotlib.colormaps["tab10"](index))
    return tuple(shard_colour(index, count))


def _fill(schedule: Schedule, term: Any, slot: int) -> Any:
    if term is None:
        return "white"
    got = leaves(term)
    p = schedule.group_size
    if schedule.collective in ("allreduce", "reduce_scatter"):
        r, g, b, _ = _colour(slot % p, p)
        share = len(got) / p  # how much of the sum is in
        return (r, g, b, 0.2 + 0.8 * share)
    origin = got[0][0] if schedule.collective != "bcast" else got[0][1]
    return _colour(origin % p, p)


def render_rounds_png(schedule: Schedule, directory: Union[str, os.PathLike], dpi: int = 100) -> list[str]:
    """Write ``round_00.png`` (the start), ``round_NN.png`` per round and ``rounds.png`` (all of them).

    Returns the paths written, the overview last.
    """
    check_picture_ranks(schedule.group_size)
    require_matplotlib()  # before the folder: a refusal leaves nothing behind
    directory = picture_directory(directory)
    snaps = states(schedule)
    p, slots = schedule.group_size, len(schedule.slot_counts)
    width, height = 1.2 + 0.75 * p, 1.4 + 0.45 * slots
    head = f"{schedule.name} on {counted(p, 'rank')}"
    paths = []
    for i, snap in enumerate(snaps):
        fig = new_figure(width, height)
        draw_round(fig.add_subplot(1, 1, 1), schedule, snap, i)
        fig.suptitle(head, fontsize=9)
        fig.subplots_adjust(top=0.78, bottom=0.1)
        paths.append(save_figure(fig, os.path.join(directory, f"round_{i:02d}.png"), dpi))
    cols = min(_PER_ROW, len(snaps))
    rows = -(-len(snaps) // cols)
    fig = new_figure(width * cols, height * rows + 0.4)
    for i, snap in enumerate(snaps):
        draw_round(fig.add_subplot(rows, cols, i + 1), schedule, snap, i)
    fig.suptitle(f"{head}: red arrows add into the receiver's slot, blue ones copy", fontsize=10)
    fig.subplots_adjust(top=1 - 0.9 / (height * rows + 0.4), bottom=0.05, hspace=0.6, wspace=0.25)
    paths.append(save_figure(fig, os.path.join(directory, "rounds.png"), dpi))
    return paths
