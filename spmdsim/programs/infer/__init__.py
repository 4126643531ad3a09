"""Pure inference: what each operator does to layouts, and the step records that finish it.

Never imports mpi4py or spmdsim.runtime. `operators` holds matmul, linear,
embedding, elementwise, transpose and softmax; `reshape` the reshape rule; `concat`
narrow, concatenate and broadcast_to; `einsum` and `pointwise` (elementwise ops with
broadcasting, reductions) the general rules; `norms` layer and RMS norm; `losses`
cross-entropy; `attention` scaled dot-product attention;
`finish` how a local result with pending sums reaches the wanted layout.
The operators (`spmdsim.nn.ops`) run these programs and the strategy search
(`spmdsim.tools.autoshard`) prices them: each rule is stated here once.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .attention import AttentionPlan, infer_attention
from .concat import infer_broadcast_to, infer_concatenate, infer_narrow
from .finish import out_layout_from_strategy, resolve_partial
from .losses import CrossEntropyPlan, infer_cross_entropy
from .norms import NormPlan, infer_norm
from .operators import *  # noqa: F401,F403 - the operators' inference, one namespace
from .operators import __all__ as _OPERATORS
from .reshape import infer_reshape, reshape_shape

__all__ = sorted(set(_OPERATORS) | {"AttentionPlan", "infer_attention", "infer_reshape", "reshape_shape",
                                     "resolve_partial", "out_layout_from_strategy", "infer_narrow",
                                     "infer_concatenate", "infer_broadcast_to", "CrossEntropyPlan",
                                     "infer_cross_entropy", "NormPlan", "infer_norm"})

# Its modules by name, loaded on first use: spmdsim.programs.infer.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
