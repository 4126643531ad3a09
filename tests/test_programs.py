"""Operators and redistributions run step programs: what the trace records is what the steps say.

One vocabulary for moving bytes (docs/explanation/architecture.md): an operator's inference
(spmdsim.programs.infer) and the redistribution planner both give step records, the
executor runs them, and each trace entry's bytes are the step's own
(`Step.sized`). Run on 8 simulated ranks in this process.
"""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import Layout, SeededTensor, simulate
from spmdsim.programs.infer import infer_embedding, infer_linear, infer_matmul
from spmdsim.programs.plan import plan_redistribution
from spmdsim.programs.plan.steps import KINDS, Allgather, Allreduce, Alltoall, ReduceScatter, moved_bytes

MESH = Layout((2, 4), ("dp", "mp"))


def _traced(fn):
    """Per rank: [(op, axes, bytes sent, bytes received)] of what `fn(mesh)` ran on 8 simulated ranks."""
    def body():
        from spmdsim.runtime import Mesh, collect_trace

        mesh = Mesh(MESH)
        with collect_trace() as trace:
            fn(mesh)
        return [(e.op, e.axes, e.bytes_sent, e.bytes_received) for e in trace.entries]
    return simulate(8, body)


def _expected(steps, shape, itemsize, rank):
    sized = [s.sized(shape, itemsize) for s in steps]
    return [(s.op, s.axes, s.bytes_sent[rank], s.bytes_received[rank]) for s in sized]


@pytest.mark.parametrize("x_map, w_map, out", [
    (("dp", "mp"), ("mp", None), None),                       # K split: Allreduce
    (("dp", "mp"), ("mp", None), (("dp", "mp"), None)),       # out_strategy: Reduce_scatter
    ((None, "mp"), ("mp", "dp"), None),
    (("dp", None), (None, "mp"), None),                       # no collective
])
def test_matmul_trace_is_its_programs_steps(x_map, w_map, out):
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime import DTensor

    x_tl, w_tl = MESH(*x_map), MESH(*w_map)
    out_tl = None if out is None else MESH(*out)
    plan = infer_matmul(x_tl, w_tl, out=out_tl)
    xs, ws = SeededTensor((16, 32), "float32", 1), SeededTensor((32, 8), "float32", 2)

    def run(mesh):
        matmul(DTensor.from_seeded(mesh, x_tl, xs), DTensor.from_seeded(mesh, w_tl, ws), out_layout=out_tl)
    for rank, got in enumerate(_traced(run)):
        assert got == _expected(plan.steps, (16, 8), 4, rank)


def test_linear_and_embedding_traces_are_their_programs_steps():
    from spmdsim.nn.ops import embedding, linear
    from spmdsim.runtime import DTensor

    x_tl, w_tl, b_tl = MESH("dp", None), MESH(None, "mp"), MESH("mp")
    lin = infer_linear(x_tl, w_tl, b_tl, gather_out=True)
    ids_tl, table_tl = MESH(None), MESH("mp", "dp")
    emb = infer_embedding(ids_tl, table_tl)
    assert [s.op for s in lin.steps] == ["allgather"] and [s.op for s in emb.steps] == [
        "allreduce", "allgather"]
    xs, ws, bs = (SeededTensor(s, "float64", i) for i, s in enumerate(((8, 16), (16, 32), (32,))))
    table = SeededTensor((64, 8), "float32", 5)
    ids = np.arange(12, dtype=np.int64) * 5 % 64

    def run(mesh):
        linear(*(DTensor.from_seeded(mesh, tl, src) for tl, src in ((x_tl, xs), (w_tl, ws), (b_tl, bs))),
               gather_out=True)
        embedding(DTensor.from_global(mesh, ids, ids_tl), DTensor.from_seeded(mesh, table_tl, table))
    for rank, got in enumerate(_traced(run)):
        assert got == _expected(lin.steps, (8, 32), 8, rank) + _expected(emb.steps, (12, 8), 4, rank)


def test_redistribution_trace_is_its_plans_steps():
    from spmdsim.runtime import DTensor, redistribute

    src, dst = MESH(("dp", "mp"), None), MESH("mp", "dp")
    plan = plan_redistribution(src, dst, (16, 8), "float32")
    assert len(plan.steps) >= 1
    source = SeededTensor((16, 8), "float32", 3)

    def run(mesh):
        redistribute(DTensor.from_seeded(mesh, src, source), dst)
    for rank, got in enumerate(_traced(run)):
        wanted = [(s.op, s.axes, s.bytes_sent[rank], s.bytes_received[rank]) for s in plan.steps]
        assert [g[0] for g in got] == [("alltoallv" if w[0] == "exchange" else w[0]) for w in wanted]
        assert [g[2:] for g in got] == [w[2:] for w in wanted]


@pytest.mark.parametrize("kind", [Allgather, Alltoall, Allreduce, ReduceScatter])
def test_each_kind_owns_one_byte_formula(kind):
    # The runtime's trace asks the same formula by name; the cost model inverts it.
    from fractions import Fraction

    for g in (2, 3, 4, 8):
        n = 4096 * g
        assert moved_bytes(kind.op, g, n) == kind.moved(g, n)
        buffer = kind.buffer_bytes(g, Fraction(kind.moved(g, n)))
        assert buffer == (n * g if kind is Allgather else n)  # the larger of input and output
    assert KINDS[kind.op] is kind
