"""One message of a program: the Transfer every floor that moves or counts bytes speaks.

Pure (no numpy). A redistribution's Exchange lists its boxes as Transfers (spmdsim.programs.plan.steps), a
collective algorithm's rounds are Transfers between work slots (spmdsim.programs.algorithms), and the bytes of
each follow from what it carries. The bytes a whole collective step moves per rank are the step kinds'
formulas (spmdsim.programs.plan.steps.KINDS), which the cost model, the estimate's ledger and the
algorithms' textbook table take too.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Transfer", "MOVED"]

#: Bytes one member of a group of g ranks sends (and receives) in each collective for an n-byte input (an
#: Allgather's: the block it contributes; the others': the whole buffer), the bandwidth-optimal count (ring,
#: pairwise): the one formula the layout steps, the block records, the trace, the estimate and the
#: algorithms' textbook table take.
MOVED = {
    "allgather": lambda g, n: (g - 1) * n,  # the g - 1 blocks it lacks
    "alltoall": lambda g, n: (g - 1) * n // g,  # all but its own 1/g
    "reduce_scatter": lambda g, n: (g - 1) * n // g,  # g - 1 partial sums of 1/g each
    "allreduce": lambda g, n: 2 * (g - 1) * n // g,  # a reduce-scatter, then an allgather of the 1/g parts
}


class Transfer(NamedTuple):
    """Rank `src` sends `piece` to rank `dst`.

    piece: what travels: a box of the global tensor ((start, stop) per dim) in an Exchange, a collective
        algorithm's work slots (their indices) in a schedule's round;
    into: where it lands on `dst` when that is not `piece` (an algorithm's destination slots); () where it
        is (an Exchange's box lands as the same box of the global tensor);
    reduce: added to what `dst` holds there (a reduction's partial sums), else copied over it.
    """

    src: int
    dst: int
    piece: tuple
    into: tuple = ()
    reduce: bool = False

    @property
    def landing(self) -> tuple:
        """Where the piece lands on `dst`: `into`, or `piece` itself."""
        return self.into or self.piece
