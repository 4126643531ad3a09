"""Distributed operators on DTensors, and their pure layout inference (`spmdsim.programs.infer`).

Importing these modules does not import mpi4py (the runtime is loaded when an
operator first runs). The functions shadow their modules' names on purpose
(``spmdsim.nn.ops.matmul`` is the function; the module stays importable as
``import spmdsim.nn.ops.matmul``), so they are bound eagerly here.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .attention import attention
from .einsum import einsum
from .elementwise import activation, bias_add, gelu, relu, scale
from .embedding import ParallelEmbedding, VocabParallelEmbedding, embedding
from .joins import broadcast_to, chunk, concatenate, narrow, stack
from .linear import ColumnParallelLinear, RowParallelLinear, linear
from .local import reshape, transpose
from .losses import cross_entropy, mse_loss
from .matmul import matmul
from .mlp import ParallelMLP
from .masks import causal_mask, dropout, masked_fill
from .norms import layer_norm, log_softmax, resolved, rms_norm, softmax
from .paddle_split import paddle_mesh, split
from .ufuncs import (abs, add, astype, ceil, clip, cos, div, equal, erf, exp, floor, floor_divide, log, maximum,
                        minimum, mul, neg, not_equal, pow, remainder, round, rsqrt, sigmoid, sign, silu, sin, sqrt,
                        square, sub, tanh, where)
from .reduce import argmax, argmin, max, mean, min, prod, sum, var
from .methods import bind_dtensor as _bind_dtensor

_bind_dtensor()  # the runtime's DTensor calls these operators: x + y, x @ w, x.sum(), np.exp(x), x.view(...)

concat = concatenate  # numpy 2's, PyTorch's and JAX's other name for it

__all__ = ["matmul", "einsum", "linear", "embedding", "relu", "gelu", "activation", "scale", "add", "sub", "mul",
           "div", "floor_divide", "remainder", "round", "floor", "ceil", "sign", "neg", "pow", "maximum", "minimum",
           "where", "exp", "log", "sqrt", "tanh", "abs", "sigmoid",
           "silu", "sin", "cos", "square", "rsqrt", "clip", "erf", "equal", "not_equal", "sum", "mean", "max", "min",
           "prod", "var", "argmax", "argmin", "bias_add", "astype",
           "transpose", "reshape", "narrow", "chunk", "concatenate", "concat", "stack", "broadcast_to", "softmax",
           "log_softmax",
           "layer_norm", "rms_norm", "causal_mask", "masked_fill", "dropout", "attention", "resolved", "mse_loss",
           "cross_entropy",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelEmbedding",
           "ParallelMLP", "split", "paddle_mesh"]

__getattr__ = modules_by_name(__name__)  # spmdsim.<package>.<module> after a bare import (spmdsim/_lazy.py)
