"""Programs: what is decided before anything runs (pure numpy): redistribution plans, sharding
inference, pipeline schedules, collective algorithms, cost models, memory bounds, pictures.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.programs.<module>.
__getattr__ = modules_by_name(__name__)
