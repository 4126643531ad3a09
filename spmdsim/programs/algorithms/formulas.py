"""Textbook byte counts of each algorithm, written from the papers, apart from the schedules.

Pure. ``n`` is the bytes of one rank's input buffer (allgather: the block it
contributes; reduce_scatter and alltoall: all p blocks), ``p`` the group
size, ``p2`` the largest power of two <= p and ``r = p - p2`` the ranks folded
first. Each formula gives the bytes the busiest rank sends; it is exact when
the buffer divides into the algorithm's pieces (tests check it against every
schedule). The ring's and pairwise's are the layout steps' own (spmdsim.programs.transfer.MOVED).
`model_bytes` converts ``n`` into the cost model's message size.
"""
from __future__ import annotations

import math
from typing import Any

from ..transfer import MOVED
from .schedule import Schedule, fold_sizes

__all__ = ["busiest_bytes_sent", "model_bytes", "FORMULAS", "MODEL_FORMULA", "cost_terms", "predict_seconds",
           "round_count"]


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length()


def _rd_allgather(p: int, n: int) -> int:
    # Survivor 0 (rank 1) sends its growing group, 2^k blocks plus the folded
    # ones among them, then the other p-1 blocks to rank 0.
    p2, r = fold_sizes(p)
    steps = sum(2 ** k + min(r, 2 ** k) for k in range(int(math.log2(p2))))
    return n * (steps + (p - 1 if r else 0))


def _bruck_alltoall(p: int, n: int) -> int:
    # Round k sends the blocks whose index has bit k set: n/p bytes each.
    blocks = sum(sum(1 for j in range(p) if j >> k & 1) for k in range(_log2_ceil(p)))
    return blocks * n // p


#: name -> (formula text, busiest rank's bytes sent as a function of (p, n)).
FORMULAS = {
    "ring-allreduce": ("2(p-1)/p n", MOVED["allreduce"]),
    "recursive-doubling-allreduce": ("ceil(log2 p) n", lambda p, n: _log2_ceil(p) * n),
    "rabenseifner-allreduce": ("2(p2-1)/p2 n (+ n when p > p2)",
                               lambda p, n: 2 * (fold_sizes(p)[0] - 1) * n // fold_sizes(p)[0]
                               + (n if fold_sizes(p)[1] else 0)),
    "ring-allgather": ("(p-1) n", MOVED["allgather"]),
    "recursive-doubling-allgather": ("(p-1) n (folded: sum over k of (2^k+min(r,2^k)) n + (p-1) n)",
                                     _rd_allgather),
    "bruck-allgather": ("(p-1) n", MOVED["allgather"]),
    "ring-reduce-scatter": ("(p-1)/p n", MOVED["reduce_scatter"]),
    "recursive-halving-reduce-scatter": ("(p-1)/p n (n when p > p2)",
                                         lambda p, n: n if fold_sizes(p)[1] else (p - 1) * n // p),
    "pairwise-alltoall": ("(p-1)/p n", MOVED["alltoall"]),
    "bruck-alltoall": ("log2(p) n/2 (else n/p per slot index with bit k set)", _bruck_alltoall),
    "binomial-bcast": ("ceil(log2 p) n", lambda p, n: _log2_ceil(p) * n),
    "scatter-allgather-bcast": ("2(p-1)/p n", MOVED["allreduce"]),  # a scatter, then a ring allgather
}


def _doubling(p: int) -> int:
    # log2 p2 exchanges, and a round each way for the ranks folded first when p is no power of two
    p2, r = fold_sizes(p)
    return p2.bit_length() - 1 + (2 if r else 0)


#: name -> its schedule's rounds on p >= 2 ranks (tests check each against the schedule built), known before the
#: schedule is built: building a ring's on 1,000 ranks (2 million transfers) took seconds of its own.
ROUNDS = {
    "ring-allreduce": lambda p: 2 * (p - 1), "recursive-doubling-allreduce": _doubling,
    "rabenseifner-allreduce": lambda p: 2 * _doubling(p) - (2 if fold_sizes(p)[1] else 0),
    "ring-allgather": lambda p: p - 1, "recursive-doubling-allgather": _doubling, "bruck-allgather": _log2_ceil,
    "ring-reduce-scatter": lambda p: p - 1, "recursive-halving-reduce-scatter": _doubling,
    "pairwise-alltoall": lambda p: p - 1, "bruck-alltoall": _log2_ceil, "binomial-bcast": _log2_ceil,
    "scatter-allgather-bcast": lambda p: _log2_ceil(p) + p - 1,
}


def round_count(name: str, p: int) -> int:
    """The rounds of algorithm `name` on `p` ranks (each sends at most one message a round): ROUNDS."""
    return ROUNDS[name](p) if p > 1 else 0


def busiest_bytes_sent(name: str, p: int, n: int) -> int:
    """The textbook bytes the busiest rank sends in algorithm `name` (see FORMULAS) on p ranks."""
    if p <= 1:
        return 0
    return FORMULAS[name][1](p, n)


def model_bytes(collective: str, p: int, n: int) -> int:
    """The cost model's message size for an input of n bytes: the gathered output for allgather."""
    return n * p if collective == "allgather" else n


#: The cost model formula (spmdsim.programs.cost.model) each algorithm follows on a power-of-two group;
#: None: the model has no row for it (Rabenseifner: 2 log2(p) alpha + the ring's beta and gamma).
MODEL_FORMULA = {
    "ring-allreduce": "ring", "recursive-doubling-allreduce": "tree", "rabenseifner-allreduce": None,
    "ring-allgather": "ring", "recursive-doubling-allgather": "tree", "bruck-allgather": "tree",
    "ring-reduce-scatter": "ring", "recursive-halving-reduce-scatter": "tree",
    "pairwise-alltoall": "ring", "bruck-alltoall": "tree",
    "binomial-bcast": "tree", "scatter-allgather-bcast": "ring",
}


def cost_terms(schedule: Schedule) -> tuple[int, int, int]:
    """(rounds, busiest bytes sent, busiest bytes reduced): the alpha, beta, gamma coefficients."""
    if not schedule.rounds:
        return 0, 0, 0
    return len(schedule.rounds), max(schedule.bytes_sent()), max(schedule.bytes_reduced())


def predict_seconds(schedule: Schedule, model: Any) -> float:
    """The alpha-beta-gamma time of `schedule` with `model`'s parameters for its collective and group."""
    a, b, c = cost_terms(schedule)
    alpha, beta, gamma = model.params(schedule.collective, schedule.group_size)
    return a * alpha + b * beta + c * gamma
