"""Gradients added into ``.grad`` over several backwards (``keep_pending``: a pipeline's microbatches, DDP's
no_sync): the walk adds a gradient into the block of the leaf's ``.grad`` in place where nothing else can see
that block (spmdsim.nn.autograd.leaves' `_added_into`), else into a new one. Either way each ``.grad``
is the sum of its own gradients: a block two gradients share, a view of another gradient's block, or a ``.grad``
a caller kept from an earlier backward is never written. Tiny tensors on 2 simulated ranks: well under a second.
"""
from __future__ import annotations

import weakref

import numpy as np

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.autograd import reduce_grads

A = np.arange(12.0).reshape(4, 3) / 7
W = np.arange(6.0).reshape(3, 2) / 5 - 0.3
V = np.arange(6.0) / 4 - 0.5
SCALES = (1.0, -0.5, 2.0)  # one input per backward (a microbatch each)


def _dz(z: np.ndarray, scale: float) -> np.ndarray:
    """d sum((x z)^2) / dz for x = scale * A."""
    x = scale * A
    return 2 * x.T @ (x @ z)


def _run(body):
    """`body(mesh, x_of, leaves)` on 2 ranks, each leaf replicated (its gradient pending over "dp" when kept)."""
    def wrapped():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        rep = layout(None, None)
        a = DTensor.from_global(mesh, W, rep).requires_grad_()
        b = DTensor.from_global(mesh, W[::-1].copy(), rep).requires_grad_()
        v = DTensor.from_global(mesh, V, layout(None)).requires_grad_()
        x_of = lambda s: DTensor.from_global(mesh, s * A, layout("dp", None))  # noqa: E731
        return body(mesh, x_of, (a, b, v))

    return spmdsim.simulate(2, wrapped)


def test_leaves_whose_gradients_share_a_block_each_sum_their_own():
    """a + b hands both leaves one gradient, and v's (a reshape's) is a view of it: adding the next backward's
    gradient into a's block in place would add it to b's and v's too (each of them twice the right sum's
    share of it)."""
    def body(mesh, x_of, leaves):
        a, b, v = leaves
        for s in SCALES:
            z = a + b + ops.reshape(v, (3, 2))
            y = x_of(s) @ z
            ops.sum(y * y).backward(keep_pending=leaves)
        reduce_grads(list(leaves))
        return [t.grad.gather() for t in leaves]

    z = W + W[::-1] + V.reshape(3, 2)
    want = sum(_dz(z, s) for s in SCALES)
    for a, b, v in _run(body):
        np.testing.assert_allclose(a, want, rtol=1e-13)
        np.testing.assert_allclose(b, want, rtol=1e-13)
        np.testing.assert_allclose(v, want.reshape(6), rtol=1e-13)


def test_a_grad_kept_from_an_earlier_backward_keeps_its_values():
    """A caller's reference to ``w.grad`` after one backward: the next backward's sum goes into a new block, not
    into that tensor's (PyTorch accumulates in place; spmdsim's ``.grad`` after a backward was always a new
    tensor, and stays one where a caller holds the old). Nobody holding it, the sum is made in place."""
    def body(mesh, x_of, leaves):
        a = leaves[0]
        sums = []
        for s in SCALES:
            y = x_of(s) @ a
            ops.sum(y * y).backward(keep_pending=[a])
            sums.append(a.grad)  # each backward's .grad, kept
        blocks = [t.local.copy() for t in sums]
        # Kept by nobody: the next backward adds into the block itself.
        a.grad = None
        sums = None
        for s in SCALES:
            y = x_of(s) @ a
            ops.sum(y * y).backward(keep_pending=[a])
            if s == SCALES[0]:
                first = weakref.ref(a.grad.local)
        same = first() is a.grad.local
        reduce_grads([a])
        return blocks, same, a.grad.gather()

    parts = [_dz(W, s) for s in SCALES]
    for blocks, same, total in _run(body):
        # a pending sum over the 2 ranks' rows: each rank's block is its rows' part; their sum the gradient
        assert same
        np.testing.assert_allclose(total, sum(parts), rtol=1e-13)
        for k in range(1, len(SCALES)):  # each kept tensor still differs from the one after it by its addend
            assert not np.array_equal(blocks[k], blocks[k - 1])
    # The ranks' blocks of each kept .grad add up to that backward's running sum.
    per_rank = [blocks for blocks, _, _ in _run(body)]
    for k in range(len(SCALES)):
        np.testing.assert_allclose(per_rank[0][k] + per_rank[1][k], sum(parts[:k + 1]), rtol=1e-13)


