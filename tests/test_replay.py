"""A captured step replayed (spmdsim.runtime.replay) gives what running it again gives, to the last bit.

Each program runs twice from the same start on simulated ranks: eagerly for
every step, and captured at the first step then replayed for the rest. The
losses, parameters and gradients must be equal bit for bit (the replay makes
the same numpy calls on the same arrays), with new inputs and a new dropout
seed each step. A step a replay cannot repeat stops with one line.
"""
from __future__ import annotations

import operator
import re
import warnings

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, SeededTensor
from spmdsim.base import buffers
from spmdsim.nn import ops
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.optim import SGD, Adam, AdamW
from spmdsim.runtime import replay
from spmdsim.runtime.replay import ReplayError, Scalar, capture

SMALL = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)
TEXT = encode(load_text(20_000))


@pytest.mark.parametrize("ranks, dp, tp, sp", [(4, 2, 2, True), (8, 2, 4, False)])
def test_gpt_replayed_equals_gpt_run_step_by_step(ranks, dp, tp, sp):
    def both():
        comm = spmdsim.world()
        eager = train(SMALL, comm, dp, tp, 4, TEXT, sp=sp)[1]
        replayed = train(SMALL, comm, dp, tp, 4, TEXT, sp=sp, replay=True)[1]
        return eager, replayed

    for eager, replayed in spmdsim.simulate(ranks, both):
        assert [r.loss for r in replayed] == [r.loss for r in eager]
        assert [(r.calls, r.bytes_sent) for r in replayed] == [(r.calls, r.bytes_sent) for r in eager]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in replayed), replayed


def _general_step(optimizer_kind: str, replay: bool, steps: int = 4):
    """einsum (column -> row), layer_norm over a split dim, gelu, dropout seeded per step, softmax along a split
    dim, a slice of a split dim, a join, reductions and a backward, then an optimizer step."""
    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
    L = mesh.layout
    shapes = [((8, 16), (None, "tp")), ((16, 32), (None, "tp")), ((32, 16), ("tp", None)), ((16,), ("tp",))]
    params = [DTensor.from_seeded(mesh, L(*m), SeededTensor(s, "float64", seed=i)).requires_grad_()
              for i, (s, m) in enumerate(shapes[1:])]
    opt = {"sgd": lambda: SGD(params, lr=0.1, momentum=0.9), "adam": lambda: Adam(params, lr=0.01),
           "adamw": lambda: AdamW(params, lr=0.01)}[optimizer_kind]()

    def step(x, seed):
        opt.zero_grad()
        w1, w2, g = params
        h = ops.layer_norm(x, g)
        h = ops.dropout(ops.gelu(ops.einsum("bd,df->bf", h, w1)), 0.25, seed=lambda: 100 + int(seed))
        y = ops.einsum("bf,fd->bd", h, w2)
        s = ops.softmax(y + 0.0, dim=-1)
        joined = ops.concatenate([s[:, 12:], s[:, :12]], dim=1)  # halves of the split dim swapped
        loss = ops.mean(joined * y) + ops.sum(y[:, -1]) * 0.5
        loss.backward()
        opt.step()
        return loss

    losses = []
    graph = None
    for k in range(steps):
        x = DTensor.from_seeded(mesh, L("dp", "tp"), SeededTensor(shapes[0][0], "float64", seed=50 + k))
        if not replay:
            loss = step(x, Scalar(k))
        elif graph is None:
            graph = capture(step, x, Scalar(k), state=params)
            loss = graph.result
        else:
            loss = graph(x, k)
        losses.append(float(ops.resolved(loss).local))
    blocks = [p.local.copy() for p in params] + [p.grad.local.copy() for p in params]
    return losses, blocks, graph.operations if graph else 0


@pytest.mark.parametrize("optimizer_kind", ["sgd", "adam", "adamw"])
def test_general_operators_replay_bit_for_bit(optimizer_kind):
    def both():
        return _general_step(optimizer_kind, False), _general_step(optimizer_kind, True)

    for (losses, blocks, _), (again, replayed, operations) in spmdsim.simulate(4, both):
        assert again == losses
        assert len(set(losses)) == len(losses)  # new inputs and masks each step: the steps differ
        assert operations > 50
        for a, b in zip(blocks, replayed):
            assert a.tobytes() == b.tobytes()


