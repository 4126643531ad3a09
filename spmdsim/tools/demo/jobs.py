"""Builders of Jobs (one operator on generated data) used by the demo scenarios and `spmdsim run`.

Every builder validates layouts and shapes on all ranks before any
collective, makes each rank's shards from SeededTensors (the global inputs
are never built) and pairs the forward pass with its region reference.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ...layouts.datagen import SeededTensor
from ...layouts.dialects.strategy import format_strategy, matmul_layouts, parse_strategy
from ...errors import OperatorError
from ...layouts.layout import Layout, TensorLayout
from ...layouts.notation import format_entry
from ...programs.infer import LinearPlan, infer_embedding, infer_linear, out_layout_from_strategy
from ...models.nets.model import short_layout as short  # compact layout text for tables: [mp,(sp,dp)]
from ...programs.plan.steps import Step
from ...references.forward import embedding_region, linear_region, matmul_region, matmul_rounding
from ...references.tolerances import contraction_atol
from ...base.validate import counted
from .registry import Job
from ...layouts.dialects.paddle import split_layouts
from ...nn.ops.embedding import ParallelEmbedding, VocabParallelEmbedding
from ...nn.ops.linear import ColumnParallelLinear, RowParallelLinear
from ...nn.ops.matmul import matmul, plan_matmul
from ...nn.ops.mlp import ParallelMLP
from ...nn.ops.paddle_split import split
from ...programs.memory import matmul_job_need
from ...runtime.budget import check_memory
from ...runtime.dtensor import DTensor
from ...runtime.mesh import Mesh

__all__ = [
    "short", "contraction_atol", "mp_layout", "matmul_job", "strategy_matmul_job", "check_batch_dims", "linear_job",
    "embedding_job", "mlp_job", "FRONTS",
]

#: The APIs `linear_job` and `embedding_job` can go through (one implementation underneath).
FRONTS = ("megatron", "paddle")


def mp_layout(world_size: int) -> Layout:
    """The 1-D tensor-parallel mesh of Megatron/Paddle examples: every rank on axis "mp"."""
    return Layout((world_size,), ("mp",))


def _mesh(layout: Layout, comm: Any) -> Any:
    return Mesh(layout, comm)


def _dtensor(mesh: Any, layout: TensorLayout, source: SeededTensor) -> Any:
    return DTensor.from_seeded(mesh, layout, source)


def _partial_reason(axes: tuple[str, ...], what: str) -> str:
    return f"{what} is split over {format_entry(axes)}, so each rank holds a partial sum"


def matmul_job(
    comm: Any, x_layout: TensorLayout, w_layout: TensorLayout,
    x_shape: Sequence[int], w_shape: Sequence[int], *, dtype: str = "float32", seed: int = 0,
    transpose_a: bool = False, transpose_b: bool = False,
    out_layout: Optional[TensorLayout] = None, op: str = "MatMul", shape_flag: str = "--shape",
) -> Job:
    """Y = op(X) @ op(W) for explicit layouts (X from `seed`, W from `seed + 1`); `shape_flag`: what a refusal for
    memory calls the shape it names (`spmdsim run matmul`'s flag; the demo's: "shape", it has no flag)."""
    mesh = _mesh(x_layout.layout, comm)
    # Before any shard exists: refused alike on every rank when the peak does not fit.
    check_memory(comm, op, *matmul_job_need(x_layout, w_layout, x_shape, w_shape, dtype, transpose_a,
                                            transpose_b, out_layout), shape_flag=shape_flag)
    xs, ws = SeededTensor(x_shape, dtype, seed), SeededTensor(w_shape, dtype, seed + 1)
    x, w = _dtensor(mesh, x_layout, xs), _dtensor(mesh, w_layout, ws)
    plan, _ = plan_matmul(x, w, transpose_a=transpose_a, transpose_b=transpose_b,
                          out_layout=out_layout)
    steps = ()
    if plan.collective:
        steps = ((plan.steps[0], _partial_reason(plan.contraction_axes, "contraction dim K")),)
    # The tolerance follows the magnitudes that entered each output (|x| @ |w|), not k eps alone: the demo's
    # (32, 784, 512) summed largest products first is 1.5x beyond contraction_atol(784) + 1e-4 |y|.
    rtol, scale = matmul_rounding(xs, ws, transpose_a, transpose_b)
    return Job(
        op, f"x{short(x_layout)} w{short(w_layout)} -> {short(plan.out)}", mesh,
        lambda: matmul(x, w, transpose_a=transpose_a, transpose_b=transpose_b,
                       out_layout=out_layout),
        matmul_region(xs, ws, transpose_a, transpose_b), {"x": x, "w": w}, steps, rtol=rtol, scale=scale,
    )


def _batch_dims(n: int) -> str:
    return "no batch dim" if n == 0 else counted(n, "batch dim")


def check_batch_dims(dims: Sequence[int], strategy: Any, x_ndim: int) -> None:
    """Refuse a (batch..., M, K, N) `dims` whose batch dims are not the x of `strategy`'s (`x_ndim` dims) less 2,
    or fewer than its w's (w's batch counts line up with x's last ones)."""
    have, want = len(dims) - 3, x_ndim - 2
    if have != want:
        batch = ",".join(["B"] if want == 1 else [f"B{i}" for i in range(1, want + 1)])
        raise OperatorError(
            f"matmul shape {tuple(dims)!r} has {_batch_dims(have)} but strategy {strategy!r} gives x "
            f"{counted(x_ndim, 'dim')} ({_batch_dims(want)}); expected {counted(want + 3, 'size')}, "
            f"{batch + ',' if batch else ''}M,K,N"
        )
    parsed = parse_strategy(strategy)
    if len(parsed) == 2 and len(parsed[1]) - 2 > have:
        w_ndim = len(parsed[1])
        raise OperatorError(
            f"matmul shape {tuple(dims)!r} has {_batch_dims(have)} but strategy {strategy!r} gives w "
            f"{counted(w_ndim, 'dim')} ({_batch_dims(w_ndim - 2)}); expected w's strategy with at most "
            f"{counted(x_ndim, 'slice count')}, as many as x's"
        )