def test_a_grad_without_keep_pending_accumulates_over_backwards_in_buckets_and_alone():
    """Without keep_pending each backward sums its gradients at once (in one bucket when asked: views of its
    flat Allreduce), and a second backward adds into ``.grad`` as it is."""
    def body(mesh, x_of, leaves):
        a, b, v = leaves
        for s in SCALES:
            z = a * b + ops.reshape(v, (3, 2))
            y = x_of(s) @ z
            ops.sum(y * y).backward(bucket=s != SCALES[1])
        return [t.grad.gather() for t in leaves]

    B = W[::-1]
    z = W * B + V.reshape(3, 2)
    dz = sum(_dz(z, s) for s in SCALES)
    for a, b, v in _run(body):
        np.testing.assert_allclose(a, dz * B, rtol=1e-13)
        np.testing.assert_allclose(b, dz * W, rtol=1e-13)
        np.testing.assert_allclose(v, dz.reshape(6), rtol=1e-13)


def test_the_engine_makes_a_bucket_s_tensors_with_every_slot_of_a_dtensor():
    """A bucket's whole gradients are made slot by slot in C (plans._tensors, as DTensor._trusted makes one):
    a slot added to DTensor and not set there would be an AttributeError on its first read."""
    from spmdsim.nn.autograd import plans
    from spmdsim.runtime.dtensor import DTensor as Runtime

    assert sorted(plans.TENSOR_SLOTS) == sorted(Runtime.__slots__)


def test_backward_kept_is_backward_with_keep_pending():
    """engine.backward_kept(loss, gradient, kept_leaves(params)), a pipeline stage's microbatch backward
    (spmdsim.models.gpt.pipeline), fills ``.grad`` as ``loss.backward(gradient=..., keep_pending=params)`` does, bit for
    bit, its loss and gradient checked alike."""
    from spmdsim.nn.autograd import engine

    def body(mesh, x_of, leaves):
        a, b, v = leaves
        kept = engine.kept_leaves([a, b])
        sums = []
        for fast in (False, True):
            for s in SCALES:
                y = x_of(s) @ (a * b + ops.reshape(v, (3, 2)))
                g = DTensor.from_global(mesh, np.full((4, 2), s), y.layout)
                if fast:
                    engine.backward_kept(y, g, kept)
                else:
                    y.backward(gradient=g, keep_pending=[a, b])
            sums.append([t.grad.local.copy() for t in leaves])
            for t in leaves:
                t.grad = None
        try:  # a gradient of another shape: the same one-line refusal as backward's
            engine.backward_kept(x_of(1.0) @ a, DTensor.from_global(mesh, np.ones((4, 3)), y.layout), kept)
        except spmdsim.SpmdsimError as e:
            refused = str(e)
        return sums, refused

    for (slow, fast), refused in _run(body):
        for x, y in zip(slow, fast):
            assert x.tobytes() == y.tobytes()
        assert refused == ("backward(gradient): gradient of global shape (4, 3) for a tensor of global shape "
                           "(4, 2); expected the same shape")