def test_a_conversion_of_a_block_is_replayed_with_the_new_values():
    """DTensor.astype and a gradient a rule returns in another dtype than the gradient's (a bfloat16 block of a
    bfloat16 tensor, whose gradient is float32) convert through the block's own astype, which a capture records:
    ``np.ndarray.astype(block, ...)`` was not recorded, and a replay read the capture's values."""
    from spmdsim.base.precision import bfloat16
    from spmdsim.nn.autograd.rules.grads import gradient_block

    def main():
        mesh = Mesh(Layout((2,), ("a",)))
        L = mesh.layout("a", None)

        def f(x):
            wide = x.astype("float32")
            grad = gradient_block(x, x.local * np.asarray(3, x.local.dtype), x.layout)  # float32 from bfloat16
            return wide.local * 2, grad.local

        x = DTensor.from_global(mesh, np.ones((4, 2), bfloat16()), L)
        graph = capture(f, x)
        new = DTensor.from_global(mesh, np.full((4, 2), 5, bfloat16()), L)
        wide, grad = graph(new)
        return wide.dtype.name, float(wide[0, 0]), grad.dtype.name, float(grad[0, 0])

    assert spmdsim.simulate(2, main) == [("float32", 10.0, "float32", 15.0)] * 2


def test_no_module_calls_a_recorded_ndarray_method_unbound():
    """``np.ndarray.astype(block, ...)`` (or .copy, .reshape, ...) calls ndarray's own method on a traced block,
    which a capture does not see: the package calls the block's (`spmdsim.base.buffers.converted`)."""
    import ast
    from pathlib import Path

    import importkit
    from spmdsim.runtime.traced import Traced

    recorded = {name for name in vars(Traced) if not name.startswith("_") and hasattr(np.ndarray, name)}
    assert {"astype", "copy", "reshape"} <= recorded
    found = []
    for path in sorted((Path(spmdsim.__file__).parent).rglob("*.py")):
        text = path.read_text()
        if "ndarray" not in text and text.isascii():
            # no `np.ndarray.X` can be in it: parsing it (2/3 of the files, ~2 CPU-s) finds nothing. The name is
            # an identifier, never split; only a non-ASCII one could spell it otherwise (NFKC): such a file is read
            continue
        for node in ast.walk(importkit.tree_of(path)):  # (parsed once, shared with the tests that read the package)
            if isinstance(node, ast.Attribute) and node.attr in recorded and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "ndarray" and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id == "np":
                found.append(f"{path.name}:{node.lineno}: np.ndarray.{node.attr}")
    assert not found, found


def test_plain_arrays_are_static_inputs():
    def f(a, b):
        c = np.exp(a) * 2 + b.sum(axis=0)
        c[0] = c[-1] - 1
        return c

    a, b = np.arange(6.0).reshape(3, 2), np.ones((4, 2))
    graph = capture(f, a, b)
    assert np.array_equal(graph.result, f(a, b))
    a2, b2 = np.linspace(0, 1, 6).reshape(3, 2), np.full((4, 2), 3.0)
    out = graph(a2, b2)
    assert out is graph.result and np.array_equal(out, f(a2, b2))


def test_intermediates_whose_lives_do_not_overlap_share_memory_and_keep_their_values():
    """b, c, d, e of 8 KiB each: d is first written after b's last read, so a replay writes d into b's memory
    (a replay's intermediates live as an eager step's allocator would place them, warm); the results are
    the step's, step after step."""
    def f(a):
        b = a * 2.0
        c = b + 1.0
        d = np.exp(-c)
        e = d * 3.0
        return e.sum() + c.sum()

    a = np.linspace(0, 1, 1024)
    graph = capture(f, a)
    assert graph.shared_bytes >= 8192
    for k in range(1, 4):
        a2 = np.linspace(-k, k, 1024)
        assert graph(a2) == f(a2)


