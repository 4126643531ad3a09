"""Whole networks as pure values: stages with the layouts they need, a schedule, a reference.

A `Network` is its global input (a SeededTensor and the layout it arrives in)
and its `Stage`s, each with the input layout its operator requires, its
parameters and its output layout (inferred here, so a bad strategy fails on every
rank alike before any collective). `schedule` makes the `Hop`s: a planned
redistribution wherever the previous output's layout differs from what the next
operator requires, then the operator, each with the collectives it must run.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from ...references import forward as reference
from ...layouts.datagen import SeededTensor
from ...layouts.dialects.paddle import split_layouts
from ...errors import OperatorError, ShapeError
from ...layouts.layout import TensorLayout
from ...programs.infer import infer_linear, infer_matmul, matmul_shape
from ...programs.plan import Plan, plan_redistribution

__all__ = [
    "KINDS", "Param", "Stage", "Network", "Hop", "flatten_stage", "matmul_stage", "linear_stage",
    "relu_stage", "paddle_stage", "schedule", "reference_rows", "short_layout",
]

#: Operator kinds a Stage may have.
KINDS = ("flatten", "matmul", "linear", "relu", "gelu", "embedding", "column_linear", "row_linear")

_LOCAL_STEPS = ("local_slice", "local_zero")


def short_layout(tl: TensorLayout) -> str:
    """Compact layout text for tables: [mp,(sp,dp)] or [m,-]P(k)."""
    parts = ["-" if not axes else axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")"
             for axes in tl.tensor_map]
    return "[" + ",".join(parts) + "]" + (f"P({','.join(tl.partial)})" if tl.partial else "")


@dataclass(frozen=True)
class Param:
    """A weight or bias: its global values (seeded) and how the operator wants it laid out."""

    name: str
    layout: TensorLayout
    source: SeededTensor


@dataclass(frozen=True)
class Stage:
    """One operator of a network.

    Attributes:
        name: "MatMul1", "ReLU2", ...
        kind: one of KINDS.
        how: the strategy as the user wrote it (for tables).
        x: the layout the operator requires for its input.
        out: the layout of its (finished) output.
        out_shape: the global output shape.
        params: weights and biases, in call order.
        collectives: (op, axes) of the collectives the operator itself runs.
    """

    name: str
    kind: str
    how: str
    x: TensorLayout
    out: TensorLayout
    out_shape: tuple[int, ...]
    params: tuple[Param, ...] = ()
    collectives: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OperatorError(f"stage kind {self.kind!r} is not one of {KINDS!r}")


@dataclass(frozen=True)
class Network:
    """A whole network: global input, the layout it arrives in, and its stages.

    `batch_dims` leading dims are rows the network treats independently (the
    reference computes only the rows a rank checks).
    """

    name: str
    title: str
    source: SeededTensor
    input_layout: TensorLayout
    stages: tuple[Stage, ...]
    batch_dims: int = 1

    @property
    def out(self) -> TensorLayout:
        return self.stages[-1].out

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.stages[-1].out_shape

    @property
    def flow(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(global shape, dtype) of the value before each stage and after the last (one more than stages).

        An operator with weights produces the weights' dtype (an embedding turns ids into
        floats); the others keep their input's.
        """
        shape, dtype = self.source.shape, self.source.dtype
        out = [(shape, dtype)]
        for stage in self.stages:
            shape, dtype = stage.out_shape, stage.params[0].source.dtype if stage.params else dtype
            out.append((shape, dtype))
        return tuple(out)


@dataclass(frozen=True)
class Hop:
    """One row of a network run: a redistribution, or an operator.

    Attributes:
        label: "Flatten", "-> MatMul1" (redistribution into MatMul1's layout), ...
        stage: index of the stage this hop applies or feeds.
        upto: stages applied to the value after this hop (its reference).
        plan: the redistribution plan (None for an operator hop).
        expected: (op, axes) of every collective the hop must run on a group
            of more than one rank, in order (axes None for an Alltoallv exchange).
    """

    label: str
    stage: int
    before: TensorLayout
    after: TensorLayout
    shape: tuple[int, ...]
    upto: int
    plan: Optional[Plan] = None
    expected: tuple[tuple[str, Optional[tuple[str, ...]]], ...] = ()

    @property
    def is_redistribution(self) -> bool:
        return self.plan is not None

    def note(self) -> str:
        """What a hop without collectives does instead."""
        if self.plan is None:
            return "local compute"
        if not self.plan.steps:
            return "same shards, new device matrix"
        ops = sorted({s.via for s in self.plan.steps if s.op in _LOCAL_STEPS})
        return ", ".join(ops) if ops else "-"


# -- stage builders ----------------------------------------------------------------
def flatten_stage(x: TensorLayout, shape: Sequence[int], name: str = "Flatten",
                  how: str = "data parallel") -> Stage:
    """Flatten (N, ...) -> (N, prod(...)): a local reshape when only dim 0 is split."""
    shape = x.check_shape(shape)
    if any(x.num_shards(d) > 1 for d in range(1, x.ndim)) or x.partial:
        raise OperatorError(
            f"flatten of {x} needs only dim 0 split (and no pending sum) to be a local reshape"
        )
    out = x.layout(x.tensor_map[0], None)
    return Stage(name, "flatten", how, x, out, (shape[0], int(np.prod(shape[1:]))))


def matmul_stage(name: str, how: str, x: TensorLayout, w: TensorLayout,
                 x_shape: Sequence[int], w_source: SeededTensor) -> Stage:
    """Y = X @ W with the given input layouts; a split K is finished by Allreduce."""
    plan = infer_matmul(x, w)
    shape = matmul_shape(tuple(x_shape), w_source.shape)
    for tl, s in ((x, x_shape), (w, w_source.shape), (plan.out, shape)):
        tl.check_shape(s)
    colls = tuple((s.op, s.axes) for s in plan.steps)
    return Stage(name, "matmul", how, x, plan.out, shape, (Param("w", w, w_source),), colls)


