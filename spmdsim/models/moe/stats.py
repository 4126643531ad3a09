"""The MoE layer's dispatch figures: what each rank routed, sent and dropped (spmdsim.models.moe.layer)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional
import numpy as np
from ...runtime.sim.dry import dry_run_active
from .exchange import _Exchange


@dataclass(frozen=True)
class MoEStats:
    """What one rank's dispatch did in one forward: the picture's numbers (spmdsim.models.moe.report).

    Attributes:
        layer: the layer's name ("h1").
        rank: this mesh rank; group: the mesh ranks of its ep group, in group order.
        tokens_to: real token rows sent to each group member (kept assignments).
        bytes_to: bytes sent to each group member by the dispatch (a capacity's empty slots included).
        per_expert: kept assignments routed to each expert (global index), from this rank's tokens.
        dropped: assignments dropped (past capacity); assignments: all of them (k per token).
        send_bytes, received_bytes: the dispatch's send and receive buffers (the combine's are the same
            two, the other way).
        chosen: (bl, T, k) each of this rank's tokens' experts, its batch rows as it holds them (None in a
            dry run): the check's reference follows them at near-ties (spmdsim.models.moe.routing.followed).
    """

    layer: str
    rank: int
    group: tuple[int, ...]
    tokens_to: tuple[int, ...]
    bytes_to: tuple[int, ...]
    per_expert: tuple[int, ...]
    dropped: int
    assignments: int
    send_bytes: int = 0
    received_bytes: int = 0
    chosen: Optional[np.ndarray] = field(default=None, compare=False, repr=False)


_new = object.__new__


_STATS_FIELDS = tuple(f.name for f in fields(MoEStats))  # (in MoEStats' order: its __init__'s)


def _stats(mesh: Any, name: str, routing: Any, move: _Exchange, at: np.ndarray, row: int) -> MoEStats:
    """`row`: the bytes of one token row (d_model values of the activations' dtype)."""
    group = mesh.group_ranks(move.fold.ep_axes)
    ep = move.ep
    # A kept assignment's row lies in its destination's share of the send buffer.
    if move.dropless:
        bounds = np.cumsum(move.send_rows)
        tokens = np.bincount(np.searchsorted(bounds, at, side="right"), minlength=ep)
        sent = [n * row for n in move.send_rows]
    else:  # the slots are destination-major: (ep, bl, El, C)
        tokens = np.bincount(at // (move.bl * move.El * move.C), minlength=ep)
        sent = [n * row for n in move.send_rows]
    return MoEStats(name, mesh.rank, tuple(int(r) for r in group), tuple(int(n) for n in tokens[:ep]),
                    tuple(int(n) for n in sent), tuple(int(n) for n in routing.per_expert()), routing.dropped,
                    int(routing.slots.size), sum(move.send_rows) * row, sum(move.recv_rows) * row,
                    None if dry_run_active() else routing.experts.copy())
