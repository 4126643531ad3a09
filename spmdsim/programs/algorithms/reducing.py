"""Schedules of the reducing collectives: Allreduce and Reduce_scatter.

Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 19(1), 2005), sections 4.2-4.4. Non-power-of-two
groups fold first (their section 4.4): of the first 2r ranks (r = p - p2, p2
the largest power of two <= p) each even rank sends its whole buffer to the
next odd rank, which adds it; the p2 remaining ranks run the power-of-two
algorithm; the odd ranks then send the result back (unfold).
"""
from __future__ import annotations

from .schedule import Round, Schedule, fold_sizes, split_counts
from ..transfer import Transfer

__all__ = ["ring_allreduce", "recursive_doubling_allreduce", "rabenseifner_allreduce",
           "ring_reduce_scatter", "recursive_halving_reduce_scatter", "survivor", "survivors"]


def survivors(p: int) -> tuple[int, ...]:
    """The ranks left after the fold, in their new order: odd ranks below 2r, then the ranks from 2r."""
    p2, r = fold_sizes(p)
    return tuple(2 * s + 1 if s < r else s + r for s in range(p2))


def survivor(p: int, rank: int) -> int | None:
    """`rank`'s index among the survivors, or None for a folded (even, below 2r) rank."""
    _, r = fold_sizes(p)
    if rank < 2 * r:
        return rank // 2 if rank % 2 else None
    return rank - r


def _all(n: int) -> tuple[int, ...]:
    return tuple(range(n))


def _fold(p: int, slots: tuple[int, ...]) -> list[Round]:
    _, r = fold_sizes(p)
    if not r:
        return []
    return [Round("fold", tuple(Transfer(2 * i, 2 * i + 1, slots, slots, True) for i in range(r)))]


def _unfold(p: int, slots_of) -> list[Round]:
    """Odd rank 2i+1 sends slots_of(2i) back to the folded rank 2i."""
    _, r = fold_sizes(p)
    if not r:
        return []
    return [Round("unfold", tuple(Transfer(2 * i + 1, 2 * i, slots_of(2 * i), slots_of(2 * i))
                                  for i in range(r)))]


def _ring_reduce_scatter(p: int) -> list[Round]:
    """p-1 rounds; in round s rank i adds slot (i-s-1) mod p into rank i+1, so rank i ends with slot i."""
    return [Round("reduce-scatter", tuple(
        Transfer(i, (i + 1) % p, ((i - s - 1) % p,), ((i - s - 1) % p,), True) for i in range(p)))
        for s in range(p - 1)]


def _ring_allgather(p: int) -> list[Round]:
    """p-1 rounds; in round s rank i forwards slot (i-s) mod p to rank i+1."""
    return [Round("allgather", tuple(
        Transfer(i, (i + 1) % p, ((i - s) % p,), ((i - s) % p,)) for i in range(p)))
        for s in range(p - 1)]


def _schedule(collective: str, algorithm: str, p: int, counts: tuple[int, ...], itemsize: int,
              rounds: list[Round], outputs: tuple[tuple[int, ...], ...] | None = None) -> Schedule:
    everything = _all(len(counts))
    return Schedule(collective, algorithm, p, counts, itemsize, (everything,) * p,
                    outputs if outputs is not None else (everything,) * p, tuple(rounds))


def ring_allreduce(p: int, count: int, itemsize: int) -> Schedule:
    """Ring reduce-scatter then ring allgather over p slots: 2(p-1) rounds, 2(p-1)/p n bytes per rank."""
    rounds = _ring_reduce_scatter(p) + _ring_allgather(p) if p > 1 else []
    return _schedule("allreduce", "ring", p, split_counts(count, p), itemsize, rounds)


