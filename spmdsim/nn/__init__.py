"""Neural-network layer: operators on DTensors, autograd, optimizers (SGD, Adam(W), ZeRO).
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.nn.<module>.
__getattr__ = modules_by_name(__name__)
