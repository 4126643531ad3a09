"""The eager step's hot path: no import statement (a relative import inside a function runs importlib's
Python on every call), no redistribution compiled again after the first step (docs/explanation/performance.md, "Then
the import statements on the hot path") and none of the per-operator helpers cut since ("Then the autograd
walk's and the operators' own frames")."""
from __future__ import annotations

import contextlib
import os
import sys

import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
from spmdsim.models.gpt.parallel import GPT
from spmdsim.models.gpt.params import decays, param_specs
from spmdsim.nn.optim import AdamW

SMALL = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)


@pytest.fixture(autouse=True)
def _empty_operator_tables(empty_tables):
    """Each test starts with spmdsim's bounded tables of decided calls empty (tests/bounded_tables.py): a table
    starts over when full (the operators' at 4,096 entries, spmdsim.nn.ops._common.prepare), and one that the
    earlier tests of this worker filled to the brim could start over between a test's first call and its repeat,
    which then prepares again (seen once in a full run: test_a_repeated_pointwise_call_takes_its_prepared_path
    [moved]). The compiled moves live on each mesh (runtime.compiled.keep_move): a test's new meshes start
    empty."""
    yield


def _train_three_steps(kept: str, around) -> None:
    """Three GPT training steps on 8 simulated ranks (dp 2 x tp 4, sequence parallel: einsum products,
    redistributions, a bucketed backward, AdamW; with `kept` "megatron", Megatron's fused pieces and their
    local products), each run inside ``around(comm, step)`` (a context manager), then ``around(comm, 3)``."""
    def body():
        comm = spmdsim.world()
        mesh = Mesh(Layout((2, 4), ("dp", "tp")), comm)
        model = GPT(SMALL, mesh, sp=True, kept=kept)
        specs = param_specs(SMALL)
        opt = AdamW([model.params[s.name] for s in specs], lr=SMALL.lr,
                    decay=[model.params[s.name] for s in specs if decays(s)])
        ids = encode(load_text())
        for step in range(3):
            x, y = batch(ids, SMALL, step)
            xd, yd = (DTensor.from_global(mesh, a, mesh.layout("dp", None)) for a in (x, y))
            with around(comm, step):
                opt.zero_grad()
                model.loss(xd, yd, step).backward(bucket=True)
                opt.step()
        with around(comm, 3):
            pass
        mesh.close()

    spmdsim.simulate(8, body)


def _importlib_calls(kept: str) -> dict:
    """Rank 0's calls into importlib's Python during the third of `_train_three_steps`' steps."""
    seen: dict = {}

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith("<frozen importlib"):
            caller = frame.f_back
            where = f"{caller.f_code.co_filename}:{caller.f_code.co_name}" if caller is not None else "?"
            seen[where] = seen.get(where, 0) + 1

    @contextlib.contextmanager
    def around(comm, step):
        counting = step == 2 and comm.rank == 0
        if counting:
            sys.setprofile(hook)  # this rank's thread only
        try:
            yield
        finally:
            if counting:
                sys.setprofile(None)

    _train_three_steps(kept, around)
    return seen


@pytest.mark.parametrize("kept", ["graph", "megatron"])
def test_an_eager_step_runs_no_import_statement(kept):
    assert _importlib_calls(kept) == {}


@pytest.mark.parametrize("kept", ["graph", "megatron"])
def test_a_step_after_the_first_compiles_no_redistribution(kept, monkeypatch):
    """Each move's program is compiled once (runtime.executor keeps them by the layout objects): a layout made
    anew each step would plan and compile its moves again every step (Megatron's row-parallel product did)."""
    from spmdsim.runtime import executor

    compiled: list = []
    compile_ = executor._compile

    def counting(plan, mesh, cls):
        compiled.append(spmdsim.world().rank)
        return compile_(plan, mesh, cls)

    monkeypatch.setattr(executor, "_compile", counting)
    marks: list = []

    @contextlib.contextmanager
    def around(comm, step):
        comm.Barrier()
        if comm.rank == 0:
            marks.append(len(compiled))
        comm.Barrier()
        yield

    _train_three_steps(kept, around)
    per_step = [b - a for a, b in zip(marks, marks[1:])]
    assert per_step[0] > 0 and per_step[1:] == [0, 0], per_step


