"""Distributed operators on DTensors, and their pure layout inference (`spmdsim.ops.infer`).

Names load on first use, so ``import spmdsim.ops.infer`` (pure) never pulls in
the runtime; the operators themselves import mpi4py through the runtime.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "matmul",
    "linear",
    "embedding",
    "relu",
    "gelu",
    "activation",
    "add",
    "bias_add",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "ParallelMLP",
    "split",
    "paddle_mesh",
]

_WHERE = {
    "matmul": "matmul",
    "linear": "linear",
    "ColumnParallelLinear": "linear",
    "RowParallelLinear": "linear",
    "embedding": "embedding",
    "VocabParallelEmbedding": "embedding",
    "relu": "elementwise",
    "gelu": "elementwise",
    "activation": "elementwise",
    "add": "elementwise",
    "bias_add": "elementwise",
    "ParallelMLP": "mlp",
    "split": "paddle_split",
    "paddle_mesh": "paddle_split",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