def test_the_walk_notes_a_tensor_s_layout_only_where_its_gradient_takes_another():
    """The walk keeps a gradient laid out by its tensor's very layout object without noting that layout (most
    gradients: the sum of such addends keeps the object), and notes it where an addend came in another (a
    replicated leaf's, pending over dp): the leaves' ``.grad`` come out alike either way (a store
    fewer per gradient)."""
    from spmdsim.nn.autograd import engine

    def body(mesh, x_of, leaves):
        a, b, v = leaves
        x = x_of(1.0)
        s = DTensor.from_global(mesh, np.arange(8.0).reshape(4, 2) / 3, x.layout).requires_grad_()
        y = x @ a + s
        loss = ops.sum((y + s) * y)
        ones = DTensor.from_global(mesh, np.ones(()), loss.layout.layout())
        grads, owners = {loss._ag: ones}, {}
        engine._walk(engine._topological(loss._ag), grads, owners)
        noted = (a._ag in owners, s._ag in owners, grads[s._ag]._layout is s._layout, owners.get(a._ag) is a._layout)
        y = x @ a + s
        ops.sum((y + s) * y).backward()
        return noted, a.grad.gather(), s.grad.gather()

    S = np.arange(8.0).reshape(4, 2) / 3
    Y = A @ W + S
    for noted, da, ds in _run(body):
        assert noted == (True, False, True, True)
        np.testing.assert_allclose(da, A.T @ (2 * Y + S), rtol=1e-13)
        np.testing.assert_allclose(ds, 3 * Y + S, rtol=1e-13)


def test_capped_buckets_let_each_gradient_go_once_it_is_in_its_flat_block(monkeypatch):
    """With a bucket cap (`bucket=` bytes) the walk's end and reduce_grads let a bucket's gradients go once they
    are in its flat block, before its Allreduce, and sum a leaf alone in its own block: at each Allreduce the
    gradients already summed are gone, so a rank holds one bucket's gradients twice at a time, not all of them
    beside the last bucket's block. Here a and b share a bucket of 96 bytes, v is summed alone after them."""
    from spmdsim.runtime import executor

    seen: dict = {0: [], 1: []}  # rank -> (its label, its pending blocks still alive) at each Allreduce
    refs: dict = {0: {}, 1: {}}  # rank -> {leaf name: a weak reference to its pending gradient's block}

    def note(label: str) -> None:
        rank = spmdsim.world().Get_rank()
        seen[rank].append((label, "".join(name for name, ref in refs[rank].items() if ref() is not None)))

    resolve = executor.resolve
    monkeypatch.setattr(executor, "resolve", lambda *a, **k: note(a[3]) or resolve(*a, **k))

    def body(mesh, x_of, leaves):
        a, b, v = leaves
        z = a * b + ops.reshape(v, (3, 2))
        y = x_of(1.0) @ z
        spmdsim.nn.autograd.backward(ops.sum(y * y), keep_pending=leaves)
        refs[mesh.rank].update((name, weakref.ref(t.grad.local)) for name, t in zip("abv", leaves))
        at = v.grad.local.ctypes.data  # where v's pending gradient lies
        reduce_grads(leaves, bucket=96)
        return [t.grad.local.copy() for t in leaves], v.grad.local.ctypes.data == at  # summed in place there

    (first, in_place), (second, _) = _run(body)
    sums = [("gradient bucket of 2 leaves", "v"), ("gradient bucket of 1 leaf", "v")]
    assert seen == {0: sums, 1: sums} and in_place, (seen, in_place)
    assert all(np.array_equal(x, y) for x, y in zip(first, second))  # summed: every rank's whole gradients
    B = W[::-1]
    dz = _dz(W * B + V.reshape(3, 2), 1.0)
    for got, want in zip(first, (dz * B, dz * W, dz.reshape(6))):
        np.testing.assert_allclose(got, want, rtol=1e-13)