def strategy_matmul_layouts(strategy: Any, world: int, dims: Sequence[int], transpose_a: bool = False,
                            transpose_b: bool = False) -> Any:
    """`matmul_layouts` of `strategy` on `world` ranks, for the (batch..., M, K, N) `dims`: a strategy with a dim
    too many for them is refused as such, before it reads as a contraction or batch count that differs."""
    if len(dims) < 3:
        raise OperatorError(f"matmul shape {tuple(dims)!r} must be M,K,N (or B,...,M,K,N)")
    parsed = parse_strategy(strategy)
    if len(parsed) == 2 and min(map(len, parsed)) >= 2:
        check_batch_dims(dims, parsed, len(parsed[0]))
    m = matmul_layouts(strategy, world, transpose_a, transpose_b)
    check_batch_dims(dims, m.strategy, m.x.ndim)
    return m


def strategy_matmul_job(
    comm: Any, strategy: Any, dims: Sequence[int], *, dtype: str = "float32", seed: int = 0,
    transpose_a: bool = False, transpose_b: bool = False,
    out_strategy: Optional[Sequence[int]] = None, shape_flag: str = "--shape",
) -> Job:
    """MindSpore ``MatMul().shard(strategy)`` on (batch..., M, K, N) = `dims` (`shape_flag`: matmul_job's)."""
    dims = tuple(int(d) for d in dims)
    m = strategy_matmul_layouts(strategy, comm.Get_size(), dims, transpose_a, transpose_b)
    *batch, mm, k, n = dims
    x_shape = tuple(batch) + ((k, mm) if transpose_a else (mm, k))
    w_batch = tuple(batch)[len(batch) - (m.w.ndim - 2):] if m.w.ndim > 2 else ()
    w_shape = w_batch + ((n, k) if transpose_b else (k, n))
    out = None if out_strategy is None else out_layout_from_strategy(m.out, out_strategy)
    op = f"MatMul {format_strategy(m.strategy)}"
    if out_strategy is not None:
        op += f" out {format_strategy((tuple(out_strategy),))}"
    return matmul_job(comm, m.x, m.w, x_shape, w_shape, dtype=dtype, seed=seed,
                      transpose_a=transpose_a, transpose_b=transpose_b, out_layout=out, op=op, shape_flag=shape_flag)


def _linear_steps(plan: LinearPlan) -> tuple[tuple[Step, str], ...]:
    steps = []
    if plan.matmul.collective:
        steps.append((plan.matmul.steps[0],
                      _partial_reason(plan.matmul.contraction_axes, "the input dim (weight rows)")
                      + " (the bias is added once, after the sum)"))
    for gather in plan.gather:
        steps.append((gather, f"output columns are split over {format_entry(gather.axes)} and "
                              "gather_out asks for whole rows"))
    return tuple(steps)


