"""Reverse-mode autograd on DTensors: ``requires_grad_()``, ``loss.backward()``, ``.grad``, `no_grad`.

Operators record a node on their output when an input requires grad
(`spmdsim.nn.autograd.graph`); `backward` walks the nodes in reverse, runs each
operator's rule (`spmdsim.nn.autograd.rules`, one module per family of
operators) and moves gradients with the redistribution planner, so each
backward collective is the conjugate of a forward one. Importing this package
starts no MPI. `checkpoint` recomputes a region in the backward instead of keeping its
activations; `kept_bytes` measures what a recorded graph keeps for backward, by the kinds
`kept_as` tags its nodes with.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .checkpoint import checkpoint
from .engine import backward, reduce_grads
from .function import Function, FunctionCtx
from .graph import enable_grad, is_grad_enabled, kept_as, no_grad
from .kept import kept_bytes

__all__ = ["backward", "reduce_grads", "no_grad", "enable_grad", "is_grad_enabled", "Function", "FunctionCtx",
           "checkpoint", "kept_as", "kept_bytes"]

__getattr__ = modules_by_name(__name__)  # spmdsim.<package>.<module> after a bare import (spmdsim/_lazy.py)
