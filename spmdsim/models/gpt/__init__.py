"""A small GPT shared by the distributed model and its single-process numpy reference.

``GPTConfig`` (config), the parameters and dropout masks as seeded tensors (params),
the text and its batches (data); ``spmdsim.models.gpt.reference`` trains the same model in one
numpy process (``python -m spmdsim.models.gpt.reference --steps 200``). Pure: no mpi4py.
"""
from __future__ import annotations

from typing import Any

from ..._lazy import submodule
from .config import GPTConfig
from .data import batch, decode, encode, load_text
from .params import (ParamSpec, constant, decays, dropout_seed, dropout_shape, dropout_sites, dropout_tensor,
                     initial_value, param_specs, seeded)

__all__ = ["GPTConfig", "ParamSpec", "param_specs", "seeded", "constant", "decays", "initial_value",
           "dropout_seed", "dropout_tensor", "dropout_shape", "dropout_sites", "load_text", "encode",
           "decode", "batch", "reference"]


def __getattr__(name: str) -> Any:
    # A module of the package (`reference`, `train`, `parallel`, ...) loads on first use, so
    # `python -m spmdsim.models.gpt.reference` runs it once, as __main__.
    found = submodule(__name__, name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found
