"""The autograd API as a PyTorch user tries it (docs/howto/train.md, "API" and "Bad input"), on simulated ranks:
gradients against numpy, and each misuse refused in one line alike on every rank, before any collective.

Each body is tiny (a 4 x 3 input, a 3 x 2 weight): the whole file takes about a second.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.autograd import Function, checkpoint, no_grad
from spmdsim.errors import OperatorError
from spmdsim.nn.optim import SGD, DistributedAdamW

A = np.arange(12.0).reshape(4, 3) / 7
W = np.arange(6.0).reshape(3, 2) / 5 - 0.3


def _setup(ranks: int):
    """(mesh, layout, x rows split over "dp" requiring grad, w replicated requiring grad) on 1-d mesh."""
    layout = Layout((ranks,), ("dp",))
    mesh = Mesh(layout)
    x = DTensor.from_global(mesh, A, layout("dp", None)).requires_grad_()
    w = DTensor.from_global(mesh, W, layout(None, None)).requires_grad_()
    return mesh, layout, x, w


def _refused(ranks: int, body) -> set:
    """The messages `body` raised on each rank (one entry when every rank raised the same)."""
    def wrapped():
        try:
            body()
        except OperatorError as e:
            return str(e)
        return None

    return set(spmdsim.simulate(ranks, wrapped))


def _square_loss(x, w):
    y = x @ w
    return ops.sum(y * y)


STALE = "backward through a graph recorded before an optimizer step changed a parameter it reads in place"


@pytest.mark.parametrize("case", ["loss before the step", "loss after the step", "checkpointed region"])
def test_backward_of_a_graph_recorded_before_a_step_is_refused(case):
    """PyTorch's version counter refuses these; spmdsim's rules read the parameter's block in place, so the walk
    took the step's new values where the forward read the old ones: a wrong gradient, without a word."""
    def body():
        mesh, layout, x, w = _setup(4)
        opt = SGD([w], lr=0.5)
        _square_loss(x, w).backward()  # w has a gradient: the step below changes its block
        if case == "loss before the step":
            loss = _square_loss(x, w)
            opt.step()
        elif case == "loss after the step":  # part of the graph read w before the step
            h = x @ w
            opt.step()
            loss = ops.sum(h * h)
        else:
            h = checkpoint(lambda a, b: ops.tanh(a @ b), x, w)  # its recomputation would read the new w
            opt.step()
            loss = ops.sum(h)
        loss.backward()

    (message,) = _refused(4, body)
    assert message.startswith(STALE) and "global shape (3, 2)" in message


def test_training_loops_step_between_backwards_unrefused_and_exact(monkeypatch):
    """No refusal where nothing is stale: zero_grad, forward, backward, step; a forward not walked before a step
    (an evaluation without no_grad) leaves later backwards alone: their graphs were recorded after the step (a
    flag set then made every later backward on the thread look at every node for stale reads); each gradient
    and update against numpy."""
    from spmdsim.nn.autograd import checks

    looked = []
    real = checks.stale_reads
    monkeypatch.setattr(checks, "stale_reads", lambda order: looked.append(len(order)) or real(order))

    def body():
        mesh, layout, x, w = _setup(4)
        opt = SGD([w], lr=0.1)
        ref = W.copy()
        for step in range(3):
            opt.zero_grad()
            _square_loss(x, w).backward()
            expected = 2 * A.T @ (A @ ref)
            assert np.allclose(w.grad.gather(), expected, rtol=1e-13)
            _square_loss(x, w)  # recorded, never walked: the step below cannot know it is dropped
            opt.step()
            ref = ref - 0.1 * expected
            assert np.allclose(w.gather(), ref, rtol=1e-13)
        return True

    assert spmdsim.simulate(4, body) == [True] * 4
    assert looked == []  # no graph walked held a node recorded before a step


