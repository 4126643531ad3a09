"""One place for each operator rule: the strategy search prices the program spmdsim.programs.infer gives an
operator, and the operators run that program.

For every candidate of every operator kind the search knows, its output layout
is the one `spmdsim.programs.infer` gives on its layouts and its own collectives
(`Candidate.own`) are infer's step records, kind, axes and bytes (sized on the
whole mesh by the step's own formula). Then layer_norm and cross_entropy, whose
programs the search prices from `infer.norms` and `infer.losses`, are run on
simulated ranks: the collectives they issue are those steps, byte for byte.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.nn import ops
from spmdsim.tools.autoshard import build
from spmdsim.tools.autoshard.candidates import candidates, make_candidate
from spmdsim.tools.autoshard.graph import KINDS, OpNode
from spmdsim.layouts.datagen import SeededTensor
from spmdsim.errors import OperatorError
from spmdsim.programs.infer import (infer_cross_entropy, infer_elementwise, infer_embedding, infer_linear, infer_matmul,
                           infer_norm, infer_reshape, infer_softmax, resolve_partial)
from spmdsim.programs.infer.einsum import infer_einsum
from spmdsim.programs.infer.losses import counts_packed
from spmdsim.programs.infer.pointwise import infer_pointwise
from spmdsim.layouts.layout import TensorLayout
from spmdsim.programs.plan.steps import Allreduce


def _infer(node, c):
    """(output layout, program) that spmdsim.programs.infer gives `node` on candidate `c`'s layouts: the test's own
    dispatch to the rules, one per kind."""
    kind, x = node.kind, (c.inputs[0] if c.inputs else None)
    operands = tuple(c.inputs) + tuple(c.params)
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    on_out = lambda steps: tuple((s, tuple(node.out_shape)) for s in steps)  # noqa: E731
    if kind == "input":
        return node.layout, ()
    if kind in ("flatten", "reshape"):
        return infer_reshape(x, node.in_shapes[0], node.out_shape)[0], ()
    if kind in ("relu", "gelu"):
        return infer_elementwise(x, kind), ()
    if kind == "softmax":  # the search offers the local kernel's: rows whole (axes of size 1 cut nothing)
        return infer_softmax(x.layout(*x.tensor_map[:-1], None))[0].layout(*x.tensor_map), ()
    if kind == "pointwise":
        return infer_pointwise(node.spec, operands, shapes, node.dtype).out, ()
    if kind == "einsum":
        out, steps = resolve_partial(infer_einsum(node.spec, operands, shapes, node.dtype).local, c.out)
        return out, on_out(steps)
    if kind == "layernorm":
        plan = infer_norm("layer_norm", x, node.in_shapes[0])
        return plan.out, plan.program
    if kind == "cross_entropy":
        plan = infer_cross_entropy(x, TensorLayout(x.layout, x.tensor_map[:1]), node.in_shapes[0], node.dtype)
        return plan.out, plan.program
    if kind == "embedding":
        plan = infer_embedding(x, c.params[0], gather_out=False, out=c.out)
        return plan.out, on_out(plan.steps)
    if kind == "linear":
        plan = infer_linear(x, *c.params)
        return plan.out, on_out(plan.steps)
    w = c.params[0] if kind == "matmul" else c.inputs[1]
    plan = infer_matmul(x, w, transpose_b=node.transpose_b, out=c.out)
    return plan.out, on_out(plan.steps)


def _program(c):
    return [(s.op, s.axes, getattr(s, "reduction", None), s.max_bytes_received) for p in c.own for s in p.steps]


def _sized(program, dtype):
    item = np.dtype(dtype).itemsize
    return [(s.op, s.axes, getattr(s, "reduction", None), s.sized(shape, item).max_bytes_received)
            for s, shape in program]


NETWORKS = [("gpt", 8), ("gpt_sp", 8), ("net_mindspore_tutorial", 8), ("net_paddle_tp", 4), ("attention", 8)]


def test_every_kind_the_search_knows_prices_the_program_infer_gives_it():
    seen, collectives = set(), 0
    for name, devices in NETWORKS:
        graph, hand = build(name, devices)
        for i, node in enumerate(graph.nodes):
            dtypes = tuple(graph.nodes[graph.index(s)].dtype for s in node.inputs)
            cands = list(candidates(node, devices, dtypes))
            if hand is not None and hand[i] is not None:
                h = hand[i]
                cands.append(make_candidate(node, h.inputs, h.params, dtypes, h.out, hand=True))
            for c in cands:
                out, program = _infer(node, c)
                assert c.out == out, (name, node.name, c.text)
                assert _program(c) == _sized(program, node.dtype), (name, node.name, c.text)
                assert c.own_bytes == sum(b for *_, b in _sized(program, node.dtype))
                collectives += len(program)
            seen.add(node.kind)
    assert seen == set(KINDS) and collectives > 1000


def test_the_gpts_layer_norm_and_loss_own_collectives_are_infers():
    graph, hand = build("gpt", 8)
    ln, loss = graph.nodes[graph.index("h0.ln1")], graph.nodes[graph.index("loss")]
    (c,) = [c for c in candidates(ln, 8) if c.strategy[0] == (2, 1, 4)]  # hidden dim split 4 ways
    assert [(s.op, s.group_size) for p in c.own for s in p.steps] == [("allreduce", 4)] * 2
    megatron = make_candidate(loss, hand[-1].inputs, (), ("float64",))  # rows over dp, classes over tp
    plan = infer_cross_entropy(megatron.inputs[0], TensorLayout(megatron.inputs[0].layout, (("dp",),)),
                               loss.in_shapes[0], "float64")
    assert (plan.row_axes, plan.class_axes, plan.words) == (("dp",), ("tp",), 2)
    assert [(s.op, s.axes, s.reduction) for p in megatron.own for s in p.steps] == [
        ("allreduce", ("tp",), "max"), ("allreduce", ("tp",), "sum"), ("allreduce", ("dp",), "sum")]
    rows = loss.in_shapes[0][0] // 2  # each rank's rows: 8 x 64 split over dp = 2
    assert megatron.own_bytes == 2 * 3 * (rows * 8) // 4 + 2 * 3 * (2 * rows * 8) // 4 + 2 * 1 * 16 // 2


def test_a_flatten_is_infers_reshape():
    # (32, 1, 28, 28) -> (32, 784) with the image rows split: each rank's block is a block of the 784
    # (a run of 7 rows of 28), so the operator (ops.reshape) runs it as a local reshape, and the search
    # now says so too (it refused every split but dim 0's). Its columns split: not a block, refused by both.
    graph, _ = build("net_mindspore_tutorial", 8)
    node = graph.nodes[1]
    mesh = Layout((2, 4), ("a", "b"))
    c = make_candidate(node, (mesh("a", None, "b", None),), ())
    assert c.out == infer_reshape(mesh("a", None, "b", None), node.in_shapes[0], node.out_shape)[0] == mesh("a", "b")
    assert c.own == () and c.flops == 0
    for refuse in (lambda x: make_candidate(node, (x,), ()), lambda x: infer_reshape(x, node.in_shapes[0], (32, 784))):
        with pytest.raises(OperatorError, match="not a block of the new dims"):
            refuse(mesh("a", None, None, "b"))


def _traced(ranks, layout_of, body):
    """Per rank, (op, axes, bytes received) of every collective `body(mesh)` issues."""
    def run():
        from spmdsim.runtime import Mesh, collect_trace

        mesh = Mesh(layout_of, spmdsim.world())
        with collect_trace() as trace:
            body(mesh)
        return [(e.op, tuple(e.axes), e.bytes_received) for e in trace.entries if e.group_size > 1]

    return spmdsim.simulate(ranks, run)


def _expected(program, dtype):
    item = np.dtype(dtype).itemsize
    return [(s.op, s.axes, s.sized(shape, item).max_bytes_received) for s, shape in program]


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("hidden", [("tp",), ()])
def test_norms_issue_the_program_infer_gives(kind, hidden):
    mesh_layout, shape = Layout((2, 4), ("dp", "tp")), (4, 6, 16)
    x_layout = mesh_layout("dp", None, hidden or None)
    plan = infer_norm(kind, x_layout, shape)
    assert len(plan.steps) == ({"layer_norm": 2, "rms_norm": 1}[kind] if hidden else 0)
    assert plan.whole == (not hidden)

    def body(mesh):
        x = spmdsim.DTensor.from_seeded(mesh, x_layout, SeededTensor(shape, "float64", 1))
        getattr(ops, kind)(x)

    for ran in _traced(8, mesh_layout, body):
        assert ran == _expected(plan.program, "float64")


@pytest.mark.parametrize("rows, classes, dtype", [((2, 4), "tp", "float64"), ("dp", None, "float32"),
                                                  (None, ("dp", "tp"), "float64")])
def test_cross_entropy_issues_the_program_infer_gives(rows, classes, dtype):
    mesh_layout, shape = Layout((2, 4), ("dp", "tp")), (16, 24)
    rows = ("dp",) if rows == (2, 4) else rows
    logits_layout, labels_layout = mesh_layout(rows, classes), mesh_layout(rows)
    plan = infer_cross_entropy(logits_layout, labels_layout, shape, dtype)

    def body(mesh):
        z = spmdsim.DTensor.from_seeded(mesh, logits_layout, SeededTensor(shape, dtype, 2))
        y = spmdsim.DTensor.from_seeded(mesh, labels_layout, SeededTensor((16,), "int64", 3, low=0, high=24))
        ops.cross_entropy(z, y)

    for ran in _traced(8, mesh_layout, body):
        assert ran == _expected(plan.program, dtype) and len(ran) == len(plan.steps) > 0


def test_a_large_float32_loss_is_priced_as_it_runs():
    """Found by asking infer: past 4,094 rows a float32 loss cannot pack its two label counts into one
    number, and ops.cross_entropy sends three; the search priced two (14 B a rank instead of 21 on 8)."""
    rows, classes = 8192, 8
    assert counts_packed(4094, "float32") and not counts_packed(rows, "float32") and counts_packed(rows, "float64")
    layout = Layout((8,), ("dp",))("dp", None)
    x = OpNode("x", "input", (), (), (rows, classes), "float32", layout=layout,
               source=SeededTensor((rows, classes), "float32", 0))
    loss = OpNode("loss", "cross_entropy", ("x",), ((rows, classes),), (), "float32",
                  source=SeededTensor((rows,), "int64", 1, low=0, high=classes))
    c = make_candidate(loss, (layout,), ())
    assert [(s.op, s.axes) for p in c.own for s in p.steps] == [("allreduce", ("dp",))]
    assert c.own_bytes == Allreduce.moved(8, 3 * 4) == 21

    def body(mesh):
        z = spmdsim.DTensor.from_seeded(mesh, layout, x.source)
        ops.cross_entropy(z, spmdsim.DTensor.from_seeded(mesh, layout.layout("dp"), loss.source))

    assert all(ran == [("allreduce", ("dp",), 21)] for ran in _traced(8, layout.layout, body))


def test_the_rules_refuse_alike_in_infer_and_on_ranks():
    mesh_layout = Layout((2, 4), ("dp", "tp"))
    with pytest.raises(OperatorError, match=r"labels .* must be split like the logits' batch dim"):
        infer_cross_entropy(mesh_layout("dp", "tp"), mesh_layout(None), (16, 24), "float64")
    with pytest.raises(OperatorError, match="of a pending sum"):
        infer_cross_entropy(mesh_layout("dp", None, partial="tp"), mesh_layout("dp"), (16, 24), "float64")
    with pytest.raises(OperatorError, match="norm 'batch_norm' is not known"):
        infer_norm("batch_norm", mesh_layout("dp", "tp"), (16, 24))

    def run():
        from spmdsim.runtime import Mesh, collect_trace

        mesh = Mesh(mesh_layout, spmdsim.world())
        z = spmdsim.DTensor.from_seeded(mesh, mesh_layout("dp", "tp"), SeededTensor((16, 24), "float64", 2))
        y = spmdsim.DTensor.from_seeded(mesh, mesh_layout(None), SeededTensor((16,), "int64", 3, low=0, high=24))
        with collect_trace() as trace:
            try:
                ops.cross_entropy(z, y)
            except OperatorError as e:
                return str(e), len([e for e in trace.entries if e.group_size > 1])
        return "ran", 0

    (message, collectives), = set(spmdsim.simulate(8, run))  # every rank refuses alike, before any collective
    assert "must be split like the logits' batch dim" in message and collectives == 0


def test_a_vocabulary_reduce_scatters_where_infer_says():
    # Megatron's sequence parallelism: the embedding's pending sum over the vocabulary's axis lands split
    # on the sequence; infer_embedding(out=) gives the step, and the search prices that step.
    mesh_layout = Layout((2, 4), ("dp", "tp"))
    ids, table = mesh_layout("dp", None), mesh_layout("tp", None)
    plan = infer_embedding(ids, table, gather_out=False, out=mesh_layout("dp", "tp", None))
    (step,) = plan.steps
    assert (step.op, step.axes, step.tensor_dim, plan.out) == ("reduce_scatter", ("tp",), 1,
                                                               mesh_layout("dp", "tp", None))
    with pytest.raises(OperatorError, match="cannot be reached from the pending sum"):
        infer_embedding(ids, table, gather_out=False, out=mesh_layout(None, "tp", None))