def linear_job(
    comm: Any, parallel: str, dims: Sequence[int], *, dtype: str = "float32", seed: int = 0,
    gather_out: Optional[bool] = None, bias: bool = True, front: str = "megatron",
) -> Job:
    """Column- or row-parallel Linear on X (M, K) and W (K, N) over every rank ("mp").

    Row-parallel X arrives split on K (as a column-parallel layer leaves it);
    `gather_out` applies to column-parallel only and defaults to each front's
    own default: True for Paddle's ``split`` (``gather_out=True``), False for
    Megatron's ColumnParallelLinear (``gather_output=False``). W uses seed + 1,
    b seed + 2.
    """
    if parallel not in ("column", "row"):
        raise OperatorError(f"parallel {parallel!r} must be 'column' or 'row'")
    if front not in FRONTS:
        raise OperatorError(f"front {front!r} must be one of {FRONTS!r}")
    mm, k, n = (int(d) for d in dims)
    row = parallel == "row"
    if gather_out is None:
        gather_out = front == "paddle"
    gather_out = bool(gather_out) and not row
    layout = mp_layout(comm.Get_size())
    x_layout = layout(None, "mp") if row else layout(None, None)
    w_layout = layout("mp", None) if row else layout(None, "mp")
    b_layout = (layout(None) if row else layout("mp")) if bias else None
    plan = infer_linear(x_layout, w_layout, b_layout, gather_out=gather_out)
    mesh = _mesh(layout, comm)
    xs = SeededTensor((mm, k), dtype, seed)
    x = _dtensor(mesh, x_layout, xs)
    inputs = {"x": x}
    if front == "paddle":
        axis = 0 if row else 1
        w_src = SeededTensor((k, n), dtype, seed + 1)
        b_src = SeededTensor((n,), dtype, seed + 2) if bias else None
        op = f"paddle split linear axis={axis}" + ("" if row else f" gather_out={gather_out}")
        # split() makes the weights inside the call; its layouts say which block each rank gets.
        spec = split_layouts((k, n), "linear", axis, layout.num_devices, gather_out)
        inputs.update(_weights(W=(spec.weight, (k, n)), b=(spec.bias, (n,)) if bias else None))

        def forward(x: Any) -> Any:
            return split(x, (k, n), "linear", axis=axis,
                         num_partitions=layout.num_devices, gather_out=gather_out,
                         weight_attr=w_src, bias_attr=b_src if bias else False)
    else:
        if row:
            layer: Any = RowParallelLinear(mesh, k, n, bias=bias, input_is_parallel=True,
                                           dtype=dtype, seed=seed + 1)
        else:
            layer = ColumnParallelLinear(mesh, k, n, bias=bias, gather_output=gather_out,
                                         dtype=dtype, seed=seed + 1)
        w_src, b_src, op = layer.weight_source, layer.bias_source, type(layer).__name__
        forward = layer
        inputs.update(_weights(W=layer.weight, b=layer.bias))
    rtol, scale = matmul_rounding(xs, w_src, bias=b_src)  # as matmul_job's
    return Job(op, f"x{short(x_layout)} W{short(w_layout)} -> {short(plan.out)}", mesh,
               lambda: forward(x), linear_region(xs, w_src, b_src), inputs,
               _linear_steps(plan), rtol=rtol, scale=scale)


def _weights(**tensors: Any) -> dict[str, Any]:
    """The layer's weights for the rank lines (which block each rank holds), Nones left out.

    Each is a DTensor, or a (TensorLayout, shape[, note]) tuple (`spmdsim.layouts.holdings`) for
    weights the operator makes inside the call, as Paddle's ``split`` does.
    """
    return {name: t for name, t in tensors.items() if t is not None}


