"""Mixture of experts: a router, experts split over an ``ep`` mesh axis, tokens moved by Alltoall(v).

``MoEConfig`` (config) on a ``GPTConfig(moe=...)``; which mesh axes the experts use,
Megatron-Core's parallel folding with ``etp`` below tp (fold); the routing stated once for
ranks and reference (routing); the layer in one numpy process (reference);
on DTensors (``spmdsim.models.moe.layer``, loaded on first use: it runs collectives);
the pictures of who sent how many tokens where (report). docs/howto/experts.md.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .config import AUX_LOSS_COEFF, Z_LOSS_COEFF, MoEConfig
from .routing import Routing, dispatch_rows, gates_backward, route

__all__ = ["MoEConfig", "AUX_LOSS_COEFF", "Z_LOSS_COEFF", "Routing", "route", "gates_backward", "dispatch_rows"]

# Its modules by name, loaded on first use: spmdsim.models.moe.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
