"""Distributed operators on DTensors, and their pure layout inference (`spmdsim.infer`).

Importing these modules does not import mpi4py (the runtime is loaded when an
operator first runs). The functions shadow their modules' names on purpose
(``spmdsim.ops.matmul`` is the function; the module stays importable as
``import spmdsim.ops.matmul``), so they are bound eagerly here.
"""
from __future__ import annotations

from .elementwise import activation, add, bias_add, gelu, relu, scale
from .embedding import ParallelEmbedding, VocabParallelEmbedding, embedding
from .linear import ColumnParallelLinear, RowParallelLinear, linear
from .local import reshape, softmax, transpose
from .losses import cross_entropy, mse_loss
from .matmul import matmul
from .mlp import ParallelMLP
from .paddle_split import paddle_mesh, split

__all__ = ["matmul", "linear", "embedding", "relu", "gelu", "activation", "scale", "add", "bias_add", "transpose",
           "reshape", "softmax", "mse_loss", "cross_entropy", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "ParallelEmbedding", "ParallelMLP", "split", "paddle_mesh"]