def test_with_share_memory_off_each_intermediate_keeps_its_own_memory(monkeypatch):
    def f(a):
        b = a * 2.0
        c = np.exp(-b)
        d = c * 3.0
        return d.sum()

    a = np.linspace(0, 1, 1024)
    monkeypatch.setattr(replay, "SHARE_MEMORY", False)
    graph = capture(f, a)
    assert graph.shared_bytes == 0 and graph.held_bytes >= 3 * 8192
    a2 = np.linspace(-1, 2, 1024)
    assert graph(a2) == f(a2)
    monkeypatch.setattr(replay, "SHARE_MEMORY", True)
    assert capture(f, a).shared_bytes == 16384  # exp's input -b too: c takes b's memory, d takes -b's


def test_a_join_of_arrays_made_for_it_alone_is_written_in_place():
    """A gradient bucket's join: b and c made for it alone (it is their last use) into a buffer it uses first.
    The capture makes b and c views of their places in that buffer and drops the join (its bytes in
    `joined_bytes`): a replay copies nothing, and its values are the step's, step after step."""
    def f(a):
        b = a * 2.0
        c = np.exp(-a)
        flat = np.concatenate([b.reshape(-1), c.reshape(-1)])
        flat *= 3.0  # an in-place Allreduce of the bucket, say
        return flat[:1024].sum() - flat[1024:].sum()

    a = np.linspace(0, 1, 1024)
    graph = capture(f, a)
    assert graph.joined_bytes == 16384
    assert np.concatenate not in [func for func, _, _ in graph._entries]
    for k in range(1, 4):
        a2 = np.linspace(-k, k, 1024)
        assert graph(a2) == f(a2)


def test_a_join_whose_part_is_read_again_copies_it():
    """b is read after the join (and c is one of the step's inputs): the join stays, each keeps its memory."""
    def f(a, c):
        b = a * 2.0
        flat = np.concatenate([b, np.exp(-a)])
        other = np.concatenate([a * 3.0, c])
        return flat.sum() + b.sum() + other.sum()

    a, c = np.linspace(0, 1, 1024), np.ones(1024)
    graph = capture(f, a, c)
    assert graph.joined_bytes == 0
    for k in range(1, 4):
        a2, c2 = np.linspace(-k, k, 1024), np.full(1024, float(k))
        assert graph(a2, c2) == f(a2, c2)


def test_a_join_of_joins_keeps_the_inner_ones_own_memory():
    """flat joins b and c in place; outer then joins flat (its last use) with d: flat keeps its own memory
    (its parts already live there), so the outer join copies it; the values are the step's."""
    def f(a):
        b, c = a * 2.0, np.exp(-a)
        flat = np.concatenate([b, c])
        flat *= 3.0
        outer = np.concatenate([flat, a + 1.0])
        return outer[:2048].sum() - outer[2048:].sum()

    a = np.linspace(0, 1, 1024)
    graph = capture(f, a)
    assert graph.joined_bytes == 16384  # the inner join alone
    for k in range(1, 4):
        a2 = np.linspace(-k, k, 1024)
        assert graph(a2) == f(a2)


KEPT: list = []


def test_an_intermediate_the_step_keeps_a_reference_to_keeps_its_own_memory():
    """The step keeps d (a reference outside the record, as a parameter's gradient or a cache is): d is not
    moved nor lent, so after each replay the kept array holds that step's values."""
    def f(a):
        b = a * 2.0
        c = b + 1.0
        d = np.exp(-c)
        KEPT.append(d)
        e = d * 3.0
        f = e + c
        return f.sum()

    KEPT.clear()
    a = np.linspace(0, 1, 1024)
    graph = capture(f, a)
    kept = KEPT[0]
    for k in range(1, 4):
        a2 = np.linspace(-k, k, 1024)
        graph(a2)
        assert np.array_equal(kept, np.exp(-(a2 * 2.0 + 1.0)))


def test_arrays_of_python_objects_keep_their_own_memory():
    """An object array's bytes are pointers it owns: no other array takes its memory, nor it another's (a
    float array written over them would leave the object array releasing garbage)."""
    def f(a):
        o = a.astype(object)
        p = o + 1
        q = p.astype(np.float64)
        r = q * 2.0
        s = r + 1.0
        return s.sum()

    a = np.linspace(0, 1, 1024)
    graph = capture(f, a)
    assert graph.shared_bytes == 8192  # s takes q's memory: the float arrays share, the object ones do not
    for k in range(1, 4):
        a2 = np.linspace(-k, k, 1024)
        assert graph(a2) == f(a2)


