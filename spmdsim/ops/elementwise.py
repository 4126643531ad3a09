"""Elementwise ops on DTensors: ReLU, GELU, add, bias add. No communication; layout kept.

A pending sum (partial layout) is rejected where the result would be wrong:
ReLU(a) + ReLU(b) != ReLU(a + b), and adding a non-partial tensor to a pending
sum would count it once per rank of the group.
"""
from __future__ import annotations

from typing import Any

from .. import reference
from ..errors import ShapeError
from ._common import make_dtensor, operands_mesh, raise_if_not_dtensors, require_float
from .infer import infer_add, infer_bias_add, infer_elementwise

__all__ = ["relu", "gelu", "activation", "add", "bias_add"]


def activation(x: Any, name: str) -> Any:
    """Apply the activation `name` ("relu" or "gelu") shard by shard."""
    fn = reference.activation(name)
    try:
        layout = infer_elementwise(x.layout, name)
    except AttributeError:
        raise_if_not_dtensors(name, ("x",), x)
        raise
    if name == "gelu":  # max(x, 0) is exact on integers; GELU's values are not integers
        require_float(name, x.local)
    return make_dtensor(x.mesh, fn(x.local), layout, x.global_shape)


def relu(x: Any) -> Any:
    """max(x, 0); x must not be a pending sum."""
    return activation(x, "relu")


def gelu(x: Any) -> Any:
    """GELU (tanh approximation); x must be floating and not a pending sum."""
    return activation(x, "gelu")


def add(a: Any, b: Any) -> Any:
    """a + b for two DTensors of one shape and layout (two pending sums over the same axes add)."""
    mesh = operands_mesh("add", ("a", "b"), a, b)
    # Shapes first: no redistribution makes different shapes addable.
    if tuple(a.global_shape) != tuple(b.global_shape):
        raise ShapeError(
            f"cannot add shapes {tuple(a.global_shape)!r} and {tuple(b.global_shape)!r}: add needs "
            "one shape (it does not broadcast; bias_add adds a vector along the last dim)"
        )
    layout = infer_add(a.layout, b.layout)
    return make_dtensor(mesh, a.local + b.local, layout, a.global_shape)


def bias_add(x: Any, bias: Any) -> Any:
    """x + bias along the last dim; bias split like x's last dim, x not a pending sum."""
    mesh = operands_mesh("bias_add", ("x", "bias"), x, bias)
    layout = infer_bias_add(x.layout, bias.layout)
    if tuple(bias.global_shape) != tuple(x.global_shape)[-1:]:
        raise ShapeError(
            f"bias of shape {tuple(bias.global_shape)!r} does not match the last dim of "
            f"{tuple(x.global_shape)!r}"
        )
    return make_dtensor(mesh, x.local + bias.local, layout, x.global_shape)
