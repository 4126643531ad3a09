"""Reverse-mode autograd on DTensors: ``requires_grad_()``, ``loss.backward()``, ``.grad``, `no_grad`.

Operators record a node on their output when an input requires grad
(`spmdsim.autograd.graph`); `backward` walks the nodes in reverse, runs each
operator's rule (`spmdsim.autograd.rules`, one module per family of
operators) and moves gradients with the redistribution planner, so each
backward collective is the conjugate of a forward one. Importing this package
starts no MPI.
"""
from __future__ import annotations

from .engine import backward, reduce_grads
from .function import Function, FunctionCtx
from .graph import is_grad_enabled, no_grad

__all__ = ["backward", "reduce_grads", "no_grad", "is_grad_enabled", "Function", "FunctionCtx"]
