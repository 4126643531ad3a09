"""DTensor: this rank's shard of a global tensor plus the TensorLayout that places it.

A partial layout means the global value is the sum over the partial axes of
the local values; when one is built from full data, the member with index 0
over the partial axes holds the value and the others hold zeros (B -> P).
"""
from __future__ import annotations

import math
from functools import lru_cache
from operator import attrgetter
from typing import Any, Callable, Sequence, Union

import numpy as np

from ..base import buffers
from ..base.foreign import take_foreign
from ..layouts.datagen import SeededTensor
from ..errors import DTypeError, OperatorError, PlanError, RankError, ShapeError, SpmdsimError
from ..layouts.layout import TensorLayout
from ..base.context import current as _context
from ..base.validate import as_int, describe, dtype_arg, plain_array, tolerance_arg
from . import door
from .replay import local_of
from .check import (Verdict, agree, checked_scale, count_once, default_tolerances, local_stats, mismatch_record,
                    passed_record, place)
from .mesh import Mesh
from ..layouts.dialects.dtensor import placements_of
from ..layouts.dialects.partition_spec import layout_to_partition_spec
from .executor import redistribute, resolve
from .dtensor_build import _Constructors, _check_placement
from .dtensor_methods import _OPERATORS, _Methods

__all__ = ["DTensor"]

# Dtypes a shard may have without more checks: numeric, not bool, native byte
# order (a set lookup; the rest goes through _check_dtype).
_PLAIN_DTYPES = frozenset(np.dtype(c) for c in np.typecodes["AllInteger"] + np.typecodes["AllFloat"]
                          if c not in "gG")  # long double: refused by dtype_arg

Reference = Union[SeededTensor, np.ndarray, Callable[[tuple], Any]]


