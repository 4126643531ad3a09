"""What a DTensor's constructors refuse, in one line each: a mesh that is no Mesh, a layout that is no
TensorLayout of the mesh's device matrix, a shard dtype MPI cannot move or sum."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..base.validate import describe, dtype_arg
from ..errors import DTypeError, LayoutError
from ..layouts.layout import Layout, TensorLayout
from .mesh import Mesh


def _check_dtype(dtype: np.dtype, layout: TensorLayout) -> None:
    """Raise unless a shard of `dtype` can move (and, under a partial layout, be summed) by MPI."""
    dtype_arg(dtype, "local shard dtype")  # names the dtype and what is supported
    if dtype.kind == "b" and layout.partial:
        raise DTypeError(f"a bool tensor cannot be a pending sum ({layout}); MPI has no sum of "
                         "bools: use an integer dtype")


def _check_placement(mesh: Any, layout: Any) -> None:
    if type(layout) is TensorLayout and type(mesh) is Mesh and layout.layout is mesh.layout:
        return  # the usual case, in three identity tests
    if not isinstance(mesh, Mesh):
        # (described: an ndarray passed as the mesh was its whole repr, many lines)
        raise LayoutError(f"mesh must be a spmdsim Mesh, got {describe(mesh)}; make one with "
                          "Mesh(Layout((2, 4), ('dp', 'tp'))), and pass it first")
    if not isinstance(layout, TensorLayout):
        raise LayoutError(_not_a_tensor_layout(layout))
    if layout.layout != mesh.layout:
        raise LayoutError(f"tensor layout is over {layout.layout} but the mesh is {mesh.layout}")


def _not_a_tensor_layout(layout: Any) -> str:
    """The refusal of a `layout` that is no TensorLayout, saying how to make one from what was given (a
    PartitionSpec tuple, DTensor placements, a device matrix's Layout) rather than only its type."""
    if isinstance(layout, Layout):
        how = ("a Layout is the device matrix alone; call it with each tensor dim's mesh axis (or None): "
               f"layout({layout.alias_name[0]!r}, None)")
    else:
        how = ("make one with mesh.layout('dp', None) (a mesh axis or None per tensor dim), or from a dialect "
               "with spmdsim.layouts.dialects' placements_to_layout(placements, mesh, ndim) or "
               "partition_spec_to_layout(spec, mesh, ndim)")
    return f"layout must be a TensorLayout, got {describe(layout)}; {how}"


def _shape_note(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "" if shape is None else f" of shape {tuple(shape)!r}"
