"""Shared pieces of the MPI operators: result tensors, prepared calls, local B -> S slicing, seeded blocks."""
from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ...base import buffers
from ...errors import DTypeError, OperatorError
from ...layouts.layout import Layout, TensorLayout
from ...base.precision import _PRODUCT_DTYPES, matmul, product_dtype, wide
from ...layouts.datagen import SeededTensor, bind_keep, uniform_at_least
from ...runtime.replay import kernel, kernels
from ...base.validate import as_int, describe, dtype_name
from ...base.context import current as _context
from ...runtime.engines import c_order
from ...runtime.engines.base import DRY_VALUES_BYTES
from ...base.flops import gemm
from ..autograd.graph import with_partial
from ...runtime.executor import redistribute
from ...runtime.dtensor import DTensor
from ...runtime.mesh import Mesh
from ._operands import _no_common, result_dtype
from ...base.tables import put

_DTENSOR: Any = None  # runtime.DTensor, bound by _dtensor_class on first use
_MESH: Any = None  # runtime.Mesh, bound with it
_BOOL = np.dtype(bool)
# An operator's operands' layouts, global shapes, dtypes and blocks, as ``tuple(map(LAYOUT, xs))``: in C, where
# a comprehension runs a frame of its own (a few an operator).
LAYOUT, SHAPE, LOCAL = attrgetter("_layout"), attrgetter("_shape"), attrgetter("local")
# The blocks themselves, for a hot path while this thread does not capture (spmdsim.base.buffers.CAPTURE): the same
# arrays `LOCAL` gives then, without DTensor.local's function call per tensor.
BLOCK = attrgetter("_local")
DTYPE = attrgetter("_local.dtype")


def dim_or_axis(op: str, dim: Any, axis: Any, default: int) -> Any:
    """`dim`, or numpy's and JAX's ``axis=`` given in its place (``softmax(x, axis=-1)``); both given: one line."""
    if axis is None:
        return dim
    if dim != default:
        raise OperatorError(f"{op}: dim {dim!r} and axis={axis!r} both given; give one of them")
    return axis


def make_dtensor(mesh: Any, local: np.ndarray, layout: TensorLayout, shape: Sequence[int]) -> Any:
    """A DTensor from this rank's block (the one place that builds result tensors)."""
    cls = _DTENSOR or _dtensor_class()
    if type(local) is not np.ndarray:
        local = np.asanyarray(local)  # ascontiguousarray alone would make a 0-d block (a loss) 1-d
    if not local.flags.c_contiguous:  # C order (a dry run's large block: the engine's zeros, no page written)
        local = c_order(local)
    if type(shape) is not tuple:
        shape = tuple(shape)
    # The checks DTensor() makes, passed before by this shape under an equal layout: the same block
    # shape, a plain dtype and the mesh's device matrix are all that can differ.
    seen = _CHECKED.get((id(layout), shape))
    if (seen is not None and seen[0] is layout and local.shape == seen[2] and (seen[1] is shape or _ints(shape))
            and local.dtype in _PLAIN_DTYPES and type(mesh) is _MESH
            and (layout.layout is mesh.layout or layout.layout == mesh.layout)):
        return cls._trusted(mesh, local, layout, shape)
    out = cls(mesh, local, layout, shape)
    if out.global_shape == shape and _ints(shape) and type(layout) is TensorLayout:
        put(_CHECKED, (id(layout), shape), (layout, shape, out.local.shape), 4096)
    return out


def shaped_as(x: Any, block: Any, layout: TensorLayout) -> Any:
    """``make_dtensor(x.mesh, block, layout, x.global_shape)`` for a result of x's shape (an elementwise
    kernel's): built directly, without make_dtensor's checks, when `layout` is x's own layout object and `block` a
    C-ordered ndarray of x's block shape and dtype (what x's own checks passed)."""
    own = x._local
    if (layout is x._layout and type(block) is np.ndarray and block.dtype is own.dtype and block.shape == own.shape
            and block.flags.c_contiguous and _DTENSOR is not None):
        out = _new(_DTENSOR)  # DTensor._trusted's tensor, without its call
        out._mesh, out._local, out._layout, out._shape, out._ag = x._mesh, block, layout, x._shape, None
        return out
    return make_dtensor(x._mesh, block, layout, x._shape)


