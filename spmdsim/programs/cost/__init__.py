"""Alpha-beta cost model of the collectives: predicted seconds per call.

Pure (numpy only; never imports mpi4py). One module per job:

- `model`: the formulas per collective, the frozen `CostModel` and its `predict`;
- `fit`: `CostModel.fit` from timed calls;
- `store`: JSON save/load, `default_path` and `load_or_default`;
- `plan`: `predict_plan` / `StepPrediction` over planner steps.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .model import ALGORITHMS, DEFAULT_MODEL, OPS, CostModel, Measurement, OpParams, normalize_op
from .plan import StepPrediction, predict_plan
from .store import default_path, load_or_default

__all__ = ["OPS", "ALGORITHMS", "CostModel", "Measurement", "OpParams", "DEFAULT_MODEL", "default_path",
           "load_or_default", "predict_plan", "StepPrediction", "normalize_op"]

# Its modules by name, loaded on first use: spmdsim.programs.cost.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