def test_an_eager_step_calls_none_of_the_helpers_it_has_cut():
    """Rank 0's third step runs no frame that only repeated what was decided before or wrapped a C call:
    numpy's Python wrapper of ``ndarray.sum`` (sums are ``np.add.reduce``), the pointwise backward's
    per-operand summed dims, axes and layouts (kept per plan, dY's layout and the operands' layouts; the
    ranks' threads share the table), a comprehension gathering an operator's operands (mapped by
    attrgetter in C) or a node's read layouts, a new plan
    of the walk's leaves (the first step's is taken again: `_leaf_plan`, once), `gradient_block` (a rule's
    transposed block of its operand's shape and dtype is copied to C order by `grad_tensor`); and the walk brings a
    node's gradient to its layout (`_prepared`) only where it is not already there."""
    import os

    import numpy as np

    calls: dict = {}
    numpy_dir, ours = os.path.dirname(np.__file__), os.path.dirname(spmdsim.__file__) + os.sep

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            where = "numpy" if code.co_filename.startswith(numpy_dir) else code.co_filename.replace(ours, "")
            calls[(where, code.co_name)] = calls.get((where, code.co_name), 0) + 1

    @contextlib.contextmanager
    def around(comm, step):
        counting = step == 2 and comm.rank == 0
        if counting:
            sys.setprofile(hook)
        try:
            yield
        finally:
            if counting:
                sys.setprofile(None)

    _train_three_steps("graph", around)
    rules = "nn/autograd/rules/"
    cut = [("numpy", "_sum"), (rules + "pointwise.py", "_summed"), (rules + "pointwise.py", "_sum_dims"),
           (rules + "pointwise.py", "_summed_axes"), (rules + "pointwise.py", "<listcomp>"),
           (rules + "einsum.py", "<listcomp>"), ("nn/ops/pointwise.py", "<listcomp>"),
           ("nn/ops/ufuncs.py", "<listcomp>"), ("nn/ops/einsum.py", "<listcomp>"),
           ("nn/autograd/graph.py", "<listcomp>"), ("nn/autograd/plans.py", "_new_leaf_plan"),
           (rules + "grads.py", "gradient_block"),  # (attention's transposed dq, dk, dv: copied by grad_tensor)
           ("runtime/replay.py", "recorded")]  # (kernels called through replay.kernels' namespaces: no wrapper)
    assert {key: calls[key] for key in cut if key in calls} == {}
    # Blocks read as ``x._local`` after this thread's capture test, not through DTensor.local's function: a few
    # reads off the hot operators' paths remain (a transpose, the loss's backward, the ids' check ...).
    assert calls.get(("runtime/replay.py", "local_of"), 0) <= 8, calls.get(("runtime/replay.py", "local_of"))
    assert calls.get(("nn/autograd/plans.py", "_leaf_plan")) == 1
    # every node: `attach`'s (`record` calls it; prepared calls and fused pieces too) and the moves' (built by
    # `_Recorded.moved` itself)
    nodes = calls[("nn/autograd/graph.py", "attach")] + calls.get(("nn/autograd/graph.py", "moved"), 0)
    prepared = calls.get(("nn/autograd/engine.py", "_prepared"), 0)
    assert nodes > 20 and prepared < nodes / 2, (nodes, prepared)


def test_an_eager_step_decides_no_move_again_and_builds_its_fused_gradients_itself():
    """Rank 0's third step: the walk moves a gradient to its tensor's layout without `_move`'s frame and its
    layout comparison (whether it moves is kept with grad_layout's answer), the model compares no layout again to
    gather its activations (an unequal one is kept too), a dropout mask is drawn without a SeededTensor of its
    seed (`uniform_at_least`), a whole-row norm computes without its kernel's closure and the engine's frame, a
    collective's buffer is sized once per shape and dtype, the fused pieces' rules build their usual
    gradients without `grad_tensor`'s frame, and the walk sums two gradients of one layout object without
    `add_grads`' frame."""
    seen: dict = {}
    ours = os.path.dirname(spmdsim.__file__) + os.sep

    def hook(frame, event, arg):
        if event == "call":
            code, back = frame.f_code, frame.f_back.f_code
            key = (code.co_filename.replace(ours, ""), code.co_name, back.co_filename.replace(ours, ""), back.co_name)
            seen[key] = seen.get(key, 0) + 1

    @contextlib.contextmanager
    def around(comm, step):
        counting = step == 2 and comm.rank == 0
        if counting:
            sys.setprofile(hook)
        try:
            yield
        finally:
            if counting:
                sys.setprofile(None)

    _train_three_steps("graph", around)
    called = {(name, caller) for _, name, _, caller in seen}
    callees = {(f, name) for f, name, _, _ in seen}
    assert ("_move", "_walk") not in called and ("__eq__", "_gathered") not in called
    # two gradients of one tensor in one layout object (a residual stream's) summed by the walk itself
    assert ("add_grads", "_walk") not in called
    assert ("grad_tensor", "__call__") not in {(n, c) for f, n, cf, c in seen if cf == "nn/autograd/rules/fused.py"}
    assert {k for k in [("layouts/datagen.py", "with_seed"), ("layouts/datagen.py", "at_least"),
                        ("nn/ops/norms.py", "kernel"), ("nn/ops/normalize.py", "kernel"), ("base/buffers.py", "_sized")]
            if k in callees} == set()
    # (the masks are drawn: the fast path is the one taken)
    assert ("layouts/datagen.py", "uniform_at_least") in callees
    # A repeated Allgather or Reduce_scatter move runs its kept collective call from `redistribute` itself (no
    # runner's and no collective's frame), a move's node is built by `moved` itself, a gradient sum without
    # DTensor._trusted's frame, a buffer without current()'s, the fused rules' blocks without `_made`'s and
    # `is_low`'s frames, attention's float products per head without precision.product's and matmul's, a whole-row
    # norm's values without shaped_as's frame.
    assert sum(v for (f, n, _, _), v in seen.items() if (f, n) == ("runtime/executor.py", "redistribute")) >= 8
    assert {k for k in [("runtime/executor.py", "run_allgather"), ("runtime/executor.py", "run_reduce_scatter"),
                        ("runtime/collectives.py", "allgather"), ("runtime/collectives.py", "reduce_scatter")]
            if k in callees} == set()
    assert {("attach", "moved"), ("_trusted", "add_grads"), ("current", "kept_empty"), ("current", "repeat"),
            ("product", "grouped_product"), ("product", "grouped_sum"), ("shaped_as", "normal_values")} \
        & called == set()
    # A kept collective's buffer from kept_empty itself (not through buffers.empty's frame), a whole-row norm's
    # statistics without `_normalize`'s and any_open's frames, attention's result without make_dtensor's.
    assert {("empty", "redistribute"), ("_normalize", "normal_values"), ("any_open", "normal_values"),
            ("make_dtensor", "attention")} & called == set()
    assert ("kept_empty", "redistribute") in called
    assert {n for f, n, cf, c in seen if cf == "nn/autograd/rules/fused.py" and c == "__call__"} & {"_made", "is_low"} \
        == set()


