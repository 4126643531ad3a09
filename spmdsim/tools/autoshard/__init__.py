"""Sharding propagation and strategy search (MindSpore's auto-parallel concepts): choose every operator's strategy.

Pure: numpy only, never the runtime or mpi4py (the runners, `execute` and `dag`, are imported on their
own). `autoshard(network, devices, ...)`
enumerates each operator's candidate strategies (`candidates`), prices them and
the redistributions between them (`cost`: exact bytes per rank, or modelled
seconds), and picks one per operator by propagation from the fixed operators
or by search (`search`: exact DP on chains and trees, branch and bound or
variable elimination on other graphs); ``training=True`` adds the backward's bytes (`backward`).
`spmdsim autoshard --network NAME` is the command line; `spmdsim.tools.autoshard.execute` runs a choice on the ranks
(chains through the network runner, other graphs node by node: `dag`, checked against `evaluate`'s numpy). The module is
callable: ``spmdsim.tools.autoshard("net_mindspore_tutorial", 8)`` is ``autoshard(...)``.
"""
from __future__ import annotations

import sys
import types

from ..._lazy import modules_by_name
from .candidates import Candidate, make_candidate
from .choose import METHODS, autoshard
from .cost import OBJECTIVES, Objective, Table
from .gpt import gpt_graph, megatron
from .graph import Graph, OpNode, ParamSpec, attention, mlp_chain
from .networks import NAMES, build, gpt_network
from .report import OpReport, Result
from .search import Outcome, branch_and_bound, eliminate, propagate, tree_search
from .volume import redistribution_bytes

__all__ = [
    "autoshard",
    "Result",
    "OpReport",
    "Candidate",
    "make_candidate",
    "Graph",
    "OpNode",
    "ParamSpec",
    "mlp_chain",
    "attention",
    "gpt_graph",
    "megatron",
    "gpt_network",
    "NAMES",
    "build",
    "Objective",
    "OBJECTIVES",
    "METHODS",
    "Table",
    "redistribution_bytes",
    "Outcome",
    "propagate",
    "tree_search",
    "branch_and_bound",
    "eliminate",
]


class _CallableModule(types.ModuleType):
    """This module, callable: ``spmdsim.tools.autoshard(...)`` is `autoshard`; its names stay reachable."""

    def __call__(self, *args, **kwargs) -> Result:
        return autoshard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

# Its modules by name, loaded on first use: spmdsim.tools.autoshard.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