def test_distributed_adamw_step_also_marks_its_parameters():
    def body():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        x = DTensor.from_global(mesh, A, layout("dp", None))
        w = DTensor.from_global(mesh, W, layout(None, None)).requires_grad_()
        opt = DistributedAdamW([w], mesh, ("dp",), lr=0.1)
        _square_loss(x, w).backward(keep_pending=[w])
        loss = _square_loss(x, w)
        opt.step()
        loss.backward(keep_pending=[w])

    (message,) = _refused(2, body)
    assert message.startswith(STALE)


def test_backward_refuses_pytorch_options_and_an_explain_that_is_no_list():
    """``loss.backward(None, True)`` (PyTorch's retain_graph, positionally) was an AttributeError of 'bool' from
    deep in the walk; ``retain_graph=True`` a TypeError."""
    cases = [(lambda loss: loss.backward(None, True), "backward(explain=True): expected a list"),
             (lambda loss: loss.backward(retain_graph=True), "backward(retain_graph=True): not taken"),
             (lambda loss: loss.backward(create_graph=True), "backward(create_graph=True): not taken")]
    for call, start in cases:
        def body():
            mesh, layout, x, w = _setup(2)
            call(_square_loss(x, w))

        (message,) = _refused(2, body)
        assert message.startswith(start), message

    def fine():
        mesh, layout, x, w = _setup(2)
        _square_loss(x, w).backward(retain_graph=False)
        return np.allclose(w.grad.gather(), 2 * A.T @ (A @ W))

    assert spmdsim.simulate(2, fine) == [True, True]


def test_pytorchs_backward_inputs_step_closure_and_retain_grad_pass_or_are_refused_in_one_line():
    """``loss.backward(inputs=[w])`` and ``opt.step(closure)`` were Python's bare TypeError, ``y.retain_grad()`` an
    AttributeError; a value asking for what spmdsim does (inputs=None, closure None, a leaf's retain_grad) passes."""
    def body():
        mesh, layout, x, w = _setup(2)
        said = []

        def closure():
            return 1.0

        for call in (lambda: _square_loss(x, w).backward(inputs=[w]), lambda: SGD([w], lr=0.1).step(closure),
                     lambda: (x @ w).retain_grad(), DTensor.from_global(mesh, W, layout(None, None)).retain_grad):
            with pytest.raises(OperatorError) as info:
                call()
            said.append(str(info.value))
        w.retain_grad()  # a leaf's: its .grad is filled anyway
        _square_loss(x, w).backward(inputs=None)
        SGD([w], lr=0.5).step(None)
        return said, np.allclose(w.gather(), W - 0.5 * 2 * A.T @ (A @ W))

    (said, ok), _ = spmdsim.simulate(2, body)
    assert ok and said == [
        "backward(inputs=[DTensor(shape=(3, 2), layout=(None, None), dtype=float64...): spmdsim does not do this; "
        "the walk fills the .grad of every leaf the loss depends on; read the ones you need; inputs may be None or "
        "left out",
        "SGD.step(closure=<function closure>): spmdsim does not do this; a step updates from the gradients "
        ".grad holds and evaluates nothing; call the closure (its forward and backward) first, then step(); closure "
        "may be None or left out",
        "retain_grad() of a DTensor of global shape (4, 2) made by 'matmul': spmdsim does not do this; backward "
        "fills the .grad of leaves only; to read this gradient, make the tensor a leaf where it is made, "
        "t = t.detach().requires_grad_(), before the ops that read it",
        "retain_grad() of a DTensor of global shape (3, 2): spmdsim does not do this; it records no gradient "
        "(requires_grad is False); t.requires_grad_() makes it a leaf whose .grad is filled"]


