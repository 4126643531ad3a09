"""Pure layout inference of the operators: output layout and the steps that finish it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from spmdsim import Layout, OperatorError, ShapeError, TensorLayout
from spmdsim.layouts.dialects.strategy import matmul_layouts
from spmdsim.programs.infer import (
    infer_bias_add,
    infer_elementwise,
    infer_embedding,
    infer_linear,
    infer_matmul,
    matmul_shape,
    resolve_partial,
)
from spmdsim.programs.infer.assign import choose_splits

L3 = Layout((2, 2, 2), ("dp", "sp", "mp"))
L2 = Layout((2, 4), ("dp", "mp"))


@pytest.mark.parametrize(
    "strategy, out_map, collective, axes",
    [
        ("((2,1),(1,4))", ("m", "n"), None, ()),
        ("((2,4),(4,1))", ("m", "n"), "allreduce", ("k",)),
        ("((1,8),(8,1))", ("m", "n"), "allreduce", ("k",)),
        ("((2,2),(2,2))", ("m", "n"), "allreduce", ("k",)),
        ("((1,2),(2,1))", ("m", "n"), "allreduce", ("k",)),  # 4 repeated ranks ("rep")
    ],
)
def test_mindspore_strategies(strategy, out_map, collective, axes):
    m = matmul_layouts(strategy, 8)
    plan = infer_matmul(m.x, m.w)
    assert plan.out == m.layout(*out_map)
    assert plan.collective == collective and tuple(a for s in plan.steps for a in s.axes) == axes
    assert plan.local == (m.out if collective else m.out.with_partial(()))


def test_layout_tuple_matmul_allreduces_over_both_axes():
    plan = infer_matmul(L3("mp", ("sp", "dp")), L3(("sp", "dp"), None))
    assert plan.local == L3("mp", None, partial=("sp", "dp"))
    assert plan.out == L3("mp", None)
    assert plan.collective == "allreduce" and plan.steps[0].axes == ("sp", "dp")
    # Group members in mixed-radix order of (sp, dp), sp major.
    assert L3.axis_groups(plan.steps[0].axes)[0] == (0, 4, 2, 6)
    assert "partial sum" in plan.why() and "Allreduce" in plan.why()


def test_out_strategy_asks_for_reduce_scatter():
    m = matmul_layouts("((2,4),(4,1))", 8)
    plan = infer_matmul(m.x, m.w, out=m.layout(("m", "k"), "n"))
    assert plan.collective == "reduce_scatter"
    assert plan.steps[0].axes == ("k",) and plan.steps[0].tensor_dim == 0
    plan = infer_matmul(m.x, m.w, out=m.layout("m", ("n", "k")))
    assert plan.steps[0].tensor_dim == 1
    # The reduced axes must come after (minor to) the existing ones.
    with pytest.raises(OperatorError, match="Reduce_scatter"):
        infer_matmul(m.x, m.w, out=m.layout(("k", "m"), "n"))


def test_keep_partial_and_explicit_allreduce_out():
    m = matmul_layouts("((2,4),(4,1))", 8)
    assert infer_matmul(m.x, m.w, reduce=False).out == m.out
    assert infer_matmul(m.x, m.w, out=m.out.with_partial(())).collective == "allreduce"


def test_transposes_and_batch():
    # Strategies are in storage order: x (k, m) with transpose_a, w (n, k) with transpose_b.
    for ta, tb, strategy in [(False, True, "((2,4),(1,4))"), (True, False, "((4,2),(4,1))"),
                             (True, True, "((4,2),(1,4))")]:
        m = matmul_layouts(strategy, 8, transpose_a=ta, transpose_b=tb)
        plan = infer_matmul(m.x, m.w, transpose_a=ta, transpose_b=tb)
        assert plan.out == m.layout("m", "n") and plan.collective == "allreduce"
    b = Layout((2, 2, 2), ("b", "m", "k"))
    plan = infer_matmul(b("b", "m", "k"), b("b", "k", None))
    assert plan.out == b("b", "m", None) and plan.steps[0].axes == ("k",)
    plan = infer_matmul(b("b", "m", "k"), b("k", None))  # shared 2-d weight
    assert plan.out == b("b", "m", None)
    assert matmul_shape((3, 6, 10), (10, 14)) == (3, 6, 14)
    assert matmul_shape((3, 10, 6), (3, 14, 10), True, True) == (3, 6, 14)


@pytest.mark.parametrize(
    "x, w, message",
    [
        (L2("dp", "mp"), L2(None, "mp"), "contraction dim K is split over \"mp\" in x"),
        (L3("mp", ("sp", "dp")), L3(("dp", "sp"), None), r"e\.g\. w mapped \(\(\"sp\", \"dp\"\)"),
        (L2("mp", "dp"), L2("dp", "mp"), "axis 'mp' splits both dim M of x and dim N of w"),
        (L2("dp", None, None), L2(None, "mp"), None),
    ],
)
def test_inconsistent_matmul_layouts(x, w, message):
    if message is None:  # 3-d x with 2-d w is fine; this row checks the batch clash instead
        infer_matmul(x, w)
        with pytest.raises(OperatorError, match="axis 'dp' splits both batch dim 0"):
            infer_matmul(x, L2(None, "dp"))
        return
    with pytest.raises(OperatorError, match=message):
        infer_matmul(x, w)


def test_matmul_errors_mesh_partial_shape():
    with pytest.raises(OperatorError, match="share one device matrix"):
        infer_matmul(L2("dp", None), L3(None, None))
    with pytest.raises(OperatorError, match="both pending sums"):
        infer_matmul(L2(None, None, partial=("mp",)), L2(None, None, partial=("dp",)))
    with pytest.raises(OperatorError, match="resolve x"):
        infer_matmul(L2(None, None, partial=("mp",)), L2(None, "mp"))
    # A pending x times a weight replicated over its axes stays pending.
    plan = infer_matmul(L2("dp", None, partial=("mp",)), L2(None, None))
    assert plan.local.partial == ("mp",) and plan.collective == "allreduce"
    with pytest.raises(ShapeError) as caught:
        matmul_shape((4, 6), (5, 3))
    assert str(caught.value) == "contraction sizes differ: x of shape (4, 6) gives K=6, w of shape (5, 3) gives K=5"
    with pytest.raises(ShapeError) as caught:  # nn.Linear's (out, in) weight, ported as it is
        matmul_shape((8, 16), (32, 16))
    assert str(caught.value) == ("contraction sizes differ: x of shape (8, 16) gives K=16, w of shape (32, 16) gives "
                                 "K=32; w looks stored (out, in) = (32, 16), as nn.Linear's weight is: spmdsim's is "
                                 "(in, out), x @ w: pass w.T (or ops.matmul(x, w, transpose_b=True))")


def test_linear_column_and_row():
    col = infer_linear(L2("dp", None), L2(None, "mp"), L2("mp"))
    assert col.kind == "column" and col.out == L2("dp", "mp") and not col.steps
    gathered = infer_linear(L2("dp", None), L2(None, "mp"), L2("mp"), gather_out=True)
    assert gathered.out == L2("dp", None)
    assert [str(s) for s in gathered.steps] == ["S(1)->B via Allgather on ('mp',)"]
    assert gathered.steps[0].tensor_dim == 1 and gathered.steps[0].after == L2("dp", None)
    row = infer_linear(L2("dp", "mp"), L2("mp", None), L2(None))
    assert row.kind == "row" and row.out == L2("dp", None)
    assert [s.op for s in row.steps] == ["allreduce"] and row.steps[0].before.partial == ("mp",)
    pending = infer_linear(L2("dp", "mp"), L2("mp", None), L2(None), reduce=False)
    assert pending.bias_on_pending and pending.out.partial == ("mp",)
    with pytest.raises(OperatorError, match="bias .* must be split like the output's last dim"):
        infer_linear(L2("dp", None), L2(None, "mp"), L2(None))
    with pytest.raises(OperatorError, match="contraction dim K"):
        infer_linear(L2("dp", None), L2("mp", None))


def test_embedding_vocab_and_dim_parallel():
    one = Layout((8,), ("mp",))
    vocab = infer_embedding(one(None, None), one("mp", None))
    assert vocab.local.partial == ("mp",) and vocab.out == one(None, None, None)
    assert [s.op for s in vocab.steps] == ["allreduce"]
    dim = infer_embedding(one(None), one(None, "mp"))
    assert [str(s) for s in dim.steps] == ["S(1)->B via Allgather on ('mp',)"]
    assert infer_embedding(one(None), one(None, "mp"), gather_out=False).out == one(None, "mp")
    both = infer_embedding(L2(None), L2("dp", "mp"))
    assert both.local == L2(None, "mp", partial=("dp",)) and both.out == L2(None, None)
    ids_split = infer_embedding(L2("dp", None), L2("mp", None))
    assert ids_split.out == L2("dp", None, None) and ids_split.reduce[0].axes == ("mp",)
    with pytest.raises(OperatorError, match="ids must be replicated over the table's axes"):
        infer_embedding(one("mp"), one("mp", None))


def test_elementwise_rules():
    assert infer_elementwise(L2("dp", "mp")) == L2("dp", "mp")
    with pytest.raises(OperatorError, match=r"relu\(a\) \+ relu\(b\) != relu\(a \+ b\)"):
        infer_elementwise(L2("dp", None, partial=("mp",)), "relu")
    p = L2("dp", None, partial=("mp",))
    assert infer_bias_add(L2("dp", "mp"), L2("mp")) == L2("dp", "mp")
    with pytest.raises(OperatorError, match="once per rank"):
        infer_bias_add(p, L2(None))
    with pytest.raises(OperatorError, match="split like the last dim"):
        infer_bias_add(L2("dp", "mp"), L2(None))


def test_resolve_partial_without_pending_rejects_other_layout():
    full = L2("dp", None)
    assert resolve_partial(full) == (full, ())
    with pytest.raises(OperatorError, match="needs a redistribution"):
        resolve_partial(full, L2(None, "dp"))


def test_inference_and_references_import_no_mpi():
    code = (
        "import sys, spmdsim.programs.infer, spmdsim.references.forward, spmdsim.nn.ops.matmul, "
        "spmdsim.nn.ops.linear, spmdsim.nn.ops.embedding, spmdsim.nn.ops.mlp, spmdsim.nn.ops.paddle_split\n"
        "assert 'mpi4py' not in sys.modules, 'mpi4py imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_contraction_mismatch_hint_is_itself_a_valid_map():
    from spmdsim import Layout, OperatorError
    from spmdsim.programs.infer import infer_matmul

    mesh = Layout((2, 4), ("dp", "mp"))
    with pytest.raises(OperatorError) as info:
        infer_matmul(mesh("dp", "mp"), mesh(None, "mp"))
    message = str(info.value)
    assert message.endswith('e.g. w mapped ("mp", None)')
    # Following the hint works: the suggested w layout is accepted.
    assert infer_matmul(mesh("dp", "mp"), mesh("mp", None)) is not None


@pytest.mark.parametrize("x_map, w_map, hint", [
    (("dp", None), ("mp", "dp"), '(None, None)'),  # w's N on dp, which splits x's M: the hint kept it
    ((None, "mp", None), (None, "dp", "mp"), '(None, None, None)'),
    (("dp", None, "mp"), (None, None, "dp"), '("dp", "mp", None)'),  # w's batch dims are x's
])
def test_contraction_mismatch_hint_leaves_x_axes_off_w(x_map, w_map, hint):
    """The hint moved x's K axes to w's K dim but kept w's N on an axis that splits x's M (x ("dp", None), w
    ("mp", "dp"): 'e.g. w mapped (None, "dp")'), which the next try refused: "axis 'dp' splits both dim M of x
    and dim N of w". The hinted map now leaves x's axes off w's other dims, and is accepted."""
    from spmdsim import Layout, OperatorError
    from spmdsim.programs.infer import infer_matmul

    mesh = Layout((2, 4), ("dp", "mp"))
    with pytest.raises(OperatorError) as info:
        infer_matmul(mesh(*x_map), mesh(*w_map))
    assert str(info.value).endswith(f"e.g. w mapped {hint}")
    assert infer_matmul(mesh(*x_map), mesh(*(None if e == "None" else e.strip('"')
                                              for e in hint[1:-1].split(", ")))) is not None


