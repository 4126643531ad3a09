"""Layouts: device matrices, tensor maps, how a dim is cut, who holds what, seeded data, and the
frameworks' dialects (MindSpore, OneFlow SBP, Paddle, DTensor, JAX). Pure numpy.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.layouts.<module>.
__getattr__ = modules_by_name(__name__)