def linear_stage(name: str, how: str, x: TensorLayout, w: TensorLayout, x_shape: Sequence[int],
                 w_source: SeededTensor, b: Optional[TensorLayout] = None,
                 b_source: Optional[SeededTensor] = None) -> Stage:
    """Y = X @ W + b with the given layouts (`spmdsim.programs.infer.infer_linear`), as nn.Linear
    under an SBP: a split in_features is finished by Allreduce, the bias added once."""
    if (b is None) != (b_source is None):
        raise OperatorError(f"{name}: give both the bias layout and its values, or neither")
    plan = infer_linear(x, w, b)
    shape = matmul_shape(tuple(x_shape), w_source.shape)
    checks = [(x, x_shape), (w, w_source.shape), (plan.out, shape)]
    if b is not None:
        checks.append((b, b_source.shape))
    for tl, s in checks:
        tl.check_shape(s)
    params = (Param("w", w, w_source),) + ((Param("b", b, b_source),) if b is not None else ())
    colls = tuple((s.op, s.axes) for s in plan.steps)
    return Stage(name, "linear", how, x, plan.out, shape, params, colls)


def relu_stage(name: str, how: str, x: TensorLayout, shape: Sequence[int]) -> Stage:
    """ReLU on the layout its strategy gives: shard by shard, no communication."""
    shape = x.check_shape(shape)
    return Stage(name, "relu", how, x, x, shape)


def paddle_stage(name: str, kind: str, x_shape: Sequence[int], num_partitions: int,
                 weight: SeededTensor, bias: Optional[SeededTensor] = None) -> Stage:
    """``paddle.distributed.split``: kind "embedding", "column_linear" (axis=1, no gather)
    or "row_linear" (axis=0), with layouts from `spmdsim.layouts.dialects.paddle.split_layouts`."""
    operation, axis = {"embedding": ("embedding", 0), "column_linear": ("linear", 1),
                       "row_linear": ("linear", 0)}[kind]
    spec = split_layouts(weight.shape, operation, axis, num_partitions, False, len(x_shape))
    x_shape = tuple(x_shape)
    shape = x_shape + weight.shape[1:] if kind == "embedding" else matmul_shape(x_shape, weight.shape)
    spec.input.check_shape(x_shape)
    spec.output_after.check_shape(shape)
    params = (Param("w", spec.weight, weight),)
    if bias is not None:
        if bias.shape != weight.shape[1:]:
            raise ShapeError(f"bias of shape {bias.shape!r} does not match weight {weight.shape!r}")
        params += (Param("b", spec.bias, bias),)
    colls = ()
    if spec.collective and num_partitions > 1:
        colls = ((spec.collective, spec.layout.alias_name),)
    how = f"split({operation}, axis={axis}, num_partitions={num_partitions})"
    return Stage(name, kind, how, spec.input, spec.output_after, shape, params, colls)


# -- schedule ------------------------------------------------------------------------
def _expected_steps(plan: Plan) -> tuple:
    out = []
    for step in plan.steps:
        if step.op in _LOCAL_STEPS:
            continue
        if step.op == "exchange":
            out.append(("alltoallv", None))
        elif step.group_size > 1:
            out.append((step.op, tuple(step.axes)))
    return tuple(out)


def schedule(net: Network) -> tuple[Hop, ...]:
    """The hops of a forward pass: each stage, preceded by a redistribution when layouts differ."""
    hops = []
    cur = net.input_layout
    for i, (stage, (shape, dtype)) in enumerate(zip(net.stages, net.flow)):
        if cur != stage.x:
            plan = plan_redistribution(cur, stage.x, shape, dtype)
            hops.append(Hop(f"-> {stage.name}", i, cur, stage.x, shape, i, plan,
                            _expected_steps(plan)))
        hops.append(Hop(stage.name, i, stage.x, stage.out, stage.out_shape, i + 1, None,
                        stage.collectives))
        cur = stage.out
    return tuple(hops)


# -- reference -----------------------------------------------------------------------
@lru_cache(maxsize=32)
def _full(source: SeededTensor) -> np.ndarray:
    # Parameters are small; every check of every hop reuses them (never written to).
    out = source.full()
    out.setflags(write=False)
    return out


def _apply(stage: Stage, x: np.ndarray, batch_dims: int) -> np.ndarray:
    params = [_full(p.source) for p in stage.params]
    if stage.kind == "flatten":
        return x.reshape(x.shape[:batch_dims] + (-1,))
    if stage.kind in ("relu", "gelu"):
        return reference.activation(stage.kind)(x)
    if stage.kind == "matmul":
        return reference.matmul(x, params[0])
    if stage.kind == "embedding":
        return reference.embedding(x, params[0])
    return reference.linear(x, *params)


def reference_rows(net: Network, upto: int, region: Sequence[slice]) -> np.ndarray:
    """The block `region` of the value after `upto` stages, from the rows it needs only.

    Rows (the first `batch_dims` dims) go through the network independently, so
    a rank checking its shard computes its own rows of every layer, in numpy.
    """
    region = tuple(region)
    lead = region[: net.batch_dims]
    rest = (slice(None),) * (len(net.source.shape) - net.batch_dims)
    value = net.source.region(lead + rest)
    for stage in net.stages[:upto]:
        value = _apply(stage, value, net.batch_dims)
    return value[(slice(None),) * net.batch_dims + region[net.batch_dims:]]