def test_transpose_moves_the_tensor_map_with_the_dims():
    from spmdsim.programs.infer import infer_transpose

    mesh = Layout((2, 4), ("dp", "mp"))
    x = mesh("dp", None, "mp").with_partial(())
    assert infer_transpose(x, (2, 0, 1)) == (mesh("mp", "dp", None), (2, 0, 1))
    assert infer_transpose(x)[0] == mesh("mp", None, "dp")  # None reverses, as numpy does
    pending = Layout((2, 4), ("dp", "mp"))(None, "mp").with_partial(("dp",))
    assert infer_transpose(pending, [1, 0])[0] == mesh("mp", None).with_partial(("dp",))
    for bad in ((0, 1), (0, 0, 1), (0, 1, 3), (0, 1.0, 2), "012", 3):
        with pytest.raises(OperatorError, match=r"transpose perm .* must be a permutation of 0..2"):
            infer_transpose(x, bad)


def test_softmax_needs_a_whole_dim_and_no_pending_sum():
    from spmdsim.programs.infer import infer_softmax

    mesh = Layout((2, 4), ("dp", "mp"))
    x = mesh("dp", None)
    assert infer_softmax(x, -1) == (x, 1) and infer_softmax(x, 1) == (x, 1)
    with pytest.raises(OperatorError, match=r'softmax along dim 0 of .*split over "dp", so no rank holds a whole row'):
        infer_softmax(x, 0)
    with pytest.raises(OperatorError, match=r"softmax of a pending sum over \('mp',\) is wrong"):
        infer_softmax(x.with_partial(("mp",)), 1)
    for bad in (2, -3, 1.0, None):
        with pytest.raises(OperatorError, match=r"softmax dim .* is out of range"):
            infer_softmax(x, bad)