def test_ufuncs_outputs_and_reductions_replay_in_numpys_fastest_spelling_with_no_warning():
    """A replay calls each ufunc itself with its outputs by position, np.maximum and np.minimum by keyword
    (numpy 2 deprecates their third positional argument), reductions without numpy's default keywords:
    the values are the step's, and no warning is raised."""
    def f(a, b):
        hi, lo = np.maximum(a, b), np.minimum(a, b)
        q, r = np.divmod(a * 3.0, b + 3.0)
        return (hi - lo).sum(axis=0, keepdims=True) + np.add.reduce(q + r, axis=0, where=True) + np.exp(-a).max()

    a, b = np.arange(6.0).reshape(3, 2), np.linspace(-1, 1, 6).reshape(3, 2)[::-1].copy()
    graph = capture(f, a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(1, 4):
            a2, b2 = a * k - 2.5, b + 0.25 * k
            assert np.array_equal(graph(a2, b2), f(a2, b2))


def test_a_kernel_returning_new_arrays_takes_out_the_captured_tuple_on_replay():
    """A kernel that takes ``out`` and returns a tuple of new arrays is handed that tuple on replay (it writes into
    the captured arrays, no copy); one whose results share memory is copied into them as before."""
    from spmdsim.runtime.replay import kernel

    outs = []

    def split(x, out=None):
        outs.append(out)
        a, b = out if out is not None else (np.empty_like(x), np.empty_like(x))
        np.multiply(x, 2.0, out=a)
        np.add(x, 1.0, out=b)
        return a, b

    def overlapping(x, out=None):
        outs.append(out)
        both = x * 3.0
        return both, both[1:]  # the second a view of the first: not handed back as out=

    for func, expect in ((split, lambda x: (x * 2.0, x + 1.0)), (overlapping, lambda x: (x * 3.0, x[1:] * 3.0))):
        outs.clear()
        step = kernel(func)
        graph = capture(lambda x: step(x), np.ones(2))
        graph(np.array([3.0, 4.0]))
        assert all(np.array_equal(r, e) for r, e in zip(graph.result, expect(np.array([3.0, 4.0]))))
        if func is split:
            assert outs[0] is None and outs[1] is not None
            assert all(np.shares_memory(o, r) for o, r in zip(outs[1], graph.result))
        else:
            assert outs == [None, None]


def test_a_scalar_read_outside_a_kernel_is_refused():
    with pytest.raises(ReplayError, match=r"Scalar\(3\) was read outside a kernel while capturing"):
        capture(lambda x, s: x * int(s), np.ones(2), Scalar(3))
    assert int(Scalar(3)) == 3  # outside a capture it is a number


def test_a_scalar_converts_to_its_own_value():
    # float() once fell back to __index__'s integer: a learning rate of Scalar(0.5) read in a kernel was 0.0.
    assert float(Scalar(0.5)) == 0.5 and int(Scalar(2.7)) == 2 and [0, 1, 2][Scalar(1)] == 1
    with pytest.raises(ReplayError, match=r"Scalar\(2.5\) used as an index: its value is not an integer"):
        operator.index(Scalar(2.5))
    with pytest.raises(ReplayError, match=r"Scalar\('0.1'\): a Scalar holds a real number .*, got str"):
        Scalar("0.1")
    with pytest.raises(ReplayError, match=r"Scalar\(0.5\) was read outside a kernel while capturing \(float\(\)\)"):
        capture(lambda x, s: x * float(s), np.ones(2), Scalar(0.5))

    @replay.kernel
    def scaled(x, s, out=None):
        return np.multiply(x, float(s), out=out)

    graph = capture(scaled, np.ones(3), Scalar(0.5))
    assert np.array_equal(graph.result, np.full(3, 0.5))
    for rate in (0.25, Scalar(1.5), np.float32(2.0)):  # a Scalar's place takes a number or a Scalar
        expect = float(getattr(rate, "value", rate))
        assert np.array_equal(graph(np.ones(3), rate), np.full(3, expect)), rate
    with pytest.raises(ReplayError, match=r"argument 1 was captured as Scalar\(.*2.0\)+ and is .x. now; a Scalar.s "
                                          r"place takes a real number"):
        graph(np.ones(3), "x")


def test_a_number_read_off_an_array_must_not_change():
    graph = capture(lambda x: x * float(x.sum()), np.ones(3))
    assert np.array_equal(graph(np.ones(3)), np.full(3, 3.0))  # the same value: replays
    with pytest.raises(ReplayError, match=r"float\(\) read 3.0 from an array while capturing and 6.0 now"):
        graph(np.full(3, 2.0))


def test_a_changed_value_stops_the_replay_with_the_captured_value():
    def f(x):
        return x * 2 if bool(x.sum() > 0) else x * 3

    graph = capture(f, np.ones(3))
    assert np.array_equal(graph(np.full(3, 5.0)), np.full(3, 10.0))  # the same branch: replays
    with pytest.raises(ReplayError, match=r"bool\(\) read True from an array while capturing and False now"):
        graph(np.full(3, -1.0))


def test_replay_arguments_must_match_the_captured_ones():
    graph = capture(lambda x, n: x * n, np.ones(3), 2)
    with pytest.raises(ReplayError,
                       match=r"argument 0 must match the captured one: array \(3,\) float64, got array \(4,\)"):
        graph(np.ones(4), 2)
    with pytest.raises(ReplayError,
                       match="argument 1 was 2 when captured and is 5 now; .* spmdsim.runtime.replay.Scalar"):
        graph(np.ones(3), 5)
    with pytest.raises(ReplayError, match="got 1 argument"):
        graph(np.ones(3))


def test_a_dtensor_argument_of_another_shape_is_named_by_its_global_shape():
    """docs/howto/replay.md promises the global shapes: the line named only this rank's blocks, (8, 8) and (8, 16)."""
    def body():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        graph = capture(lambda a: a * 2.0, DTensor.from_global(mesh, np.ones((16, 8)), layout("dp", None)))
        try:
            graph(DTensor.from_global(mesh, np.ones((16, 16)), layout("dp", None)))
        except ReplayError as e:
            return str(e)

    assert set(spmdsim.simulate(2, body)) == {
        'replay: argument 0 must match the captured one: global shape (16, 8) float64 under ("dp", None) (block '
        '(8, 8) on this rank), got global shape (16, 16) float64 under ("dp", None) (block (8, 16) on this rank)'}


def test_nothing_of_a_capture_stays_behind():
    original, local = np.zeros, DTensor.__dict__["local"]
    seen = []
    capture(lambda x: seen.append(DTensor.__dict__["local"]) or np.zeros(3) + x, np.ones(3))
    assert np.zeros is original and buffers.FRESH is None
    assert seen == [local] and DTensor.__dict__["local"] is local  # never swapped, not even while capturing


def _sum_of_multiples(make):
    """A rank's step that zeroes an array made by `make(block)`, accumulates into it, fills another by item
    assignment and np.copyto, and Allreduces their sum over the ranks."""
    from spmdsim.runtime import collectives as C

    mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
    weights = np.arange(1.0, 5.0)  # made in the step's program and only read: a constant

    def step(x):
        block = x.local
        acc = make(block)
        for k in range(1, 4):
            acc += block * k
        rows = np.empty_like(block)
        rows[0] = acc[-1]
        np.copyto(rows[1:], acc[:-1] * weights[1:])
        return C.allreduce(mesh, acc + rows, "x")

    def x_at(k):
        return DTensor.from_local(mesh, np.linspace(mesh.rank, k + 1.0, 4), mesh.layout(None))

    x = x_at(0)
    graph = capture(step, x)
    replayed = [graph.result.copy()] + [graph(x_at(k)).copy() for k in range(1, 4)]
    eager = [step(x_at(k)) for k in range(4)]
    return replayed, eager


@pytest.mark.parametrize("make", [
    lambda b: buffers.zeros(b.shape, b.dtype), lambda b: np.zeros_like(b),
    lambda b: np.full_like(b, 0.0), lambda b: np.ones_like(b, shape=(4,)) * 0.0,
    lambda b: buffers.fresh(np.zeros(4), 0)],
    ids=["buffers.zeros", "zeros_like", "full_like", "ones_like-times-0", "buffers.fresh"])
def test_memory_the_step_makes_through_the_capture_replays_with_new_inputs(make):
    for replayed, eager in spmdsim.simulate(2, _sum_of_multiples, make):
        assert len({r.tobytes() for r in eager}) == 4  # new inputs each step: the steps differ
        assert [r.tobytes() for r in replayed] == [e.tobytes() for e in eager]


_REFUSED = (r"^replay: np\.{what} wrote into a plain array \(4,\) float64 while capturing: numpy made it out of the "
            r"capture's sight, so a replay would not zero or fill it again; make it with spmdsim\.base\.buffers\.zeros"
            r"\(\.\.\.\) or np\.zeros_like\(<a traced array>\), and read traced arrays with np\.asanyarray, not "
            r"np\.asarray$")


def test_an_accumulator_zeroed_with_np_zeros_is_refused_at_capture_in_one_line():
    """A replay of it would start from the sum the capture left there: the capture refuses it, on every rank."""
    with pytest.raises(ReplayError) as info:
        spmdsim.simulate(2, _sum_of_multiples, lambda b: np.zeros(b.shape))
    first, *rest = str(info.value).splitlines()
    assert re.match(_REFUSED.format(what="add"), first) and rest == [], str(info.value)


@pytest.mark.parametrize("write, what", [
    (lambda acc, x: np.multiply(x, 2.0, out=acc), "multiply"), (lambda acc, x: np.copyto(acc, x), "copyto"),
    (lambda acc, x: np.add.at(acc, [0, 0], x[:2]), r"add\.at"), (lambda acc, x: np.put(acc, [1], x[:1]), "put")])
def test_each_recorded_write_into_a_plain_array_is_refused(write, what):
    def step(x):
        acc = np.zeros(4)
        write(acc, x)
        return acc

    with pytest.raises(ReplayError, match=_REFUSED.format(what=what)):
        capture(step, np.ones(4))
    # The same write into memory the capture sees (its input) is recorded and replayed.
    graph = capture(lambda x: (write(x, x[::-1] * 1.0), x)[1], np.ones(4))
    new = np.arange(4.0)
    expected = new.copy()
    write(expected, expected[::-1] * 1.0)
    assert np.array_equal(graph(new), expected) and not np.array_equal(expected, np.arange(4.0))


def test_a_transfer_no_kernel_records_is_refused_at_capture_and_runs_inside_one():
    from spmdsim.runtime.replay import kernel

    def step_gathering(marked: bool):
        mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
        x = DTensor.from_local(mesh, np.full(2, float(mesh.rank)), mesh.layout("x"))
        gather = kernel(DTensor.gather) if marked else DTensor.gather
        graph = capture(lambda t: gather(t) * 2.0, x)
        y = DTensor.from_local(mesh, np.full(2, 5.0 + mesh.rank), mesh.layout("x"))
        return graph(y).tolist()

    with pytest.raises(ReplayError, match=r"^replay: gather while capturing is not recorded \(no kernel runs it\), so "
                       r"a replay would not repeat it; .* spmdsim\.runtime\.replay\.kernel"):
        spmdsim.simulate(2, step_gathering, False)
    assert spmdsim.simulate(2, step_gathering, True) == [[10.0, 10.0, 12.0, 12.0]] * 2


def _many_operators(replay: bool, steps: int = 3):
    """A step through most of spmdsim.nn.ops on dp 2 x tp 2 (split dims joined, narrowed and reduced, exact GELU,
    erf, norms, attention with dropout, both losses, argmax, an embedding), its backward and AdamW."""
    from spmdsim.nn.optim import AdamW

    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
    L = mesh.layout
    specs = {"w1": ((16, 32), (None, "tp")), "w2": ((32, 16), ("tp", None)), "g": ((16,), (None,)),
             "b": ((16,), (None,)), "table": ((12, 16), ("tp", None)), "wq": ((16, 16), (None, "tp"))}
    P = {name: DTensor.from_seeded(mesh, L(*m), SeededTensor(s, "float64", seed=i)).requires_grad_()
         for i, (name, (s, m)) in enumerate(specs.items())}
    opt = AdamW(list(P.values()), lr=0.01)

    def step(x, ids, labels, seed):
        opt.zero_grad()
        h = ops.layer_norm(x, P["g"], P["b"]) + ops.embedding(ids, P["table"])
        u = ops.einsum("bd,df->bf", h, P["w1"])
        u = ops.gelu(u, approximate="none") + ops.silu(u) * 0.1 + ops.sigmoid(u) - ops.tanh(u) * 0.2
        u = ops.dropout(u, 0.2, seed=lambda: 7 + int(seed))
        left, right = ops.chunk(u, 2, dim=1)  # u's dim 1 is split over tp: joined and narrowed by Alltoallv
        split = ops.mean(ops.concatenate([right, left], dim=1) * u) + ops.sum(ops.narrow(u, 1, 3, 20)) * 0.01
        h = ops.resolved(ops.einsum("bf,fd->bd", u, P["w2"]))
        a = ops.exp(ops.clip(h, -2.0, 2.0)) + ops.sqrt(ops.abs(h) + 1.0) + ops.log(ops.square(h) + 1.0)
        a = a + ops.sin(h) * ops.cos(h) + ops.rsqrt(ops.square(h) + 1.0) + ops.erf(h)
        a = ops.maximum(a, h) - ops.minimum(a, -h) + ops.pow(ops.abs(h) + 1.0, 2.0) / 3.0
        a = ops.where(ops.equal(h, h), a, ops.neg(a)) + ops.relu(h)
        r = ops.rms_norm(h, P["g"])
        s = ops.softmax(r, dim=-1) + ops.log_softmax(r, dim=-1) * 0.01
        left, right = ops.chunk(h, 2, dim=1)
        joined = ops.concatenate([right, left], dim=1)
        q = ops.reshape(ops.einsum("bd,df->bf", h, P["wq"]), (2, 4, 2, 8))
        o = ops.attention(q, q, q, causal=True, dropout=0.1, seed=lambda: 3 + int(seed))
        top = ops.equal(h, ops.max(h, dims=1, keepdims=True))
        loss = (split + ops.mean(h * h) + ops.mean(a) + ops.sum(s * r) * 0.1 + ops.var(r) + ops.max(r) - ops.min(r)
                + ops.mean(joined * h) + ops.sum(ops.narrow(h, 1, 3, 10)) * 0.01 + ops.mean(ops.stack([h, joined]))
                + ops.mean(ops.transpose(h, (1, 0)) ** 2) + ops.mean(ops.broadcast_to(ops.sum(h, dims=0), (8, 16)))
                + ops.mean(o * o) + ops.cross_entropy(h, labels, label_smoothing=0.1)
                + ops.mse_loss(h, ops.resolved(x * 1.0).redistribute(h.layout))
                + ops.mean(ops.masked_fill(h, top, 0.5)) + ops.sum(ops.argmax(h, dim=1).astype("float64")) * 0.0)
        loss.backward()
        opt.step()
        return loss

    losses, graph = [], None
    for k in range(steps):
        x = DTensor.from_seeded(mesh, L("dp", "tp"), SeededTensor((8, 16), "float64", seed=50 + k))
        ids = DTensor.from_seeded(mesh, L("dp"), SeededTensor((8,), "int64", seed=60 + k, low=0, high=12))
        labels = DTensor.from_seeded(mesh, L("dp"), SeededTensor((8,), "int64", seed=70 + k, low=0, high=16))
        if not replay:
            loss = step(x, ids, labels, Scalar(k))
        elif graph is None:
            graph = capture(step, x, ids, labels, Scalar(k), state=list(P.values()))
            loss = graph.result
        else:
            loss = graph(x, ids, labels, k)
        losses.append(float(ops.resolved(loss).local))
    return losses, [t.local.tobytes() for p in P.values() for t in (p, p.grad)]


def test_many_operators_replay_bit_for_bit():
    """Each operator's own numpy work recorded with numpy untouched: a place that made a plain array of a
    traced one (np.asarray, np.ascontiguousarray, np.zeros then filled) would replay other values."""
    for (losses, blocks), (again, replayed) in spmdsim.simulate(4, lambda: (_many_operators(False),
                                                                            _many_operators(True))):
        assert len(set(losses)) == 3 and again == losses
        assert replayed == blocks
