"""Collective algorithms as pure schedules: who sends which slots to whom in each round.

    from spmdsim.programs.algorithms import schedule, check
    s = schedule("ring-allreduce", 4, count=1024, itemsize=4)
    check(s)                 # every piece ends where Allreduce puts it, summed once
    s.bytes_sent()           # per rank: 6144 each = 2(p-1)/p of 4096 bytes

Pure (no mpi4py, no numpy): spmdsim.runtime.algorithms runs a schedule over
point-to-point messages; docs/explanation/algorithms.md describes each algorithm.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ..._lazy import modules_by_name
from ...errors import ShapeError, SpmdsimError
from ...base.suggest import did_you_mean, word_list
from ...base.validate import as_int, counted
from . import moving, reducing
from .formulas import FORMULAS, busiest_bytes_sent, model_bytes
from .schedule import Round, Schedule
from ..transfer import Transfer
from .symbolic import check, sum_order

__all__ = ["COLLECTIVES", "ALGORITHMS", "NAMES", "schedule", "build", "parse_name", "check_choices",
           "Schedule", "Round", "Transfer", "check", "sum_order", "busiest_bytes_sent", "model_bytes",
           "FORMULAS", "elements_for", "VARIABLE"]

_BUILDERS = {
    "allreduce": {"ring": reducing.ring_allreduce,
                  "recursive-doubling": reducing.recursive_doubling_allreduce,
                  "rabenseifner": reducing.rabenseifner_allreduce},
    "allgather": {"ring": moving.ring_allgather,
                  "recursive-doubling": moving.recursive_doubling_allgather,
                  "bruck": moving.bruck_allgather},
    "reduce_scatter": {"ring": reducing.ring_reduce_scatter,
                       "recursive-halving": reducing.recursive_halving_reduce_scatter},
    "alltoall": {"pairwise": moving.pairwise_alltoall, "bruck": moving.bruck_alltoall},
    "bcast": {"binomial": moving.binomial_bcast, "scatter-allgather": moving.scatter_allgather_bcast},
}

COLLECTIVES = tuple(_BUILDERS)
#: Collectives whose counts differ by rank, and their algorithms: a schedule of fixed slots cannot state
#: them, so they run from the ranks' own counts (spmdsim.runtime.algorithms.emulate); `Mesh(...,
#: algorithms={"alltoallv": "pairwise"})` takes them.
VARIABLE = {"alltoallv": ("pairwise",)}
#: collective -> its algorithms' short names (the values `Mesh(..., algorithms=)` takes).
ALGORITHMS = {c: tuple(algos) for c, algos in _BUILDERS.items()}
#: Every algorithm's command-line name, "ring-allreduce", ...
NAMES = tuple(f"{a}-{c.replace('_', '-')}" for c, algos in ALGORITHMS.items() for a in algos)


def parse_name(name: Any) -> tuple[str, str]:
    """ "ring-allreduce" -> ("allreduce", "ring"), in any case ("Ring-AllReduce", as `spmdsim pipeline` takes
    "1F1B"); SpmdsimError naming the choices otherwise (a collective's own name, "bcast", its algorithms)."""
    for collective, algos in ALGORITHMS.items():
        for algo in algos:
            if isinstance(name, str) and name.lower() == f"{algo}-{collective.replace('_', '-')}":
                return collective, algo
    hint = did_you_mean(name, NAMES) if isinstance(name, str) else ""
    if isinstance(name, str) and not hint:
        ones = [n for n in NAMES if n.endswith("-" + name.lower().replace("_", "-").rsplit("-", 1)[-1])]
        hint = f"did you mean {word_list([repr(n) for n in ones])}?" if ones else ""
    raise SpmdsimError(f"unknown collective algorithm {name!r}{f' ({hint})' if hint else ''}; "
                       f"expected one of {', '.join(NAMES)}")


def build(collective: str, algorithm: str, p: int, count: int, itemsize: int = 1, root: int = 0) -> Schedule:
    """The schedule of `algorithm` for `collective` on p ranks with `count` input elements per rank.

    Args:
        count: elements of each rank's input (allgather: its block; reduce_scatter
            and alltoall: all p blocks, so a multiple of p).
        itemsize: bytes per element.
        root: the bcast root (group rank; numpy's integers too); the other collectives ignore it.
    """
    if collective not in _BUILDERS or algorithm not in _BUILDERS[collective]:
        raise SpmdsimError(f"unknown algorithm {algorithm!r} for {collective!r}; expected one of "
                           f"{ALGORITHMS.get(collective, NAMES)!r}")
    for what, value, low in (("group size", p, 1), ("element count", count, 0), ("itemsize", itemsize, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpmdsimError(f"{what} {value!r} must be an integer >= {low}")
    if collective in ("reduce_scatter", "alltoall") and count % p:
        raise ShapeError(f"{collective}: {counted(count, 'element')} per rank "
                         f"{'does' if count == 1 else 'do'} not divide into {p} blocks")
    if collective == "bcast":
        index = as_int(root)  # numpy's integers too (np.int64(2) is a group rank as 2 is); bool not
        if index is None or not 0 <= index < p:
            raise SpmdsimError(f"bcast root {root!r} must be an integer group rank (0 <= root < {p})")
        root = index
    else:
        root = 0  # the others have none: one cached schedule whatever a caller looping over NAMES passes
    return _cached(collective, algorithm, p, count, itemsize, root)


@lru_cache(maxsize=256)
def _cached(collective: str, algorithm: str, p: int, count: int, itemsize: int, root: int) -> Schedule:
    make = _BUILDERS[collective][algorithm]
    if collective == "bcast":
        return make(p, count, itemsize, root)
    return make(p, count, itemsize)


def schedule(name: str, p: int, count: int, itemsize: int = 1, root: int = 0) -> Schedule:
    """`build` by command-line name ("ring-allreduce", "bruck-alltoall", ...)."""
    collective, algorithm = parse_name(name)
    return build(collective, algorithm, p, count, itemsize, root)


def elements_for(collective: str, p: int, size: int, itemsize: int) -> int:
    """Input elements per rank for a message of `size` bytes, as the cost model counts it.

    The buffer for allreduce, reduce_scatter, alltoall and bcast; the gathered
    result for allgather (each rank contributes size/p). ShapeError when the
    bytes are not whole elements, or not p blocks where the collective cuts them.
    """
    if size % itemsize:
        raise ShapeError(f"{size:,} byte{'s are' if size != 1 else ' is'} not a whole number of {itemsize}-byte "
                         "elements")
    count = size // itemsize
    if collective in ("allgather", "reduce_scatter", "alltoall") and count % p:
        raise ShapeError(f"{count:,} element{'s' if count != 1 else ''} of {itemsize} bytes "
                         f"{'does' if count == 1 else 'do'} not divide into {p} "
                         f"blocks, one per rank; expected a multiple of {p * itemsize} bytes")
    return count // p if collective == "allgather" else count


def check_choices(choices: Mapping[str, str] | None) -> dict[str, str] | None:
    """Validate ``{"allreduce": "ring", ...}`` (Mesh's `algorithms=`; "alltoallv" too, `VARIABLE`); None or
    {} -> None."""
    if choices is None:
        return None
    if not isinstance(choices, Mapping):
        raise SpmdsimError(f"algorithms {choices!r} must be a dict like {{'allreduce': 'ring'}}")
    out = {}
    known = {**ALGORITHMS, **VARIABLE}
    for collective, algorithm in choices.items():
        if collective not in known:
            raise SpmdsimError(f"algorithms: unknown collective {collective!r}; expected one of "
                               f"{tuple(known)!r}")
        if algorithm not in known[collective]:
            raise SpmdsimError(f"algorithms: {algorithm!r} is not an algorithm for {collective}; "
                               f"expected one of {known[collective]!r}")
        out[collective] = algorithm
    return out or None


# Its modules by name, loaded on first use: spmdsim.programs.algorithms.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