def test_requires_grad_flag_and_the_setters_pytorch_users_write():
    def body():
        mesh, layout, x, w = _setup(2)
        with pytest.raises(OperatorError, match=r"requires_grad_\('no'\): expected True or False, got a str"):
            DTensor.from_global(mesh, W, layout(None, None)).requires_grad_("no")  # was: asked for gradients
        b = DTensor.from_global(mesh, np.ones(2), layout(None))
        b.requires_grad = True  # was: AttributeError, no setter
        assert b.requires_grad
        loss = _square_loss(x, w) + ops.sum(b)
        loss.backward()
        w.grad = None  # was: AttributeError
        assert w.grad is None and np.allclose(b.grad.gather(), 1)
        with pytest.raises(OperatorError, match=r"\.grad = a DTensor of global shape \(2,\) laid out .*: expected a "
                                                r"DTensor of global shape \(3, 2\)"):
            w.grad = b
        w.grad = DTensor.from_global(mesh, np.ones((3, 2)), layout(None, None))
        SGD([w], lr=0.5).step()
        return np.allclose(w.gather(), W - 0.5)

    assert spmdsim.simulate(2, body) == [True, True]


def test_optimizer_refuses_a_parameter_twice_a_lone_tensor_and_groups():
    """A parameter given twice was stepped twice a step (SGD moved it by 2 lr g)."""
    def body():
        mesh, layout, x, w = _setup(2)
        with pytest.raises(OperatorError, match=r"optimizer parameter 1 is parameter 0 again \(a DTensor of global "
                                                r"shape \(3, 2\), .*a leaf\); give each parameter once"):
            SGD([w, w], lr=0.1)
        with pytest.raises(OperatorError, match=r"expected an iterable of parameters .* got a DTensor of global "
                                                r"shape \(3, 2\).*one parameter goes in a list"):
            SGD(w, lr=0.1)  # was: iterated by rows, "parameter 0 ... not a leaf"
        with pytest.raises(OperatorError, match="parameter 0 is a dict: parameter groups are not taken"):
            SGD([{"params": [w], "lr": 0.1}], lr=0.1)
        opt = SGD([w], lr=0.1)
        _square_loss(x, w).backward()
        opt.zero_grad(set_to_none=False)  # was: TypeError
        zeros = w.grad.gather()
        _square_loss(x, w).backward()
        return np.array_equal(zeros, np.zeros((3, 2))) and np.allclose(w.grad.gather(), 2 * A.T @ (A @ W))

    assert spmdsim.simulate(2, body) == [True, True]


def test_function_contract_errors_name_what_was_returned_and_ctx_has_needs_input_grad():
    class Pair(Function):
        @staticmethod
        def forward(ctx, x):
            return x, x

    class Text(Function):
        @staticmethod
        def forward(ctx, x, scale):
            assert ctx.needs_input_grad == (True, False)  # PyTorch's: per argument
            return x * scale

        @staticmethod
        def backward(ctx, dy):
            return "oops"  # was: ValueError "could not convert string to float"

    def body():
        mesh, layout, x, w = _setup(2)
        with pytest.raises(OperatorError, match=r"Pair.forward returned a tuple of 2; expected one numpy array"):
            Pair.apply(x)
        y = Text.apply(x, 3.0)
        assert y._ag.backward is not None
        ops.sum(y).backward()

    (message,) = _refused(2, body)
    assert message.startswith("Text.backward returned a str as a gradient; expected a numpy array"), message


class _Twice(Function):
    """A backward that returns two gradients for its one DTensor argument."""

    @staticmethod
    def forward(ctx, x, *rest):
        return x * 2.0

    @staticmethod
    def backward(ctx, dy):
        return dy * 2.0, dy * 2.0


@pytest.mark.parametrize("rest, line", [
    ((), "_Twice.backward returned 2 gradients for a forward of 1 DTensor argument; expected 1, one per DTensor "
         "argument (None where there is none)"),
    ((3.0, 4.0), "_Twice.backward returned 2 gradients for a forward of 1 DTensor argument among 3 arguments; "
                 "expected 1, one per DTensor argument, or 3, one per argument as PyTorch's (None where there is "
                 "none)"),
])
def test_a_backward_returning_too_many_gradients_is_counted_in_words(rest, line):
    """It said "returned 2 gradients for 1 DTensor arguments of 1"."""
    def body():
        mesh, layout, x, w = _setup(2)
        ops.sum(_Twice.apply(x, *rest)).backward()

    assert _refused(2, body) == {line}


