"""The FLOPs of the matrix products a rank executes: each product's shape, counted while a counter is open.

``with counting() as c: ...`` opens a `FlopCounter` on the running rank's
context (spmdsim.base.context: each simulated rank has its own, as each MPI rank
does); every local matrix product the rank runs inside calls `gemm` with its
operands' shapes, and each open counter of that rank adds it, as a `Gemm`
(batch, m, n, k, dtype, phase) and how many times it ran. The products are
the rank's own blocks' (ops' local products, einsum contractions, attention's
scores and weighted values, and every gradient rule's), on real and dry runs
alike: a dry run multiplies nothing but its products have the same shapes.

The phase is the rank context's `phase`: "forward"; "backward" while
autograd's backward walk runs gradient rules (spmdsim.nn.autograd.engine); and
"recompute" while a recomputed forward runs inside it (a `checkpoint`ed
region again, or attention's scores again under selective recomputation).

Beside the products, every other kernel the rank runs (the element-wise and reduction operators of
spmdsim.nn.ops and their gradient rules, the optimizer's update) calls `sweep` with the blocks it reads
and writes, and each open counter adds a `Kernel` per dtype: elements read and written, on real and
dry runs alike (the blocks' shapes are the same). A kernel is counted as one fused pass: its operands
read once, its results written once. Views and layout copies (reshape, transpose, stacking) and
collectives are not kernels here: the collectives' bytes are the trace's.

A counter opened with ``counting(blocks=True)`` (the estimate's ledger's) also records, for each product and
each kernel over activations outside the optimizer, which blocks it read and wrote, by identity (a weak
reference to the array owning each block's memory; a (shape, dtype) pair has none, a (shape, dtype, array)
triple is that array's), and `hold` marks blocks the rank holds anyway: parameters, their gradients, what
the graph keeps for backward. `FlopCounter.fresh` then gives, per product or kernel, the elements of its
blocks that are not among those, an array once however many of the call's operands and results it is (an
in-place kernel's block, read and written, is one block alive; its traffic still counts both): `Fresh`
records, what a moment's transient blocks add beside what the rank holds
(spmdsim.tools.estimate.ledger.largest_transient).

With no counter open anywhere in the process, `gemm` and `sweep` return after one test.
"""
from __future__ import annotations

import math
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from .context import current
from ..errors import SpmdsimError
from .._lazy import numpy_on_first_use
from .flop_counts import FlopCounter, Gemm, Kernel
from .tables import put

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["counting", "any_open", "gemm", "sweep", "hold", "holding"]


_OPEN = 0  # counters open now in any context of this process: 0 and `gemm` returns at once
_BLOCKS = 0  # of those, counters that record blocks (``counting(blocks=True)``): 0 and `hold` returns at once
_LOCK = threading.Lock()


def any_open() -> bool:
    """Whether a counter is open now anywhere in this process (else `sweep` and `gemm` count nothing, and
    a caller may skip gathering what it would pass them)."""
    return _OPEN > 0


@contextmanager
def counting(blocks: bool = False) -> Iterator[FlopCounter]:
    """A counter of the running rank's matrix products until the block ends; counters nest (each sees
    every product run inside it). `blocks`: record each call's blocks too (FlopCounter.fresh)."""
    global _OPEN, _BLOCKS
    counter = FlopCounter(calls=[], held={}) if blocks else FlopCounter()
    counters = current().flops
    with _LOCK:
        _OPEN += 1
        _BLOCKS += bool(blocks)
    counters.append(counter)
    try:
        yield counter
    finally:
        # by identity: two counters of equal counts are equal, and only this one closes
        del counters[next(i for i in range(len(counters) - 1, -1, -1) if counters[i] is counter)]
        with _LOCK:
            _OPEN -= 1
            _BLOCKS -= bool(blocks)


_SIZED: dict = {}  # (shape, dtype) -> (elements, floating, itemsize): a step's calls have a few shapes


def _sized(shape: tuple, dtype: Any) -> tuple:
    key = (shape, dtype)
    out = _SIZED.get(key)
    if out is None:
        dtype = np.dtype(dtype)
        out = (int(math.prod(shape)), dtype.name.startswith(_FLOATING) and not dtype.name.startswith(_OWN),
               dtype.itemsize)
        put(_SIZED, key, out, 4096)
    return out


# numpy's names of the dtypes priced at a precision's activation width (ml_dtypes' "bfloat16" among them: a
# bfloat16 block is an activation, not a mask or ids at their own width)
_FLOATING = ("float", "complex", "bfloat")
# ... but FP8's (ml_dtypes' "float8_e4m3fn", "float8_e5m2"): a byte each at any precision, as a mask's
_OWN = "float8"


