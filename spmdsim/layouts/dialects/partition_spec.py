"""JAX PartitionSpec (as a plain tuple) <-> TensorLayout.

A spec has one entry per tensor dim: ``None`` (not split), a mesh axis name,
or a tuple of names (split over several axes, the first listed major, as in
JAX and docs/explanation/semantics.md). Mesh axes the spec does not name are replicated. jax is
never imported; ``PartitionSpec("x", None)`` is written ``("x", None)``, or as text the way the CLI's
``--partition-spec`` reads it: ``"P('x', None)"``, ``"('x', None)"`` or ``"x,None"``.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...errors import DialectError
from ..layout import Layout, TensorLayout
from ...base.validate import counted
from ...errors import SpmdsimError
from ._common import as_items, mesh_of, ndim_of, parse_partition_spec, refuse_keywords, require_layout
from ...base.deprecated import deprecated

__all__ = ["partition_spec_to_layout", "layout_to_partition_spec", "format_partition_spec"]

_ENTRY = "None, a mesh axis name or a tuple of mesh axis names"


#: How JAX's PartitionSpec.UNCONSTRAINED reads: its repr, and the spellings of it in text.
_UNCONSTRAINED = ("UNCONSTRAINED", "P.UNCONSTRAINED", "PartitionSpec.UNCONSTRAINED")


def _parsed(text: str) -> tuple:
    """A spec written as text, read as the CLI's --partition-spec reads it (one parser: _common's)."""
    try:
        return parse_partition_spec(text)
    except DialectError:
        raise
    except SpmdsimError as exc:
        raise DialectError(str(exc)) from None


def _entry(item: object, spec: object, names: tuple[str, ...], seen: set) -> tuple[str, ...]:
    if item is None:
        return ()
    shown = item if isinstance(item, str) else repr(item)
    if shown in _UNCONSTRAINED and item not in names:
        raise DialectError(f"partition spec {spec!r} has entry {shown}: JAX's 'let the compiler choose' "
                           "(with_sharding_constraint), which spmdsim does not model (it runs each operator "
                           f"eagerly on the layouts it is given); expected {_ENTRY} for that dim")
    axes = _axes(item, spec, seen)
    for axis in axes:
        if axis not in names:
            raise DialectError(
                f"partition spec {spec!r} names mesh axis {axis!r}, which is not one of "
                f"the mesh axes {names!r}"
            )
    return axes


def _axes(item: object, spec: object, seen: set) -> tuple[str, ...]:
    """The mesh axes of one entry of `spec` (() for None), each added to `seen`; DialectError for an entry that
    is none of `_ENTRY`, or an axis already in `seen` (a mesh axis shards at most one tensor dim)."""
    if item is None:
        return ()
    if isinstance(item, str):
        axes = (item,)
    else:
        listed = as_items(item)
        if listed is None or not all(isinstance(a, str) for a in listed):
            raise DialectError(f"partition spec {spec!r} has entry {item!r}; expected {_ENTRY}")
        axes = tuple(listed)
    for axis in axes:
        if axis in seen:
            raise DialectError(
                f"partition spec {spec!r} uses mesh axis {axis!r} more than once; "
                "each mesh axis may shard at most one tensor dim"
            )
        seen.add(axis)
    return axes


def _entries(spec: object) -> tuple[object, list]:
    """(`spec`, its entries): text read as the CLI's --partition-spec reads it (`_parsed`); DialectError for a
    spec that is no sequence of entries."""
    if isinstance(spec, str):  # as the CLI's --partition-spec reads it: "P('dp', None)", "('dp', None)", "dp,None"
        spec = _parsed(spec)
    entries = as_items(spec)
    if entries is None:
        raise DialectError(
            f"partition spec {spec!r} must be a tuple with one entry per tensor dim "
            f"({_ENTRY}), e.g. ('dp', None)"
        )
    return spec, entries


def partition_spec_to_layout(
    spec: Sequence[object],
    mesh_shape: Sequence[int],
    ndim: Optional[int] = None,
    mesh_axis_names: Optional[Sequence[str]] = None,
    cut: Optional[str] = None,
    **others: object,
) -> TensorLayout:
    """TensorLayout of a tensor sharded by `spec` over a mesh of `mesh_shape`.

    JAX requires every sharded dim to divide: the layout cuts evenly (and refuses
    other sizes) unless `cut` names another rule ("chunk", "balanced"), or the
    mesh is a Layout with one (docs/explanation/semantics.md, "Uneven shards").

    Mesh axes are named ``"axis_0", "axis_1", ...`` unless `mesh_axis_names` is
    given, or `mesh_shape` is a spmdsim Layout or Mesh (named axes:
    ``partition_spec_to_layout(("dp", None), mesh)``). With `ndim`, a shorter
    spec is padded with None (JAX's trailing-dims rule). The old order
    ``(spec, mesh_axis_names, mesh_shape, ndim)`` still works, with a
    DeprecationWarning.
    """
    refuse_keywords(others, "partition_spec_to_layout")
    if as_items(mesh_shape) and all(isinstance(n, str) for n in as_items(mesh_shape)):
        deprecated("partition_spec_to_layout(spec, mesh_axis_names, mesh_shape, ndim)",
                   "partition_spec_to_layout(spec, mesh_shape, ndim, mesh_axis_names)")
        mesh_axis_names, mesh_shape, ndim = mesh_shape, ndim, mesh_axis_names
    spec, entries = _entries(spec)
    shape, names, base = mesh_of(mesh_shape, mesh_axis_names)
    if ndim is not None:
        dims = ndim_of(ndim)
        if len(entries) > dims:
            raise DialectError(
                f"partition spec {spec!r} has {counted(len(entries), 'entry')} but the tensor has "
                f"{counted(dims, 'dim')}"
            )
        entries = entries + [None] * (dims - len(entries))
    seen: set = set()
    tensor_map = tuple(_entry(item, spec, names, seen) for item in entries)
    mesh = base or Layout(shape, names)
    return (mesh if cut is None else mesh.with_cut(cut))(*tensor_map)


def layout_to_partition_spec(tl: TensorLayout) -> tuple:
    """The PartitionSpec of `tl` as a tuple, one entry per tensor dim.

    Raises DialectError for partial layouts: a PartitionSpec has no pending sums.
    """
    require_layout(tl)
    if tl.partial:
        raise DialectError(
            f"PartitionSpec cannot express partial sums over {tl.partial!r}; "
            "reduce them first (allreduce or reduce_scatter)"
        )
    return tuple(
        None if not axes else axes[0] if len(axes) == 1 else axes for axes in tl.tensor_map
    )


def format_partition_spec(spec: Sequence[object]) -> str:
    """JAX's spelling: ``PartitionSpec('mp', ('sp', 'dp'))``.

    `spec`: a tuple, or text as `partition_spec_to_layout` reads it; DialectError for a spec that it refuses
    whatever the mesh (no sequence, an entry that is no axis name, an axis named twice)."""
    spec, entries = _entries(spec)
    seen: set = set()
    for item in entries:
        _axes(item, spec, seen)
    return "PartitionSpec(" + ", ".join(repr(e) for e in entries) + ")"