def test_checkpoint_takes_arguments_that_are_not_tensors():
    """PyTorch's checkpoint passes numbers and flags through; spmdsim's refused them."""
    def body():
        mesh, layout, x, w = _setup(2)
        y = checkpoint(lambda a, b, scale, square: ops.tanh(a @ b) * scale, x, w, 3.0, True)
        ops.sum(y).backward()
        t = np.tanh(A @ W)
        return np.allclose(w.grad.gather(), A.T @ (3 * (1 - t * t))) and \
            np.allclose(x.grad.gather(), (3 * (1 - t * t)) @ W.T)

    assert spmdsim.simulate(2, body) == [True, True]


def test_no_grad_decorates_with_and_without_parentheses():
    def body():
        mesh, layout, x, w = _setup(1)

        @no_grad
        def bare():
            return x @ w

        @no_grad()
        def called():
            return x @ w

        return bare().requires_grad, called().requires_grad, (x @ w).requires_grad

    assert spmdsim.simulate(1, body) == [(False, False, True)]


def test_each_backward_ends_by_the_plan_of_its_own_leaves():
    """The walk's end is worked out once per kind of leaf set (their gradients' layouts, meshes, dtypes and
    shapes, which are kept pending, the bucket cap, in leaf order: engine._leaf_plan) and reused by a later
    backward alike: backwards over other leaves, orders, shapes, pending axes, keep_pending and caps, one after
    the other, each sum and place their own gradients (numpy's)."""
    from spmdsim.nn.autograd import reduce_grads

    U = np.arange(6.0).reshape(3, 2)[::-1] / 3
    V = np.arange(12.0).reshape(3, 4) / 9 - 0.5
    S = np.array([[1.0, 2.0], [0.5, -1.0]])

    def body():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        x = DTensor.from_global(mesh, A, layout("dp", None))  # no gradient: the leaves are the matrices
        by_tp = DTensor.from_global(mesh, A, layout("tp", None))  # its matrices' gradients pending over "tp"
        whole = DTensor.from_global(mesh, A, layout(None, None))  # its matrices' gradients not pending
        rep = layout(None, None)  # one layout object for w, u and v: only their shapes tell them apart
        w, u, v = (DTensor.from_global(mesh, m, rep).requires_grad_() for m in (W, U, V))
        s = DTensor.from_global(mesh, S, layout(None, "dp")).requires_grad_()  # split: nothing pending
        tensors, found, buckets = {"w": w, "u": u, "v": v, "s": s}, [], []

        def walk(loss, **options):
            for t in tensors.values():
                t.grad = None
            steps: list = []
            loss.backward(explain=steps, **options)
            pending = {k: t.grad.layout.partial for k, t in tensors.items() if t.grad is not None}
            reduce_grads(list(tensors.values()))
            found.append({k: (t.grad.gather(), pending[k]) for k, t in tensors.items() if t.grad is not None})
            buckets.append([text.split(":")[0] for text, _ in steps if "in one bucket" in text])

        walk(ops.sum((x @ w) * (x @ u)), bucket=True)  # w and u in one bucket
        walk(ops.sum((x @ u) * (x @ w)), bucket=True)  # first contributions swapped
        walk(ops.sum((x @ w) * (x @ w)) + ops.sum(x @ v), bucket=True)  # v for u: another shape
        walk(ops.sum((x @ w) * (x @ u)) + ops.sum(x @ v), bucket=True)  # a third leaf
        walk(ops.sum(w @ s) + ops.sum(x @ u), bucket=True)  # a split leaf among them
        walk(ops.sum(x @ w) + ops.sum(by_tp @ u), bucket=True)  # pending over other axes: no bucket
        walk(ops.sum((whole @ w) * (whole @ u)), bucket=True)  # nothing pending: no bucket
        walk(ops.sum((x @ w) * (x @ u)), bucket=8)  # a cap that fits no two: no bucket
        walk(ops.sum((x @ w) * (x @ u)), bucket=True, keep_pending=[u])  # u left pending
        walk(ops.sum((x @ w) * (x @ u)))  # no bucket
        return found, buckets

    ones = np.ones((4, 2))
    pair = {"w": A.T @ (A @ U), "u": A.T @ (A @ W)}
    v = A.T @ np.ones((4, 4))
    expected = [pair, pair, {"w": 2 * A.T @ (A @ W), "v": v}, dict(pair, v=v),
                {"s": W.T @ np.ones((3, 2)), "w": np.ones((3, 2)) @ S.T, "u": A.T @ ones},
                {"w": A.T @ ones, "u": A.T @ ones}, pair, pair, pair, pair]
    two = ["2 leaves (3, 2), (3, 2)"]
    in_one = [two, two, ["2 leaves (3, 4), (3, 2)"], ["3 leaves (3, 4), (3, 2), (3, 2)"], two, [], [], [], [], []]
    for found, buckets in spmdsim.simulate(4, body):
        assert buckets == in_one
        assert [sorted(step) for step in found] == [sorted(step) for step in expected]
        for step, (got, want) in enumerate(zip(found, expected)):
            for k, grad in want.items():
                assert np.allclose(got[k][0], grad, rtol=1e-13, atol=0), (step, k)
                assert got[k][1] == (("dp",) if step == 8 and k == "u" else ()), (step, k)  # u kept pending


