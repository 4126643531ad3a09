"""Step records of a redistribution plan: small frozen values, no communication.

Every step turns one TensorLayout (`before`) into another (`after`) on the
same global shape and states, per rank, the bytes it sends and receives.
The redistribution planner and the operators' inference (spmdsim.programs.infer) build
them, the emulator and the executor (spmdsim.runtime.executor) run them. Each
kind owns its byte formula (`moved`); the planner, the trace, `spmdsim plan`,
`--explain` and the cost model all take bytes from it. A step an operator's
inference makes is shape-free (no byte figures) until `sized` binds it to a
global shape and element size.

Which collective serves which transition (on one mesh-axis group; docs/explanation/semantics.md):

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

``n`` is the step's local input size in bytes (Allgather: the input shard), its elements counted as
they travel (`Step.itemsize`): a bfloat16 tensor's sums (Allreduce, ReduceScatter) are float32's, 4
bytes an element, since MPI has no bfloat16 sum (spmdsim.base.precision.sent_itemsize); its other steps
move 2 bytes an element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Optional

from ...layouts.dialects.sbp import sbp_of_axis
from ...layouts.layout import TensorLayout
from ...base.precision import sent_itemsize
from ..transfer import MOVED, Transfer
from .uneven import sized_uneven

__all__ = ["Step", "LocalSlice", "Allgather", "Alltoall", "Allreduce", "ReduceScatter", "LocalZero", "Exchange",
           "KINDS", "moved_bytes", "placement", "step_label"]


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
    bytes_sent: tuple[int, ...] = ()
    bytes_received: tuple[int, ...] = ()

    op = "step"
    via = "step"
    sums = False  # adds the group's addends (Allreduce, ReduceScatter): a bfloat16 tensor's travel as float32

    def itemsize(self, dtype: object) -> int:
        """Bytes one element of a `dtype` tensor takes in this step's messages (spmdsim.base.precision.sent_itemsize:
        4 for bfloat16 in a sum, else the dtype's own)."""
        return sent_itemsize(dtype, self.sums)

    @staticmethod
    def moved(group_size: int, local_nbytes: int) -> int:
        """Bytes one member sends (and receives) for an `local_nbytes`-byte input: none (local)."""
        return 0

    @staticmethod
    def buffer_bytes(group_size: int, moved: Fraction) -> Fraction:
        """The cost model's buffer ``n`` (the larger of input and output) for `moved` bytes per member.

        (g-1)/g of the buffer for every kind but Allreduce, which moves twice that.
        """
        return moved * group_size / (group_size - 1)

    def sized(self, shape: tuple[int, ...], itemsize: int) -> "Step":
        """This step with every rank's byte figures for a global `shape` of `itemsize`-byte items (as they
        travel: `itemsize(dtype)`)."""
        if self.before.layout.cut != "even" and (self.before.uneven_dims(shape) or self.after.uneven_dims(shape)):
            # shards of unequal sizes: bytes rank by rank
            return sized_uneven(self, tuple(shape), itemsize)
        n = self.moved(self.group_size, math.prod(self.before.local_shape(shape)) * itemsize)
        per_rank = (n,) * self.before.layout.num_devices
        return replace(self, bytes_sent=per_rank, bytes_received=per_rank)

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

    @staticmethod
    def moved(group_size: int, local_nbytes: int) -> int:
        """Ring: each member passes on the g - 1 shards it lacks."""
        return MOVED["allgather"](group_size, local_nbytes)


@dataclass(frozen=True)
class Alltoall(Step):
    """S(concat_dim) -> S(split_dim) on `axes`: cut along split_dim, join along concat_dim."""

    split_dim: int = 0
    concat_dim: int = 0
    op = "alltoall"
    via = "Alltoall"

    @staticmethod
    def moved(group_size: int, local_nbytes: int) -> int:
        """Every member keeps 1/g of its input and sends the rest."""
        return MOVED["alltoall"](group_size, local_nbytes)


@dataclass(frozen=True)
class Allreduce(Step):
    """P -> B on `axes`: sum the pending addends (``reduction`` "max"/"min": their maximum/minimum)."""

    reduction: str = "sum"
    op = "allreduce"
    via = "Allreduce"
    sums = True

    def __str__(self) -> str:
        text = super().__str__()
        return text if self.reduction == "sum" else text.replace("via Allreduce",
                                                                 f"via Allreduce({self.reduction.upper()})")

    @staticmethod
    def moved(group_size: int, local_nbytes: int) -> int:
        """Ring: a reduce-scatter then an allgather of the 1/g parts."""
        return MOVED["allreduce"](group_size, local_nbytes)

    @staticmethod
    def buffer_bytes(group_size: int, moved: Fraction) -> Fraction:
        return moved * group_size / (2 * (group_size - 1))


@dataclass(frozen=True)
class ReduceScatter(Step):
    """P -> S(tensor_dim) on `axes`: sum and keep this rank's part of tensor_dim."""

    tensor_dim: int = 0
    op = "reduce_scatter"
    via = "Reduce_scatter"
    sums = True

    @staticmethod
    def moved(group_size: int, local_nbytes: int) -> int:
        """Ring: g - 1 partial sums of 1/g of the input each."""
        return MOVED["reduce_scatter"](group_size, local_nbytes)


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

    `transfers` lists every box moved between two different ranks (spmdsim.programs.transfer: a Transfer's
    `piece` is a box of the global tensor, [start, stop) per dim); the part of
    a rank's new block it already holds is copied locally. A folded exchange
    (spmdsim.programs.plan.folded, past thousands of devices) holds a `FoldedTransfers`
    there instead, which works out one rank's boxes when asked, and says
    `peers` (at least the most ranks one rank talks to) and `bytes_copied` (the
    most bytes a rank packs) for the cost model, which would otherwise list
    every box to count them.
    """

    transfers: tuple[Transfer, ...] = ()
    peers: Optional[int] = None
    bytes_copied: Optional[int] = None
    op = "exchange"
    via = "Alltoallv exchange"

    def sized(self, shape: tuple[int, ...], itemsize: int) -> "Step":
        """The bytes of the boxes each rank sends and receives (`transfers` are for `shape`)."""
        sent = [0] * self.before.layout.num_devices
        received = list(sent)
        for t in self.transfers:
            n = math.prod(hi - lo for lo, hi in t.piece) * itemsize
            sent[t.src] += n
            received[t.dst] += n
        return replace(self, bytes_sent=tuple(sent), bytes_received=tuple(received))

    def __str__(self) -> str:
        # No rank lacks any of its new block: each copies it out of its old one, and no call is made.
        via = "local copy (nothing to exchange)" if self.bytes_received and not any(self.bytes_received) \
            else self.via
        return f"{self.before}->{self.after} via {via}"


#: Step kinds by their `op` name (the names the runtime's collectives trace).
KINDS: dict[str, type[Step]] = {k.op: k for k in (LocalSlice, Allgather, Alltoall, Allreduce,
                                                  ReduceScatter, LocalZero, Exchange)}


def moved_bytes(op: str, group_size: int, local_nbytes: int) -> int:
    """Bytes one member of a group sends (and receives) in collective `op`: the step kind's formula."""
    kind = KINDS.get(op)
    if kind is None or kind is Exchange:
        raise ValueError(f"no byte formula for {op!r}")
    return kind.moved(group_size, local_nbytes)


def step_label(step: Step, index: Optional[int] = None) -> str:
    """Trace label of a step: ``redistribute[1] S(0)->B via Allgather on ('mp',)``."""
    where = "" if index is None else f"[{index}]"
    return f"redistribute{where} {step}"