_new = object.__new__


def decided(infer: Any, name: str, layouts: tuple, shapes: tuple, dtypes: tuple, promote: Any = None) -> tuple:
    """(plan, result dtype, its name, whether each operand stays as it is) for operator `name` (an op or an
    einsum spec) planned by `infer(name, layouts, shapes, dtype name)` on operands of these layouts, global
    shapes and dtypes: what the operator decides, remembered per call signature as DTensor's sharding
    propagation cache does, so a step's repeated calls derive none of it again. A pure function of its
    key (the planners are pure): one table for every simulation; a refusal raises and is not kept.

    Keyed by the layout objects' ids (a step passes the same objects every time: hashing and comparing
    tuples of ints is C, where a TensorLayout key calls its Python __hash__ and __eq__); each entry holds
    its layouts, so an id in the table is never another object's.

    `promote`: the result dtype's rule, `result_dtype` (np.result_type's, the default) or `ufunc_dtype`
    (numpy's ufuncs', spmdsim.nn.ops.pointwise's)."""
    promote = promote or result_dtype
    key = (infer, name, tuple(map(id, layouts)), shapes, dtypes, promote)
    try:
        return _DECIDED[key][1]
    except KeyError:
        pass
    except TypeError:  # a size that does not hash (the planner refuses it)
        key = None
    dtype = promote(*dtypes)
    plan = infer(name, layouts, shapes, dtype_name(dtype))
    out = (plan, dtype, dtype_name(dtype), tuple(layout == t for layout, t in zip(layouts, plan.targets)))
    if key is not None and all(_ints(shape) for shape in shapes):  # 16.0 hashes as 16: never kept
        put(_DECIDED, key, (layouts, out), 4096)
    return out


# (planner, op, ids of the operands' layouts, global shapes, dtypes) -> (those layouts, decided's answer)
_DECIDED: dict = {}


def signature(name: str, xs: tuple) -> tuple:
    """An operator call's key in its table of `Prepared` calls: `name` (an op or an einsum spec), the ids of
    the operands' layout objects, their global shapes and their dtypes, one flat tuple (built in C for the
    usual one or two operands); AttributeError when an operand is not a DTensor."""
    if len(xs) == 2:
        a, b = xs
        return name, id(a._layout), id(b._layout), a._shape, b._shape, a._local.dtype, b._local.dtype
    if len(xs) == 1:
        a = xs[0]
        return name, id(a._layout), a._shape, a._local.dtype
    return (name,) + tuple(map(id, map(LAYOUT, xs))) + tuple(map(SHAPE, xs)) + tuple(map(DTYPE, xs))


class Prepared:
    """What an operator planned by `decided` decides for one call signature (`signature`), the same on
    every rank and every call: a pure function of the key, so one table per operator serves every
    simulation (DESIGN section 3), bounded (`prepare`). A repeated call finds it with one tuple and one
    lookup and builds its result (`prepared_result`) and its graph node (``graph.attach``, with `want` and
    `reads`) without planning, checking or gathering layouts again.

    It holds the operands' layouts (`layouts`), so an id in its key is never another object's while it
    lives, and a call with the same layout objects passed the operator's checks before (its operands
    shared a mesh's device matrix, which their layouts name). `out` and `shape` are the result's layout
    (`result`: the plan's attribute naming it) and global shape; `reads` the node's read layouts (each
    operand's as the kernel reads it, its own or the one it moves to, then the result's); `block` the last
    result block shape make_dtensor checked for them, None until then: a block of that shape passes
    without its checks again (as make_dtensor's own ``_CHECKED`` would let it).
    """

    __slots__ = ("layouts", "plan", "dtype", "dtype_name", "stay", "stays", "out", "shape", "want", "reads", "block")

    def __init__(self, infer: Any, name: str, layouts: tuple, shapes: tuple, dtypes: tuple, result: str,
                 promote: Any = None) -> None:
        plan, self.dtype, self.dtype_name, stay = decided(infer, name, layouts, shapes, dtypes, promote)
        self.layouts, self.plan, self.stay, self.stays = layouts, plan, stay, all(stay)
        self.out, self.shape = getattr(plan, result), plan.shape
        self.want = with_partial(self.out, ())
        self.reads = tuple(layout if kept else target
                           for layout, target, kept in zip(layouts, plan.targets, stay)) + (self.out,)
        self.block = None


