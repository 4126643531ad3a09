"""DTensor's operators and autograd methods, given to the class when spmdsim.ops loads.

``x + y``, ``x @ w``, ``x.sum()``, ``x.requires_grad_()`` and ``loss.backward()``
are methods of the runtime's DTensor that call what this module installs in
`spmdsim.runtime.dtensor`'s table: the operators and autograd build DTensors,
so the runtime, below them, imports neither (docs/architecture.md, "The layers").
PyTorch's spellings of spmdsim's operators (``x.view(...)``, ``x.softmax(-1)``,
``x.unsqueeze(0)``, ``x.detach()``, ...) are methods this module gives the class.
"""
from __future__ import annotations

import math
from typing import Any

from ..autograd.engine import backward
from ..autograd.graph import requires_grad_
from ..errors import OperatorError
from ..runtime.dtensor import DTensor, install_operators
from .concat import getitem, narrow
from .local import reshape, transpose
from .matmul import matmul
from .norms import log_softmax, masked_fill, softmax
from .pointwise import pointwise
from .reduce import arg_reduce, reduce

install_operators(pointwise=pointwise, matmul=matmul, reduce=reduce, arg=arg_reduce, requires_grad_=requires_grad_,
                  backward=backward, getitem=getitem, reshape=reshape, transpose=transpose)


def _dims(x: Any, dim: Any, extra: int = 0) -> int:
    """`dim` of `x` (counted from the end when negative; `extra` more dims allowed, as unsqueeze's)."""
    ndim = len(x.global_shape) + extra
    if type(dim) is not int or not -ndim <= dim < max(ndim, 1):
        raise OperatorError(f"dim {dim!r} is out of range for a tensor of {ndim - extra} dims "
                            f"(expected an integer from {-ndim} to {ndim - 1})")
    return dim % max(ndim, 1)


def _size(x: Any, dim: Any = None) -> Any:
    """PyTorch's ``x.size()``: the global shape, or one dim's size."""
    return tuple(x.global_shape) if dim is None else x.global_shape[_dims(x, dim)]


def _unsqueeze(x: Any, dim: int) -> Any:
    """A new dim of size 1 at `dim` (PyTorch's unsqueeze): a reshape."""
    d, shape = _dims(x, dim, 1), tuple(x.global_shape)
    return reshape(x, shape[:d] + (1,) + shape[d:])


def _squeeze(x: Any, dim: Any = None) -> Any:
    """Dims of size 1 removed (all, or `dim` when it is 1), as PyTorch's squeeze: a reshape."""
    shape = tuple(x.global_shape)
    drop = {i for i, n in enumerate(shape) if n == 1} if dim is None else {_dims(x, dim)} & {
        i for i, n in enumerate(shape) if n == 1}
    return reshape(x, tuple(n for i, n in enumerate(shape) if i not in drop)) if drop else x


def _flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    """Dims `start_dim` to `end_dim` merged into one (PyTorch's flatten): a reshape."""
    shape = tuple(x.global_shape)
    if not shape:
        return reshape(x, (1,))
    a, b = _dims(x, start_dim), _dims(x, end_dim)
    if a > b:
        raise OperatorError(f"flatten: start_dim {start_dim!r} comes after end_dim {end_dim!r}")
    return reshape(x, shape[:a] + (math.prod(shape[a:b + 1]),) + shape[b + 1:])


def _split(x: Any, split_size_or_sections: Any, dim: int = 0) -> tuple:
    """PyTorch's ``x.split(size, dim)`` (pieces of `size`, the last smaller) or ``x.split([a, b], dim)``: narrows.

    spmdsim.ops.split is Paddle's distributed split layer, not this."""
    d = _dims(x, dim)
    total = x.global_shape[d]
    sizes = split_size_or_sections
    if type(sizes) is int and sizes > 0:
        sizes = [min(sizes, total - start) for start in range(0, total, sizes)] or [0]
    elif not isinstance(sizes, (list, tuple)) or any(type(n) is not int or n < 0 for n in sizes) or sum(sizes) != total:
        raise OperatorError(f"split: {split_size_or_sections!r} must be a positive size or sizes adding up to "
                            f"dim {d}'s {total}")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(narrow(x, d, start, n) for start, n in zip(starts, sizes))


def _detach(x: Any) -> Any:
    """The same block, outside the graph (PyTorch's detach: no gradient flows back through it)."""
    return type(x)._trusted(x.mesh, x.local, x.layout, tuple(x.global_shape))


#: PyTorch's method spellings of spmdsim's operators (docs/porting.md).
_TORCH_METHODS = {
    "view": lambda x, *shape: reshape(x, shape[0] if len(shape) == 1 else shape),
    "size": _size, "numel": lambda x: math.prod(x.global_shape), "dim": lambda x: len(x.global_shape),
    "unsqueeze": _unsqueeze, "squeeze": _squeeze, "flatten": _flatten, "contiguous": lambda x: x,
    "detach": _detach, "split": _split, "softmax": lambda x, dim=-1: softmax(x, dim),
    "log_softmax": lambda x, dim=-1: log_softmax(x, dim), "masked_fill": masked_fill,
    "exp": lambda x: pointwise("exp", x), "log": lambda x: pointwise("log", x),
    "sqrt": lambda x: pointwise("sqrt", x), "tanh": lambda x: pointwise("tanh", x),
}
for _name, _method in _TORCH_METHODS.items():
    setattr(DTensor, _name, _method)