def test_out_layout_differing_only_by_size_one_axes_needs_nothing():
    # An axis of size 1 cuts nothing: asking for it in the output is the result's own layout.
    mesh = Layout((2, 1), ("dp", "mp"))
    plan = infer_matmul(mesh("dp", "mp"), mesh("mp", None), out=mesh(("dp", "mp"), None))
    assert plan.steps == () and plan.out == mesh(("dp", "mp"), None)
    with pytest.raises(OperatorError, match="needs a redistribution"):
        infer_matmul(mesh("dp", "mp"), mesh("mp", None), out=mesh(None, "dp"))


def test_contraction_messages_say_where_a_transpose_flag_puts_k():
    mesh = Layout((2, 4), ("dp", "mp"))
    with pytest.raises(OperatorError, match=r"w is stored \(\.\.\., N, K\) with transpose_b=True: K is its last dim"):
        infer_matmul(mesh(None, "mp"), mesh("mp", None), transpose_b=True)
    with pytest.raises(ShapeError, match=r"gives K=8 \(w is stored \(\.\.\., N, K\) with transpose_b=True"):
        matmul_shape((8, 16), (16, 8), transpose_b=True)
    with pytest.raises(ShapeError, match=r"x is stored \(\.\.\., K, M\) with transpose_a=True"):
        matmul_shape((8, 16), (16, 8), transpose_a=True)


