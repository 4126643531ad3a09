"""Whole seed networks: pure descriptions (`model`, `seeds`, `table`) and an MPI runner (`run`).

The descriptions load with the package; the runner (`NetworkRunner`,
`NetworkRun`) loads on first use, so a pure module reading a `Network` does not
load the module that runs one. Importing this package loads neither the
runtime nor mpi4py; `NetworkRunner` loads the runtime when first built.

    from spmdsim.models.nets import mindspore_tutorial, NetworkRunner
    runner = NetworkRunner(mindspore_tutorial(8), MPI.COMM_WORLD)
    result = runner.forward()
    print(result.table()); print(result.check())
"""
from __future__ import annotations

from ...references.tolerances import network_atol
from .model import Hop, Network, Param, Stage, reference_rows, schedule
from .seeds import (mindspore_layout, mindspore_tutorial, needs_eight, oneflow_2d_sbp,
                    oneflow_2d_signature, oneflow_needs, paddle_needs, paddle_tp)
from .table import HopRow, format_table
from ..._lazy import lazy

__all__ = [
    "Network", "Stage", "Param", "Hop", "HopRow", "schedule", "reference_rows", "network_atol",
    "format_table", "mindspore_tutorial", "mindspore_layout", "paddle_tp", "needs_eight",
    "paddle_needs", "oneflow_2d_sbp", "oneflow_2d_signature", "oneflow_needs", "NetworkRunner",
    "NetworkRun", "NETWORKS",
]

#: Network builders by scenario name: ``NETWORKS[name](world_size, dtype=..., seed=...)``.
NETWORKS = {
    "net_mindspore_tutorial": mindspore_tutorial,
    "net_mindspore_layout": mindspore_layout,
    "net_paddle_tp": paddle_tp,
    "net_oneflow_2d_sbp": oneflow_2d_sbp,
    "net_oneflow_2d_signature": oneflow_2d_signature,
}

# Loaded on first use (module of this package -> names), as spmdsim.runtime and spmdsim.runtime.sim load theirs.
_WHERE = {name: module for module, names in {
    "run": ("NetworkRunner", "NetworkRun"),
}.items() for name in names}


__getattr__, __dir__ = lazy(__name__, _WHERE, globals())
