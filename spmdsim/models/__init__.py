"""Models: the GPT (dense, Llama options), mixture of experts, and the seed networks.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.models.<module>.
__getattr__ = modules_by_name(__name__)
