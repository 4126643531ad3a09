"""Layer norm and RMS norm over the last dim by sharding rules (pure): the program of their statistics.

- x's last dim whole on every rank: one local kernel per row, nothing moves (rows split or not: sequence parallel, data
  parallel)
- x's last dim split over A: layer_norm: two Allreduces over A of one number per row (the mean, then the variance);
  rms_norm: one (the mean square)

Each statistic is a sum over the last dim (`infer_reduce`: a pending sum over
A, one number per row) finished by the Allreduce `resolve_partial` gives. A
pending x is resolved first (a norm of a sum is not the sum of the norms).
The output keeps x's layout. `spmdsim.nn.ops.layer_norm` and `rms_norm` run
this program (their composite of `ops.reduce.sum` and `ops.norms.resolved`
issues exactly these steps, tested against the trace); the strategy search
prices it (`spmdsim.tools.autoshard.rules`). Never imports mpi4py.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ...errors import OperatorError
from ...layouts.layout import TensorLayout
from ..plan.steps import Step
from .finish import resolve_partial
from .pointwise import infer_reduce

__all__ = ["NormPlan", "infer_norm", "NORMS"]

#: Per norm, how many statistics of one number per row it sums over the last dim.
NORMS = {"layer_norm": 2, "rms_norm": 1}


@dataclass(frozen=True)
class NormPlan:
    """A norm over the last dim: its input (resolved), output, statistics' layout and the steps finishing them."""

    kind: str
    source: TensorLayout
    x: TensorLayout  # the input the kernel reads: `source` with any pending sum resolved
    out: TensorLayout
    stats: TensorLayout  # one statistic before its Allreduce: x's map, last dim 1, pending over its axes
    stats_shape: tuple[int, ...]
    steps: tuple[Step, ...]  # one Allreduce per statistic (none when the statistics are whole)

    @property
    def whole(self) -> bool:
        """The last dim is whole on every rank (not split at all): the one local kernel."""
        return not self.x.tensor_map[-1]

    @property
    def program(self) -> tuple[tuple[Step, tuple[int, ...]], ...]:
        """Each step with the global shape of the tensor it acts on (the statistics, (..., 1))."""
        return tuple((step, self.stats_shape) for step in self.steps)

    def why(self) -> str:
        if not self.steps:
            return f"{self.kind}: the last dim is whole on every rank: each rank normalises its own rows"
        return (f"{self.kind}: the last dim is split over {self.stats.partial!r}: "
                f"{len(self.steps)} Allreduce(s) of one number per row")


@lru_cache(maxsize=1024)
def infer_norm(kind: str, x: TensorLayout, shape: tuple[int, ...]) -> NormPlan:
    """The program of `kind` ("layer_norm" or "rms_norm") over the last dim of x (global `shape`)."""
    if kind not in NORMS:
        raise OperatorError(f"norm {kind!r} is not known; expected one of {sorted(NORMS)!r}")
    if x.ndim < 1:
        raise OperatorError(f"{kind} of a 0-d tensor: it normalises over the last dim")
    shape = x.check_shape(shape)
    whole = x.with_partial(())
    last = (x.ndim - 1,)
    local = infer_reduce("sum", whole, last, True).local
    stats_shape = shape[:-1] + (1,)
    _, steps = resolve_partial(local)
    return NormPlan(kind, x, whole, whole, local, stats_shape, steps * NORMS[kind])