def test_an_eager_steps_walk_routes_a_kept_gradient_by_its_layouts_mark_and_products_by_kept_functions(monkeypatch):
    """Rank 0's third step: the walk looks up grad_layout's answer (moves._GRAD_BY_OBJECT) only for a gradient
    that moves (one that stays as it is, a parameter's pending over dp, is known by its layout object's mark,
    TensorLayout._grad_of), and an einsum rule runs its products' kept functions (no `pair_plain` frame)."""
    from spmdsim.nn.autograd import moves

    looked: list = []
    counting = [False]

    class Counted(dict):
        def get(self, key, default=None):
            if counting[0] and spmdsim.world().rank == 0:
                looked.append(key)
            return dict.get(self, key, default)

    monkeypatch.setattr(moves, "_GRAD_BY_OBJECT", Counted())
    seen: dict = {}
    ours = os.path.dirname(spmdsim.__file__) + os.sep

    def hook(frame, event, arg):
        if event == "call":
            code, back = frame.f_code, frame.f_back.f_code
            key = (code.co_name, back.co_filename.replace(ours, ""), back.co_name)
            seen[key] = seen.get(key, 0) + 1

    @contextlib.contextmanager
    def around(comm, step):
        on = step == 2 and comm.rank == 0
        if on:
            counting[0] = True
            sys.setprofile(hook)
        try:
            yield
        finally:
            if on:
                sys.setprofile(None)
                counting[0] = False

    _train_three_steps("graph", around)
    moves = seen.get(("redistribute", "nn/autograd/engine.py", "_walk"), 0)
    assert moves > 0 and len(looked) == moves, (len(looked), moves)  # (a move's each; none for the others)
    assert ("pair_plain", "nn/autograd/rules/einsum.py", "__call__") not in seen
    assert sum(v for (n, f, c), v in seen.items() if n == "plain" and f == "nn/autograd/rules/einsum.py") > 0


def test_a_layouts_walk_mark_is_no_part_of_its_value():
    """TensorLayout._grad_of (the walk's mark) is no field: equal, hashed, shown and pickled as without it."""
    import pickle

    layout = Layout((2, 2), ("dp", "tp"))
    from spmdsim.layouts.layout import TensorLayout

    a, b = TensorLayout(layout, ((), ("tp",)), ("dp",)), TensorLayout(layout, ((), ("tp",)), ("dp",))
    object.__setattr__(a, "_grad_of", TensorLayout(layout, ((), ("tp",))))
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert pickle.dumps(a) == pickle.dumps(b)
    assert pickle.loads(pickle.dumps(a))._grad_of is None


# The frames a repeated operator call must not run (`_watched_calls`), counted only when the operator's own code
# calls them (not a moved operand's redistribution, which records its node).
_WATCHED = {"_operands", "decided", "make_dtensor", "record"}
_CALLERS = {"pointwise", "_first_call", "record_pointwise", "einsum", "record_einsum", "prepare", "__init__"}


def _watched_calls(f, watched=_WATCHED, callers=_CALLERS):
    """(the `watched` frames `f()` runs, called from a frame named in `callers` (None: any), its result)."""
    calls: list = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name in watched and (
                callers is None or frame.f_back.f_code.co_name in callers):
            calls.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        return calls, f()
    finally:
        sys.setprofile(None)


def _watched_step(f, leaves, watched=_WATCHED, callers=_CALLERS):
    """`f()` watched (`_watched_calls`), then the sum of its result backward: (the watched frames, the result
    gathered, its layout, its node's (name, want, reads), each of `leaves`' gradient gathered); the leaves'
    gradients are cleared after (the next call's not added to these)."""
    calls, y = _watched_calls(f, watched, callers)
    node = y._ag
    y.sum().backward()
    grads = tuple(t.grad.gather() for t in leaves)
    for t in leaves:
        t._ag.grad = None
    return calls, y.gather(), y.layout, (node.name, node.want, node.reads), grads


