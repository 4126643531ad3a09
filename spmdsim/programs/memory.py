"""Memory before allocation: each rank's peak bytes, the memory it may use, one-line refusals.

Pure (standard library and numpy; never imports mpi4py). A `Need` lists the
arrays one rank will hold at its peak (shards, temporaries, collective
buffers, the check's reference block); `check_need` compares it with the
rank's share of the machine and raises ResourceError naming the need, the
memory and the largest shape that fits. Every figure depends only on layouts,
shapes and dtypes every rank shares, so every rank decides alike once the
ranks agree on the budget (`spmdsim.runtime.budget` takes the minimum).

The budget per rank is MemAvailable (/proc/meminfo, capped by a cgroup v2
limit) divided over the ranks that share the node. SPMDSIM_MEMORY overrides it:
a size per rank (``2GiB``, ``512M``, ``1e9`` bytes) or ``off`` for no check.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from ..base.sizes import ENV_VAR, format_size, out_of_memory
from ..errors import ResourceError, SpmdsimError
from .infer import infer_matmul, matmul_shape
from .plan import plan_redistribution

__all__ = [
    "Need",
    "Budget",
    "ENV_VAR",
    "local_bytes",
    "seeded_need",
    "matmul_need",
    "matmul_operand_shapes",
    "matmul_job_need",
    "redistribute_need",
    "shard_multiples",
    "matmul_multiples",
    "budget_per_rank",
    "check_need",
    "largest_fitting_shape",
    "out_of_memory",
    "peak_rss",
]

#: The generator's pass (datagen._CHUNK_ELEMENTS elements): uint64 indices, hashes and values,
#: three 8-byte arrays at most, beside one uint64 index per element of a row.
_GENERATOR_PASS = 1 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


@dataclass(frozen=True)
class Need:
    """The arrays one rank holds at its peak: (what, bytes) pairs."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def __str__(self) -> str:
        shown = ", ".join(f"{what} {format_size(n)}" for what, n in self.parts if n)
        return f"{format_size(self.total)} ({shown})" if shown else format_size(self.total)


@dataclass(frozen=True)
class Budget:
    """Bytes one rank may use, and where the figure comes from (for the message)."""

    bytes: int
    source: str


def local_bytes(tl, shape: Sequence[int], dtype) -> int:
    """Bytes of one rank's shard of a tensor of `shape` under TensorLayout `tl` (the largest, where shards differ)."""
    return math.prod(tl.max_local_shape(shape)) * np.dtype(dtype).itemsize


def seeded_need(tl, shape: Sequence[int], dtype, what: str = "shard") -> Need:
    """A shard made by `DTensor.from_seeded`: the shard and the generator's temporaries."""
    local = tuple(tl.max_local_shape(shape))
    elements = math.prod(local)
    row = math.prod(local[1:]) if local else 0
    return Need(((what, local_bytes(tl, shape, dtype)),
                 ("generator", 8 * min(row, elements) + 24 * min(elements, max(row, _GENERATOR_PASS)))))


def matmul_need(x_tl, w_tl, x_shape: Sequence[int], w_shape: Sequence[int], dtype,
                transpose_a: bool = False, transpose_b: bool = False, out_layout=None) -> Need:
    """One rank's peak for a checked MatMul: shards, output, then the larger temporary.

    The forward pass holds the local product while the collective makes the
    result; the check then makes the reference block from the rank's rows of X
    and columns of W over the whole contraction dim, in float64 (reference.matmul).
    """
    plan = infer_matmul(x_tl, w_tl, transpose_a=transpose_a, transpose_b=transpose_b, out=out_layout)
    y_shape = matmul_shape(tuple(x_shape), tuple(w_shape), transpose_a, transpose_b)
    item = np.dtype(dtype).itemsize
    out_local = tuple(plan.out.max_local_shape(y_shape))
    cols, rows = out_local[-1], math.prod(out_local[:-1])  # rows: batch dims and M together
    k = x_shape[-2] if transpose_a else x_shape[-1]
    w_batch = math.prod(out_local[:-2]) if len(w_shape) > 2 else 1
    reference = (item + 8) * (rows * k + w_batch * k * cols + rows * cols)
    product = local_bytes(plan.local, y_shape, dtype) if plan.collective else 0
    return Need((("x shard", local_bytes(x_tl, x_shape, dtype)), ("w shard", local_bytes(w_tl, w_shape, dtype)),
                 ("output", local_bytes(plan.out, y_shape, dtype)),
                 ("product or check", max(product, reference))))