@pytest.mark.parametrize("case", ["the same loss", "tanh met first", "matmul met first"])
def test_a_backward_through_a_freed_graph_names_the_step_a_depth_first_search_meets_first(case):
    """A second loss reading steps the first backward freed is refused naming the freed step that the search
    from the loss meets first (depth first, an operator's last input first), the same one on every rank."""
    def body():
        mesh, layout, x, w = _setup(2)
        h = x @ w
        t = ops.tanh(h)
        loss = ops.sum(h * t)
        loss.backward()
        if case == "the same loss":
            loss.backward()
        elif case == "tanh met first":
            ops.sum(ops.exp(h) + t).backward()
        else:
            ops.sum(ops.exp(t) * h).backward()

    (message,) = _refused(2, body)
    step = {"the same loss": "'sum'", "tanh met first": "'tanh'", "matmul met first": '"matmul: '}[case]
    assert message.startswith(f"backward through the graph of {step}") and "a second time" in message, message


def test_grad_of_an_operators_output_is_none_with_pytorchs_warning_saying_how():
    """``y.grad`` of a non-leaf was None without a word (PyTorch warns); the leaves' and untracked tensors' stay
    quiet."""
    def body():
        mesh, layout, x, w = _setup(2)
        y = x @ w
        ops.sum(y * y).backward()
        with pytest.warns(UserWarning) as caught:
            assert y.grad is None
        plain = DTensor.from_global(mesh, W, layout(None, None))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert plain.grad is None and w.grad is not None
        h = (x @ w).detach().requires_grad_()  # the way the warning gives
        ops.sum(h * h).backward()
        return [str(c.message) for c in caught], np.allclose(h.grad.gather(), 2 * A @ W)

    (messages, ok), _ = spmdsim.simulate(2, body)
    assert ok and messages == [".grad of a DTensor of global shape (4, 2) made by 'matmul' is None: backward fills "
                               "the .grad of leaves only (tensors given requires_grad_()) and refuses "
                               "retain_grad() of another; to read this gradient, make the tensor a leaf where it "
                               "is made, t = t.detach().requires_grad_(), before the ops that read it"]