def _ref(a: Any) -> Any:
    """A weak reference to the array whose memory `a` views (spmdsim.base.buffers.owner): the block's identity; None
    for a numpy scalar and for a broadcast scalar (a dry run's stand-in of a shape, spmdsim.base.buffers.broadcast_zero,
    shared by every call of that shape: no block of its own)."""
    nd = np.ndarray
    base = a.base if type(a) is nd else getattr(a, "base", None)  # (most blocks are arrays: no getattr default)
    while isinstance(base, nd):
        a, base = base, base.base
    if (a.ndim if type(a) is nd else getattr(a, "ndim", 0)) == 0:
        return None
    try:
        return weakref.ref(a)
    except TypeError:
        return None


def _record(counters: list, what: Any, phase: str, blocks: Any, sized: Optional[tuple] = None,
            entries: Optional[tuple] = None) -> None:
    """Add one call's blocks to the counters that record them; `sized`: each block's (elements, floating,
    itemsize) where the caller has them (`_sweep`'s), else worked out here; `entries`: the call's `_entries`
    where the caller has them (`blocks` then unread)."""
    for counter in counters:
        if counter.calls is not None:
            if entries is None:
                entries = _entries(blocks) if sized is None else _entries_sized(blocks, sized)
            counter.calls.append((what, phase, entries))


def _entries(blocks: Any) -> tuple:
    """Each of one call's blocks as (a weak reference to the block's owner or None, elements, floating, itemsize):
    an array, a (shape, dtype) pair or a (shape, dtype, array) triple (counted as the pair, the block that array's:
    `sweep`); None skipped. An array once however many of its operands and results it is (an in-place kernel's
    block, read and written: one block alive, not two), the arrays met kept by id (the call holds them all: a dry
    run's step records ~50,000 calls); a (shape, dtype) pair is a block of its own each time it is given (one
    pair may stand for several blocks of its shape)."""
    blocks = tuple(blocks)
    return _entries_sized(blocks, tuple(None if (sig := _signature(b)) is None else _sized(*sig) for b in blocks))


def _entries_sized(blocks: tuple, sized: tuple) -> tuple:
    """`_entries` of `blocks`, each block's (elements, floating, itemsize) given (None: a block skipped): a kernel's
    come with its signature (`_sweep`), so only the arrays' identities are looked up."""
    out = []
    seen = []  # the ids of the arrays met: a call's few (a list's `in`, no set made)
    for block, size in zip(blocks, sized):
        if size is None:
            continue
        a = block
        if type(a) is tuple:
            a = block[2] if len(block) > 2 else None
            if a is None:
                out.append((None,) + size)
                continue
        i = id(a)
        if i in seen:
            continue
        seen.append(i)
        out.append((_ref(a),) + size)
    return tuple(out)


def holding() -> bool:
    """Whether a counter that records blocks is open now anywhere in this process (else `hold` marks nothing,
    and a caller may skip gathering what it would pass it)."""
    return _BLOCKS > 0


def hold(*arrays: Any) -> None:
    """Mark these blocks (arrays; None skipped) as held by the rank anyway in every counter open on this rank
    that records blocks: a parameter, a parameter's gradient, a block the graph keeps for backward. A call's
    blocks so marked, before or after the call, are not in its `Fresh` record."""
    if not _BLOCKS:
        return
    counters = [c for c in current().flops if c.held is not None]
    if not counters:  # (another rank's counter records blocks, none of this rank's does)
        return
    for a in arrays:
        ref = None if a is None else _ref(a)
        if ref is None:
            continue
        for counter in counters:
            counter.held[id(ref)] = ref


def gemm(a_shape: tuple, b_shape: tuple, dtype: Any, blocks: Optional[tuple] = None, kernel: str = "",
         share: float = 1.0) -> None:
    """Count one ``np.matmul(a, b)`` of operands shaped `a_shape` and `b_shape` (batch dims broadcast,
    a 1-d operand a row or column as np.matmul takes it; a stack of rows times one matrix is one GEMM
    of all the rows) in every counter open on this rank. `blocks`: the arrays (a, b, result), for the
    counters that record blocks (each may be a (shape, dtype) pair, a block held by nothing, or a (shape,
    dtype, array) triple, as `sweep` takes them); without them the product's are three blocks of its shapes,
    held by nothing. `kernel`, `share`: the fused kernel the product runs in and the part of it executed
    (spmdsim.base.flop_counts.Gemm)."""
    if not _OPEN:
        return
    context = current()
    if context.flops:
        g = _count(context.flops, a_shape, b_shape, dtype, context.phase, kernel, share)
        if _BLOCKS:
            if blocks is None:  # three blocks of its shapes, held by nothing: the same entries every call
                _record(context.flops, g, g.phase, None, entries=_unheld(g, dtype))
            else:
                _record(context.flops, g, g.phase, blocks)