# typed, the sizes as separate arguments: (16.0, 8) and (True, 8) hash like (16, 8) and (1, 8) and must miss.
@lru_cache(maxsize=1024, typed=True)
def _checked_shapes(layout: TensorLayout, rank: int, *global_shape: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global shape as ints, `rank`'s shard shape), cached: deriving the shard shape of every
    operator's result is ~6 us of each call (a failed check raises and is not cached)."""
    shape = layout.check_shape(global_shape)
    return shape, layout.local_shape(shape, rank)


_new = object.__new__
#: PyTorch's keywords of DTensor.redistribute besides (device_mesh, placements): spmdsim.base.foreign's table.
_REDISTRIBUTE_KEYWORDS = {
    "async_op": ((False,), "the move is done when redistribute returns (collectives run eagerly)"),
    "forward_dtype": ((None,), "the data keeps its dtype: x.astype(dtype) before or after"),
    "backward_dtype": ((None,), "the gradient keeps the dtype of the forward's data"),
}


def refuse_truncated(layout: TensorLayout, have: np.dtype, want: np.dtype) -> None:
    """The DTypeError of a cast to integers or bools (`want`) of a pending sum (`layout` partial) of floats
    (`have`), on every rank alike: the sum of truncated addends is not the truncated sum."""
    if layout.partial and want.kind in "biu" and have.kind not in "biu":
        raise DTypeError(
            f"astype({want.name!r}) of a pending sum over {layout.partial!r} of dtype {have.name!r}: the addends "
            "would be truncated one by one; resolve the sum first (redistribute to a layout without partial axes)")


class DTensor(_Constructors, _Methods):
    """``DTensor(mesh, local, layout, global_shape)``; treat it as an immutable value.

    Attributes: ``mesh``, ``local`` (this rank's shard), ``layout``,
    ``global_shape``, ``dtype``, ``partial`` and ``slices`` (this rank's region
    of the global tensor); ``placements`` and ``partition_spec`` (the layout in
    PyTorch's and JAX's words); ``requires_grad`` and ``grad`` (docs/howto/train.md).
    """

    # _ag: autograd's record (None, a Leaf or a Node; spmdsim.nn.autograd), None unless asked for.
    __slots__ = ("_mesh", "_local", "_layout", "_shape", "_ag")

    def __init__(self, mesh: Mesh, local: np.ndarray, layout: TensorLayout,
                 global_shape: Sequence[int]) -> None:
        _check_placement(mesh, layout)
        try:
            if type(global_shape) is not tuple:  # a string must not be unpacked into sizes
                raise TypeError
            shape, expected = _checked_shapes(layout, mesh.rank, *global_shape)
        except TypeError:  # a list or unhashable sizes: checked without the cache
            shape = layout.check_shape(global_shape)
            expected = layout.local_shape(shape, mesh.rank)
        local = local if type(local) is np.ndarray else plain_array(local, "local shard")
        if local.shape != expected:
            raise ShapeError(f"local shard shape {local.shape!r} does not match {expected!r}, the shard of "
                             f"global shape {shape!r} under {layout}")
        if local.dtype not in _PLAIN_DTYPES:
            _check_dtype(local.dtype, layout)
        self._mesh, self._local, self._layout, self._shape = mesh, local, layout, shape
        self._ag = None

    @classmethod
    def _trusted(cls, mesh: Mesh, local: np.ndarray, layout: TensorLayout,
                 global_shape: tuple[int, ...]) -> "DTensor":
        """No checks (~6 us less): for runtime code that checked `local` against `layout` itself (runtime.executor)."""
        self = _new(cls)  # object.__new__ read once: not looked up on the class each call (~430 a rank-step)
        self._mesh, self._local, self._layout, self._shape, self._ag = mesh, local, layout, global_shape, None
        return self

    def astype(self, dtype: Any) -> "DTensor":
        """This tensor with every shard converted to `dtype` (same layout; no communication); where autograd
        records this tensor, `spmdsim.nn.ops.astype`, which records the cast (PyTorch's ``x.float()``).

        A pending sum may widen but not be cut to integers: the sum of truncated addends is not the truncated sum.
        """
        want = dtype_arg(dtype)
        if self._ag is not None:  # (it was converted here alone: a graph's gradient stopped at every x.astype)
            return _OPERATORS.astype(self, want)
        refuse_truncated(self._layout, self._local.dtype, want)
        local = local_of(self)  # converted by the engine (a dry run's: zeros of the new dtype, no page written)
        block = self._mesh.engine.local(buffers.converted, buffers.broadcast_zero(local.shape, want), local, want)
        return DTensor(self._mesh, block, self._layout, self._shape)

    # -- views (read-only; attrgetter: C, the operators and autograd read them often) --
    mesh = property(attrgetter("_mesh"))
    local = property(local_of, doc="this rank's block (seen as recorded while this thread captures a step: "
                                   "spmdsim.runtime.replay)")
    layout = property(attrgetter("_layout"))
    global_shape = property(attrgetter("_shape"))
    shape = property(attrgetter("_shape"), doc="the global shape (as PyTorch's DTensor), not this rank's block's")
    ndim = property(lambda self: len(self._shape), doc="the number of global dims")
    dtype = property(attrgetter("_local.dtype"))
    partial = property(attrgetter("_layout.partial"))

    @property
    def slices(self) -> tuple[slice, ...]:
        return self._layout.slices(self._mesh.rank, self._shape)

    @property
    def placements(self) -> tuple:
        """The layout as PyTorch DTensor placements, one per mesh axis (``(Shard(0), Replicate())``); refused
        (DialectError) where DTensor would cut this tensor's shape otherwise (a size that does not divide under
        the balanced cut, which DTensor does not have: docs/explanation/semantics.md, "Uneven shards")."""
        return placements_of(self._layout, self._shape)

    @property
    def partition_spec(self) -> tuple:
        """The layout as a JAX PartitionSpec tuple, one entry per dim (``("dp", None)``); none for a pending sum."""
        return layout_to_partition_spec(self._layout)

    def __repr__(self) -> str:
        # No rank: a refusal that quotes a DTensor passed where a number goes (ops.scale(x, norm)) reads alike on
        # every rank, one line, not one rank's text and "ranks differ: ..."; x.mesh.rank says which rank holds it.
        return (f"DTensor(shape={self._shape!r}, layout={self._layout}, dtype={self.dtype.name}, "
                f"local_shape={self._local.shape!r})")

    def redistribute(self, target: TensorLayout | None = None, *placements: Any, **foreign: Any) -> "DTensor":
        """This tensor re-laid out as `target` by the least-communication plan (`spmdsim.redistribute`).

        PyTorch's ``(device_mesh, placements)``, positional or by keyword, and OneFlow's ``sbp=`` are refused in
        one line naming the layout to pass; its ``async_op=False`` and dtypes of None are taken
        (spmdsim.base.foreign)."""
        if placements or "device_mesh" in foreign or "placements" in foreign:
            raise PlanError("redistribute takes the target TensorLayout alone, not PyTorch's (device_mesh, "
                            "placements): x.redistribute(placements_to_layout(placements, x.mesh, x.ndim)), "
                            "from spmdsim.layouts.dialects")
        if "sbp" in foreign:  # OneFlow's x.to_global(placement, sbp)
            raise PlanError("redistribute takes the target TensorLayout alone, not OneFlow's (placement, sbp): "
                            "x.redistribute(sbp_to_layout(sbp, x.mesh, x.ndim)), from spmdsim.layouts.dialects")
        if foreign:
            take_foreign("redistribute", foreign, _REDISTRIBUTE_KEYWORDS)
        return redistribute(self, target)

    def resolved_local(self, label: str | None = None) -> np.ndarray:
        """This rank's shard with pending partial sums added up (the local array if none)."""
        if not self._layout.partial:
            return local_of(self)
        return resolve(self._mesh, local_of(self), self._layout, label)

    # -- whole-tensor views ------------------------------------------------------------
    def item(self) -> float | int | bool:
        """A 0-d tensor's value as a Python number (a loss); no communication, so any rank may call it.

        A pending sum is refused: adding it up is a collective every rank must enter
        (``ops.resolved(x).item()`` on every rank).
        """
        return self._value("item()")

    def __float__(self) -> float:
        return float(self._value("float(x)"))

    def __int__(self) -> int:
        """``int(x)`` of a 0-d tensor, as numpy's (a float truncated toward zero): `item`'s refusals otherwise."""
        return int(self._value("int(x)"))

    def _value(self, call: str) -> float | int | bool:
        """`item`, its refusals naming `call` (the program's ``float(x)`` says float(x), not item())."""
        if self._shape != ():
            raise OperatorError(f"{call} needs a 0-d DTensor (a scalar such as a loss), got global shape "
                                f"{self._shape!r}; gather() returns the whole tensor")
        if self._layout.partial:
            raise OperatorError(f"{call}: the scalar is a pending sum over {self._layout.partial!r}; add it up "
                                "first on every rank (a collective): ops.resolved(x).item()")
        return local_of(self).item()

    def gather(self, root: int | None = None) -> np.ndarray | None:
        """The global tensor on every rank (root=None) or on mesh rank `root` (None elsewhere)."""
        mesh = self._mesh
        if root is not None:
            # Checked on every rank before the first collective: a root that only
            # passed a range check (1.5) would send ranks down different paths.
            index = as_int(root)
            if index is None or not 0 <= index < mesh.size:
                raise RankError(f"gather root {root!r} is not a mesh rank (an integer with "
                                 f"0 <= root < {mesh.size})")
            root = index
        local = np.ascontiguousarray(self.resolved_local(label="gather"))
        uneven = self._layout.uneven_dims(self._shape)
        if uneven:  # shards of unequal sizes travel padded to the largest (every rank's slot alike)
            padded = np.zeros(self._layout.max_local_shape(self._shape), local.dtype)
            padded[tuple(slice(0, n) for n in local.shape)] = local
            local = padded
        stack = buffers.empty((mesh.size,) + local.shape, local.dtype) if root in (None, mesh.rank) else None
        comm, polite = mesh.comm, mesh.polite
        if root is None:
            door.transfer(comm, "gather", (), local, (), polite, mesh.engine.all_gather, local, stack)
        else:
            door.transfer(comm, "gather", (), local, (root,), polite, mesh.engine.gather_to, local, stack, root)
        if stack is None:
            return None
        out = np.empty(self._shape, local.dtype)
        block = self._local.shape  # a 0-d shard travels as one element
        for rank in range(mesh.size):
            if uneven:
                region = self._layout.slices(rank, self._shape)
                out[region] = stack[rank][tuple(slice(0, s.stop - s.start) for s in region)]
            else:
                out[self._layout.slices(rank, self._shape)] = stack[rank].reshape(block)
        return out

    def check(self, reference: Reference, rtol: float | None = None,
              atol: float | None = None, scale: Any = None) -> Verdict:
        """Compare this rank's region with `reference`; all ranks return the same Verdict (collective).

        `reference`: a SeededTensor, a global ndarray, or a callable taking a
        tuple of slices and returning that region; only this rank's region is
        made. Partial values are summed first (traced with label "check").
        `scale`: the magnitudes that entered each element (a global ndarray of
        the tensor's shape, or a callable of the region's slices; for a sum or
        product, the sum of its terms' absolute values): an element passes
        within atol + rtol x the larger of it and |reference| (docs/explanation/semantics.md,
        "Tolerances").
        """
        # Checked before the first collective, on every rank alike: a negative or NaN
        # tolerance fails even exact values ("FAILED ... max abs err 0").
        rtol = None if rtol is None else tolerance_arg(rtol, "rtol")
        atol = None if atol is None else tolerance_arg(atol, "atol")
        _check_whole_reference(reference, self._shape)
        if scale is not None and not callable(scale):  # every rank's alike: refused before any collective
            scale = plain_array(scale, "check: scale", SpmdsimError)  # (a ragged list: one line, no traceback)
            if scale.shape != self._shape:
                raise ShapeError(f"check: scale of shape {scale.shape!r} does not match the tensor's "
                                 f"global shape {self._shape!r}")
            scale = checked_scale(scale)
        actual = self.resolved_local(label="check")
        region = self.slices
        # Tolerances depend only on dtypes every rank knows, so the verdict agrees.
        known = [actual.dtype]
        if isinstance(reference, SeededTensor):
            known.append(np.dtype(reference.dtype))
        elif isinstance(reference, np.ndarray):
            known.append(reference.dtype)
        d_rtol, d_atol = default_tolerances(*known)
        rtol = d_rtol if rtol is None else rtol
        atol = d_atol if atol is None else atol
        dry = _context().dry_run
        try:
            if dry:  # a dry run has no values to check: its reference is not made, nothing is compared
                stats = passed_record(actual.size)
            elif isinstance(reference, SeededTensor):
                expected = reference.region(region)
            elif callable(reference):
                expected = np.asarray(reference(region))
            else:
                reference = np.asarray(reference)
                if reference.shape != self._shape:
                    raise ShapeError(f"reference shape {reference.shape!r} differs from {self._shape!r}")
                expected = reference[region]
            if not dry:
                region_scale = None
                if scale is not None:
                    region_scale = checked_scale(scale(region), "check: scale(region)") if callable(scale) \
                        else scale[region]
                stats = local_stats(actual, expected, rtol, atol, region_scale)
                place(stats, region, self._shape)
        except ShapeError:
            # A mismatch on some ranks only must not skip the agreeing Allgather.
            stats = mismatch_record(actual.size)
        if not _primary(self._mesh, self._layout):
            count_once(stats)  # each global element counted once, not once per replica
        # A dry run's verdict (agree's): passed, dry_run=True, its text saying no check was made; each
        # global element counted once (the dry communicator's table holds rank 0's record for every rank).
        return agree(self._mesh.comm, stats, rtol, atol, self._mesh.polite, scaled=scale is not None,
                     elements=math.prod(self._shape) if dry else None, shape=self._shape)


def _check_whole_reference(reference: Any, shape: tuple) -> None:
    """Refuse, before any collective, a whole-tensor reference (every rank passes the same) whose shape is not
    `shape`: an array of another shape, or what is no array of it at all (`x.check("y")`, `x.check(None)` would
    otherwise give a verdict 'FAILED ... max abs err inf ... shard shape differs'). A function of the region passes."""
    if isinstance(reference, np.ndarray):
        plain_array(reference, "check: reference")
    if isinstance(reference, (SeededTensor, np.ndarray)):
        given, what = tuple(reference.shape), f"reference of shape {tuple(reference.shape)!r}"
    elif isinstance(reference, DTensor):  # (np.shape() of it gave numpy's array refusal, naming no check)
        raise OperatorError(f"check: the reference is a DTensor of global shape {tuple(reference.global_shape)!r}; "
                            "expected the whole tensor as a numpy array: pass what its gather() returns (a "
                            "collective: every rank calls it)")
    elif callable(reference):  # a region reference of spmdsim.references says its result's shape
        given = getattr(reference, "shape", shape)
        what = f"region reference of shape {given!r}"
    else:
        try:  # a nested list or a number of the tensor's shape passes, as np.asarray reads it
            given = np.shape(reference)
        except ValueError:  # a ragged list
            given = None
        what = f"reference {describe(reference)}"
    if given != shape:
        raise ShapeError(f"check: {what} does not match the tensor's global shape {shape!r}; expected the whole "
                         "global tensor (a SeededTensor or an ndarray of that shape), or a function of the "
                         "region's slices")


def _check_dtype(dtype: np.dtype, layout: TensorLayout) -> None:
    """Raise unless a shard of `dtype` can move (and, under a partial layout, be summed) by MPI."""
    dtype_arg(dtype, "local shard dtype")  # names the dtype and what is supported
    if dtype.kind == "b" and layout.partial:
        raise DTypeError(f"a bool tensor cannot be a pending sum ({layout}); MPI has no sum of "
                         "bools: use an integer dtype")


def _primary(mesh: Mesh, layout: TensorLayout) -> bool:
    """True on the first replica of this shard (over replicated and partial axes)."""
    axes = layout.replicated_axes + layout.partial
    return not axes or layout.layout.group_index(mesh.rank, axes) == 0
