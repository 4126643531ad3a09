"""DTensor's constructors (`from_local`, `from_seeded`, `full`, `zeros`, `ones`, `from_global`) and the
placement checks they share with DTensor itself; DTensor (spmdsim.runtime.dtensor) takes them from
`_Constructors`, a base class of its own.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Sequence, TypeVar

import numpy as np

from ..base import buffers
from ..base.foreign import take_foreign
from ..layouts.datagen import SeededTensor
from ..errors import DTypeError, LayoutError, OperatorError, RuntimeMismatchError, ShapeError
from ..layouts.layout import Layout, TensorLayout
from ..base.validate import counted, describe, dtype_arg, dtype_name, float_max, plain_array, shape_arg
from . import debug, debug_calls, door
from .mesh import Mesh
from .budget import check_seeded

#: The class a constructor is called on, which it makes one of (spmdsim.runtime.dtensor.DTensor, which takes these
#: constructors from this module).
_T = TypeVar("_T", bound="_Constructors")

_SEEDABLE = ("float32", "float64", "int32", "int64")  # SeededTensor's dtypes (full's size checks borrow it)


class _Maker(classmethod):
    """A constructor that, called on a tensor with no arguments (``y.full()``, a SeededTensor's whole tensor),
    says how to read the whole tensor instead of Python's "missing 4 required positional arguments"."""

    def __get__(self, tensor: Any, cls: Any = None) -> Any:
        make = super().__get__(tensor, cls)
        if tensor is None:
            return make

        def called(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs:
                raise OperatorError(f"x.{make.__name__}() takes the arguments of DTensor.{make.__name__}(mesh, "
                                    "layout, shape, value), a new tensor; the whole tensor of x is x.gather() "
                                    "(a collective every rank calls), this rank's block x.local")
            return make(*args, **kwargs)
        return called


class _Constructors:
    """DTensor's class methods that make one: each rank makes only its own block."""

    __slots__ = ()

    # -- constructors ------------------------------------------------------------
    @classmethod
    def from_local(cls: type[_T], mesh: Mesh, local: Any, layout: TensorLayout | None = None,
                   global_shape: Sequence[int] | None = None, dtype: Any = None, **foreign: Any) -> _T:
        """Wrap an existing shard; its shape (and `dtype` when given) must match. `layout` left out: replicated
        over every mesh axis, as PyTorch's ``from_local`` without placements.

        `global_shape` None: each dim's block times the number of its shards (even shards, as PyTorch's
        ``DTensor.from_local`` assumes without ``shape=``). Each rank works it out from its own block, so
        blocks of different sizes give the ranks different global shapes and wrong results: pass
        `global_shape`, or run with SPMDSIM_CHECK=1, whose guard compares the shapes across the mesh here.
        PyTorch's keywords: ``shape=`` is `global_shape`; ``run_check=False`` and ``stride=None`` are taken
        (spmdsim.base.foreign), other values refused in one line.
        """
        layout = _replicated(mesh, local, layout, "local shard")
        _check_placement(mesh, layout)  # first: a block passed where the mesh goes is named as such
        if foreign:
            global_shape = _pytorch_from_local(foreign, global_shape)
        local = plain_array(local, "local shard")
        if dtype is not None:
            dtype = dtype_arg(dtype)
            if local.dtype != dtype:
                raise DTypeError(f"local shard dtype {local.dtype.name!r} does not match {dtype.name!r}")
        if global_shape is None:
            if local.ndim != layout.ndim:
                raise ShapeError(f"local shard of shape {local.shape!r} has {counted(local.ndim, 'dim')} but the "
                                 f"layout {layout} maps {layout.ndim}"
                                 + (_short_map(layout, local.ndim) if local.ndim > layout.ndim else ""))
            if layout.layout.cut != "even" and layout.split_axes:
                # Shards may differ by rank: a size worked out from this rank's alone would differ too.
                raise ShapeError(f"from_local on a layout cut {layout.layout.cut!r} needs global_shape= "
                                 "(its shards may differ in size between ranks)")
            global_shape = tuple(n * layout.layout.group_size(entry) for n, entry in zip(local.shape,
                                                                                        layout.tensor_map))
            out = cls(mesh, local, layout, global_shape)
            if not debug.quiet():  # the guard: every rank's worked-out shape the same (one Allgather)
                debug_calls.verify_operands(mesh, "from_local", (("the global shape from its block", out._shape,
                                                                  layout, local.dtype),))
            return out
        return cls(mesh, local, layout, global_shape)

    @classmethod
    def from_seeded(cls: type[_T], mesh: Mesh, layout: TensorLayout, seeded: SeededTensor) -> _T:
        """Build only this rank's shard of a seeded global tensor."""
        _check_placement(mesh, layout)
        if not isinstance(seeded, SeededTensor):
            raise ShapeError(f"from_seeded needs a SeededTensor, got {type(seeded).__name__}"
                             f"{_shape_note(seeded)}; use DTensor.from_global for an array")
        shape = _cuttable_shape(layout, seeded.shape)
        check_seeded(mesh.comm, layout, seeded)  # before the shard exists, on every rank alike
        if _holds_value(mesh, layout):
            local = seeded.region(layout.slices(mesh.rank, shape))
        else:
            local = buffers.zeros(layout.local_shape(shape, mesh.rank), seeded.dtype)
        return cls(mesh, local, layout, shape)

    @_Maker
    def full(cls: type[_T], mesh: Mesh, layout: TensorLayout, shape: Sequence[int], value: Any,
             dtype: Any = "float64") -> _T:
        """A tensor of `shape` filled with `value`, each rank making only its block (PyTorch's
        ``torch.distributed.tensor.full``); a pending sum holds it on the first member, zeros on the others."""
        _check_placement(mesh, layout)
        kind = dtype_arg(dtype)
        name = dtype_name(kind)
        if isinstance(value, np.generic) or type(value) is np.ndarray and value.ndim == 0:  # np.array(2.0): a scalar
            value = value.item()
        _check_fill(value, kind, name)
        seeded = SeededTensor(shape_arg(shape), name if name in _SEEDABLE else "float64")
        shape = _cuttable_shape(layout, seeded.shape)
        check_seeded(mesh.comm, layout, seeded)  # the same limits as a generated tensor, on every rank alike
        local = buffers.zeros(layout.local_shape(shape, mesh.rank), kind)
        # A dry run's large block (lazy zeros) is not written: its values are not results, and a fill would touch
        # every page (a 10,000,000,000-wide GPT's weights, terabytes, would be filled element by element).
        if value and _holds_value(mesh, layout) and not buffers.is_lazy(local):
            local[...] = value
        return cls(mesh, local, layout, shape)

    @classmethod
    def zeros(cls: type[_T], mesh: Mesh, layout: TensorLayout, shape: Sequence[int], dtype: Any = "float64") -> _T:
        """Zeros of `shape`, each rank making only its block (PyTorch's ``torch.distributed.tensor.zeros``)."""
        return cls.full(mesh, layout, shape, 0, dtype)

    @classmethod
    def ones(cls: type[_T], mesh: Mesh, layout: TensorLayout, shape: Sequence[int], dtype: Any = "float64") -> _T:
        """Ones of `shape`, each rank making only its block (PyTorch's ``torch.distributed.tensor.ones``)."""
        return cls.full(mesh, layout, shape, 1, dtype)

    @classmethod
    def from_global(cls: type[_T], mesh: Mesh, array: Any, layout: TensorLayout | None = None,
                    verify: bool = True) -> _T:
        """Cut this rank's shard out of a global array every rank has (small demos).

        `layout` left out: replicated over every mesh axis, as PyTorch's ``distribute_tensor`` without
        placements. Every rank must pass the same array: each cuts its block from its own copy, so arrays that differ
        (drawn without a seed, say) would make a tensor no rank passed. `verify` checks that first, by two
        reductions of a 63-bit digest of the array's shape, dtype and bytes; `verify=False` skips them, for
        an array built alike on every rank by the program itself.
        """
        layout = _replicated(mesh, array, layout, "array")
        _check_placement(mesh, layout)
        array = plain_array(array, "array")
        dtype_arg(array.dtype, "array dtype")
        if verify and mesh.comm.Get_size() > 1:
            _check_same(mesh.comm, array)
        shape = _cuttable_shape(layout, array.shape)
        if _holds_value(mesh, layout):
            local = buffers.placed_copy(array[layout.slices(mesh.rank, shape)])
        else:
            local = buffers.zeros(layout.local_shape(shape, mesh.rank), array.dtype)
        return cls(mesh, local, layout, shape)


#: PyTorch's keywords of DTensor.from_local besides ``shape=`` (spmdsim.base.foreign's table).
_FROM_LOCAL_KEYWORDS = {
    "run_check": ((False,), "each rank's block is checked against the global shape; SPMDSIM_CHECK=1 (--check) "
                            "compares the ranks' shapes too, and a replicated block is never sent from the first "
                            "rank"),
    "stride": ((None,), "a block is a numpy array in C order, and so is the global tensor"),
}


def _pytorch_from_local(foreign: dict, global_shape: Any) -> Any:
    """`global_shape` of a from_local call given PyTorch's keywords `foreign`: its ``shape=`` (refused beside
    `global_shape`); the others taken or refused by `_FROM_LOCAL_KEYWORDS`."""
    if "shape" in foreign:
        if global_shape is not None:
            raise ShapeError(f"from_local got shape={foreign['shape']!r} and global_shape={global_shape!r}; "
                             "expected one: shape= is PyTorch's name for global_shape")
        foreign = dict(foreign)
        global_shape = foreign.pop("shape")
    take_foreign("from_local", foreign, _FROM_LOCAL_KEYWORDS)
    return global_shape


def _digest(array: np.ndarray) -> int:
    """A 63-bit digest of `array`'s shape, dtype and bytes (C order)."""
    h = hashlib.blake2b(f"{array.shape}{array.dtype.str}".encode(), digest_size=8)
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return int.from_bytes(h.digest(), "little") >> 1


def _check_same(comm: Any, array: np.ndarray) -> None:
    """Refuse, on every rank alike, a `from_global` whose ranks passed arrays that differ: rank 0's digest to all,
    then the first rank whose own differs (two reductions of one number each)."""
    mine, rank, size = _digest(array), comm.Get_rank(), comm.Get_size()
    first = door.all_reduce_object(comm, mine if rank == 0 else -1, "max")  # digests are never negative
    other = door.all_reduce_object(comm, rank if mine != first else size, "min")
    if other < size:
        raise RuntimeMismatchError(f"DTensor.from_global: ranks 0 and {other} passed different arrays; each rank "
                                   "cuts its block from its own copy, so every rank must pass the same array: draw "
                                   "it from a fixed seed (np.random.default_rng(0)), or build only each rank's "
                                   "block with DTensor.from_seeded")


def _check_fill(value: Any, kind: np.dtype, name: str) -> None:
    """Refuse a fill `value` that dtype `kind` (named `name`) cannot hold: no number (a complex one unless `kind` is
    complex); for a bool or an integer dtype a fraction, NaN or an infinity, or an integer past its range; a finite
    number (a complex one's parts) past a float dtype's largest (it would be stored as an infinity)."""
    held = isinstance(value, (int, float, bool)) or (isinstance(value, complex) and kind.kind == "c")
    span = ""
    if held and isinstance(value, float) and kind.kind in "iub":
        held = math.isfinite(value) and value == int(value)
    if kind.kind in "iu":
        info = np.iinfo(kind)
        span = f" (an integer in {info.min}..{info.max})"
        held = held and info.min <= value <= info.max
    elif held and kind.kind in "fVc":
        top = float_max(kind)
        span = f" (at most {top:g} in magnitude{' in each part' if kind.kind == 'c' else ''})"
        held = all(abs(part) <= top or (isinstance(part, float) and not math.isfinite(part))
                   for part in (value.real, value.imag))
    elif isinstance(value, complex):
        span = " (a real number)"
    if not held:
        shown = repr(value) if type(value) is not int or len(str(value)) <= 24 else f"of {len(str(abs(value)))} digits"
        raise DTypeError(f"fill value {shown} must be a number that dtype {name!r} holds{span}")


def _replicated(mesh: Any, block: Any, layout: Any, what: str) -> Any:
    """`layout`, or where it is left out (None) on a Mesh, `block` (named `what`) replicated over every mesh axis
    (PyTorch's default placements); a mesh that is no Mesh is left to `_check_placement` to name."""
    if layout is None and isinstance(mesh, Mesh):
        return mesh.layout(*[None] * plain_array(block, what).ndim)
    return layout


def _check_placement(mesh: Any, layout: Any) -> None:
    if type(layout) is TensorLayout and type(mesh) is Mesh and layout.layout is mesh.layout:
        return  # the usual case, in three identity tests
    if not isinstance(mesh, Mesh):
        raise LayoutError(f"mesh must be a spmdsim Mesh, got {describe(mesh)}; make one with "
                          "Mesh(Layout((2, 4), ('dp', 'tp'))), and pass it first")
    if not isinstance(layout, TensorLayout):
        raise LayoutError(_not_a_tensor_layout(layout))
    if layout.layout != mesh.layout:
        fix = ""
        if layout.layout.with_cut(mesh.layout.cut) == mesh.layout:  # the cut alone differs: the mesh takes it too
            cut = layout.layout.cut
            fix = (f"; a mesh cuts its tensors one way: make it Mesh({_layout_call(layout.layout, cut)}) to cut "
                   f"by {cut!r}")
        raise LayoutError(f"tensor layout is over {layout.layout} but the mesh is {mesh.layout}{fix}")


def _cuttable_shape(layout: TensorLayout, shape: tuple) -> tuple:
    """``layout.check_shape(shape)`` (`shape` a tuple of ints), a size the even cut cannot split refused naming
    the cuts that can (`_cut_hinted`)."""
    try:
        return layout.check_shape(shape)
    except ShapeError as exc:
        raise _cut_hinted(exc, layout, shape) from None


def _cut_hinted(exc: ShapeError, layout: TensorLayout, shape: tuple) -> ShapeError:
    """`exc`, a refusal of `shape` (a tuple of ints) on `layout`, naming the cuts that can split it where `layout`
    cuts evenly a dim that does not divide: the mesh's Layout with cut="balanced" or "chunk" (every constructor
    and redistribute cut by either; docs/explanation/semantics.md, "Uneven shards"); a map shorter than the shape
    naming how to pad it (`_short_map`); else `exc` as it is."""
    if len(shape) > layout.ndim:
        return ShapeError(f"{exc}{_short_map(layout, len(shape))}")
    if layout.layout.cut != "even" or len(shape) != layout.ndim or not any(
            n % k for n, k in zip(shape, layout.shards_per_dim)):
        return exc
    return ShapeError(f"{exc}; a mesh of {_layout_call(layout.layout, 'balanced')} cuts it unevenly (shards differing "
                      "by at most one), or of cut='chunk' as DTensor's torch.chunk does")


def _short_map(layout: TensorLayout, ndim: int) -> str:
    """How to write `layout`, shorter than a tensor of `ndim` dims, for all of them: JAX pads a short PartitionSpec
    with None, spmdsim's converters where told the number of dims. Every converter is named: the layout does not
    say which made it (DTensor placements made for 2 dims put a Shard(-1) on dim 1 of a 3-d tensor)."""
    padded = ", ".join([*(repr(a[0]) if len(a) == 1 else repr(a) if a else "None" for a in layout.tensor_map),
                        *["None"] * (ndim - layout.ndim)]) + (f", partial={layout.partial!r}" if layout.partial else "")
    return (f"; expected one entry per dim, None where not split (mesh.layout({padded})); a dialect's converter "
            f"takes the number of dims: placements_to_layout(placements, mesh, {ndim}) (a negative Shard dim counts "
            f"from the last of them), sbp_to_layout(sbp, mesh, {ndim}) or partition_spec_to_layout(spec, mesh, "
            f"{ndim}) (which pads a shorter JAX PartitionSpec with None, as JAX does)")


def _layout_call(layout: Layout, cut: str) -> str:
    """The call that makes `layout`'s device matrix cutting by `cut`: "Layout((2, 4), ('dp', 'tp'), cut='chunk')"."""
    return f"Layout({layout.device_matrix!r}, {layout.alias_name!r}, cut={cut!r})"


def _not_a_tensor_layout(layout: Any, name: str = "layout") -> str:
    """The refusal of a `layout` that is no TensorLayout (`name`: what the caller calls it, a redistribution's
    "target"), saying how to make one from what was given (a PartitionSpec tuple, DTensor placements, a device
    matrix's Layout) rather than only its type."""
    if isinstance(layout, Layout):
        how = ("a Layout is the device matrix alone; call it with each tensor dim's mesh axis (or None): "
               f"layout({layout.alias_name[0]!r}, None)")
    else:
        how = ("make one with mesh.layout('dp', None) (a mesh axis or None per tensor dim), or from a dialect "
               "with spmdsim.layouts.dialects' placements_to_layout(placements, mesh, ndim) or "
               "partition_spec_to_layout(spec, mesh, ndim)")
    return f"{name} must be a TensorLayout, got {describe(layout)}; {how}"


def _shape_note(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "" if shape is None else f" of shape {tuple(shape)!r}"


def _holds_value(mesh: Mesh, layout: TensorLayout) -> bool:
    """True unless this rank is a non-zero member over the partial axes (those hold zeros)."""
    return not layout.partial or layout.layout.group_index(mesh.rank, layout.partial) == 0