def test_a_bucket_cap_counts_the_bytes_of_a_ranks_shards(monkeypatch):
    """`bucket=` bytes caps a bucket by the parameter shards a rank holds, as DDP's bucket_cap_mb and Megatron's
    bucket_size count a process's parameters: a and b, 8 float64 elements each split over tp 2, are 32 bytes a rank,
    so a cap of 64 bytes sums both in one Allreduce over dp (counted whole, 64 bytes each, they went in two), and
    63 bytes sums each alone. The sums equal the uncapped run's."""
    from spmdsim.runtime import executor

    labels: dict = {}  # rank -> the labels of its collectives in the backward
    resolve = executor.resolve
    monkeypatch.setattr(executor, "resolve",
                        lambda *a, **k: labels[spmdsim.world().Get_rank()].append(a[3]) or resolve(*a, **k))
    rng = np.random.default_rng(0)
    x_, p_, q_ = rng.standard_normal((2, 4, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))

    def body():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        out = []
        for cap in (True, 64, 63):
            a = DTensor.from_global(mesh, p_, layout("tp", None)).requires_grad_()
            b = DTensor.from_global(mesh, q_, layout("tp", None)).requires_grad_()
            x = DTensor.from_global(mesh, x_, layout("dp", "tp", None))
            loss = ops.sum(x * (a * b))
            labels[mesh.rank] = []
            spmdsim.nn.autograd.backward(loss, bucket=cap)
            out.append((labels[mesh.rank], a.grad.local.copy(), b.grad.local.copy()))
        return out

    for whole, at_64, at_63 in spmdsim.simulate(4, body):
        assert [whole[0], at_64[0], at_63[0]] == [["gradient bucket of 2 leaves"], ["gradient bucket of 2 leaves"],
                                                  ["gradient bucket of 1 leaf"] * 2]
        for run in (at_64, at_63):
            assert all(np.array_equal(g, h) for g, h in zip(run[1:], whole[1:]))


def test_a_leaf_summed_alone_is_a_gradient_sum_with_an_explanation_too():
    """With `explain=` a leaf summed alone (no bucket) is one Allreduce labelled as a gradient sum, as without it
    (the estimate prices such a sum in the gradients phase), where it was a redistribution's move; the gradients
    are the same bits with and without."""
    from spmdsim.runtime.trace import collect_trace

    def body(mesh, x_of, leaves):
        out = []
        for explain in (None, []):
            for t in leaves:
                t.grad = None
            a, b, v = leaves
            loss = ops.sum((x_of(1.0) @ (a * b + ops.reshape(v, (3, 2)))) ** 2)
            with collect_trace() as trace:
                spmdsim.nn.autograd.backward(loss, explain=explain)
            out.append(([e.label for e in trace.entries if e.op == "allreduce"],
                        [t.grad.local.copy() for t in leaves]))
        return out

    for (labels, grads), (explained, same) in _run(body):
        assert labels == explained == ["gradient bucket of 1 leaf"] * 3, (labels, explained)
        assert all(np.array_equal(g, h) for g, h in zip(grads, same))


def test_a_gradient_two_leaves_share_is_summed_once_for_each():
    """a + b hands both leaves the same gradient block: summed alone (each above the bucket cap of 8 bytes), at the
    walk's end and by reduce_grads, neither is summed in that shared block (which would sum the other's twice):
    the gradients equal the uncapped run's."""
    def body(mesh, x_of, leaves):
        out = []
        for cap, kept in ((True, False), (8, False), (True, True), (8, True)):
            a, b, v = leaves
            for t in leaves:
                t.grad = None
            y = x_of(1.0) @ (a + b + ops.reshape(v, (3, 2)))
            spmdsim.nn.autograd.backward(ops.sum(y * y), bucket=False if kept else cap,
                                      keep_pending=leaves if kept else ())
            if kept:
                reduce_grads(leaves, bucket=cap)
            out.append([t.grad.local.copy() for t in leaves])
        return out

    for runs in _run(body):
        for run in runs[1:]:
            for got, want in zip(run, runs[0]):
                np.testing.assert_array_equal(got, want)
    dz = _dz(W + W[::-1] + V.reshape(3, 2), 1.0)
    np.testing.assert_allclose(runs[0][0], dz, rtol=1e-13)
