"""Paddle's ``paddle.distributed.split`` front end over spmdsim's Linear and Embedding.

``split(x, size, operation="linear"|"embedding", axis, num_partitions, gather_out)``
runs on a mesh with a model-parallel axis "mp" of size num_partitions (see
`paddle_mesh`; other axes act as data parallel). The layouts come from
`spmdsim.layouts.dialects.paddle.split_layouts` (Paddle's distributed.split):

* linear, axis=0: row-parallel; x is split on its last dim locally when it is
  replicated (Paddle's ``_c_split``), Allreduce, bias added after the sum;
* linear, axis=1: column-parallel; Allgather when gather_out (the default);
* embedding: vocab-parallel with a zero padding row per rank; Allreduce.

Paddle creates the weights inside ``split``; here ``weight_attr`` /
``bias_attr`` name them as a SeededTensor or a seed (None: seed 0 / seed 1),
so a reference can rebuild them. ``bias_attr=False`` means no bias.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ...layouts.datagen import SeededTensor
# The pure part (layouts, parameters) lives in the dialect; importable from here as before.
from ...layouts.dialects.paddle import MP_AXIS, ParamAttr, paddle_layout, paddle_param, split_layouts
from ...errors import DialectError, OperatorError, RankCountError
from ._common import scatter_local, seeded_dtensor
from ._operands import check_dtensor
from ...runtime.engines import engine_of, launcher, ways_out, world
from ...runtime import Mesh
from .embedding import embedding
from .linear import linear

__all__ = ["split", "paddle_mesh", "paddle_layout", "paddle_param"]


def paddle_mesh(num_partitions: int, comm: Any = None) -> Any:
    """A runtime Mesh over `comm` (default `spmdsim.world()`) with the layout of `paddle_layout`."""
    comm = world() if comm is None else comm
    if not engine_of(comm).simulated:
        from mpi4py import MPI

        if not isinstance(comm, MPI.Intracomm):
            raise OperatorError(f"comm {comm!r} must be an MPI intracommunicator (default COMM_WORLD)")
    size = comm.Get_size()
    try:
        layout = paddle_layout(num_partitions, size)
    except RankCountError as exc:  # over the whole world: how to get ranks it divides, as Mesh says its own
        if size != world().Get_size():
            raise
        raise exc.with_ways(ways_out(exc.needed, size, launcher(size))) from None
    return Mesh(layout, comm)


def _mp_axis(mesh: Any, num_partitions: int) -> str:
    layout = mesh.layout
    if MP_AXIS in layout.alias_name and layout.axis_size(MP_AXIS) == num_partitions:
        return MP_AXIS
    if layout.ndim == 1 and layout.device_matrix[0] == num_partitions:
        return layout.alias_name[0]
    raise OperatorError(f"num_partitions={num_partitions!r} needs a mesh axis {MP_AXIS!r} of that size; "
                        f"x lives on {layout} (build the mesh with paddle_mesh({num_partitions}))")


def split(x: Any, size: Sequence[int], operation: str, axis: int = 0, num_partitions: int = 1,
          gather_out: bool = True, weight_attr: ParamAttr = None, bias_attr: ParamAttr = None,
          name: Optional[str] = None) -> Any:
    """Paddle's distributed split on a DTensor `x` (ids for embedding); returns a DTensor."""
    check_dtensor(x, "split: x")
    if not isinstance(size, (list, tuple)):  # torch.split's (x, split_size, dim) habit
        raise DialectError(f"split: size {size!r} must be a list or tuple of two positive integers (the weight's "
                           "shape: ops.split is Paddle's distributed split layer); to cut a tensor along a dim "
                           "use ops.narrow(x, dim, start, length)")
    spec = split_layouts(size, operation, axis, num_partitions, gather_out, x.layout.ndim)
    mesh = x.mesh
    mp = _mp_axis(mesh, spec.num_partitions)
    layout = mesh.layout
    if spec.kind == "vocab":
        dtype = weight_attr.dtype if isinstance(weight_attr, SeededTensor) else "float32"
        table = paddle_param(weight_attr, spec.size, dtype, 0)
        weight = seeded_dtensor(mesh, layout(mp, None), table)
        return embedding(x, weight, label=name or "paddle.embedding")
    dtype = x.local.dtype.name
    w_src = paddle_param(weight_attr, spec.size, dtype, 0)
    b_src = paddle_param(bias_attr, spec.size[1:], dtype, 1)
    if spec.kind == "row":
        if not x.layout.tensor_map[-1]:
            x = scatter_local(x, x.layout.ndim - 1, (mp,))
        weight = seeded_dtensor(mesh, layout(mp, None), w_src)
        bias = None if b_src is None else seeded_dtensor(mesh, layout(None), b_src)
        return linear(x, weight, bias, label=name or "paddle.row_linear")
    weight = seeded_dtensor(mesh, layout(None, mp), w_src)
    bias = None if b_src is None else seeded_dtensor(mesh, layout(mp), b_src)
    return linear(x, weight, bias, gather_out=spec.gather_out, label=name or "paddle.column_linear")
