"""DTensor's operators and autograd methods, given to the class when spmdsim.ops loads.

``x + y``, ``x @ w``, ``x.sum()``, ``x.requires_grad_()`` and ``loss.backward()``
are methods of the runtime's DTensor that call what this module installs in
`spmdsim.runtime.dtensor`'s table: the operators and autograd build DTensors,
so the runtime, below them, imports neither (docs/architecture.md, "The layers").
"""
from __future__ import annotations

from ..autograd.engine import backward
from ..autograd.graph import requires_grad_
from ..runtime.dtensor import install_operators
from .concat import getitem
from .local import reshape, transpose
from .matmul import matmul
from .pointwise import pointwise
from .reduce import arg_reduce, reduce

install_operators(pointwise=pointwise, matmul=matmul, reduce=reduce, arg=arg_reduce, requires_grad_=requires_grad_,
                  backward=backward, getitem=getitem, reshape=reshape, transpose=transpose)