def test_operators_md_inference_example_runs_as_quoted():
    """docs/reference/operators.md's `>>>` example of an operator program (its steps and bytes) holds."""
    import doctest
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "reference" / "operators.md"
    result = doctest.testfile(str(path), module_relative=False, verbose=False)
    assert result.attempted >= 6 and result.failed == 0


def test_contraction_split_over_a_size_one_axis_on_one_side_is_no_mismatch():
    # tp = 1 leaves a row-parallel weight on ("tp", None) while x's K is whole: the same blocks, no collective.
    mesh = Layout((3, 1), ("dp", "tp"))
    plan = infer_matmul(mesh("dp", None, None), mesh("tp", None))
    assert plan.steps == () and plan.out == mesh("dp", None, None) and plan.contraction_axes == ()
    plan = infer_matmul(mesh("dp", "tp"), mesh(None, None))  # and the other way round
    assert plan.steps == () and plan.out == mesh("dp", None)
    with pytest.raises(OperatorError, match="contraction dim K is split over \"dp\" in x"):
        infer_matmul(mesh(None, "dp"), mesh("tp", None))  # an axis that cuts still must match


@pytest.mark.usefixtures("empty_tables")  # (a table at its limit would start over between the calls)
def test_the_split_choice_hands_out_one_target_layout_object_per_layout():
    """choose_splits' targets are the planners' shared layouts (spmdsim.programs.plan.candidates.laid_out): an
    equal choice made again gives the same objects, each the layout its splits say."""
    args = (["mk", "kn"], [L2("dp", None), L2(None, "mp")], [(8, 8), (8, 8)], "float64", [(), ()])
    first, again = choose_splits(*args), choose_splits(*args)
    assert first.targets == again.targets and all(a is b for a, b in zip(first.targets, again.targets))
    assert first.targets == tuple(TensorLayout(L2, tuple(dict(first.splits).get(ch, ()) for ch in word))
                                  for word in ("mk", "kn"))
