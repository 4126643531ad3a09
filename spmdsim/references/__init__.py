"""References: single-process numpy forward and backward of every operator, local kernels, training
references and check tolerances. Pure numpy.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.references.<module>.
__getattr__ = modules_by_name(__name__)
