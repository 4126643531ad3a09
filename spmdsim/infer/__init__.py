"""Pure inference: what each operator does to layouts, and the step records that finish it.

Never imports mpi4py or spmdsim.runtime. `operators` holds matmul, linear,
embedding, elementwise, transpose and softmax; `reshape` the reshape rule; `concat`
narrow, concatenate and broadcast_to;
`finish` how a local result with pending sums reaches the wanted layout.
"""
from __future__ import annotations

from .attention import AttentionPlan, infer_attention
from .concat import infer_broadcast_to, infer_concatenate, infer_narrow
from .finish import out_layout_from_strategy, resolve_partial
from .operators import *  # noqa: F401,F403 - the operators' inference, one namespace
from .operators import __all__ as _OPERATORS
from .reshape import infer_reshape, reshape_shape

__all__ = sorted(set(_OPERATORS) | {"AttentionPlan", "infer_attention", "infer_reshape", "reshape_shape",
                                     "resolve_partial", "out_layout_from_strategy", "infer_narrow",
                                     "infer_concatenate", "infer_broadcast_to"})
