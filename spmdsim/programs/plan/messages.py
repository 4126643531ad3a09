"""Step records of traffic that is not a layout's move: messages between ranks, collectives on plain blocks.

A pipeline's activations and gradients between stages and the tied table's exchange are `Messages`; an
expert layer's exchanges are `BlockAlltoall` (the capacity's slots, the dropless counts), `BlockAlltoallv`
(the dropless tokens) and `BlockAllreduce` (the experts' sum over the tensor axis); a fully sharded unit's
parameters are gathered by one `BlockAllgather` and its gradients summed onto the shards by one
`BlockReduceScatter` (spmdsim.nn.fsdp_flat). Like the layout steps
(spmdsim.programs.plan.steps) they are small frozen values made without communication, each knowing its
bytes per rank from the same formulas (`KINDS`) and its conjugate, the step the backward runs; the
executor (spmdsim.runtime.executor) runs them on an engine, traced, checked and replayed there.

==================  ======================================  ==========================
record              what moves                              conjugate
==================  ======================================  ==========================
Messages            each send to its peer, each receive      sends and receives swapped
BlockAlltoall       block j of dim 0 to member j            itself
BlockAlltoallv      send_rows[j] rows to member j           the counts swapped
BlockAllreduce      the sum of every member's block         none (identity)
BlockAllgather      every member's 1-d block, joined        BlockReduceScatter
BlockReduceScatter  part j of the members' summed block     BlockAllgather
                    to member j
==================  ======================================  ==========================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .steps import KINDS

__all__ = ["Message", "Messages", "BlockAlltoall", "BlockAlltoallv", "BlockAllreduce", "BlockAllgather",
           "BlockReduceScatter"]

#: One message as a rank posts it: (the peer's rank in the group, the tag, its bytes).
Message = tuple[int, int, int]


@dataclass(frozen=True)
class Messages:
    """Point-to-point messages between members of one group over `axes` (of `group_size` ranks), posted
    together and all waited for: MPI's Isend and Irecv then one Waitall (a Send, a Recv and a Sendrecv
    are the groups of one and two). `sends` and `receives` as (peer, tag, bytes), receives posted first."""

    axes: tuple[str, ...]
    group_size: int
    sends: tuple[Message, ...] = ()
    receives: tuple[Message, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_described", (self.op, self.axes, self.group_size, self.bytes_sent,
                                                 self.bytes_received, self.peers, self.partners))

    @classmethod
    def of(cls, axes: tuple[str, ...], group_size: int, receives: Sequence, sends: Sequence) -> "Messages":
        """The record of the messages posted as `receives` and `sends` (buffer, peer, tag): what a caller
        that posts groups of the same sizes again (a pipeline's schedule, step after step) makes once."""
        return cls(tuple(axes), group_size, tuple((peer, tag, buf.nbytes) for buf, peer, tag in sends),
                   tuple((peer, tag, buf.nbytes) for buf, peer, tag in receives))

    @property
    def op(self) -> str:
        """The trace's name: "sendrecv", "recv" or "send"."""
        return "sendrecv" if self.receives and self.sends else ("recv" if self.receives else "send")

    @property
    def bytes_sent(self) -> int:
        return sum(n for _, _, n in self.sends)

    @property
    def bytes_received(self) -> int:
        return sum(n for _, _, n in self.receives)

    @property
    def peers(self) -> int:
        """How many ranks the group talks to."""
        return len({peer for peer, _, _ in self.sends + self.receives})

    @property
    def partners(self) -> tuple:
        """(peer, bytes sent to it, bytes received from it) of each peer, by peer: where each message goes, which
        an estimate prices within a node or across nodes (spmdsim.tools.estimate.transfers.placed)."""
        out: dict = {}
        for way, messages in enumerate((self.sends, self.receives)):
            for peer, _, n in messages:
                out.setdefault(peer, [0, 0])[way] += n
        return tuple((peer, sent, got) for peer, (sent, got) in sorted(out.items()))

    def described(self) -> tuple:
        """What the trace row says of the group besides its times and label (spmdsim.runtime.door.messages):
        (op, axes, group size, bytes sent, bytes received, peers, partners)."""
        return self._described  # type: ignore[attr-defined]

    def conjugate(self) -> "Messages":
        """The backward's messages: what was sent comes back from the same peer, and what came is returned."""
        return Messages(self.axes, self.group_size, self.receives, self.sends)

    def __str__(self) -> str:
        return f"{self.op} of {self.bytes_sent:,} B out, {self.bytes_received:,} B in on {self.axes!r}"


@dataclass(frozen=True)
class _Block:
    """A collective on every member's plain block of one group over `axes` (not a layout's move)."""

    axes: tuple[str, ...]
    op = "block"

    def moved(self, group_size: int, local_nbytes: int, member: int = 0) -> int:
        """Bytes a member sends for a `local_nbytes`-byte block: the layout step's formula of its kind."""
        return KINDS[self.op].moved(group_size, local_nbytes)

    def conjugate(self) -> Optional["_Block"]:
        return self

    def __str__(self) -> str:
        return f"{self.op} of blocks on {self.axes!r}"


@dataclass(frozen=True)
class BlockAlltoall(_Block):
    """Each member's block cut into g equal parts along dim 0, part j to member j, joined along dim 0."""

    op = "alltoall"


@dataclass(frozen=True)
class BlockAllreduce(_Block):
    """The sum of every member's block, on every member (in place where the executor is given `out`)."""

    op = "allreduce"

    def conjugate(self) -> None:
        """A sum's backward moves nothing: every member already holds the sum's gradient."""
        return None


@dataclass(frozen=True)
class BlockAlltoallv(_Block):
    """`send_rows[j]` consecutive rows of the block to member j, `recv_rows[j]` rows from member j (the
    counts agree across the group: member i's send_rows[j] is member j's recv_rows[i])."""

    send_rows: tuple[int, ...] = ()
    recv_rows: tuple[int, ...] = ()
    op = "alltoallv"

    def moved(self, group_size: int, local_nbytes: int, member: int = 0) -> int:
        """Bytes `member` sends from its `local_nbytes`-byte block: its rows to the other members (its
        rows to itself are copied)."""
        rows = sum(self.send_rows)
        return 0 if not rows else local_nbytes // rows * (rows - self.send_rows[member])

    def conjugate(self) -> "BlockAlltoallv":
        """The rows go back where they came from."""
        return BlockAlltoallv(self.axes, self.recv_rows, self.send_rows)


@dataclass(frozen=True)
class BlockAllgather(_Block):
    """Every member's 1-d block joined in group order, on every member (a fully sharded unit's packed shards:
    spmdsim.nn.fsdp_flat). `local_nbytes`: the block a member contributes."""

    op = "allgather"

    def conjugate(self) -> "BlockReduceScatter":
        """A gather's backward sums the gradients of the joined block and hands each member its part."""
        return BlockReduceScatter(self.axes)


@dataclass(frozen=True)
class BlockReduceScatter(_Block):
    """The sum of every member's 1-d block, cut into g equal parts, part j on member j (a fully sharded unit's
    packed gradients, laid out member-major: spmdsim.nn.fsdp_flat). `local_nbytes`: the whole block."""

    op = "reduce_scatter"

    def conjugate(self) -> BlockAllgather:
        """The backward of a sum cut into parts joins the parts' gradients again."""
        return BlockAllgather(self.axes)
