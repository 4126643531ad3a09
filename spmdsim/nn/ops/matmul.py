"""Distributed MatMul Y = op(X) @ op(W), batched over leading dims.

Each rank multiplies its own blocks; when the contraction dim K is split the
local products are partial sums, finished by Allreduce (MindSpore's
MatMul -> AllReduce) or by Reduce_scatter when an output split is asked for
(MindSpore's ``out_strategy``). All validation runs before the collective.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import numpy as np

from ..autograd.rules.matmul import record_matmul
from ...errors import OperatorError
from ...programs.infer import MatMulPlan, infer_matmul, matmul_shape
from ...layouts.layout import TensorLayout
from ...runtime.executor import execute
from ._common import local_matmul, make_dtensor
from ._operands import flag, operands_mesh, raise_if_not_dtensors, refuse_bool_sum

__all__ = ["matmul", "plan_matmul"]


def plan_matmul(x: Any, w: Any, *, transpose_a: bool = False, transpose_b: bool = False,
                out_layout: Optional[TensorLayout] = None, reduce: bool = True) -> tuple[MatMulPlan, tuple[int, ...]]:
    """The plan and the global output shape, validated (shapes included) on every rank."""
    if out_layout is not None and not isinstance(out_layout, TensorLayout):
        raise OperatorError(f"matmul: out_layout {out_layout!r} must be a TensorLayout or None")
    try:
        layouts_shapes = (x.layout, w.layout, x.global_shape, w.global_shape)
    except AttributeError:
        raise_if_not_dtensors("matmul", ("x", "w"), x, w)
        raise
    return _plan_matmul(*layouts_shapes, flag("matmul", "transpose_a", transpose_a),
                        flag("matmul", "transpose_b", transpose_b), out_layout, flag("matmul", "reduce", reduce))


@lru_cache(maxsize=256)
def _plan_matmul(x_layout: Any, w_layout: Any, x_shape: tuple, w_shape: tuple, transpose_a: bool,
                 transpose_b: bool, out_layout: Optional[TensorLayout],
                 reduce: bool) -> tuple[MatMulPlan, tuple[int, ...]]:
    # Cached on the (hashable) layouts and shapes, as linear's plan is.
    plan = infer_matmul(x_layout, w_layout, transpose_a=transpose_a, transpose_b=transpose_b,
                        out=out_layout, reduce=reduce)
    shape = matmul_shape(x_shape, w_shape, transpose_a, transpose_b)
    plan.local.check_shape(shape, "matmul output Y")
    plan.out.check_shape(shape, "matmul output Y")
    return plan, shape


def matmul(x: Any, w: Any, *, transpose_a: bool = False, transpose_b: bool = False,
           out_layout: Optional[TensorLayout] = None, reduce: bool = True, label: Optional[str] = "matmul") -> Any:
    """Y = op(x) @ op(w) on DTensors; returns a DTensor.

    Args:
        x, w: DTensors on one mesh whose contraction dims use the same axes.
        transpose_a, transpose_b: x is stored (..., K, M) / w is stored (..., N, K).
        out_layout: wanted output layout (MindSpore out_strategy); None = Allreduce.
        reduce: False returns the pending sum (partial layout) without communicating.
    """
    mesh = operands_mesh("matmul", ("x", "w"), x, w)
    plan, shape = plan_matmul(x, w, transpose_a=transpose_a, transpose_b=transpose_b, out_layout=out_layout,
                              reduce=reduce)
    a = np.swapaxes(x.local, -1, -2) if transpose_a else x.local
    b = np.swapaxes(w.local, -1, -2) if transpose_b else w.local
    local = local_matmul(a, b, bool(plan.steps))
    refuse_bool_sum("matmul", local, "a product sums over K")
    local = execute(mesh, local, plan.steps, shape, label, owned=True)
    out = make_dtensor(mesh, local, plan.out, shape)
    if x._ag is not None or w._ag is not None:  # the one check autograd costs a forward
        record_matmul(out, x, w, plan, bool(transpose_a), bool(transpose_b), label)
    return out
