"""spmdsim's bounded module-level tables that start over when full, for tests that need them empty.

A table of decided calls (checked layouts, prepared operators, compiled moves, ...) lives as long as the
process and starts over (``table.clear()``) when it reaches its limit. Under pytest-xdist one worker runs
hundreds of tests: the earlier ones can fill a table to the brim, and it then starts over inside a later
test, between its first call and the repeat it checks, which decides (plans, checks, compiles) again. A test
that asserts a repeat decides nothing again, or counts the calls such a table spares, starts with them empty:
``@pytest.mark.usefixtures("empty_tables")`` (tests/conftest.py), which calls `empty()`.

A new table of this kind is added to `TABLES` (test_bounded_tables.py finds every ``len(NAME) >= ...``
followed by ``NAME.clear()`` in spmdsim/ and checks it is listed).
"""
from __future__ import annotations

import importlib

#: (module, global's name, entries at which it starts over). The limits are the sources'; `empty` reads none.
TABLES = (
    ("spmdsim.runtime.compiled", "_MOVES", 4096),
    ("spmdsim.runtime.budget", "_SEEDED", 4096),
    ("spmdsim.nn.ops._common", "_CHECKED", 4096),
    ("spmdsim.nn.ops._common", "_DECIDED", 4096),
    ("spmdsim.nn.ops._common", "_UNIFORM", 1024),
    ("spmdsim.nn.ops.pointwise", "_PREPARED", 4096),  # (also ops.fused's _ADDS: the same dict)
    ("spmdsim.nn.ops.scalars", "_SCALARS", 256),
    ("spmdsim.nn.ops.einsum", "_PREPARED", 4096),
    ("spmdsim.nn.ops.attention", "_PREPARED", 1024),
    ("spmdsim.nn.ops.attention", "_SWAPPED", 1024),
    ("spmdsim.nn.ops.fused", "_CALLS", 4096),
    ("spmdsim.nn.ops.residual", "_RESIDUAL_CALLS", 4096),
    ("spmdsim.nn.ops.fused", "_RESHAPE_CALLS", 4096),
    ("spmdsim.nn.ops.fused", "_LINEARS", 4096),
    ("spmdsim.nn.ops.residual", "_RESIDUALS", 4096),
    ("spmdsim.nn.ops.norm_affine", "_NORMS", 1024),
    ("spmdsim.nn.ops.local", "_RESHAPED", 1024),
    ("spmdsim.nn.ops.megatron", "_ROW_PRODUCT", 1024),
    ("spmdsim.nn.ops.megatron", "_ROW_PRODUCT_BY_VALUE", 1024),
    ("spmdsim.nn.ops.norms", "_WHOLE", 1024),
    ("spmdsim.nn.ops.norms", "_AFFINE_DTYPES", 256),
    ("spmdsim.nn.ops.norms", "_LAYER_NORMS", 1024),
    ("spmdsim.nn.ops.masks", "_MASKS", 256),
    ("spmdsim.nn.ops.masks", "_GEOMETRY", 1024),
    ("spmdsim.programs.plan.volume", "_HELD", 16384),
    ("spmdsim.programs.plan.candidates", "_LAYOUTS", 65536),
    ("spmdsim.programs.plan.planner", "_VALIDATED", 4096),  # (stops adding when full: a repeat then plans again)
    ("spmdsim.tools.autoshard.candidates", "_CACHE", 256),
    ("spmdsim.base.flops", "_SIZED", 4096),
    ("spmdsim.base.flops", "_GEMMS", 4096),
    ("spmdsim.base.flops", "_UNHELD", 4096),
    ("spmdsim.base.flops", "_SWEEPS", 4096),
    ("spmdsim.base.precision", "_PRODUCT_DTYPES", 256),
    ("spmdsim.programs.infer.reshape", "_RESHAPES", 1024),
    ("spmdsim.nn.autograd.plans", "_PLANS", 256),
    ("spmdsim.nn.autograd.moves", "_GRAD_BY_OBJECT", 4096),
    ("spmdsim.nn.autograd.moves", "_GRAD_LAYOUTS", 4096),
    ("spmdsim.nn.autograd.rules.grads", "_PENDING", 4096),
    ("spmdsim.nn.autograd.rules.pointwise", "_SUM_DIMS", 4096),
    ("spmdsim.nn.autograd.rules.pointwise", "_SUMMED_AXES", 4096),
    ("spmdsim.nn.autograd.rules.fused", "_SUMS", 4096),
    ("spmdsim.nn.autograd.graph", "_USED", 4096),
    ("spmdsim.nn.autograd.graph", "_BY_OBJECT", 4096),
    ("spmdsim.models.moe.layer", "_LAYER_CHECKED", 256),
    ("spmdsim.models.moe.layer", "_EXPERTS_CHECKED", 256),
    ("spmdsim.models.moe.layer", "_COUNTS_LAYOUTS", 64),
    ("spmdsim.models.moe.slots", "_TABLES", 64),
    ("spmdsim.models.moe.fold", "_FOLDS", 64),
    ("spmdsim.models.moe.tokens", "_TAKEN", 64),
    ("spmdsim.models.moe.tokens", "_EXPERT_LAYOUTS", 64),
    ("spmdsim.models.moe.losses", "_CALLS", 256),
    ("spmdsim.layouts.counters", "_KEYS", 4096),
    ("spmdsim.layouts.counters", "_PLANS", 4096),
    ("spmdsim.references.contraction", "_RUNS", 4096),
    ("spmdsim.references.contraction", "_PLAIN", 4096),  # (starts over with _RUNS)
    ("spmdsim.references.contraction", "_PRESENT", 4096),
    ("spmdsim.base.buffers", "_SIZED", 1024),
    ("spmdsim.base.buffers", "_ZEROS", 4096),
    ("spmdsim.models.gpt.stage_steps", "_COMPILED", 256),
    ("spmdsim.base.flop_counts", "_FRESH", 8192),
    ("spmdsim.nn.autograd.kept", "_VIEWS", 4096),
    ("spmdsim.tools.estimate.ledger", "_GEMMS_AT", 4096),
    ("spmdsim.nn.fsdp", "_SHARDED", 1024),
    ("spmdsim.nn.ops.megatron", "_COLUMNS", 1024),
)


def tables() -> list:
    """[(module, name, limit, the dict itself)] of `TABLES`."""
    return [(module, name, limit, getattr(importlib.import_module(module), name)) for module, name, limit in TABLES]


def empty() -> None:
    """Empty every table of `TABLES` in place (a module may hold one bound elsewhere too: executor's
    `_forget_moves` has `_MOVES` as a default argument, so a fresh dict set in its place would not be the one
    cleaned when a mesh closes). What they held is only ever decided again: no result changes."""
    for _module, _name, _limit, table in tables():
        table.clear()
    counters = importlib.import_module("spmdsim.layouts.counters")  # its regions' tables start over by their bytes
    counters._INNERS.clear()
    counters._BASES.clear()
    counters._INNER_BYTES[0] = 0
