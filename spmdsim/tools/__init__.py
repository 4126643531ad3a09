"""Tools: the command line, the demo, the estimate, autoshard and the lab grader.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.tools.<module>.
__getattr__ = modules_by_name(__name__)
