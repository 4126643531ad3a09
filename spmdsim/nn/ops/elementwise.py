"""Elementwise ops on DTensors: ReLU, GELU, scale, bias add. No communication; layout kept.

Broadcasting arithmetic (add, mul, ...) is spmdsim.nn.ops.ufuncs.

A pending sum (partial layout) is added up before an activation (ReLU(a) +
ReLU(b) != ReLU(a + b)) and refused by bias_add, which would count the bias
once per rank of the group (spmdsim.nn.ops.add keeps it pending exactly).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...base.buffers import CAPTURE, broadcast_zero
from ...references import activations
from ..autograd.kept import kept_problem
from ..autograd.rules.pointwise import record_activation, record_bias_add, record_scale
from ...errors import OperatorError, ShapeError
from ...base.flops import any_open, sweep
from ...programs.infer import infer_bias_add, infer_elementwise
from ...runtime.engines import local as engine_local
from ...base.precision import is_low
from ._common import make_dtensor, shaped_as
from ._operands import operands_mesh, raise_if_not_dtensors, require_float
from .norms import resolved
from .pointwise import pointwise

__all__ = ["relu", "gelu", "activation", "scale", "bias_add"]


def activation(x: Any, name: str, keep_tanh: bool = True) -> Any:
    """Apply the activation `name` ("relu" or "gelu") shard by shard; a pending sum is added up first.

    (An Allreduce: relu(a + b) != relu(a) + relu(b).) `keep_tanh`: GELU's node keeps its inner tanh beside
    its input (else the backward computes it again)."""
    fn = activations.forward(name)  # the shard in its own precision (spmdsim.references.activations)
    try:
        if x.layout.partial:
            x = resolved(x)
        layout = infer_elementwise(x.layout, name)
    except AttributeError:
        raise_if_not_dtensors(name, ("x",), x)
        raise
    local = x._local if not CAPTURE.on else x.local  # this rank's block, read once (captured: its record's view)
    if name == "gelu":  # max(x, 0) is exact on integers; GELU's values are not integers
        require_float(name, local)
    if name == "gelu" and x._ag is not None and keep_tanh:  # the inner tanh kept for the backward (one tanh, not two)
        # bfloat16: the tanh is float32 (spmdsim.references.activations computes it widened); a dry run's zeros alike
        like = broadcast_zero(local.shape, np.float32) if is_low(local.dtype) else local
        tanh = engine_local(activations.gelu_tanh, like, local)
        out = shaped_as(x, engine_local(activations.gelu_from_tanh, local, local, tanh), layout)
        if any_open():  # else nothing is counted: no blocks to gather
            sweep(name, (local,), (out.local, tanh))
        return record_activation(out, x, name, tanh)
    out = shaped_as(x, engine_local(fn, local, local), layout)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep(name, (local,), (out.local,))
    return out if x._ag is None else record_activation(out, x, name)


def relu(x: Any) -> Any:
    """max(x, 0); x must not be a pending sum."""
    return activation(x, "relu")


def gelu(x: Any, approximate: str = "tanh", kept: str = "graph") -> Any:
    """GELU, `approximate` "tanh" (the default) or "none" (erf, PyTorch's default); x must be floating
    (a pending sum is added up first).

    `approximate`: "tanh" (GPT-2's and Megatron's formula, the default here) or "none", x * Phi(x) with
    the error function (PyTorch's default for ``F.gelu``/``nn.GELU()``; the two differ by up to ~5e-4).
    `kept` ("tanh" only): "graph" keeps x and the inner tanh for the backward, "megatron" x only (the
    backward computes the tanh again, as Megatron's bias_gelu).
    """
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"gelu: {problem}")
    if approximate == "tanh":
        return activation(x, "gelu", kept == "graph")
    if approximate != "none":
        raise OperatorError(f"gelu: approximate {approximate!r} must be 'tanh' or 'none' (as PyTorch's)")

    try:
        require_float("gelu", x.local)
    except AttributeError:
        raise_if_not_dtensors("gelu", ("x",), x)
        raise
    return pointwise("gelu_erf", x)


def scale(x: Any, factor: Any) -> Any:
    """x * factor for a real scalar (attention's 1/sqrt(d)); x's dtype and layout are kept.

    Linear, so a pending sum stays pending. An integer x takes only an integer
    factor (a fraction would be truncated).
    """
    raise_if_not_dtensors("scale", ("x",), x)
    value = factor.item() if isinstance(factor, np.generic) else factor
    if type(value) not in (int, float) or value != value:
        raise OperatorError(f"scale factor {factor!r} must be a real number (int or float, not NaN)")
    dtype = x.local.dtype
    if dtype.kind == "b" or (dtype.kind in "iu" and type(value) is not int):
        raise OperatorError(f"scale of a DTensor of dtype {dtype.name!r} by {factor!r} would truncate; "
                            "convert first, e.g. x.astype('float64')")
    try:
        factor_array = np.asarray(value, dtype=dtype)
    except OverflowError:
        raise OperatorError(f"scale factor {factor!r} does not fit dtype {dtype.name!r}") from None
    out = make_dtensor(x.mesh, engine_local(np.multiply, x.local, x.local, factor_array), x.layout,
                       x.global_shape)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("scale", (x.local,), (out.local,))
    return out if x._ag is None else record_scale(out, x, value)


def bias_add(x: Any, bias: Any) -> Any:
    """x + bias along the last dim; bias split like x's last dim, x not a pending sum."""
    mesh = operands_mesh("bias_add", ("x", "bias"), x, bias)
    layout = infer_bias_add(x.layout, bias.layout)
    if tuple(bias.global_shape) != tuple(x.global_shape)[-1:]:
        raise ShapeError(f"bias of shape {tuple(bias.global_shape)!r} does not match the last dim of "
                         f"{tuple(x.global_shape)!r}")
    out = make_dtensor(mesh, x.local + bias.local, layout, x.global_shape)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("bias_add", (x.local, bias.local), (out.local,))
    return out if x._ag is None and bias._ag is None else record_bias_add(out, x, bias)