def prepare(table: dict, limit: int, make: Any, xs: Any, key: Any) -> Any:
    """``make(layouts, shapes, dtypes)`` of operands `xs` (checked DTensors), a `Prepared`, kept in `table`
    under `key` unless it is None (an operand the operator made itself, a lifted number) or a size is not a
    Python int (16.0 finds 16's entry)."""
    shapes = tuple(map(SHAPE, xs))
    out = make(tuple(map(LAYOUT, xs)), shapes, tuple(map(DTYPE, xs)))
    if key is not None and all(_ints(shape) for shape in shapes):
        put(table, key, out, limit)
    return out


def moved(xs: Any, prepared: Prepared) -> Any:
    """Operands `xs` in the layouts `prepared`'s plan reads them in: `xs` itself when none moves, else a tuple
    with those that move redistributed (the executor imported only then: ~2 us a call)."""
    if prepared.stays:
        return xs

    return tuple(x if kept else redistribute(_summable(x, target, prepared.dtype), target)
                 for x, target, kept in zip(xs, prepared.plan.targets, prepared.stay))


def _summable(x: Any, target: TensorLayout, dtype: np.dtype) -> Any:
    """`x`, or a bool `x` the plan makes join a pending sum (`target` partial: its value on one replica, zeros on
    the others) converted first to the result's `dtype` (`x - x.mean(0, keepdims=True)` of a bool x with dim 0
    of size 1 split: no pending sum holds bools, and the kernel computes the same values in that dtype)."""
    if target.partial and x._local.dtype.kind == "b" and dtype.kind != "b":
        return x.astype(dtype)
    return x


def prepared_result(mesh: Any, block: Any, prepared: Prepared) -> Any:
    """The result DTensor of a `Prepared` call: `block` under its layout and shape, checked by make_dtensor
    unless a block of its shape passed those checks before."""
    if type(block) is np.ndarray and block.shape == prepared.block and block.flags.c_contiguous:
        return _DTENSOR._trusted(mesh, block, prepared.out, prepared.shape)
    out = make_dtensor(mesh, block, prepared.out, prepared.shape)
    if type(block) is np.ndarray and out._local.dtype in _PLAIN_DTYPES and type(mesh) is _MESH:
        prepared.block = out._local.shape
    return out


def _ints(shape: tuple) -> bool:
    """Every size a Python int (a float or bool of equal value finds the same cache entry)."""
    for n in shape:
        if type(n) is not int:
            return False
    return True


# (id(layout), global shape) -> (that layout, that shape tuple, the shard shape) for result tensors
# DTensor() checked. Keyed by the layout object's id (an operator hands out the same layout objects
# every step; a TensorLayout key would call its Python __hash__ and __eq__), the entry holding the
# layout so its id is not reused while the entry lives; by the shape's value: a shape of Python ints
# equal to one that passed passes again (16.0 equals 16 and hashes alike: such a tuple is checked
# every time). Without it DTensor()'s checks are ~5 us of every operator's result (paid once per simulated rank).
_CHECKED: dict = {}
# Dtypes a shard may have without more checks (runtime.dtensor keeps the same set).
_PLAIN_DTYPES = frozenset(np.dtype(c) for c in np.typecodes["AllInteger"] + np.typecodes["AllFloat"])


def _dtensor_class() -> Any:
    """runtime.DTensor, bound into `_DTENSOR` (and Mesh into `_MESH`) at the first operator's call."""
    global _DTENSOR, _MESH
    _DTENSOR, _MESH = DTensor, Mesh
    return DTensor


