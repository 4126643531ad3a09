"""Schedules of the collectives that only move data: Allgather, Alltoall and Bcast.

Thakur, Rabenseifner & Gropp (2005) sections 4.1 (Allgather: ring, recursive
doubling, Bruck), 4.5 (Alltoall: Bruck, pairwise exchange) and 4.6 (Bcast:
binomial tree; scatter + allgather after van de Geijn); Bruck, Ho, Kipnis,
Upfal & Weathersby, "Efficient algorithms for all-to-all communications in
multiport message-passing systems" (IEEE TPDS 8(11), 1997). Recursive
doubling on a non-power-of-two group folds first, as the reducing
collectives do (spmdsim.programs.algorithms.reducing).
"""
from __future__ import annotations

from .reducing import survivors
from .schedule import Round, Schedule, fold_sizes, split_counts
from ..transfer import Transfer

__all__ = ["ring_allgather", "recursive_doubling_allgather", "bruck_allgather", "pairwise_alltoall",
           "pairwise_peers", "bruck_alltoall", "binomial_bcast", "scatter_allgather_bcast"]


def _blocks(p: int, m: int) -> tuple[int, ...]:
    return (m,) * p


def _gather(algorithm: str, p: int, m: int, itemsize: int, rounds: list[Round],
            inputs: tuple[tuple[int, ...], ...] | None = None,
            outputs: tuple[tuple[int, ...], ...] | None = None) -> Schedule:
    return Schedule("allgather", algorithm, p, _blocks(p, m), itemsize,
                    inputs or tuple((i,) for i in range(p)),
                    outputs or (tuple(range(p)),) * p, tuple(rounds))


def ring_allgather(p: int, count: int, itemsize: int) -> Schedule:
    """p-1 rounds; in round s rank i forwards block (i-s) mod p to rank i+1."""
    rounds = [Round("allgather", tuple(Transfer(i, (i + 1) % p, ((i - s) % p,), ((i - s) % p,))
                                       for i in range(p))) for s in range(p - 1)]
    return _gather("ring", p, count, itemsize, rounds)


def recursive_doubling_allgather(p: int, count: int, itemsize: int) -> Schedule:
    """Fold (even rank 2i gives its block to 2i+1); doubling exchanges between survivors; unfold."""
    p2, r = fold_sizes(p)
    old = survivors(p)
    bounds = tuple(2 * s if s < r else s + r for s in range(p2 + 1))  # survivor s holds these blocks
    rounds = []
    if r:
        rounds.append(Round("fold", tuple(Transfer(2 * i, 2 * i + 1, (2 * i,), (2 * i,)) for i in range(r))))
    distance = 1
    while distance < p2:
        transfers = []
        for s in range(p2):
            base = s & ~(distance - 1)
            slots = tuple(range(bounds[base], bounds[base + distance]))
            transfers.append(Transfer(old[s], old[s ^ distance], slots, slots))
        rounds.append(Round(f"doubling +-{distance}", tuple(transfers)))
        distance *= 2
    if r:
        rest = [tuple(b for b in range(p) if b != 2 * i) for i in range(r)]
        rounds.append(Round("unfold", tuple(Transfer(2 * i + 1, 2 * i, rest[i], rest[i]) for i in range(r))))
    return _gather("recursive-doubling", p, count, itemsize, rounds)


def bruck_allgather(p: int, count: int, itemsize: int) -> Schedule:
    """ceil(log2 p) rounds; rank i's slot j holds block (i+j) mod p; a last local rotation orders them.

    Round k: rank i sends its first min(2^k, p-2^k) slots to rank i-2^k,
    which appends them after the 2^k it holds.
    """
    rounds, distance = [], 1
    while distance < p:
        n = min(distance, p - distance)
        first = tuple(range(n))
        rounds.append(Round(f"bruck +{distance}", tuple(
            Transfer(i, (i - distance) % p, first, tuple(range(distance, distance + n))) for i in range(p))))
        distance *= 2
    outputs = tuple(tuple((j - i) % p for j in range(p)) for i in range(p))
    return _gather("bruck", p, count, itemsize, rounds, (((0,),) * p), outputs)


