"""Dialects: other frameworks' ways of writing a sharding, converted to and from TensorLayout.

* ``strategy``: MindSpore ``.shard`` strategies (single tensors and MatMul);
* ``sbp``: OneFlow nD SBP (``B``, ``S(d)``, ``P``) on a placement;
* ``dtensor``: PyTorch DTensor placements (``Shard``, ``Replicate``, ``Partial``);
* ``partition_spec``: JAX PartitionSpec written as a plain tuple;
* ``paddle``: ``paddle.distributed.split`` (row / column / vocab parallel).

All pure: no mpi4py, torch, jax, oneflow, paddle or mindspore import.
Decisions (axis names, orders, what is not expressible) are in docs/reference/dialects.md.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .dtensor import (Partial, Placement, Replicate, Shard, format_placements,
                      layout_to_placements, parse_placements, placements_to_layout)
from .paddle import MP_AXIS, PaddleSplit, split_layouts
from .partition_spec import (format_partition_spec, layout_to_partition_spec,
                             partition_spec_to_layout)
from .sbp import (SBP, Broadcast, PartialSum, Split, format_sbp, layout_to_sbp, parse_sbp,
                  sbp_to_layout)
from .strategy import (REP_AXIS, MatMulLayouts, format_strategy, layout_to_strategy,
                       matmul_layouts, parse_strategy, strategy_layout, strategy_of,
                       strategy_to_layout)

__all__ = [
    # MindSpore strategies
    "REP_AXIS", "MatMulLayouts", "parse_strategy", "format_strategy", "strategy_to_layout",
    "strategy_layout", "matmul_layouts", "layout_to_strategy", "strategy_of",
    # OneFlow SBP
    "SBP", "Broadcast", "Split", "PartialSum", "parse_sbp", "format_sbp", "sbp_to_layout",
    "layout_to_sbp",
    # PyTorch DTensor
    "Placement", "Shard", "Replicate", "Partial", "parse_placements", "format_placements",
    "placements_to_layout", "layout_to_placements",
    # JAX PartitionSpec
    "partition_spec_to_layout", "layout_to_partition_spec", "format_partition_spec",
    # Paddle
    "MP_AXIS", "PaddleSplit", "split_layouts",
]

# Its modules by name, loaded on first use: spmdsim.layouts.dialects.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