def local_matmul(a: np.ndarray, b: np.ndarray, sent: bool = True) -> np.ndarray:
    """``np.matmul(a, b)`` as spmdsim.base.precision.product computes it (bfloat16 widened: a float32 product), of
    its dtype (`product_dtype`, numpy's np.matmul's) whether or not a collective sums it; placed for MPI
    (spmdsim.base.buffers) when a collective reads it next (`sent`): a pending sum of bfloat16 blocks is float32, as
    the whole product is, and the collective adds float32 (not rounded to bfloat16 on each rank first, as
    np.result_type's dtype, bfloat16, would have it).

    A product no collective reads (a column-parallel Linear without its
    gather) is numpy's own array: placing it costs ~2 us of Python, several
    times that at 4 ranks per core, and buys nothing. On the dry engine
    (spmdsim.runtime.sim.dry) the zeros it would give, not multiplied. Counted by spmdsim.base.flops either way.
    """
    engine = _context().engine
    if not sent or engine.dry:  # numpy's own array, or a dry run's zeros
        out = engine.matmul(a, b)
    else:
        lead_a, lead_b = a.shape[:-2], b.shape[:-2]
        # np.broadcast_shapes costs ~1 us (Python); equal or absent batch dims need none of it.
        lead = lead_a if lead_a == lead_b or not lead_b else np.broadcast_shapes(lead_a, lead_b)
        shape = lead + (a.shape[-2], b.shape[-1])
        da, db = a.dtype, b.dtype
        dtype = _PRODUCT_DTYPES.get((da, db))  # the whole product's dtype, decided once per pair
        if dtype is None:
            dtype = product_dtype(da, db)
        if da.kind == "V" or db.kind == "V":  # bfloat16 (is_low's first test): product's widened blocks
            a, b = wide(a), wide(b)
        out = matmul(a, b, out=buffers.empty(shape, dtype))
    gemm(a.shape, b.shape, out.dtype, (a, b, out))  # spmdsim.base.flops: one test unless a counter is open
    return out


#: In a dry run (spmdsim.runtime.sim.dry) an elementwise result of this many bytes or more is the dry engine's zeros,
#: its kernel not run; a smaller one is computed on the zeros (what a program may decide by: a count, a
#: mask), as a dry collective's result up to this size gets this rank's own values.
DRY_ZEROS_BYTES = DRY_VALUES_BYTES


def dry_zeros(mesh: Any, shape: tuple, dtype: Any, fn: Any, *args: Any) -> Optional[np.ndarray]:
    """In a dry run, the zeros that stand in for ``fn(*args)``, a result of `shape` and `dtype` of
    DRY_ZEROS_BYTES or more (`fn` not called); None on real ranks and for smaller results (compute them)."""
    if not mesh.engine.dry:
        return None
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < DRY_ZEROS_BYTES:
        return None
    return mesh.engine.local(fn, buffers.broadcast_zero(shape, dtype), *args)


def add_bias(owned: np.ndarray, bias: np.ndarray, op: str = "linear") -> np.ndarray:
    """``owned + bias``, in place when the sum keeps `owned`'s shape and dtype.

    `owned` must be the operator's own temporary (its local product or a
    collective's fresh result), never a caller's array. In place spares a new
    array per call, and the work a rank does before the next collective is
    paid several times over when ranks share cores (docs/explanation/performance.md).
    Dtypes numpy has no common one of (a float16 product, a bfloat16 bias): `no_bias_sum`'s line naming `op`.
    """
    try:  # (costs nothing unless numpy refuses)
        dtype = np.result_type(owned, bias)
    except TypeError:  # DTypePromotionError
        raise no_bias_sum(op, owned.dtype, bias.dtype) from None
    # A bias along the last dim (the usual case) keeps `owned`'s shape without np.broadcast_shapes (~1 us).
    fits = bias.shape == owned.shape[-1:] or bias.shape == owned.shape
    shape = owned.shape if fits else np.broadcast_shapes(owned.shape, bias.shape)
    if dtype == owned.dtype and shape == owned.shape and owned.flags.writeable:
        if buffers.is_lazy(owned):  # a dry run's zeros, whose sum is no result: adding wrote every page of them
            return owned
        return np.add(owned, bias, out=owned)
    out = buffers.empty(shape, dtype)
    return out if buffers.is_lazy(out) and buffers.is_lazy(owned) else np.add(owned, bias, out=out)