@pytest.mark.parametrize("b_map", [(None, "tp"), ("dp", None), (None,)], ids=["moved", "same", "broadcast"])
def test_a_repeated_pointwise_call_takes_its_prepared_path(b_map):
    """A pointwise call with the layout objects, shapes and dtypes of an earlier one (spmdsim.nn.ops.pointwise's
    prepared call) plans, checks and builds nothing again: no `_operands`, `decided`, `make_dtensor` or
    `record` frame (a moved operand's redistribution records its own node), and the same result, layout,
    graph node and gradients as the first call; an operand in another layout, or of another shape, prepares
    again (and is right)."""
    import numpy as np

    rng = np.random.default_rng(3)
    ga = rng.standard_normal((4, 6))
    gb = rng.standard_normal((4, 6)[-len(b_map):])

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        a = DTensor.from_global(mesh, ga, mesh.layout("dp", None)).requires_grad_()
        b = DTensor.from_global(mesh, gb, mesh.layout(*b_map)).requires_grad_()

        def run():
            calls, z = _watched_calls(lambda: a * b)
            node = z._ag
            z.sum().backward()
            grads = a.grad.gather(), b.grad.gather()
            a._ag.grad = b._ag.grad = None  # the next call's gradients, not added to these
            return calls, z, node, grads

        first, second = run(), run()
        # A shape, and a layout, the prepared calls have not seen: prepared again.
        c = DTensor.from_global(mesh, ga[:2], mesh.layout("dp", None))
        a2 = DTensor.from_global(mesh, ga, mesh.layout(None, "tp"))
        calls, (d, e) = _watched_calls(lambda: (c + c, a2 * b))
        out = (first[0], first[1].gather(), first[1].layout, first[2], first[3], second[0], second[1].gather(),
               second[1].layout, second[2], second[3], calls, d.gather(), e.gather())
        mesh.close()
        return out

    (calls1, z1, layout1, node1, grads1, calls2, z2, layout2, node2, grads2, calls3, d,
     e) = spmdsim.simulate(4, body)[0]
    assert "_operands" in calls1 and "decided" in calls1
    assert calls2 == []
    assert np.array_equal(z2, z1) and np.array_equal(z1, ga * gb)
    assert layout2 is layout1
    assert (node2.name, node2.want, node2.reads, node2.kind, node2.low) == (
        node1.name, node1.want, node1.reads, node1.kind, node1.low)
    assert [x.layout for x in node2.inputs] == [x.layout for x in node1.inputs]
    for g2, g1 in zip(grads2, grads1):
        assert np.array_equal(g2, g1)
    assert np.array_equal(grads1[0], np.broadcast_to(gb, ga.shape))
    assert np.array_equal(grads1[1], ga if gb.ndim == 2 else ga.sum(axis=0))
    assert calls3.count("_operands") == 2 and calls3.count("decided") == 2
    assert np.array_equal(d, ga[:2] + ga[:2]) and np.array_equal(e, z1)


def test_a_repeated_einsum_takes_its_prepared_path():
    """As pointwise's: a repeated einsum (ops.einsum) plans, checks and builds nothing again, with the first
    call's result, layout, node and gradients; an operand of another shape prepares again."""
    import numpy as np

    from spmdsim.nn import ops

    rng = np.random.default_rng(5)
    gx, gw = rng.standard_normal((4, 3, 8)), rng.standard_normal((8, 6))

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, gx, mesh.layout("dp", None, "tp")).requires_grad_()
        w = DTensor.from_global(mesh, gw, mesh.layout("tp", None)).requires_grad_()
        runs = [_watched_step(lambda: ops.einsum("tbd,de->tbe", x, w), (x, w)) for _ in range(2)]
        v = DTensor.from_global(mesh, gx[:2], mesh.layout("dp", None, "tp"))
        calls, z = _watched_calls(lambda: ops.einsum("tbd,de->tbe", v, w))
        out = runs, calls, z.gather()
        mesh.close()
        return out

    ((calls1, y1, layout1, node1, (gx1, gw1)), (calls2, y2, layout2, node2, (gx2, gw2))), calls, z = \
        spmdsim.simulate(4, body)[0]
    assert "decided" in calls1 and calls2 == []
    assert np.allclose(y1, np.einsum("tbd,de->tbe", gx, gw))
    assert layout2 is layout1 and node2 == node1
    assert np.array_equal(y2, y1) and np.array_equal(gx2, gx1) and np.array_equal(gw2, gw1)
    assert calls.count("decided") == 1 and np.allclose(z, np.einsum("tbd,de->tbe", gx[:2], gw))


