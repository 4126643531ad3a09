"""spmdsim: run and check tensor-parallel programs on plain CPUs with MPI.

The front door: ``from spmdsim import Layout, Mesh, DTensor, SeededTensor,
redistribute, ops, simulate, world, optim, ...`` gives what the examples use.
The errors load with the package; every other name on first use, so
``import spmdsim`` loads neither mpi4py nor numpy (``spmdsim mpirun`` of a
program without numpy loads none) and changes no process setting.
docs/reference/api.md lists every public name.
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import (CheckFailed, DialectError, DTypeError, LayoutError, OperatorError,
                     PlanError, RankCountError, RankError, RuntimeMismatchError, ShapeError, SpmdsimError)

__version__ = "0.1.0"

# Loaded on first use: name -> (module, attribute; None for the module itself).
_LAZY = {
    "Layout": ("spmdsim.layouts.layout", "Layout"),
    "TensorLayout": ("spmdsim.layouts.layout", "TensorLayout"),
    "SeededTensor": ("spmdsim.layouts.datagen", "SeededTensor"),
    "contraction_atol": ("spmdsim.references.tolerances", "contraction_atol"),
    "default_tolerances": ("spmdsim.references.tolerances", "default_tolerances"),
    "Mesh": ("spmdsim.runtime.mesh", "Mesh"),
    "DTensor": ("spmdsim.runtime.dtensor", "DTensor"),
    "redistribute": ("spmdsim.runtime.executor", "redistribute"),
    "collect_trace": ("spmdsim.runtime.trace", "collect_trace"),
    "install_excepthook": ("spmdsim.runtime.guard", "install_excepthook"),
    "abort_on_error": ("spmdsim.runtime.guard", "abort_on_error"),
    "print_ranked": ("spmdsim.runtime.ranked", "print_ranked"),
    "simulate": ("spmdsim.runtime.sim", "simulate"),
    "world": ("spmdsim.emulator.comm", "world"),
    "script": ("spmdsim.runtime.sim", "script"),
    "ops": ("spmdsim.nn.ops", None),
    "optim": ("spmdsim.nn.optim", None),
    "fully_shard": ("spmdsim.nn.fsdp", "fully_shard"),
    "dialects": ("spmdsim.layouts.dialects", None),
    "reference": ("spmdsim.references.forward", None),
    "autoshard": ("spmdsim.tools.autoshard", None),  # also callable: spmdsim.tools.autoshard(...)
}

__all__ = [
    *_LAZY,
    "SpmdsimError", "LayoutError", "ShapeError", "DTypeError", "RankError", "DialectError",
    "OperatorError", "PlanError", "RuntimeMismatchError", "RankCountError", "CheckFailed",
]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        # A module of the package by its dotted name, as the docs write it: spmdsim.nn.autograd.no_grad().
        from ._lazy import submodule

        found = submodule(__name__, name)
        if found is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return found
    if where[0].startswith("spmdsim.runtime") and not where[0].startswith("spmdsim.runtime.sim"):
        # A DTensor from the front door has its operators (x + y, x @ w, .backward()): the runtime's
        # DTensor calls them through a table spmdsim.nn.ops.methods.bind_dtensor fills.
        importlib.import_module("spmdsim.nn.ops.methods").bind_dtensor()
    module = importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The names this module imported for itself (typing's Any, importlib, the __future__ flag) are not the API.
    return sorted((set(globals()) | set(__all__)) - {"Any", "annotations", "importlib"})
