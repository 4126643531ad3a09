"""The MPI side of spmdsim: meshes, collectives, distributed tensors, checks, guards.

Names are loaded on first use so that ``import spmdsim.runtime`` alone does not
initialize MPI; ``spmdsim.runtime.trace`` never imports mpi4py at module
level. DTensor's operators (``x + y``, ``x @ w``,
``.backward()``) come with ``spmdsim.nn.ops``, which ``import spmdsim.nn.ops`` or the
front door (``from spmdsim import DTensor``) loads: the runtime sits below the
operators and imports none. ``spmdsim.runtime.exchange`` is the function
`exchange`, also once its module (runtime/exchange.py) is imported: a module
never takes the place of a name of `_WHERE` (spmdsim/_lazy.py).
"""
from __future__ import annotations

from .._lazy import lazy

# Where each public name lives (module of this package); the order is __all__'s.
_WHERE = {name: module for module, names in {
    "mesh": ("Mesh",),
    "dtensor": ("DTensor",),
    "check": ("Verdict",),
    "trace": ("TraceEntry", "Trace", "collect_trace"),
    "guard": ("abort_on_error", "install_excepthook", "run_guarded"),
    "collectives": ("allgather", "alltoall", "allreduce", "reduce_scatter", "bcast", "alltoallv", "exchange"),
    "exchange_spec": ("ExchangeSpec",),
    "prepared": ("Prepared", "prepare_allreduce", "prepare_allgather", "prepare_reduce_scatter", "prepare_alltoall"),
    "ranked": ("print_ranked", "rank_ordered"),
    "trace_export": ("write_chrome_trace",),
    "executor": ("redistribute",),
    "replay": ("capture", "Scalar", "ReplayError", "kernel"),
    "shared_reference": ("shared_numeric_grads",),
}.items() for name in names}

__all__ = list(_WHERE)


__getattr__, __dir__ = lazy(__name__, _WHERE, globals())
