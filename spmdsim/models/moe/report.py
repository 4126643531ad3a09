"""Pictures of an MoE layer's dispatch: who sent how many tokens to whom, per expert, dropped (pure).

They read the `MoEStats` every rank's layer recorded (spmdsim.models.moe.layer) and
gathered to one rank; the rank -> rank table is the byte matrix of
``spmdsim plan --explain`` (spmdsim.programs.viz.why.format_byte_matrix), its cells
token rows here (a rank's rows to itself included: they stay put).
"""
from __future__ import annotations

from typing import Any, Sequence

from ...base.validate import counted
from ..axes import TENSOR
from ...programs.viz.table import WIDTH, nbytes
from ...programs.viz.why import format_byte_matrix

__all__ = ["token_matrix", "byte_matrix", "dispatch_lines"]


def _of(stats: Sequence[Sequence[Any]], layer: str) -> list:
    return [s for per_rank in stats for s in per_rank if s.layer == layer]


def token_matrix(stats: Sequence[Sequence[Any]], layer: str, size: int) -> list[list[int]]:
    """matrix[src][dst]: token rows mesh rank src's dispatch sent rank dst in `layer` (every rank's stats)."""
    out = [[0] * size for _ in range(size)]
    for s in _of(stats, layer):
        for dst, n in zip(s.group, s.tokens_to):
            out[s.rank][dst] += n
    return out


def byte_matrix(stats: Sequence[Sequence[Any]], layer: str, size: int) -> list[list[int]]:
    """matrix[src][dst]: bytes rank src's dispatch sent rank dst (a rank's own block left out, as MPI does
    not move it; with a capacity the empty slots travel too)."""
    out = [[0] * size for _ in range(size)]
    for s in _of(stats, layer):
        for dst, n in zip(s.group, s.bytes_to):
            if dst != s.rank:
                out[s.rank][dst] += n
    return out


def dispatch_lines(stats: Sequence[Sequence[Any]], layer: str, size: int, tp: int, width: int = WIDTH,
                   tp_axis: str = TENSOR) -> list[str]:
    """The dispatch of `layer` as text within `width` columns: the token matrix, bytes sent, tokens per expert
    and dropped. `tp`: the experts' tp size, the mesh's or (folded, spmdsim.models.moe.fold) their etp (its ranks
    route the same tokens: each expert's load is counted on the tp rank 0 of each group, the last mesh axis,
    `tp_axis`)."""
    mine = _of(stats, layer)
    if not mine:
        return [f"{layer}: no dispatch recorded"]
    first = [s for s in mine if s.rank % tp == 0]
    experts = len(first[0].per_expert)
    load = [sum(s.per_expert[e] for s in first) for e in range(experts)]
    dropped, assignments = sum(s.dropped for s in first), sum(s.assignments for s in first)
    sent = sum(map(sum, byte_matrix(stats, layer, size)))
    copies = f" (each {tp_axis} rank sends its own copy)" if tp > 1 else " (each rank its own tokens)"
    lines = [f"{layer} dispatch: token rows rank -> rank{copies}"]
    lines += ["  " + line for line in format_byte_matrix(token_matrix(stats, layer, size), width - 2,
                                                          lambda n: f"{n:,}")]
    lines.append(f"  bytes sent by the dispatch, all ranks: {nbytes(sent)} (the combine sends them back)")
    text = " ".join(f"e{e}:{n}" for e, n in enumerate(load))
    head = "  tokens per expert: "
    while len(head) + len(text) > width:  # fold at a space
        cut = text.rfind(" ", 0, width - len(head))
        lines.append(head + text[:cut])
        head, text = " " * len(head), text[cut + 1:]
    lines.append(head + text)
    share = f" ({100.0 * dropped / assignments:.1f}%)" if assignments else ""
    lines.append(f"  dropped: {dropped} of {counted(assignments, 'assignment')}{share}; "
                 f"busiest expert {max(load)}, idlest {min(load)}")
    return lines