def recursive_doubling_allreduce(p: int, count: int, itemsize: int) -> Schedule:
    """Fold, then log2(p2) rounds exchanging the whole buffer with rank XOR 2^k, then unfold."""
    p2, _ = fold_sizes(p)
    old = survivors(p)
    rounds = _fold(p, (0,))
    distance = 1
    while distance < p2:
        rounds.append(Round(f"exchange +-{distance}", tuple(
            Transfer(old[s], old[s ^ distance], (0,), (0,), True) for s in range(p2))))
        distance *= 2
    rounds += _unfold(p, lambda rank: (0,))
    return _schedule("allreduce", "recursive-doubling", p, (count,), itemsize, rounds)


def _halving(old: tuple[int, ...], bounds: tuple[int, ...]) -> list[Round]:
    """Recursive halving over survivors: survivor s ends holding slots [bounds[s], bounds[s+1]) reduced.

    Partners are p2/2 apart first, then p2/4, ... 1; each keeps the half of its
    current range that its own half of the survivors owns and adds the other half
    into its partner.
    """
    p2 = len(old)
    rounds, distance = [], p2 // 2
    while distance >= 1:
        transfers = []
        for s in range(p2):
            base = s & ~(2 * distance - 1)
            give = base + distance if not s & distance else base  # the partner's half of survivors
            slots = tuple(range(bounds[give], bounds[give + distance]))
            if slots:
                transfers.append(Transfer(old[s], old[s ^ distance], slots, slots, True))
        rounds.append(Round(f"halving +-{distance}", tuple(transfers)))
        distance //= 2
    return rounds


def _doubling(old: tuple[int, ...], bounds: tuple[int, ...]) -> list[Round]:
    """Recursive doubling over survivors: each sends everything its aligned group owns to rank XOR d."""
    p2 = len(old)
    rounds, distance = [], 1
    while distance < p2:
        transfers = []
        for s in range(p2):
            base = s & ~(distance - 1)
            slots = tuple(range(bounds[base], bounds[base + distance]))
            if slots:
                transfers.append(Transfer(old[s], old[s ^ distance], slots, slots))
        rounds.append(Round(f"doubling +-{distance}", tuple(transfers)))
        distance *= 2
    return rounds


def rabenseifner_allreduce(p: int, count: int, itemsize: int) -> Schedule:
    """Fold; reduce-scatter by recursive halving and allgather by recursive doubling over p2 slots; unfold."""
    p2, _ = fold_sizes(p)
    old = survivors(p)
    counts = split_counts(count, p2)
    bounds = tuple(range(p2 + 1))  # survivor s owns slot s
    rounds = _fold(p, _all(p2)) + _halving(old, bounds) + _doubling(old, bounds)
    rounds += _unfold(p, lambda rank: _all(p2))
    return _schedule("allreduce", "rabenseifner", p, counts, itemsize, rounds)


def ring_reduce_scatter(p: int, count: int, itemsize: int) -> Schedule:
    """The ring Allreduce's first half on p blocks: rank i keeps block i; (p-1)/p n bytes per rank."""
    rounds = _ring_reduce_scatter(p) if p > 1 else []
    return _schedule("reduce_scatter", "ring", p, split_counts(count, p), itemsize, rounds,
                     tuple((i,) for i in range(p)))


def recursive_halving_reduce_scatter(p: int, count: int, itemsize: int) -> Schedule:
    """Fold; recursive halving over the survivors' blocks; each odd rank sends the folded rank its block.

    Survivor s below r owns blocks 2s and 2s+1 (its own and its folded
    neighbour's), the others one block each, so every survivor's blocks are
    contiguous and the halving splits ranges of blocks.
    """
    p2, r = fold_sizes(p)
    old = survivors(p)
    bounds = tuple(2 * s if s < r else s + r for s in range(p2 + 1))
    rounds = _fold(p, _all(p)) + _halving(old, bounds) + _unfold(p, lambda rank: (rank,))
    return _schedule("reduce_scatter", "recursive-halving", p, split_counts(count, p), itemsize, rounds,
                     tuple((i,) for i in range(p)))
