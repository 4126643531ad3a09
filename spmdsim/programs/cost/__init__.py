"""Alpha-beta cost model of the collectives: predicted seconds per call.

Pure (numpy only; never imports mpi4py). One module per job:

- `terms`: the collectives' names and the formula of one call, `OpParams` and `Measurement`;
- `model`: the frozen `CostModel`, its `predict` and `load_or_default`;
- `fit`: `CostModel.fit` from timed calls;
- `store`: JSON save/load and `default_path`;
- `plan`: `predict_plan` / `StepPrediction` over planner steps.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .model import DEFAULT_MODEL, CostModel, load_or_default
from .plan import StepPrediction, predict_plan
from .store import default_path
from .terms import ALGORITHMS, OPS, Measurement, OpParams, normalize_op

__all__ = ["OPS", "ALGORITHMS", "CostModel", "Measurement", "OpParams", "DEFAULT_MODEL", "default_path",
           "load_or_default", "predict_plan", "StepPrediction", "normalize_op"]

# Its modules by name, loaded on first use: spmdsim.programs.cost.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