def matmul_operand_shapes(dims: Sequence[int], w_ndim: int, transpose_a: bool = False,
                          transpose_b: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """X's and W's stored shapes for (batch..., M, K, N) = `dims` (W keeps its last `w_ndim` dims)."""
    *batch, m, k, n = dims
    x_shape = tuple(batch) + ((k, m) if transpose_a else (m, k))
    w_shape = tuple(batch)[len(batch) + 2 - w_ndim:] + ((n, k) if transpose_b else (k, n))
    return x_shape, w_shape


def matmul_multiples(x_tl, w_tl, dims_ndim: int, transpose_a: bool = False,
                     transpose_b: bool = False, outputs: Sequence = ()) -> tuple[int, ...]:
    """Per dim of (batch..., M, K, N), the number its size must be a multiple of (its shard counts).

    `outputs`: layouts of the result (batch..., M, N) that must divide it too.
    """
    batch = list(range(dims_ndim - 3))
    x_dims = batch + ([dims_ndim - 2, dims_ndim - 3] if transpose_a else [dims_ndim - 3, dims_ndim - 2])
    w_pair = [dims_ndim - 1, dims_ndim - 2] if transpose_b else [dims_ndim - 2, dims_ndim - 1]
    w_dims = batch[len(batch) - (w_tl.ndim - 2):] + w_pair
    out = [1] * dims_ndim
    for tl, where in ((x_tl, x_dims), (w_tl, w_dims), *((y, batch + [dims_ndim - 3, dims_ndim - 1])
                                                          for y in outputs)):
        for tensor_dim, d in enumerate(where):
            out[d] = math.lcm(out[d], tl.num_shards(tensor_dim))
    return tuple(out)


def matmul_job_need(x_tl, w_tl, x_shape: Sequence[int], w_shape: Sequence[int], dtype,
                    transpose_a: bool = False, transpose_b: bool = False, out_layout=None):
    """(need of dims, dims, multiples) of a MatMul, over dims (batch..., M, K, N) as `run --shape` gives them.

    Validates the shapes and layouts first, raising what the job itself would.
    """
    x_shape, w_shape = x_tl.check_shape(x_shape), w_tl.check_shape(w_shape)
    plan = infer_matmul(x_tl, w_tl, transpose_a=transpose_a, transpose_b=transpose_b, out=out_layout)
    m, k = (x_shape[-1], x_shape[-2]) if transpose_a else (x_shape[-2], x_shape[-1])
    dims = x_shape[:-2] + (m, k, w_shape[-2] if transpose_b else w_shape[-1])

    def need_of(d: tuple) -> Need:
        xs, ws = matmul_operand_shapes(d, len(w_shape), transpose_a, transpose_b)
        return matmul_need(x_tl, w_tl, xs, ws, dtype, transpose_a, transpose_b, out_layout)

    multiples = matmul_multiples(x_tl, w_tl, len(dims), transpose_a, transpose_b, (plan.local, plan.out))
    return need_of, dims, multiples


def redistribute_need(source, target, shape: Sequence[int], dtype) -> Need:
    """One rank's peak for `spmdsim run redistribute`: the seeded source, the target, the busiest step.

    A step holds what it sends and what it receives beside the blocks (Allgather's
    output, an exchange's packed buffers).
    """
    plan = plan_redistribution(source, target, tuple(shape), np.dtype(dtype).name)
    moved = max((sum(pair) for s in plan.steps for pair in zip(s.bytes_sent, s.bytes_received)), default=0)
    return Need(seeded_need(source, shape, dtype, "source shard").parts
                + (("target shard", local_bytes(target, shape, dtype)), ("step buffers", moved)))


def shard_multiples(*layouts) -> tuple[int, ...]:
    """Per tensor dim, the number its size must be a multiple of under every one of `layouts`."""
    return tuple(math.lcm(*(tl.num_shards(d) for tl in layouts)) for d in range(layouts[0].ndim))


def _parse_size(text: str) -> Optional[int]:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS:
        return None
    value = float(match.group(1)) * _UNITS[match.group(2)]
    return int(value) if math.isfinite(value) else None


def _meminfo_available(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss() -> int:
    """This process's peak resident set size in bytes since it started its program.

    Read from /proc/self/status (VmHWM), which a new program starts afresh. Not
    getrusage's ru_maxrss: Linux carries that across exec, so a child that
    subprocess starts (vfork, then exec) reports its parent's peak when larger
    (a 40 MB dry run read as 900 MB under a test worker). Elsewhere ru_maxrss
    is the fallback (KiB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _cgroup_room(root: str) -> Optional[int]:
    """Bytes left under this process's cgroup v2 memory limit, or None when there is none."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            rel = next((line.split(":", 2)[2].strip() for line in fh if line.startswith("0::")), None)
        if rel is None:
            return None
        where = os.path.join(root, rel.lstrip("/"))
        with open(os.path.join(where, "memory.max"), encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(where, "memory.current"), encoding="ascii") as fh:
            return max(0, int(limit) - int(fh.read().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def budget_per_rank(ranks_on_node: int, env: Optional[Mapping[str, str]] = None,
                    meminfo: str = "/proc/meminfo", cgroup_root: str = "/sys/fs/cgroup") -> Optional[Budget]:
    """The bytes one rank may use, or None when unknown or switched off (no check).

    SPMDSIM_MEMORY (per rank) wins; else MemAvailable, capped by the cgroup's room,
    divided over `ranks_on_node` (simulated ranks: all of them, in one process).
    """
    env = os.environ if env is None else env
    value = env.get(ENV_VAR, "").strip()
    if value.lower() in ("off", "none"):
        return None
    if value:
        size = _parse_size(value)
        if size is None:
            raise SpmdsimError(f"{ENV_VAR}={value!r} is not a size; expected bytes per rank such as "
                               "2GiB, 512M or 1e9, or off (no memory check)")
        if size == 0:  # not "off": a limit of no memory would refuse every run, so say which is meant
            raise SpmdsimError(f"{ENV_VAR}={value!r} would give a rank no memory at all; expected bytes per "
                               "rank such as 2GiB, 512M or 1e9, or off (no memory check)")
        return Budget(size, f"{ENV_VAR}={value}")
    available = _meminfo_available(meminfo)
    if available is None:
        return None
    source = "MemAvailable"
    room = _cgroup_room(cgroup_root)
    if room is not None and room < available:
        available, source = room, "the cgroup's memory limit"
    n = max(1, int(ranks_on_node))
    per = "" if n == 1 else f" over {n} ranks on this node"
    return Budget(available // n, f"{source} {format_size(available)}{per}")


def largest_fitting_shape(shape: Sequence[int], need_of: Callable[[tuple], int], limit: int,
                          multiples: Sequence[int]) -> Optional[tuple[int, ...]]:
    """The largest shape, `shape` scaled down alike in every dim, whose need fits `limit`.

    Each dim stays a multiple of its entry in `multiples` (its shard count) and at
    least that; None when even the smallest such shape does not fit.
    """
    def scaled(num: int, den: int) -> tuple[int, ...]:
        # Nearest multiple, never above the size: a small dim is not halved by rounding down.
        return tuple(min(s, max(m, (2 * s * num + den * m) // (2 * den * m) * m)) if s else 0
                     for s, m in zip(shape, multiples))

    if need_of(tuple(shape)) <= limit:
        return tuple(shape)
    if need_of(scaled(0, 1)) > limit:
        return None
    lo, hi, den = 0, 1 << 40, 1 << 40  # the scale lo/den fits, hi/den does not (or is the whole)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need_of(scaled(mid, den)) <= limit:
            lo = mid
        else:
            hi = mid
    return scaled(lo, den)


def check_need(need: Need, budget: Optional[Budget], what: str,
               shape_hint: Optional[tuple[Sequence[int], Callable[[tuple], int], Sequence[int]]] = None,
               shape_flag: str = "shape") -> None:
    """Raise ResourceError when `need` exceeds `budget` (None: no check).

    `shape_hint` is (shape, need of a shape, shard multiples per dim): the message
    then names the largest shape that fits.
    """
    if budget is None or need.total <= budget.bytes:
        return
    hint = ""
    if shape_hint is not None:
        shape, need_of, multiples = shape_hint
        fits = largest_fitting_shape(shape, need_of, budget.bytes, multiples)
        hint = (f"; the largest {shape_flag} that fits is {','.join(map(str, fits))}" if fits
                else f"; no {shape_flag} of this layout fits")
    raise ResourceError(
        f"{what} needs {need} per rank but a rank has {format_size(budget.bytes)} "
        f"({budget.source}){hint}; {ENV_VAR}=SIZE|off changes the limit"
    )
