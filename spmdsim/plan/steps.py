"""Step records of a redistribution plan: small frozen values, no communication.

Every step turns one TensorLayout (`before`) into another (`after`) on the
same global shape and states, per rank, the bytes it sends and receives.
The planner builds them, the emulator and the MPI executor interpret them.

Which collective serves which transition (on one mesh-axis group; DESIGN.md):

==========  =================================  ===========
from -> to  step                               bytes/rank
==========  =================================  ===========
S(i) -> B   Allgather, concat on dim i         (g-1) n
S(i) -> S(j) Alltoall, split j, concat i       (g-1)/g n
B -> S(i)   LocalSlice                         0
P -> B      Allreduce (ring)                   2(g-1)/g n
P -> S(i)   ReduceScatter on dim i             (g-1)/g n
B/S -> P    LocalZero (keep one replica)       0
any -> any  Exchange (Alltoallv of box parts)  exact
==========  =================================  ===========

``n`` is the step's local input size in bytes (Allgather: the input shard).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..dialects.sbp import sbp_of_axis
from ..layout import TensorLayout

__all__ = [
    "Step",
    "LocalSlice",
    "Allgather",
    "Alltoall",
    "Allreduce",
    "ReduceScatter",
    "LocalZero",
    "Exchange",
    "Transfer",
    "placement",
    "step_label",
]

#: One box of an Exchange: (source rank, destination rank, global [start, stop) per dim).
Transfer = tuple[int, int, tuple[tuple[int, int], ...]]


def placement(tl: TensorLayout, axis: str) -> str:
    """Short SBP-style placement of one mesh axis in `tl`: S(d), P or B (the SBP dialect's text)."""
    return str(sbp_of_axis(tl, axis))


@dataclass(frozen=True)
class Step:
    """One plan step on the mesh-axis group `axes` (first listed major).

    Attributes:
        before, after: the layouts the step goes from and to (same mesh, except Exchange).
        axes: the mesh axes the step acts on (its communicator group).
        bytes_sent, bytes_received: per rank, indexed by rank.
    """

    before: TensorLayout
    after: TensorLayout
    axes: tuple[str, ...]
    bytes_sent: tuple[int, ...]
    bytes_received: tuple[int, ...]

    op = "step"
    via = "step"

    @property
    def group_size(self) -> int:
        return self.before.layout.group_size(self.axes)

    @property
    def max_bytes_sent(self) -> int:
        return max(self.bytes_sent, default=0)

    @property
    def max_bytes_received(self) -> int:
        return max(self.bytes_received, default=0)

    def _transition(self) -> str:
        if not self.axes:
            return f"{self.before}->{self.after}"
        first = self.axes[0]
        return f"{placement(self.before, first)}->{placement(self.after, first)}"

    def __str__(self) -> str:
        return f"{self._transition()} via {self.via} on {self.axes!r}"


@dataclass(frozen=True)
class LocalSlice(Step):
    """B -> S on `axes`: every rank keeps the part of its block it will own; no communication."""

    op = "local_slice"
    via = "local slice"


@dataclass(frozen=True)
class Allgather(Step):
    """S(tensor_dim) -> B on `axes` (the minor end of that dim's axes)."""

    tensor_dim: int = 0
    op = "allgather"
    via = "Allgather"


@dataclass(frozen=True)
class Alltoall(Step):
    """S(concat_dim) -> S(split_dim) on `axes`: cut along split_dim, join along concat_dim."""

    split_dim: int = 0
    concat_dim: int = 0
    op = "alltoall"
    via = "Alltoall"


@dataclass(frozen=True)
class Allreduce(Step):
    """P -> B on `axes`: sum the pending addends."""

    op = "allreduce"
    via = "Allreduce"


@dataclass(frozen=True)
class ReduceScatter(Step):
    """P -> S(tensor_dim) on `axes`: sum and keep this rank's part of tensor_dim."""

    tensor_dim: int = 0
    op = "reduce_scatter"
    via = "Reduce_scatter"


@dataclass(frozen=True)
class LocalZero(Step):
    """B -> P (or S -> P) on `axes`: one replica keeps its values, the rest hold zeros.

    Axes that were split keep each rank's own block inside a zero-padded larger
    block, so the sum over the axes is still the global value.
    """

    op = "local_zero"
    via = "local zeroing"


@dataclass(frozen=True)
class Exchange(Step):
    """Any -> any: each rank receives exactly the boxes of its new block it lacks (Alltoallv).

    `transfers` lists every box moved between two different ranks; the part of
    a rank's new block it already holds is copied locally.
    """

    transfers: tuple[Transfer, ...] = ()
    op = "exchange"
    via = "Alltoallv exchange"

    def __str__(self) -> str:
        return f"{self.before}->{self.after} via {self.via}"


def step_label(step: Step, index: Optional[int] = None) -> str:
    """Trace label of a step: ``redistribute[1] S(0)->B via Allgather on ('mp',)``."""
    where = "" if index is None else f"[{index}]"
    return f"redistribute{where} {step}"
