"""The collectives' names and the coefficients of one call (see spmdsim.programs.cost.model's table),
with the validated parameter and measurement records the model and its fit share.

Pure (standard library only; never imports mpi4py).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from ...errors import SpmdsimError

__all__ = ["OPS", "ALGORITHMS", "Measurement", "OpParams", "normalize_op", "call_terms"]

OPS = ("allgather", "reduce_scatter", "allreduce", "alltoall", "alltoallv", "bcast")
ALGORITHMS = ("ring", "tree")

# Names other modules use for the same collective (planner steps, MPI names).
_ALIASES = {"all_gather": "allgather", "reducescatter": "reduce_scatter", "reduce_scatter_block": "reduce_scatter",
            "all_reduce": "allreduce", "all_to_all": "alltoall", "all_to_allv": "alltoallv", "exchange": "alltoallv",
            "broadcast": "bcast"}


def normalize_op(op: str) -> str:
    """Canonical collective name (``"AllGather"`` -> ``"allgather"``, ``"exchange"`` -> ``"alltoallv"``)."""
    if not isinstance(op, str):
        raise SpmdsimError(f"collective name {op!r} must be a string; expected one of {OPS!r}")
    key = op.strip().lower().replace("-", "_").replace(" ", "_")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("_", ""), key))
    if key not in OPS:
        raise SpmdsimError(f"unknown collective {op!r}; expected one of {OPS!r}")
    return key


def call_terms(op: str, algorithm: str, g: int, n: float) -> tuple[float, float, float]:
    """Coefficients (of alpha, beta, gamma) for one call; see the module table."""
    if g <= 1 or n < 0:
        return 0.0, 0.0, 0.0
    lg = math.log2(g)
    frac = (g - 1) / g * n
    ring = algorithm == "ring"
    if op == "allgather":
        return ((g - 1) if ring else lg), frac, 0.0
    if op == "reduce_scatter":
        return ((g - 1) if ring else lg), frac, frac
    if op == "allreduce":
        return (2 * (g - 1), 2 * frac, frac) if ring else (lg, lg * n, lg * n)
    if op == "alltoall":
        return ((g - 1), frac, 0.0) if ring else (lg, lg * n / 2, 0.0)
    if op == "alltoallv":
        return (g - 1), frac, 0.0
    if op == "bcast":
        return (lg + g - 1, 2 * frac, 0.0) if ring else (lg, lg * n, 0.0)
    raise SpmdsimError(f"unknown collective {op!r}; expected one of {OPS!r}")


@dataclass(frozen=True)
class OpParams:
    """Override of (alpha, beta, gamma) for one collective, or one collective and group size.

    Set by `CostModel.fit`; ``group_size=None`` applies to every group size
    that has no override of its own.
    """

    op: str
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    group_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", normalize_op(self.op))
        check_params(alpha_s=self.alpha_s, beta_s_per_byte=self.beta_s_per_byte,
                      gamma_s_per_byte=self.gamma_s_per_byte)
        g = self.group_size
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 2):
            raise SpmdsimError(f"override group size {g!r} must be None or an integer >= 2")

    @property
    def key(self) -> tuple[str, int]:
        return self.op, self.group_size or 0


@dataclass(frozen=True)
class Measurement:
    """One timed call: collective, group size, per-rank buffer bytes ``n``, seconds."""

    op: str
    group_size: int
    bytes_per_rank: int
    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", normalize_op(self.op))
        check_group_size(self.group_size)
        check_bytes(self.bytes_per_rank, "measurement bytes")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, numbers.Real) or not (
                0 < self.seconds < math.inf):
            raise SpmdsimError(f"measurement seconds {self.seconds!r} must be a finite number > 0")
        object.__setattr__(self, "group_size", int(self.group_size))


def check_group_size(g: int) -> None:
    # A NaN or infinite size raised ValueError/OverflowError from int(); a string compared unequal.
    if isinstance(g, bool) or not isinstance(g, numbers.Real) or not math.isfinite(g) or int(g) != g or g < 1:
        raise SpmdsimError(f"group size {g!r} must be a positive integer")


def check_bytes(value: Any, what: str) -> None:
    """A byte count: a finite real number >= 0 (a NaN or infinite one priced NaN or inf seconds, a string or
    None raised TypeError, True counted as 1 byte)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise SpmdsimError(f"{what} {value!r} must be a finite number >= 0")


def check_params(**params: float) -> None:
    """Each named parameter (a rate or latency) must be a finite number >= 0."""
    for name, value in params.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SpmdsimError(f"{name} {value!r} must be a finite number >= 0")