_GEMMS: dict = {}  # (a_shape, b_shape, dtype, phase) -> its Gemm: a step runs the same few products
_UNHELD: dict = {}  # (Gemm, dtype) -> `_unheld`'s entries


def _unheld(g: Gemm, dtype: Any) -> tuple:
    """`_entries` of the blocks of product `g` given as (shape, dtype) pairs, held by nothing: a function of the
    product alone (a pair has no identity), worked out once (a ring attention's chunk pairs count ~100,000)."""
    key = (g, dtype)
    entries = _UNHELD.get(key)
    if entries is None:
        entries = _entries((((g.batch * g.m * g.k,), dtype), ((g.batch * g.k * g.n,), dtype),
                            ((g.batch * g.m * g.n,), dtype)))
        put(_UNHELD, key, entries, 4096)
    return entries


def _count(counters: list, a_shape: tuple, b_shape: tuple, dtype: Any, phase: str, kernel: str = "",
           share: float = 1.0) -> Gemm:
    key = (tuple(a_shape), tuple(b_shape), dtype, phase, kernel, share)
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
        g = Gemm(int(batch), int(m), int(n), int(k), np.dtype(dtype).name, phase, kernel, share)
        put(_GEMMS, key, g, 4096)
    for counter in counters:
        counter.counts[g] = counter.counts.get(g, 0) + 1
    return g


def sweep(op: str, reads: Any, writes: Any, kind: str = "activations", phase: Optional[str] = None,
          times: int = 1) -> None:
    """Count one kernel `op` that reads the blocks `reads` and writes the blocks `writes` (arrays, or
    (shape, dtype) pairs; None entries skipped) in every counter open on this rank, in `phase` (default
    the rank context's), one `Kernel` per dtype. A (shape, dtype, array) triple is counted as its pair, and
    is that array's block for the counters that record blocks (a kernel counted at other shapes or dtypes
    than the arrays it stands for have: an MoE layer's, spmdsim.models.moe.layer). `times`: the kernel ran that many
    times on blocks of these shapes (flash attention's query tiles), its blocks recorded once."""
    if not _OPEN:
        return
    context = current()
    if context.flops:
        phase = phase or context.phase
        if type(reads) is not tuple:
            reads = tuple(reads)
        if type(writes) is not tuple:
            writes = tuple(writes)
        sized = _sweep(context.flops, op, reads, writes, kind, phase, times)
        if _BLOCKS and kind == "activations" and phase != "optimizer":
            _record(context.flops, op, phase, reads + writes, sized)


def _signature(block: Any) -> Optional[tuple]:
    if block is None:
        return None
    if type(block) is tuple:
        return (tuple(block[0]), np.dtype(block[1]))
    shape = getattr(block, "shape", None)
    return None if shape is None else (shape, block.dtype)


# (op, kind, phase, read signatures, written signatures) -> (its Kernels, each block's `_sized` or None): the
# block sizes are a function of the signatures, so a call of a known signature sizes no block again
_SWEEPS: dict = {}


def _sweep(counters: list, op: str, reads: tuple, writes: tuple, kind: str, phase: str, times: int = 1) -> tuple:
    """Count the kernels in `counters`; return each of the call's blocks' (elements, floating, itemsize), None
    where it has no signature (`_entries_sized`)."""
    nd = np.ndarray  # an array's signature built in place (most blocks are arrays), any other's by _signature
    key = (op, kind, phase, tuple([(b.shape, b.dtype) if type(b) is nd else _signature(b) for b in reads]),
           tuple([(b.shape, b.dtype) if type(b) is nd else _signature(b) for b in writes]))
    made = _SWEEPS.get(key)
    if made is None:
        per: dict = {}
        for signatures, slot in ((key[3], 0), (key[4], 1)):
            for sig in signatures:
                if sig is not None:
                    per.setdefault(np.dtype(sig[1]).name, [0, 0])[slot] += int(math.prod(sig[0]))
        made = (tuple(Kernel(op, phase, kind, dtype, r, w) for dtype, (r, w) in sorted(per.items()) if r or w),
                tuple(None if sig is None else _sized(sig[0], sig[1]) for sig in key[3] + key[4]))
        put(_SWEEPS, key, made, 4096)
    kernels_made = made[0]
    for counter in counters:
        kernels = counter.kernels
        for k in kernels_made:
            kernels[k] = kernels.get(k, 0) + times
    return made[1]
