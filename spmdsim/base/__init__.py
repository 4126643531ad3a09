"""The ground floor: process plumbing every floor uses (buffers, threads, the running rank's context,
numbers and their precision, FLOP counting, argument parsing); stdlib and numpy only.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.base.<module>.
__getattr__ = modules_by_name(__name__)
