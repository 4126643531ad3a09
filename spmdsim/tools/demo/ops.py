"""The scenarios of `spmdsim demo`: MindSpore MatMul strategies and Layout tuples (MindSpore's
operator-level parallel tutorial), Paddle split / Megatron layers, and the fused MLP.

Shapes follow the seeds where they divide (x (32, 784) @ fc1 (784, 512));
the others are small and not powers of two. MatMul strategies and the
(2, 2, 2) Layout need 8 devices (or a multiple, as repeated calculation) and
are skipped on other world sizes; the 1-D "mp" scenarios use every rank.
"""
from __future__ import annotations

from typing import Callable, Optional

from ...layouts.layout import Layout
from .jobs import embedding_job, linear_job, matmul_job, mlp_job, strategy_matmul_job
from .registry import Context, Job, scenario

#: What a memory refusal calls the product's shape in the demo, which has no --shape flag (spmdsim run's has).
DEMO_SHAPE = "shape"

__all__: list[str] = []


def _multiple_of(devices: int, what: str) -> Callable[[int], Optional[str]]:
    def needs(world_size: int) -> Optional[str]:
        if world_size % devices:
            return f"{what} uses {devices} devices; needs a multiple of {devices} ranks, not {world_size}"
        return None

    return needs


def _divides(size: int) -> Callable[[int], Optional[str]]:
    def needs(world_size: int) -> Optional[str]:
        if size % world_size:
            return f"sizes are multiples of {size}, which {world_size} ranks do not divide"
        return None

    return needs


@scenario("matmul_2x1_1x4", "MatMul ((2,1),(1,4))", _multiple_of(8, "strategy ((2,1),(1,4))"))
def _matmul_2x1_1x4(ctx: Context) -> Job:
    # Rows split in 2, columns in 4: K is whole everywhere, no communication.
    return strategy_matmul_job(ctx.comm, "((2,1),(1,4))", (96, 120, 72),
                               dtype=ctx.dtype, seed=ctx.seed, shape_flag=DEMO_SHAPE)


@scenario("matmul_2x4_4x1", "MatMul ((2,4),(4,1))", _multiple_of(8, "strategy ((2,4),(4,1))"))
def _matmul_2x4_4x1(ctx: Context) -> Job:
    # Seed 003 matmul1: K split in 4 -> partial sums -> Allreduce over "k".
    return strategy_matmul_job(ctx.comm, "((2,4),(4,1))", (32, 784, 512),
                               dtype=ctx.dtype, seed=ctx.seed, shape_flag=DEMO_SHAPE)


@scenario("matmul_1x8_8x1", "MatMul ((1,8),(8,1))", _multiple_of(8, "strategy ((1,8),(8,1))"))
def _matmul_1x8_8x1(ctx: Context) -> Job:
    # Seed 003 matmul2: K split over all 8 ranks -> one Allreduce over 8.
    return strategy_matmul_job(ctx.comm, "((1,8),(8,1))", (32, 512, 512),
                               dtype=ctx.dtype, seed=ctx.seed, shape_flag=DEMO_SHAPE)


@scenario("matmul_out_strategy", "MatMul ((2,4),(4,1)) out ((8,1),)",
          _multiple_of(8, "strategy ((2,4),(4,1))"))
def _matmul_out_strategy(ctx: Context) -> Job:
    # MindSpore out_strategy: the partial sum is reduce-scattered along the rows.
    return strategy_matmul_job(ctx.comm, "((2,4),(4,1))", (32, 784, 512), dtype=ctx.dtype,
                               seed=ctx.seed, out_strategy=(8, 1), shape_flag=DEMO_SHAPE)


@scenario("matmul_layout_tuple", 'MatMul Layout("mp", ("sp","dp"))',
          lambda w: None if w == 8 else f"Layout((2,2,2)) needs exactly 8 ranks, not {w}")
def _matmul_layout_tuple(ctx: Context) -> Job:
    # Seed 003 advanced: x (32, 784) rows over mp, columns over (sp, dp); K over (sp, dp).
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    return matmul_job(ctx.comm, layout("mp", ("sp", "dp")), layout(("sp", "dp"), None),
                      (32, 784), (784, 512), dtype=ctx.dtype, seed=ctx.seed,
                      op="MatMul Layout((2,2,2))", shape_flag=DEMO_SHAPE)


@scenario("embedding_vocab", "vocab-parallel Embedding (Paddle split)", _divides(960))
def _embedding_vocab(ctx: Context) -> Job:
    # Seed 004: each rank holds N/p rows + a zero padding row; Allreduce sums the lookups.
    return embedding_job(ctx.comm, "vocab", (10, 4, 960, 48), dtype=ctx.dtype,
                         seed=ctx.seed, front="paddle")


@scenario("linear_row", "row-parallel Linear (Paddle split axis=0)", _divides(240))
def _linear_row(ctx: Context) -> Job:
    return linear_job(ctx.comm, "row", (24, 240, 72), dtype=ctx.dtype, seed=ctx.seed,
                      front="paddle")


@scenario("linear_column", "ColumnParallelLinear (gather_output)", _divides(240))
def _linear_column(ctx: Context) -> Job:
    return linear_job(ctx.comm, "column", (24, 200, 240), dtype=ctx.dtype, seed=ctx.seed,
                      gather_out=True)


@scenario("mlp", "ParallelMLP column -> GELU -> row", _divides(480))
def _mlp(ctx: Context) -> Job:
    return mlp_job(ctx.comm, (24, 96, 480), dtype=ctx.dtype, seed=ctx.seed)