def pairwise_peers(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Per round s = 1 .. p-1 of the pairwise exchange, (the rank `rank` sends to, the rank it receives
    from): rank ^ s both ways when p is a power of two, else rank + s and rank - s (mod p). The Alltoall's
    schedule and the emulated Alltoallv (spmdsim.runtime.algorithms, whose counts only the ranks know)
    pair alike."""
    if p & (p - 1) == 0:
        return tuple((rank ^ s, rank ^ s) for s in range(1, p))
    return tuple(((rank + s) % p, (rank - s) % p) for s in range(1, p))


def pairwise_alltoall(p: int, count: int, itemsize: int) -> Schedule:
    """p-1 rounds; in round s rank i sends block i^s (p a power of two) or i+s to that rank.

    Slots 0..p-1 hold the input blocks, p..2p-1 the received ones; a rank's
    own block is read from its input slot.
    """
    m = count // p if p else 0
    power = p & (p - 1) == 0
    rounds = []
    peers = [pairwise_peers(p, i) for i in range(p)]
    for s in range(1, p):
        dest = [peers[i][s - 1][0] for i in range(p)]
        rounds.append(Round(f"exchange {'^' if power else '+'}{s}", tuple(
            Transfer(i, dest[i], (dest[i],), (p + i,)) for i in range(p))))
    outputs = tuple(tuple(i if j == i else p + j for j in range(p)) for i in range(p))
    return Schedule("alltoall", "pairwise", p, (m,) * (2 * p), itemsize,
                    tuple(tuple(range(p)) for _ in range(p)), outputs, tuple(rounds))


def bruck_alltoall(p: int, count: int, itemsize: int) -> Schedule:
    """Rotate (slot j holds the block for rank i+j); round k sends the slots with bit k set to rank i+2^k.

    After ceil(log2 p) rounds slot j holds the block from rank i-j: the output
    reads the slots in reverse rotation.
    """
    m = count // p if p else 0
    rounds, distance = [], 1
    while distance < p:
        slots = tuple(j for j in range(p) if j & distance)
        rounds.append(Round(f"bruck +{distance}", tuple(
            Transfer(i, (i + distance) % p, slots, slots) for i in range(p))))
        distance *= 2
    inputs = tuple(tuple((j - i) % p for j in range(p)) for i in range(p))
    outputs = tuple(tuple((i - j) % p for j in range(p)) for i in range(p))
    return Schedule("alltoall", "bruck", p, (m,) * p, itemsize, inputs, outputs, tuple(rounds))


def _bcast(algorithm: str, p: int, counts: tuple[int, ...], itemsize: int, root: int,
           rounds: list[Round]) -> Schedule:
    everything = tuple(range(len(counts)))
    inputs = tuple(everything if i == root else () for i in range(p))
    return Schedule("bcast", algorithm, p, counts, itemsize, inputs, (everything,) * p, tuple(rounds), root)


def binomial_bcast(p: int, count: int, itemsize: int, root: int = 0) -> Schedule:
    """ceil(log2 p) rounds; in round k every holder v < 2^k (counted from the root) sends to v + 2^k."""
    rounds, distance = [], 1
    while distance < p:
        rounds.append(Round(f"tree +{distance}", tuple(
            Transfer((root + v) % p, (root + v + distance) % p, (0,), (0,))
            for v in range(distance) if v + distance < p)))
        distance *= 2
    return _bcast("binomial", p, (count,), itemsize, root, rounds)


def scatter_allgather_bcast(p: int, count: int, itemsize: int, root: int = 0) -> Schedule:
    """Binomial scatter of p slots (rank v, counted from the root, gets slot v), then a ring allgather."""
    rounds = []
    distance = 1 << max(p - 1, 0).bit_length() >> 1  # the largest power of two below p
    while distance >= 1:
        transfers = []
        for v in range(0, p, 2 * distance):
            if v + distance < p:
                slots = tuple(range(v + distance, min(v + 2 * distance, p)))
                transfers.append(Transfer((root + v) % p, (root + v + distance) % p, slots, slots))
        rounds.append(Round(f"scatter +{distance}", tuple(transfers)))
        distance //= 2
    for s in range(p - 1 if p > 1 else 0):
        rounds.append(Round("allgather", tuple(
            Transfer((root + v) % p, (root + v + 1) % p, ((v - s) % p,), ((v - s) % p,)) for v in range(p))))
    return _bcast("scatter-allgather", p, split_counts(count, p), itemsize, root, rounds)
