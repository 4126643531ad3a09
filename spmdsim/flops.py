"""The FLOPs of the matrix products a rank executes: each product's shape, counted while a counter is open.

``with counting() as c: ...`` opens a `FlopCounter` on the running rank's
context (spmdsim.context: each simulated rank has its own, as each MPI rank
does); every local matrix product the rank runs inside calls `gemm` with its
operands' shapes, and each open counter of that rank adds it, as a `Gemm`
(batch, m, n, k, dtype, phase) and how many times it ran. The products are
the rank's own blocks' (ops' local products, einsum contractions, attention's
scores and weighted values, and every gradient rule's), on real and dry runs
alike: a dry run multiplies nothing but its products have the same shapes.

The phase is the rank context's `phase`: "forward"; "backward" while
autograd's backward walk runs gradient rules (spmdsim.autograd.engine); and
"recompute" while a recomputed forward runs inside it (a `checkpoint`ed
region again, or attention's scores again under selective recomputation).

With no counter open anywhere in the process, `gemm` returns after one test.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np

from .context import current
from .errors import SpmdsimError

__all__ = ["PHASES", "Gemm", "FlopCounter", "counting", "gemm"]

PHASES = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class Gemm:
    """One matrix product's shape: (a batch of) (m x k) @ (k x n), its dtype and phase."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    phase: str

    def __post_init__(self) -> None:
        for name in ("batch", "m", "n", "k"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise SpmdsimError(f"Gemm {name} {value!r} must be an integer >= 0")
        if self.phase not in PHASES:
            raise SpmdsimError(f"Gemm phase {self.phase!r} must be one of {PHASES!r}")

    @property
    def flops(self) -> int:
        """Multiplies and adds: 2 * batch * m * n * k."""
        return 2 * self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        lead = f"{self.batch} x " if self.batch != 1 else ""
        return f"{lead}({self.m}x{self.k})@({self.k}x{self.n}) {self.dtype} {self.phase}"


@dataclass
class FlopCounter:
    """How many times each `Gemm` ran while this counter was open."""

    counts: dict = field(default_factory=dict)  # Gemm -> times executed

    def add(self, gemm: Gemm, times: int = 1) -> None:
        """Count `gemm` executed `times` more times."""
        _check_times(times)
        if times:
            self.counts[gemm] = self.counts.get(gemm, 0) + times

    def total(self, phase: Optional[str] = None) -> int:
        """The FLOPs of every product counted, or of those of one `phase`."""
        if phase is not None and phase not in PHASES:
            raise SpmdsimError(f"phase {phase!r} must be one of {PHASES!r} (or None: all)")
        return sum(g.flops * n for g, n in self.counts.items() if phase is None or g.phase == phase)

    def merge(self, other: "FlopCounter", times: int = 1) -> None:
        """Add `other`'s products, each `times` times (a cell that ran `times` more times)."""
        _check_times(times)
        for g, n in list(other.counts.items()):
            self.add(g, n * times)


def _check_times(times: Any) -> None:
    if type(times) is not int or times < 0:
        raise SpmdsimError(f"times {times!r} must be an integer >= 0")


_OPEN = 0  # counters open now in any context of this process: 0 and `gemm` returns at once
_LOCK = threading.Lock()


@contextmanager
def counting() -> Iterator[FlopCounter]:
    """A counter of the running rank's matrix products until the block ends; counters nest (each sees
    every product run inside it)."""
    global _OPEN
    counter = FlopCounter()
    counters = current().flops
    with _LOCK:
        _OPEN += 1
    counters.append(counter)
    try:
        yield counter
    finally:
        # by identity: two counters of equal counts are equal, and only this one closes
        del counters[next(i for i in range(len(counters) - 1, -1, -1) if counters[i] is counter)]
        with _LOCK:
            _OPEN -= 1


def gemm(a_shape: tuple, b_shape: tuple, dtype: Any) -> None:
    """Count one ``np.matmul(a, b)`` of operands shaped `a_shape` and `b_shape` (batch dims broadcast,
    a 1-d operand a row or column as np.matmul takes it; a stack of rows times one matrix is one GEMM
    of all the rows) in every counter open on this rank."""
    if not _OPEN:
        return
    context = current()
    if context.flops:
        _count(context.flops, a_shape, b_shape, dtype, context.phase)


_GEMMS: dict = {}  # (a_shape, b_shape, dtype, phase) -> its Gemm: a step runs the same few products


def _count(counters: list, a_shape: tuple, b_shape: tuple, dtype: Any, phase: str) -> None:
    key = (tuple(a_shape), tuple(b_shape), dtype, phase)
    g = _GEMMS.get(key)
    if g is None:
        a, b = key[0], key[1]
        if not a or not b:
            raise SpmdsimError(f"gemm: operands of shapes {a!r} and {b!r}; np.matmul takes no scalars")
        m, k = (1, a[0]) if len(a) == 1 else a[-2:]
        n = 1 if len(b) == 1 else b[-1]
        batch = math.prod(np.broadcast_shapes(a[:-2], b[:-2]))
        if len(b) <= 2 and len(a) > 2:  # (..., m, k) @ (k, n) is one GEMM of all the rows, as BLAS runs it
            m, batch = m * batch, 1
        g = Gemm(int(batch), int(m), int(n), int(k), np.dtype(dtype).name, phase)
        if len(_GEMMS) >= 4096:  # a long run over many shapes: start over
            _GEMMS.clear()
        _GEMMS[key] = g
    for counter in counters:
        counter.counts[g] = counter.counts.get(g, 0) + 1