def embedding_job(
    comm: Any, mode: str, dims: Sequence[int], *, dtype: str = "float32", seed: int = 0,
    front: str = "megatron", gather_out: bool = True,
) -> Job:
    """Embedding of ids (dims[:-2]) into a (V, D) = dims[-2:] table, vocab- or dim-parallel."""
    if mode not in ("vocab", "dim"):
        raise OperatorError(f"embedding mode {mode!r} must be 'vocab' or 'dim'")
    if front not in FRONTS:
        raise OperatorError(f"front {front!r} must be one of {FRONTS!r}")
    if mode == "dim" and front == "paddle":
        # The same refusal as the CLI's: split() has no dim-parallel embedding to run.
        raise OperatorError("front 'paddle' has no mode 'dim': Paddle's split() embedding is "
                            "vocab-parallel only; use front 'megatron' (ParallelEmbedding) for dim")
    dims = tuple(int(d) for d in dims)
    if len(dims) < 3:
        raise OperatorError(f"embedding shape {dims!r} must be ID_DIMS...,VOCAB,DIM")
    ids_shape, (vocab, dim) = dims[:-2], dims[-2:]
    layout = mp_layout(comm.Get_size())
    mesh = _mesh(layout, comm)
    ids_layout = layout(*(None,) * len(ids_shape))
    ids_src = SeededTensor(ids_shape, "int64", seed, low=0, high=vocab)
    ids = _dtensor(mesh, ids_layout, ids_src)
    inputs = {"ids": ids}
    table_src = SeededTensor((vocab, dim), dtype, seed + 1)
    zeros_why = ""
    if mode == "vocab":
        table_layout = layout("mp", None)
        if front == "paddle":
            op = "paddle split embedding"
            # split() makes the table inside the call: N/p rows plus a zero padding row each.
            spec = split_layouts((vocab, dim), "embedding", 0, layout.num_devices, True,
                                 len(ids_shape))
            inputs["table"] = (spec.weight, (vocab, dim),
                               f"+ zero padding row (local {spec.local_weight_shape!r})")
            zeros_why = ("ids outside a rank's rows look up its zero padding row, "
                         f"local row {spec.padding_row}")
            rows = spec.vocab_range(mesh.rank)

            def forward(ids: Any) -> Any:
                return split(ids, (vocab, dim), "embedding", num_partitions=layout.num_devices,
                             weight_attr=table_src)
        else:
            layer = VocabParallelEmbedding(mesh, vocab, dim, dtype=dtype, seed=seed + 1)
            op, forward = "VocabParallelEmbedding", layer
            inputs["table"] = layer.weight
            rows = (layer.vocab_start_index, layer.vocab_end_index)
            zeros_why = ("ids outside a rank's rows give zero rows: Megatron masks them and "
                         "zeroes their output; this layer reads the zeros from a zero row kept "
                         "beside the weight, as Paddle does")
    else:
        table_layout = layout(None, "mp")
        layer = ParallelEmbedding(mesh, vocab, dim, gather_output=gather_out, dtype=dtype,
                                  seed=seed + 1)
        op, forward = "ParallelEmbedding (dim-parallel)", layer
        inputs["table"] = layer.weight
    plan = infer_embedding(ids_layout, table_layout, gather_out=gather_out)
    reduce_why = _partial_reason(plan.vocab_axes, "the vocabulary") + f" ({zeros_why})"
    gather_why = f"embedding columns are split over {format_entry(plan.dim_axes)}"
    steps = [(step, reduce_why) for step in plan.reduce] + [(step, gather_why) for step in plan.gather]
    notes = (_lookup_note(ids.local, rows),) if mode == "vocab" else ()
    return Job(op, f"ids{short(ids_layout)} table{short(table_layout)} -> {short(plan.out)}",
               mesh, lambda: forward(ids), embedding_region(ids_src, table_src), inputs,
               tuple(steps), notes=notes)


def _lookup_note(ids: Any, rows: tuple[int, int], most: int = 8) -> str:
    """Which ids one rank's vocab rows serve and what the others give (the first `most` ids)."""
    start, stop = (int(v) for v in rows)
    flat = [int(i) for i in ids.reshape(-1)]
    shown = flat[:most]
    mine = [i for i in shown if start <= i < stop]
    more = f" (first {most} of {len(flat)})" if len(flat) > most else ""
    found = f"{', '.join(map(str, mine))} in its rows" if mine else "none in its rows"
    return (f"ids {shown}{more}: {found} [{start}, {stop}); the other "
            f"{len(shown) - len(mine)} give zero rows")


def mlp_job(
    comm: Any, dims: Sequence[int], *, dtype: str = "float32", seed: int = 0,
    activation: str = "gelu",
) -> Job:
    """ParallelMLP on X (M, H) with inner width F = dims (M, H, F): one Allreduce."""
    mm, h, f = (int(d) for d in dims)
    layout = mp_layout(comm.Get_size())
    mesh = _mesh(layout, comm)
    xs = SeededTensor((mm, h), dtype, seed)
    x = _dtensor(mesh, layout(None, None), xs)
    mlp = ParallelMLP(mesh, h, f, activation=activation, dtype=dtype, seed=seed + 1)
    fc2 = infer_linear(layout(None, "mp"), mlp.linear_fc2.weight.layout)  # the hidden dim split over mp
    why = ("fc1 leaves the hidden dim split over \"mp\" and fc2's weight rows are split the "
           "same way, so each rank holds a partial sum of the output")
    steps = tuple((step, why) for step in fc2.steps)
    inputs = {"x": x, **_weights(W1=mlp.linear_fc1.weight, W2=mlp.linear_fc2.weight)}
    # Two contractions in a chain: the tolerance follows the magnitudes that entered each output and the
    # length of its sums (ParallelMLP.rounding), not one sum's k eps (at 3 ranks (24, 96, 480)'s error sat on
    # contraction_atol(480)).
    rtol, scale = mlp.rounding(xs)
    return Job(f"ParallelMLP ({activation})", f"x[-,-] fc1 W[-,mp] -> {activation} -> "
               "fc2 W[mp,-] -> [-,-]", mesh, lambda: mlp(x), mlp.reference(xs), inputs, steps,
               rtol=rtol, scale=scale)
