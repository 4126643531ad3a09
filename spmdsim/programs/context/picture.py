"""Pictures of context parallelism as text: which chunks of a sequence each rank holds, and the ring's
steps (who attends with which rank's keys and values while the next block travels), within 100 columns.

Pure. A cell of the step grid names the rank whose keys and values are used and how much of the block
is work under a causal mask: ``diag`` (its own, masked inside), ``keys/2`` (both query chunks against
the first key chunk), ``rows/2`` (the second query chunk against both key chunks), ``all`` (a naive
split's earlier rank), ``-`` (a naive split's later rank: masked whole, skipped).
"""
from __future__ import annotations

from ...base.validate import counted
from ..viz.table import WIDTH, nbytes
from .methods import METHODS, traffic, undivided_heads
from .ring import Attend, ring_program
from .split import causal_pairs, check_split, chunks

__all__ = ["render"]

_CELL = 11  # "r12 keys/2" and a space


def _kind(a: Attend, rank: int, cp: int, balanced: bool) -> str:
    if not a.queries:
        return "-"
    if a.source == rank:
        return "diag"
    if not balanced:
        return "all"
    return "keys/2" if len(a.keys) < len(chunks(a.source, cp, balanced)) else "rows/2"


def _grid(cp: int, balanced: bool, width: int) -> list[str]:
    """The ranks x steps grid, in bands of the steps that fit `width`."""
    programs = [ring_program(r, cp, 1, ("context",), balanced) for r in range(cp)]
    holds = [" ".join(f"c{c}" for c in chunks(r, cp, balanced)) for r in range(cp)]
    head = max(len("holds"), *map(len, holds))
    per_band = max(1, (width - 6 - head - 2) // _CELL)
    lines: list[str] = []
    for first in range(0, cp, per_band):
        steps = range(first, min(cp, first + per_band))
        lines.append((f"{'rank':>4}  {'holds':<{head}}  " + "".join(f"{'step ' + str(s):<{_CELL}}"
                                                                   for s in steps)).rstrip())
        for r, program in enumerate(programs):
            attends = [a for a in program.forward if isinstance(a, Attend)]
            cells = "".join(f"{f'r{attends[s].source} ' + _kind(attends[s], r, cp, balanced):<{_CELL}}"
                            for s in steps)
            lines.append(f"{r:>4}  {holds[r]:<{head}}  {cells}".rstrip())
        if first + per_band < cp:
            lines.append("")
    return lines


def render(cp: int, seq: int, balanced: bool = True, kv_bytes: int = 0, q_bytes: int = 0,
           width: int = WIDTH, grad_bytes: int = 0, heads: tuple = ()) -> list[str]:
    """The split, the ring's steps and each method's bytes for a context group of `cp` ranks over sequences
    of `seq` tokens (`kv_bytes`, `q_bytes`: one rank's K or V block and its Q block, for the byte lines;
    `grad_bytes`: a K or V block's gradients as summed, default `kv_bytes`; `heads`: (heads, K/V heads) of
    one rank, whose all-to-all line says why it cannot run where cp does not divide them)."""
    check_split(cp, seq, balanced)
    parts = 2 * cp if balanced and cp > 1 else cp
    how = "balanced causal split" if balanced else "naive split"
    size = seq // parts
    lines = [f"context parallel {cp}, {seq:,} tokens, {how}: {counted(parts, 'chunk')} of {size:,} "
             f"token{'' if size == 1 else 's'}",
             "ring: at each step a rank attends with the K/V of rank rN while passing them to the next rank", ""]
    lines += _grid(cp, balanced, width)
    work = [causal_pairs(r, cp, seq, balanced) for r in range(cp)]
    naive = [causal_pairs(r, cp, seq, False) for r in range(cp)]
    lines += ["", f"causal work per rank (query-key pairs): {min(work):,} to {max(work):,} "
                  f"({max(work) / min(work):.2f}x)"]
    if balanced and cp > 1:
        lines.append(f"  the naive split's: {min(naive):,} to {max(naive):,} ({max(naive) / min(naive):.2f}x)")
    if kv_bytes:
        lines.append("bytes one rank sends per attention (forward, backward):")
        for method in METHODS:
            split = _unsplit(method, cp, heads)
            if split:
                lines.append(f"  {method:<10} cannot run: {split}")
                continue
            forward, backward = traffic(method, cp, q_bytes or kv_bytes, kv_bytes, grad_bytes or None)
            lines.append(f"  {method:<10} {nbytes(forward):>16}  {nbytes(backward):>16}")
    return lines


def _unsplit(method: str, cp: int, heads: tuple) -> str:
    """Why `method` cannot split `heads` ((heads, K/V heads) of one rank) over `cp` ranks
    (methods.undivided_heads; "" when it can, or when no heads are given)."""
    undivided = undivided_heads(method, cp, *heads) if heads else None
    if undivided is None:
        return ""
    what, n = undivided
    return f"{n} {what} do not divide over cp {cp} (it splits the heads)"