def test_a_repeated_pointwise_call_with_a_number_takes_its_prepared_path():
    """A pointwise call with a Python number beside DTensors finds its prepared call by the number's type
    (spmdsim.nn.ops.pointwise._mixed_signature) and lifts the number directly: no `_operands`, `lift`, `decided`
    or `make_dtensor` frame when it repeats (a new value too), the first call's layout, node and gradients,
    and the value's own result; a number of another type prepares again (and is right)."""
    import numpy as np

    from spmdsim.nn.ops import ufuncs as P

    rng = np.random.default_rng(7)
    ga = rng.standard_normal((4, 6))
    watched = {"_operands", "lift", "decided", "make_dtensor", "record"}

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        a = DTensor.from_global(mesh, ga, mesh.layout("dp", "tp")).requires_grad_()
        # the number first, then beside a DTensor
        runs = [_watched_step(lambda: P.mul(value, a - 1.0), (a,), watched, None) for value in (2.5, -0.5)]
        calls, w = _watched_calls(lambda: a * 3, watched, None)  # an int: another signature
        out = runs, calls, w.gather(), w.local.dtype
        mesh.close()
        return out

    runs, calls, w, dtype = spmdsim.simulate(4, body)[0]
    (calls1, z1, layout1, node1, (g1,)), (calls2, z2, layout2, node2, (g2,)) = runs
    assert "_operands" in calls1 and "lift" in calls1
    assert calls2 == []
    assert np.array_equal(z1, 2.5 * (ga - 1.0)) and np.array_equal(z2, -0.5 * (ga - 1.0))
    assert layout2 is layout1 and node2 == node1
    assert np.array_equal(g1, np.full_like(ga, 2.5)) and np.array_equal(g2, np.full_like(ga, -0.5))
    assert "_operands" in calls and np.array_equal(w, ga * 3) and dtype == np.float64


