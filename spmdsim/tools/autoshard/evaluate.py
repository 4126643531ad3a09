"""A graph evaluated in one numpy process: every node's global output, the reference `--run` checks.

Pure (never imports mpi4py). Each node kind is written from its definition
(`graph.KINDS`), on whole arrays from the nodes' `SeededTensor` sources, in
float64 (float32 graphs are checked against it within float32's tolerances):

| kind          | value                                                            |
| ------------- | ---------------------------------------------------------------- |
| input         | the source                                                       |
| flatten       | rows kept, the rest merged                                       |
| matmul / bmm  | x @ w (w stored (..., N, K) with transpose_b)                    |
| linear        | x @ w + b                                                        |
| relu / gelu   | spmdsim.references.forward's (GELU: the tanh approximation)               |
| softmax       | along the last dim; spec "causal": keys after the query at -inf  |
| embedding     | table[ids]                                                       |
| einsum        | numpy.einsum of the activations, then the weights                |
| pointwise     | add / mul of the operands, or of one operand and `constant`      |
| layernorm     | (x - mean) / sqrt(var + 1e-5) * w + b over the last dim          |
| reshape       | to the output shape                                              |
| cross_entropy | mean over rows of logsumexp - the target's logit (targets: source) |
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...references import forward as reference
from ...errors import OperatorError
from .graph import Graph, OpNode

__all__ = ["evaluate", "LN_EPS"]

#: The layer norms' epsilon (spmdsim.nn.ops.layer_norm's default and the GPT's ln_eps).
LN_EPS = 1e-5

_POINTWISE: dict[str, Callable] = {"add": np.add, "mul": np.multiply, "sub": np.subtract,
                                   "div": np.divide}


def evaluate(graph: Graph) -> dict[str, np.ndarray]:
    """Every node's global output by name, float64 (int64 for integer inputs)."""
    values: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        xs = [values[name] for name in node.inputs]
        params = [_full(p.source) for p in node.params]
        out = np.asarray(_node(node, xs, params))
        if out.shape != tuple(node.out_shape):
            raise OperatorError(f"{node.name}: numpy gives shape {out.shape!r}, the graph says "
                                f"{tuple(node.out_shape)!r}")
        values[node.name] = out
    return values


def _full(source) -> np.ndarray:
    value = np.asarray(source.full())
    return value if value.dtype.kind in "iub" else value.astype(np.float64)


def _node(node: OpNode, xs: list, params: list) -> np.ndarray:
    kind = node.kind
    if kind == "input":
        return _full(node.source)
    if kind in ("flatten", "reshape"):
        return xs[0].reshape(node.out_shape)
    if kind in ("matmul", "bmm"):
        a, b = (xs[0], params[0]) if kind == "matmul" else xs
        return reference.matmul(a, b, transpose_b=node.transpose_b)
    if kind == "linear":
        return xs[0] @ params[0] + (params[1] if len(params) > 1 else 0.0)
    if kind in ("relu", "gelu"):
        return reference.activation(kind)(xs[0])
    if kind == "softmax":
        x = xs[0]
        if node.spec == "causal":
            t_q, t_k = x.shape[-2:]
            x = np.where(np.arange(t_k)[None, :] > np.arange(t_q)[:, None], -np.inf, x)
        return reference.softmax(x, -1)
    if kind == "embedding":
        return params[0][xs[0]]
    if kind == "einsum":
        return np.einsum(node.spec, *xs, *params)
    if kind == "pointwise":
        return _pointwise(node, xs + params)
    if kind == "layernorm":
        x = xs[0]
        centred = x - x.mean(axis=-1, keepdims=True)
        y = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + LN_EPS)
        if params:
            y = y * params[0]
        return y + params[1] if len(params) > 1 else y
    if kind == "cross_entropy":
        if node.source is None:
            raise OperatorError(f"{node.name}: a cross_entropy node needs its targets (source)")
        z, targets = xs[0], _full(node.source)
        top = z.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
        return np.array(np.mean(lse - z[np.arange(z.shape[0]), targets]))
    raise OperatorError(f"{node.name}: kind {kind!r} has no numpy evaluation")


def _pointwise(node: OpNode, operands: list) -> np.ndarray:
    op = _POINTWISE.get(node.spec)
    if op is None:
        raise OperatorError(f"{node.name}: pointwise op {node.spec!r} is not one of {tuple(_POINTWISE)!r}")
    if len(operands) == 1:
        if node.constant is None:
            raise OperatorError(f"{node.name}: a pointwise {node.spec!r} of one operand needs its constant")
        return op(operands[0], node.constant)
    out = operands[0]
    for x in operands[1:]:
        out = op(out, x)
    return out