def no_bias_sum(op: str, product: np.dtype, bias: np.dtype) -> DTypeError:
    """`op`'s one-line refusal of a bias of dtype `bias` numpy has no common dtype with its products' (bfloat16
    beside float16, int16 and wider ints before ml_dtypes 0.7), the same on every rank (the dtypes are every
    rank's)."""
    why = "its np.result_type refuses a product of one plus a bias of the other"
    return DTypeError(f"{op}: {_no_common((product, bias), why)}")


def default_axes(mesh: Any, axes: Optional[Iterable[str] | str]) -> tuple[str, ...]:
    """The tensor-parallel axes: `axes` as a tuple, or every mesh axis when None."""
    if not isinstance(getattr(mesh, "layout", None), Layout):
        raise OperatorError(f"mesh must be a spmdsim Mesh, got {describe(mesh)}")
    if axes is None:
        return tuple(mesh.layout.alias_name)
    if not isinstance(axes, str) and not hasattr(axes, "__iter__"):
        raise OperatorError(f"axes {axes!r} must be a mesh axis name or a sequence of them")
    out = (axes,) if isinstance(axes, str) else tuple(axes)
    for alias in out:
        mesh.layout.axis_index(alias)
    return out


def scatter_local(x: Any, tensor_dim: int, axes: tuple[str, ...]) -> Any:
    """B -> S without communication: keep this rank's piece of a dim replicated over `axes`.

    Megatron's ``scatter_to_tensor_model_parallel_region`` / Paddle's ``_c_split``;
    the redistribution planner turns it into one local slice.
    """
    layout = x.layout
    used = [a for a in axes if a in layout.split_axes or a in layout.partial]
    if used:
        raise OperatorError(f"cannot split dim {tensor_dim} of {layout} over {axes!r}: {tuple(used)!r} already "
                            "split the tensor or hold a pending sum")
    new_map = list(layout.tensor_map)
    new_map[tensor_dim] = layout.tensor_map[tensor_dim] + axes
    return redistribute(x, TensorLayout(layout.layout, tuple(new_map), layout.partial))


def seeded_dtensor(mesh: Any, layout: TensorLayout, source: Any) -> Any:
    """This rank's shard of a SeededTensor as a DTensor (the global tensor is never built)."""
    return DTensor.from_seeded(mesh, layout, source)


_UNIFORM: dict = {}  # global shape -> SeededTensor(shape, "float64", 0, 0.0, 1.0), checked once


def _keep(shape: tuple, seed: Any, region: tuple, p: float, out: np.ndarray | None = None) -> np.ndarray:
    value = seed() if callable(seed) else seed
    uniform = _UNIFORM.get(shape)
    if uniform is None:
        uniform = put(_UNIFORM, shape, SeededTensor(shape, "float64", seed=0, low=0.0, high=1.0), 1024)
    return uniform_at_least(uniform, int(value), region, p, out)  # (with_seed(...).at_least(...), no object made)


#: A dropout's keep mask at this rank's `region`: ``SeededTensor(shape, seed) >= p`` there, as
#: ``keep_mask(shape, seed, region, p)``. `seed`: an int, or a callable giving one (a seed that changes
#: between replays of a captured step, read from a spmdsim.runtime.replay.Scalar): a capture records the
#: mask as one call, rerun by each replay into the captured mask (``out=``).
keep_mask = kernel(_keep, bind=bind_keep)  # a replay draws the mask with what the capture's draw kept
#: ``MASKS.keep_mask(...)``: `keep_mask`'s function itself where this thread does not capture (no wrapper's frame).
MASKS = kernels(keep_mask=keep_mask)


def seed_arg(seed: Any, op: str) -> None:
    """An OperatorError unless `seed` is an integer (not a bool) or a callable giving one."""
    if callable(seed):
        return
    if as_int(seed) is None or isinstance(seed, bool):
        raise OperatorError(f"{op}: seed {seed!r} must be an integer")
