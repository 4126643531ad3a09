"""Dry runs: simulated ranks with shapes and dtypes but no data, and what each rank would move and hold.

In ``simulate(..., dry_run=True)`` a SeededTensor block is zeros (`zeros`:
pages the kernel maps on first write, so nothing is generated or written), collectives
meet and compare their calls but copy and add nothing, and every collective
is traced with its bytes. Each rank's `Meter` counts the bytes it holds: the
blocks made from seeds and every buffer a collective sends or receives, for as
long as the array lives, plus the collective's own buffers during the call;
its peak is the "peak bytes held". Local temporaries that never reach a
collective are not counted. Local products (the operators' matmuls and their
gradients, `product`) are zeros made without multiplying; the other local
steps still run on the zeros. Results of a dry run are not values: checks are
meaningless, and the report replaces the program's own output.
"""
from __future__ import annotations

import json
import math
import mmap
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from . import _local

__all__ = ["Meter", "RankBytes", "DryRunReport", "zeros", "dry_zeros", "meter", "active", "dry_run_active", "RUNNING",
           "product", "matmul", "local"]

#: Dry runs in progress in this process ([count], changed by spmdsim.sim.run): the hot paths
#: test ``RUNNING[0]`` before asking which rank runs, so a real run pays one list read.
RUNNING = [0]


class Meter:
    """The bytes one simulated rank holds now and at most (thread-confined: only its rank touches it)."""

    __slots__ = ("held", "peak", "_live", "__weakref__")

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # id(array) -> nbytes, until the array is freed

    def hold(self, *arrays: Any) -> None:
        """Count these arrays as held until they are freed, then update the peak."""
        for a in arrays:
            if type(a) is np.ndarray and id(a) not in self._live and a.nbytes:
                self._live[id(a)] = a.nbytes
                self.held += a.nbytes
                weakref.finalize(a, _release, weakref.ref(self), id(a))
        if self.held > self.peak:
            self.peak = self.held


def _release(ref: Any, key: int) -> None:
    owner = ref()
    if owner is not None:
        owner.held -= owner._live.pop(key, 0)


def meter() -> Meter | None:
    """The running rank's meter in a dry run, else None."""
    state = _local.current()
    return None if state is None else state.meter


def active() -> bool:
    """Whether the running thread is a rank of a dry run."""
    return bool(RUNNING[0]) and meter() is not None


def dry_run_active() -> bool:
    """Whether this code runs as a rank of a dry run (shapes, no values): skip work only values need."""
    return active()


#: From this size up a dry run's zeros are their own anonymous mapping (`zeros`).
LAZY_BYTES = 1 << 20


def zeros(shape: tuple, dtype: Any) -> np.ndarray:
    """Zeros whose pages cost no memory until written: a dry run's stand-in for any value.

    ``np.zeros`` is calloc, and in a process of simulated ranks (threads) glibc
    serves a multi-MiB calloc from a thread arena it has used before and
    clears it, writing every page (the Megatron block's attention scores are
    32 MiB a rank at 1,024 ranks). An anonymous mapping is zero-filled by the
    kernel page by page on first write, and unmapped when the array is freed.
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= LAZY_BYTES:
        try:
            return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)
        except OSError:  # out of mappings (vm.max_map_count) or address space: numpy's own
            pass
    return np.zeros(shape, dtype)


def dry_zeros(shape: tuple, dtype: Any) -> np.ndarray | None:
    """A block of zeros standing in for generated data in a dry run (counted as held), else None."""
    m = meter()
    if m is None:
        return None
    out = zeros(shape, dtype)
    m.hold(out)
    return out


def product(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """In a dry run, zeros of ``np.matmul(a, b)``'s shape and dtype (not computed), else None.

    Blocks of a dry run are zeros, so every product is zeros: skipping the
    multiplication spares its time (a matmul is the one local step that costs
    more than its operands' size) and leaves the result's pages unwritten.
    """
    if not active():
        return None
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return zeros(lead + (a.shape[-2], b.shape[-1]), np.result_type(a, b))


def local(fn: Any, like: np.ndarray, *args: Any) -> np.ndarray:
    """``fn(*args)``, an elementwise kernel whose result is shaped and typed like `like`; in a
    dry run those zeros instead, not computed.

    A dry run's values are not results, so its activations, softmaxes and their
    gradients need not run: they would touch every page of their temporaries
    (attention's scores: 2 MiB a rank at 256 ranks of the Megatron block). A
    real run reads one list item.
    """
    if RUNNING[0] and active():
        return zeros(like.shape, like.dtype)
    return fn(*args)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)``; in a dry run its zeros, not multiplied (`product`). A real run reads one list item."""
    if RUNNING[0]:
        dry = product(a, b)
        if dry is not None:
            return dry
    return np.matmul(a, b)


@dataclass(frozen=True)
class RankBytes:
    """One rank's line of a dry run: its collectives, bytes on the wire, peak bytes held."""

    rank: int
    calls: int
    bytes_sent: int
    bytes_received: int
    peak_bytes_held: int
    counts: tuple[tuple[str, int], ...] = ()

    def key(self) -> tuple:
        return (self.calls, self.bytes_sent, self.bytes_received, self.peak_bytes_held, self.counts)


@dataclass(frozen=True)
class DryRunReport:
    """Every rank's line; `table()` folds runs of ranks with equal lines, `to_json()` lists them all."""

    ranks: tuple[RankBytes, ...]

    def folded(self) -> list[tuple[list[int], RankBytes]]:
        """(ranks, line) for each distinct line, ranks in order (equal lines anywhere fold together)."""
        groups: dict[tuple, tuple[list[int], RankBytes]] = {}
        for row in self.ranks:
            groups.setdefault(row.key(), ([], row))[0].append(row.rank)
        return list(groups.values())

    def table(self) -> str:
        """Equal ranks folded into one row; within 100 columns (a long list of collectives folds)."""
        from ..viz.table import fold_table

        head = ("ranks", "calls", "sent B", "received B", "peak held B", "collectives")
        rows = [(_ranks_cell(ranks), row.calls, f"{row.bytes_sent:,}", f"{row.bytes_received:,}",
                 f"{row.peak_bytes_held:,}", ", ".join(f"{op} x{n}" for op, n in row.counts) or "none")
                for ranks, row in self.folded()]
        return "\n".join([f"dry run on {len(self.ranks)} simulated ranks (no data; bytes from the trace)"]
                         + fold_table(head, rows, right=(1, 2, 3, 4), keep=(0, 1, 2, 3, 4)))

    def to_json(self) -> str:
        return json.dumps({"ranks": [asdict(r) for r in self.ranks]})


def _ranks_cell(ranks: list[int]) -> str:
    """"ranks 0-6,8-44" within 21 columns, else how many ("1022 ranks"; --json lists them)."""
    from .engine import ranks_text

    text = ranks_text(ranks)
    return text if len(text) <= 21 else f"{len(ranks)} ranks"


def report(states: Sequence[Any]) -> DryRunReport:
    """The report of a finished dry run from its ranks' states (spmdsim.sim.run.RankState)."""
    rows = []
    for state in states:
        trace = state.traces[0]
        totals = trace.totals()
        rows.append(RankBytes(state.rank, totals["calls"], totals["bytes_sent"], totals["bytes_received"],
                              state.meter.peak, tuple(sorted(trace.counts().items()))))
    return DryRunReport(tuple(rows))
