"""The values every algorithm is written in: a Schedule of Rounds of Transfers (spmdsim.programs.transfer)
between work slots.

Pure (no numpy, no mpi4py). Each rank of a group of ``p`` keeps one work
buffer cut into slots (``slot_counts`` elements each, the same cut on every
rank). The rank's input is copied into the slots ``input_slots[rank]`` (its
pieces in order), the rounds move slots between ranks, and the output is the
slots ``output_slots[rank]`` read in order. In one round every transfer reads
the state before the round: a receiver takes the message into a temporary and
then copies it into its slots, or adds it to them (``reduce``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpmdsimError
from ..transfer import Transfer

__all__ = ["Round", "Schedule", "split_counts", "fold_sizes"]


@dataclass(frozen=True)
class Round:
    """Transfers that happen at the same time; `phase` names the part of the algorithm."""

    phase: str
    transfers: tuple[Transfer, ...]

    def __post_init__(self) -> None:
        for t in self.transfers:
            if t.src == t.dst or len(t.piece) != len(t.landing) or not t.piece:
                raise SpmdsimError(f"transfer {t!r} must join two ranks and move as many slots as it fills")


@dataclass(frozen=True)
class Schedule:
    """Every round of one collective algorithm on `group_size` ranks, in slots of `slot_counts` elements.

    Attributes:
        collective: "allreduce", "allgather", "reduce_scatter", "alltoall" or "bcast".
        algorithm: the algorithm's short name ("ring", "bruck", ...).
        group_size: ranks in the group (p).
        slot_counts: elements in each work slot.
        itemsize: bytes per element (bytes = elements * itemsize).
        input_slots: per rank, the slot of each input piece in order (empty: no input, a bcast receiver).
        output_slots: per rank, the slots whose concatenation is the output.
        rounds: the rounds in order.
        root: the root rank of a bcast (0 otherwise).
    """

    collective: str
    algorithm: str
    group_size: int
    slot_counts: tuple[int, ...]
    itemsize: int
    input_slots: tuple[tuple[int, ...], ...]
    output_slots: tuple[tuple[int, ...], ...]
    rounds: tuple[Round, ...]
    root: int = 0

    @property
    def name(self) -> str:
        """The command-line name, e.g. "ring-allreduce"."""
        return f"{self.algorithm}-{self.collective.replace('_', '-')}"

    def slot_bytes(self, slots: tuple[int, ...]) -> int:
        return sum(self.slot_counts[s] for s in slots) * self.itemsize

    def bytes_sent(self) -> tuple[int, ...]:
        """Bytes each rank sends over all rounds."""
        return self._per_rank(lambda t: t.src, False)

    def bytes_received(self) -> tuple[int, ...]:
        """Bytes each rank receives over all rounds."""
        return self._per_rank(lambda t: t.dst, False)

    def bytes_reduced(self) -> tuple[int, ...]:
        """Bytes each rank adds into its slots (the gamma term of the cost model)."""
        return self._per_rank(lambda t: t.dst, True)

    def _per_rank(self, who, reduced_only: bool) -> tuple[int, ...]:
        out = [0] * self.group_size
        for rnd in self.rounds:
            for t in rnd.transfers:
                if t.reduce or not reduced_only:
                    out[who(t)] += self.slot_bytes(t.piece)
        return tuple(out)

    def round_bytes(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(sent, received) per rank in round `index`."""
        sent, received = [0] * self.group_size, [0] * self.group_size
        for t in self.rounds[index].transfers:
            n = self.slot_bytes(t.piece)
            sent[t.src] += n
            received[t.dst] += n
        return tuple(sent), tuple(received)

    def input_count(self, rank: int) -> int:
        """Elements of `rank`'s input."""
        return sum(self.slot_counts[s] for s in self.input_slots[rank])

    def output_count(self, rank: int) -> int:
        """Elements of `rank`'s output."""
        return sum(self.slot_counts[s] for s in self.output_slots[rank])


def split_counts(count: int, parts: int) -> tuple[int, ...]:
    """`count` elements cut into `parts` nearly equal pieces, the larger first (numpy.array_split)."""
    base, extra = divmod(count, parts)
    return tuple(base + (i < extra) for i in range(parts))


def fold_sizes(p: int) -> tuple[int, int]:
    """(p2, r): the largest power of two p2 <= p and the r = p - p2 extra ranks folded in first."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2