def test_a_repeated_attention_takes_its_prepared_path():
    """attention keeps what a call decides per signature (spmdsim.nn.ops.attention._Decided): a repeated call with
    the same layout objects, shapes, dtypes and flags checks and plans nothing again (no `_decide`,
    `kept_problem`, `require_float`, `seed_arg` or `raise_if_not_dtensors` frame; only a seed that is no int
    is checked) and gives the first call's result, layout, node and gradients; a bad seed is still refused
    with its one line, and another shape decides again (and is right)."""
    import numpy as np

    from spmdsim.nn import ops
    from spmdsim.errors import OperatorError

    rng = np.random.default_rng(11)
    T, B, H, D = 6, 4, 2, 3
    gq, gk, gv = (rng.standard_normal((T, B, H, D)) for _ in range(3))
    watched = {"_decide", "kept_problem", "require_float", "seed_arg", "raise_if_not_dtensors"}

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        layout = mesh.layout(None, "dp", "tp", None)
        q, k, v = (DTensor.from_global(mesh, g, layout).requires_grad_() for g in (gq, gk, gv))

        def core(a, b, c):
            return ops.attention(a, b, c, causal=True, dropout=0.25, seed=9, batch_first=False)

        runs = [_watched_step(lambda: core(q, k, v), (q, k, v), watched, None) for _ in range(2)]
        try:
            ops.attention(q, k, v, causal=True, dropout=0.25, seed=True, batch_first=False)
            refused = None
        except OperatorError as error:
            refused = str(error)
        short = [DTensor.from_global(mesh, g[:4], layout) for g in (gq, gk, gv)]
        calls, z = _watched_calls(lambda: ops.attention(*short, causal=True, batch_first=False), watched, None)
        out = runs, refused, calls, z.gather()
        mesh.close()
        return out

    runs, refused, calls, z = spmdsim.simulate(4, body)[0]
    (calls1, y1, layout1, node1, g1), (calls2, y2, layout2, node2, g2) = runs
    assert "kept_problem" in calls1 and "require_float" in calls1
    assert calls2 == []
    assert np.array_equal(y2, y1) and layout2 is layout1 and node2 == node1
    for a, b in zip(g2, g1):
        assert np.array_equal(a, b)
    assert refused == "attention: seed True must be an integer"
    assert "kept_problem" in calls
    s = np.einsum("ibhd,jbhd->bhij", gq[:4], gk[:4]) / np.sqrt(D)
    s = np.where(np.triu(np.ones((4, 4), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    assert np.allclose(z, np.einsum("bhij,jbhe->ibhe", p, gv[:4]), rtol=1e-12, atol=1e-12)


def test_a_repeated_causal_attention_makes_its_mask_once():
    """attention's causal mask (this rank's query rows against the keys above the diagonal) is made once per
    call signature (`_Decided.above`): a repeated call runs no ``np.arange`` (a C call: counted as one), and its
    result is the first call's; the mask is read only. The result's DTensor is built without make_dtensor."""
    import numpy as np

    from spmdsim.nn import ops

    rng = np.random.default_rng(13)
    gq, gk, gv = (rng.standard_normal((6, 4, 2, 3)) for _ in range(3))

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        layout = mesh.layout(None, "dp", "tp", None)
        q, k, v = (DTensor.from_global(mesh, g, layout) for g in (gq, gk, gv))
        runs = []
        for _ in range(2):
            seen: list = []

            def hook(frame, event, arg):
                if event == "c_call" and arg is np.arange or event == "call" and frame.f_code.co_name == \
                        "make_dtensor":
                    seen.append("arange" if event == "c_call" else "make_dtensor")

            sys.setprofile(hook)
            try:
                z = ops.attention(q, k, v, causal=True, batch_first=False)
            finally:
                sys.setprofile(None)
            runs.append((seen, z.gather()))
        from spmdsim.nn.ops.attention import _PREPARED
        above = [d.above for d in _PREPARED.values() if d.above is not None]
        out = runs, all(not a.flags.writeable for a in above) and len(above) > 0
        mesh.close()
        return out

    (seen1, z1), (seen2, z2) = spmdsim.simulate(4, body)[0][0]
    assert "arange" in seen1 and seen2 == []
    assert np.array_equal(z2, z1)
    s = np.einsum("ibhd,jbhd->bhij", gq, gk) / np.sqrt(3)
    s = np.where(np.triu(np.ones((6, 6), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    assert np.allclose(z1, np.einsum("bhij,jbhe->ibhe", p, gv), rtol=1e-12, atol=1e-12)
    assert spmdsim.simulate(4, body)[0][1]


def test_a_repeated_move_names_its_node_with_the_kept_name():
    """A repeated redistribution's node takes its name and read layouts from the move's kept entry
    (the mesh's `_moves`, runtime.compiled.keep_move): two moves of the same layouts share one name object, which
    describes the move."""
    import numpy as np

    g = np.arange(32.0).reshape(8, 4)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, g, mesh.layout("dp", None)).requires_grad_()
        target = mesh.layout(None, None)
        a, b = x.redistribute(target), x.redistribute(target)
        out = (a._ag.name is b._ag.name, a._ag.reads == b._ag.reads == (x.layout, target), a._ag.describe(),
               str(x.layout), str(target), a.gather())
        mesh.close()
        return out

    same_name, same_reads, text, source, target, value = spmdsim.simulate(4, body)[0]
    assert same_name and same_reads
    assert text == f"redistribute {source} -> {target}"
    assert np.array_equal(value, g)


def test_a_rules_kept_gradient_layouts_follow_dy_and_the_operands():
    """The pointwise and einsum rules keep, per call signature, the layouts their backward gives the gradients
    (keyed by dY's layout object and, pointwise, which operands take one) and build the gradients from them
    directly: a dY pending over an axis, after a whole one, gives gradients pending there (and back again);
    an operand that takes no gradient gets None; each gradient's values are the right ones."""
    import numpy as np

    from spmdsim.nn import ops

    rng = np.random.default_rng(13)
    ga, gb, gw, gd = (rng.standard_normal(s) for s in ((4, 6), (4, 6), (6, 2), (4, 6)))

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        layout = mesh.layout(None, "tp")
        a, b = (DTensor.from_global(mesh, g, layout).requires_grad_() for g in (ga, gb))
        bare = DTensor.from_global(mesh, ga, layout)  # a's layout object, no gradient
        w = DTensor.from_global(mesh, gw, mesh.layout("tp", None)).requires_grad_()
        out = []
        for pending in ((), ("dp",), (), ("dp",)):
            dy = DTensor.from_global(mesh, gd, layout.with_partial(pending))
            for x, y in ((a, b), (bare, b), (a, bare)):
                z = x * y
                grads = z._ag.backward(dy)
                out.append(("mul", pending, tuple(None if g is None else (g.layout.partial, g.gather())
                                                  for g in grads), (x.gather(), y.gather())))
            v = ops.einsum("td,de->te", a, w)
            want = v._ag.want  # the product's layout, its pending sum resolved
            dv = DTensor.from_global(mesh, gd[:, :2], want.with_partial(pending))
            grads = v._ag.backward(dv)
            out.append(("einsum", pending, tuple((g.layout.partial, g.gather()) for g in grads), None))
        mesh.close()
        return out

    results = spmdsim.simulate(4, body)[0]
    for op, pending, grads, values in results:
        if op == "einsum":
            (pa, xa), (pw, xw) = grads
            assert "dp" in pa and "dp" in pw if pending else "dp" not in pa and "dp" not in pw
            assert np.allclose(xa, gd[:, :2] @ gw.T) and np.allclose(xw, ga.T @ gd[:, :2])
            continue
        assert len(grads) == 2
        expected = (gd * values[1], gd * values[0])
        for k, g in enumerate(grads):
            if g is None:
                continue
            assert g[0] == pending
            assert np.array_equal(g[1], expected[k])
    needed = [tuple(g is not None for g in grads) for op, _, grads, _ in results if op == "mul"]
    assert needed == [(True, True), (False, True), (True, False)] * 4


def test_a_result_shaped_as_its_operand_is_checked_unless_it_is_the_operands_block_shape_and_dtype():
    """spmdsim.nn.ops._common.shaped_as (the norms', dropout's and activations' results) builds a tensor directly
    only for a C-ordered block of the operand's block shape and dtype under the operand's own layout object;
    another dtype, another layout or a wrong block shape goes through make_dtensor's checks (the last refused)."""
    import numpy as np

    from spmdsim.errors import ShapeError
    from spmdsim.nn.ops._common import shaped_as

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, np.arange(24.0).reshape(4, 6), mesh.layout("dp", "tp"))
        same = shaped_as(x, x.local * 2, x.layout)
        cast = shaped_as(x, x.local.astype(np.float32), x.layout)
        other = mesh.layout("dp", None)
        try:
            shaped_as(x, x.local * 2, other)
            refused = None
        except ShapeError as error:
            refused = str(error)
        out = (same.gather(), same.layout is x.layout, cast.local.dtype, cast.gather(), refused)
        mesh.close()
        return out

    same, kept, dtype, cast, refused = spmdsim.simulate(4, body)[0]
    assert kept and np.array_equal(same, 2 * np.arange(24.0).reshape(4, 6))
    assert dtype == np.float32 and np.array_equal(cast, np.arange(24.0).reshape(4, 6))
    assert refused is not None and "does not match" in refused


def test_a_repeated_layer_norm_checks_nothing_again_and_a_changed_call_is_checked():
    """layer_norm keeps what its checks passed and decided per (x's layout object, shape, dtype, eps, kept, the
    weight's and bias's shapes): a repeated call runs none of the checks (`_dim`, `_eps`, `_check_affine`) and
    gives the first call's values; another eps is used (not the kept one's), and a bad eps, kept or weight after
    good ones is still refused with its one line."""
    import numpy as np

    from spmdsim.nn import ops
    from spmdsim.errors import OperatorError, ShapeError

    rng = np.random.default_rng(17)
    gx, gw = rng.standard_normal((4, 6)), rng.standard_normal(6)
    watched = {"_dim", "_eps", "_check_affine"}

    def reference(eps):
        c = gx - gx.mean(axis=-1, keepdims=True)
        return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps) * gw

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, gx, mesh.layout("dp", None))
        w = DTensor.from_global(mesh, gw, mesh.layout(None))
        runs = [_watched_calls(lambda: ops.layer_norm(x, w, eps=1e-5), watched, None) for _ in range(2)]
        other = ops.layer_norm(x, w, eps=0.5)
        refused = []
        short = DTensor.from_global(mesh, gw[:4], mesh.layout(None))
        for bad, kind in (({"eps": True}, OperatorError), ({"eps": -1.0}, OperatorError),
                          ({"kept": "all"}, OperatorError), ({"weight": short}, ShapeError)):
            try:
                ops.layer_norm(x, **{"weight": w, **bad})
                refused.append(None)
            except kind as error:
                refused.append(str(error))
        out = [(calls, y.gather()) for calls, y in runs], other.gather(), refused
        mesh.close()
        return out

    ((calls1, y1), (calls2, y2)), other, refused = spmdsim.simulate(4, body)[0]
    assert "_check_affine" in calls1 and calls2 == []
    assert np.allclose(y1, reference(1e-5)) and np.array_equal(y2, y1)
    assert np.allclose(other, reference(0.5))
    assert refused[0] == "layer_norm: eps True must be a non-negative real number"
    assert refused[1] == "layer_norm: eps -1.0 must be a non-negative real number"
    assert refused[2] is not None and refused[2].startswith("layer_norm: kept 'all' is not one of")
    assert refused[3] is not None and "weight of shape (4,)" in refused[3]


def test_grad_tensor_copies_a_transposed_block_to_c_order_and_widens_a_bfloat16_one():
    """`grad_tensor`'s transposed block of its tensor's shape and dtype (attention's dq, dk, dv) is copied to C
    order with the same values, without gradient_block; a bfloat16 one still goes there (widened to float32)."""
    import numpy as np

    from spmdsim.nn.autograd.rules.grads import grad_tensor
    from spmdsim.base.precision import bfloat16

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        out = []
        for dtype in (np.float64, bfloat16()):
            like = DTensor.from_global(mesh, np.zeros((4, 3), dtype), mesh.layout(None, None))
            block = np.arange(12.0).reshape(3, 4).astype(dtype).T  # (4, 3), not C-contiguous
            g = grad_tensor(like, block, ("dp",))
            out.append((g.local.flags.c_contiguous, g.local.dtype, np.array_equal(g.local.astype(np.float64),
                        block.astype(np.float64)), g.layout.partial, g.local is block))
        mesh.close()
        return out

    (c64, d64, same64, p64, view64), (c16, d16, same16, p16, _) = spmdsim.simulate(2, body)[0]
    assert (c64, d64, same64, p64, view64) == (True, np.float64, True, ("dp",), False)
    assert (c16, d16, same16, p16) == (True, np.float32, True, ("dp",))


def test_a_bfloat16_gradient_is_float32_whatever_its_blocks_memory_order():
    """A gradient's dtype is its tensor's, float32 for bfloat16 (spmdsim.base.precision), in C order or not: a
    C-ordered bfloat16 block of a bfloat16 tensor was kept bfloat16 by `grad_tensor` and `gradient_block`'s fast
    paths where a transposed one was widened, so ``sum(x)``'s gradient of a bfloat16 leaf was bfloat16 and
    ``sum(x.T)``'s float32. A float32 block is taken as it is (no copy)."""
    import numpy as np

    from spmdsim.nn import ops
    from spmdsim.nn.autograd.rules.grads import grad_tensor, gradient_block
    from spmdsim.base.precision import bfloat16

    bf16 = bfloat16()

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        like = DTensor.from_global(mesh, np.zeros((4, 3), bf16), mesh.layout(None, None))
        values = np.arange(12.0).reshape(4, 3)
        blocks = {"C": values.astype(bf16), "transposed": np.ascontiguousarray(values.T).astype(bf16).T}
        made = {}
        for order, block in blocks.items():
            assert block.flags.c_contiguous == (order == "C")
            for name, grad in (("grad_tensor", grad_tensor(like, block)),
                               ("gradient_block", gradient_block(like, block, like.layout))):
                assert np.array_equal(grad.local, values) and grad.local.flags.c_contiguous
                made[name, order] = grad.local.dtype
        f32 = np.arange(12, dtype=np.float32).reshape(4, 3)
        kept = grad_tensor(like, f32).local is f32 and gradient_block(like, f32, like.layout).local is f32
        leaves = {}
        for name, loss in (("sum(x)", lambda x: ops.sum(x)), ("sum(x.T)", lambda x: ops.sum(x.T))):
            x = DTensor.from_global(mesh, values.astype(bf16), mesh.layout(None, None)).requires_grad_()
            loss(x).backward()
            leaves[name] = x.grad.local.dtype
        mesh.close()
        return made, kept, leaves

    made, kept, leaves = spmdsim.simulate(2, body)[0]
    assert made == {(name, order): np.float32 for name in ("grad_tensor", "gradient_block")
                    for order in ("C", "transposed")}
    assert kept and leaves == {"sum(x)": np.float32, "sum(x.T)": np.float32}


def _opcodes(f, *args):
    """(the opcodes `f(*args)`'s own frame runs, its result). A throwaway traced call first: under Python 3.12.1 the
    first call a process traces with f_trace_opcodes runs no opcode event (later ones count as under 3.11 and 3.13)."""
    if f is not _nothing:
        _opcodes(_nothing)
    count = [0]

    def tracer(frame, event, arg):
        if frame.f_code is f.__code__:
            frame.f_trace_opcodes = True
            if event == "opcode":
                count[0] += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        out = f(*args)
    finally:
        sys.settrace(None)
    return count[0], out


def _nothing() -> None:
    """_opcodes' throwaway call."""


def test_the_walks_order_is_searched_without_python_per_node_or_per_depth():
    """checks._topological (a pipeline stage searches a graph each microbatch) runs as many opcodes for a chain of
    residual diamonds 40 deep as for one 2 deep: no Python per node, input or depth; and it finds each node once,
    latest recorded first, with leaves and None inputs left out."""
    from spmdsim.nn.autograd import checks
    from spmdsim.nn.autograd.graph import Leaf, Node

    class Slot:  # a tensor's graph slot, all the search reads
        def __init__(self, ag):
            self._ag = ag

    def diamonds(depth):
        leaf, h = Leaf(), Node("x", (None,), len, None, ())
        made = [h]
        for _ in range(depth):
            a = Node("a", (Slot(h), Slot(leaf)), len, None, ())
            b = Node("b", (Slot(h), Slot(None), None), len, None, ())
            h = Node("add", (Slot(a), Slot(b), Slot(h)), len, None, ())
            made += [a, b, h]
        return h, made

    counts = []
    for depth in (2, 40):
        root, made = diamonds(depth)
        ops, order = _opcodes(checks._topological, root)
        assert order == made[::-1]  # each once, latest first
        counts.append(ops)
    assert counts[0] == counts[1], counts


def test_reduce_grads_finds_the_pending_gradients_without_python_per_parameter():
    """autograd.reduce_grads (a pipeline stage's once a step, over every parameter) finds its leaves and which hold
    a pending gradient by maps in C: its own frame runs as many opcodes for 12 parameters as for 3; the pending
    ones summed, a whole one left as it is."""
    import numpy as np

    from spmdsim.nn import ops
    from spmdsim.nn.autograd import engine

    w = np.arange(6.0).reshape(3, 2) / 5 - 0.3
    a = np.arange(12.0).reshape(4, 3) / 7

    def body():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        out = []
        for n in (3, 12):
            leaves = [DTensor.from_global(mesh, w * (i + 1), layout(None, None)).requires_grad_() for i in range(n)]
            z = leaves[0]
            for t in leaves[1:]:
                z = z + t
            y = DTensor.from_global(mesh, a, layout("dp", None)) @ z
            ops.sum(y * y).backward(keep_pending=leaves[:-1])  # the last one's gradient whole
            whole = leaves[-1].grad
            assert not whole.layout.partial and all(t.grad.layout.partial for t in leaves[:-1])
            ops_run, _ = _opcodes(engine.reduce_grads, leaves)
            assert leaves[-1].grad is whole and not any(t.grad.layout.partial for t in leaves)
            out.append((ops_run, [t.grad.gather() for t in leaves]))
        return out

    for (small, grads_small), (large, grads_large) in spmdsim.simulate(2, body):
        assert small == large, (small, large)
        want = 2 * a.T @ (a @ (w * sum(range(1, 4))))
        for g in grads_small:
            np.testing.assert_allclose(g, want, rtol=1e-13)
