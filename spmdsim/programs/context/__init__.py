"""Context parallelism decided before anything runs: which tokens each rank holds (split), ring
attention's program of messages and blocks (ring), the three methods' bytes (methods), pictures."""
from __future__ import annotations

from ..._lazy import modules_by_name
from .methods import METHODS, check_heads, traffic
from .ring import Attend, Pass, RingProgram, ring_program
from .split import SPLITS, causal_pairs, check_split, chunks, imbalance, order, positions

__all__ = ["METHODS", "SPLITS", "Attend", "Pass", "RingProgram", "ring_program", "traffic", "check_heads",
           "check_split", "chunks", "positions", "order", "causal_pairs", "imbalance"]

# Its other modules by name, loaded on first use: spmdsim.programs.context.<module>.
__getattr__ = modules_by_name(__name__)
