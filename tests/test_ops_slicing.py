"""Slicing and joining (narrow, x[...], concatenate, stack), the new elementwise ops, and a user's own models.

The ops' forward and float64 gradients on random layouts are tests/generalkit.py's cases (run by
tests/test_ops_general.py); here: the rules without ranks, every refusal in one line, float32 kept,
and three small programs a user writes with the front door only (a Llama-style block, an encoder with
a padding mask and a mean-pooled classifier, a custom autograd.Function in a sharded MLP), each against
numpy forward and backward on 8 simulated ranks.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import spmdsim
from spmdsim import DialectError, DTensor, Layout, Mesh, OperatorError, SeededTensor, ShapeError, collect_trace
from spmdsim.nn import ops
from spmdsim.programs.infer import infer_broadcast_to, infer_concatenate, infer_narrow
from spmdsim.references.forward import gelu
from spmdsim.references.backward import numeric_grads

ROOT = pathlib.Path(__file__).resolve().parents[1]
L = Layout((2, 4), ("dp", "tp"))


def test_broadcast_to_rule_keeps_splits_and_grows_whole_dims():
    x = L("dp", None, "tp", partial=())
    assert infer_broadcast_to(x, (2, 1, 8), (3, 2, 5, 8)) == (L(None, "dp", None, "tp"), (3, 2, 5, 8))
    assert infer_broadcast_to(L(None, partial=("tp",)), (4,), (2, 4)) == (L(None, None, partial=("tp",)), (2, 4))


def test_narrow_rule_is_local_and_keeps_pending_sums():
    x = L("dp", None, "tp", partial=())
    assert infer_narrow(x, (4, 6, 8), 1, 2, 3) == (x, 1, 2, (4, 3, 8))
    pending = L(None, None, partial=("tp",))
    assert infer_narrow(pending, (4, 6), -1, -2, 2) == (pending, 1, 4, (4, 2))


def test_narrow_rule_of_a_split_dim_keeps_the_split_that_divides_the_slice():
    x = L(("dp", "tp"), None, partial=())
    assert infer_narrow(x, (16, 3), 0, 8, 8) == (x, 0, 8, (8, 3))  # 8 rows over 8 shards
    assert infer_narrow(x, (16, 3), 0, 1, 6) == (L("dp", None), 0, 1, (6, 3))  # 6 rows: over dp only
    assert infer_narrow(x, (16, 3), 0, -1, 1) == (L(None, None), 0, 15, (1, 3))  # one row: whole
    pending = L(None, "tp", partial=("dp",))
    assert infer_narrow(pending, (2, 8), 1, 2, 4) == (pending, 1, 2, (2, 4))
    wide = Layout((4, 2), ("a", "b"))  # docs/explanation/semantics.md: 2 rows of a dim over ("a", "b") keep "b"
    assert [infer_narrow(wide(("a", "b")), (16,), 0, 0, n)[0] for n in (2, 4, 6, 1)] == [
        wide("b"), wide("a"), wide("b"), wide(None)]


def test_narrow_from_the_end_of_a_dim_is_empty_as_pytorchs():
    """PyTorch's narrow takes start from -size to size: start == size with length 0 is an empty slice (its gradient
    zeros), start -size the first row; past either end, or a length past the end, it refuses."""
    assert infer_narrow(L("dp", None), (4, 3), 0, 4, 0) == (L("dp", None), 0, 4, (0, 3))  # 0 rows divide
    assert infer_narrow(L(None, "tp"), (3, 8), 1, -8, 1) == (L(None, None), 1, 0, (3, 1))
    assert infer_narrow(L(None, None), (0, 3), 0, 0, 0) == (L(None, None), 0, 0, (0, 3))

    def body():
        mesh = Mesh(Layout((2,), ("m0",)))
        a = np.arange(12.0).reshape(4, 3)
        out = []
        for rows in (None, "m0"):
            x = DTensor.from_global(mesh, a, mesh.layout(rows, None)).requires_grad_()
            empty, last = ops.narrow(x, 0, 4, 0), ops.narrow(x, 0, -4, 1)
            (ops.sum(empty) + ops.sum(last * 2.0)).backward()
            out.append((empty.global_shape, empty.gather(), last.gather(), x.grad.gather()))
        return out

    for shape, empty, last, grad in spmdsim.simulate(2, body)[0]:
        assert shape == (0, 3) and empty.shape == (0, 3)
        assert np.array_equal(last, [[0.0, 1.0, 2.0]])
        assert np.array_equal(grad, [[2.0] * 3] + [[0.0] * 3] * 3)


def test_shift_moves_each_rank_only_the_rows_it_lacks():
    """narrow(x, 0, 1, 4) of 8 rows over dp (a 2 x 4 mesh): dp 0 keeps rows 1:3 of its 0:4 and sends row 3 to
    its dp 1 peer (same tp coordinate), which keeps row 4 of its 4:8: one row a rank on dp 1, the lower bound."""
    from spmdsim.programs.plan.shift import Shift

    x, every = L("dp", None), slice(None)
    shift = Shift(x, (8, 3), x, (4, 3), 0, 1)
    first, second = shift.moves(1), shift.moves(5)  # tp 1 on dp 0 and on dp 1
    assert first.own == ((slice(0, 2), every), (slice(1, 3), every))
    assert first.sends == ((5, (slice(3, 4), every), (1, 3)),) and first.places == ()
    assert second.own == ((slice(1, 2), every), (slice(0, 1), every)) and second.sends == ()
    assert second.places == ((1, (slice(0, 1), every), (1, 3)),)
    assert shift.bytes_per_rank(8) == ((24,) * 4 + (0,) * 4, (0,) * 4 + (24,) * 4)
    back = Shift(x, (4, 3), x, (8, 3), 0, -1)  # the gradient: row 2 of the slice goes back to dp 0
    assert back.moves(5).sends == ((1, (slice(0, 1), every), (1, 3)),)
    assert back.moves(5).own == ((slice(0, 1), every), (slice(1, 2), every))
    assert back.moves(1).own == ((slice(1, 3), every), (slice(0, 2), every))
    assert back.moves(1).places == ((5, (slice(3, 4), every), (1, 3)),)
    assert not shift.moves_nothing and Shift(x, (8, 3), x, (4, 3), 0, 2).moves_nothing  # rows 2:6: all kept


@pytest.mark.parametrize("before, after, offset", [
    (("a", None), ("a", None), 3), ((("a", "b"), None), (("a",), None), 5), ((("b", "a"), None), ((), None), 7),
    ((("a", "b"), "c"), (("a", "b"), "c"), -6), ((("a",), None), (("a", "b"), None), -2),
    ((("c", "a"), None), (("c",), None), 1)])
def test_shift_sends_answer_places_rank_by_rank(before, after, offset):
    """Every box a rank expects from a source is one that source sends it, of the same shape, and each rank
    receives exactly the rows of its new block it does not hold (16 rows before, 8 after, shifted)."""
    from spmdsim.programs.plan.shift import Shift

    mesh = Layout((2, 2, 2), ("a", "b", "c"))
    b, a = mesh(*before), mesh(*after)
    shapes = ((16, 4), (8, 4)) if offset >= 0 else ((8, 4), (16, 4))
    shift = Shift(b, shapes[0], a, shapes[1], 0, offset)
    for rank in range(8):
        moves = shift.moves(rank)
        for src, _, shape in moves.places:
            assert [(dst, box) for dst, _, box in shift.moves(src).sends if dst == rank] == [(rank, shape)]
        for dst, _, shape in moves.sends:
            assert [box for s, _, box in shift.moves(dst).places if s == rank] == [shape]
        lo, hi = a.bounds(rank, shapes[1])[0]
        held = b.bounds(rank, shapes[0])[0]
        wanted = {r for r in range(lo, hi) if 0 <= r + offset < shapes[0][0]}
        lacking = {r for r in wanted if not held[0] <= r + offset < held[1]}
        assert sum(box[0] for _, _, box in moves.places) == len(lacking)
        kept = moves.own[0][0] if moves.own else slice(0, 0)
        assert kept.stop - kept.start == len(wanted) - len(lacking)


def test_shift_at_4096_devices_works_out_one_group_per_kind_of_rank():
    """narrow(x, 0, 100, 512) of 1,024 rows over 256 shards (a x b) on 8 x 32 x 16 devices: each rank needs
    2 rows held by the member 25 places on (rows 100 + 2k), who sends 2 rows to each of two ranks; the dry
    run's per-rank bytes come from one rank per coordinate on a and b, not from every rank."""
    from spmdsim.programs.plan.shift import Shift

    x = Layout((8, 32, 16), ("a", "b", "c"))(("a", "b"), None)
    shift = Shift(x, (1024, 8), x, (512, 8), 0, 100)
    assert not shift.moves_nothing
    assert shift.moves(0).places == ((400, (slice(0, 2), slice(None)), (2, 8)),)  # k 0 <- member 25 (b 25)
    assert [dst for dst, _, _ in shift.moves(400).sends] == [0, 16]  # member 25 -> k 0 and k 1 (b 1)
    sent, received = shift.bytes_per_rank(8)
    assert len(sent) == 4096 and sent[400] == 256 and received[0] == received[400] == 128
    assert max(sent) == 256 and max(received) == 128


def _split_slices():
    mesh = Mesh(L, spmdsim.world())
    a = np.arange(64.0).reshape(8, 8)
    x = DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
    with collect_trace() as trace:
        last = x[..., -1]  # the last column, held by tp 3: whole on every rank
        rows = ops.narrow(x, 0, 2, 4)
        # Rotary embedding's halves of the split last dim, swapped: 4 columns over tp's 4 shards each.
        turned = ops.concatenate([-x[..., 4:], x[..., :4]], -1)
    got = (last.layout, last.gather(), rows.layout, rows.gather(), ops.chunk(x, 4, 1)[2].gather(),
           turned.layout, turned.gather())
    (ops.sum(last) + ops.sum(rows * 2.0) + ops.sum(turned * 3.0)).backward()
    return got, x.grad.gather(), [(e.op, e.bytes_sent, e.bytes_received) for e in trace.entries]


def test_slices_of_split_dims_move_the_rows_by_one_alltoallv_each():
    every = spmdsim.simulate(8, _split_slices)
    (last_layout, last, rows_layout, rows, chunk, turned_layout, turned), grad, calls = every[5]
    # x[..., -1] (docs/reference/operators.md): tp 3 (ranks 3 and 7) sends 4 rows of column 7 to each of tp 0-2 and
    # receives nothing; the others receive their 4 rows (32 B), where an Allgather of the dim brings 192 B.
    assert [r[2][0] for r in every] == [("alltoallv", 96, 0) if r % 4 == 3 else ("alltoallv", 0, 32)
                                        for r in range(8)]
    a = np.arange(64.0).reshape(8, 8)
    assert turned_layout == L("dp", "tp") and np.array_equal(turned, np.concatenate([-a[:, 4:], a[:, :4]], 1))
    assert last_layout == L("dp") and np.array_equal(last, a[:, -1])
    assert rows_layout == L("dp", "tp") and np.array_equal(rows, a[2:6]) and np.array_equal(chunk, a[:, 4:6])
    want = np.zeros((8, 8))
    want[:, -1] += 1.0
    want[2:6] += 2.0
    want[:, 4:] -= 3.0
    want[:, :4] += 3.0
    assert np.array_equal(grad, want)
    # Rank 5 (dp 1, tp 1) holds rows 4:8, columns 2:4: it sends nothing of column 7 and receives its 4 rows
    # of it from tp 3 (4 x 8 B); rows 2:6 over dp are rows 2:4 and 4:6, which dp 0 and dp 1 hold: no call.
    # The halves, a column a rank: of x[..., 4:] it takes column 5 from tp 2; of x[..., :4] column 1 from
    # tp 0, and sends its columns 2 and 3 to tp 2 and 3. The join, one Alltoallv for both operands, puts
    # columns 2:4 of the result on it (the first half's 2 and 3, from tp 2 and 3) and sends its first-half
    # column 1 to tp 0, its second-half column 1 (the result's 5) to tp 2. Each column is 4 rows of 8 B.
    assert calls == [("alltoallv", 0, 32), ("alltoallv", 0, 32), ("alltoallv", 64, 32), ("alltoallv", 64, 64)]


def test_concatenate_rule_moves_the_cheaper_operand_and_keeps_an_agreed_pending_sum():
    plan = infer_concatenate((L("dp", None), L(None, None)), ((4, 3), (4, 5)), 1, "float64")
    assert plan.out == L("dp", None) and plan.targets == (L("dp", None), L("dp", None))
    assert plan.choice.moved == (0, 0) and plan.offsets == (0, 3) and plan.shape == (4, 8)
    assert "a local slice, no communication" in plan.why()
    both = L(None, "dp", partial=("tp",))
    plan = infer_concatenate((both, both), ((3, 4), (5, 4)), 0, "float64")
    assert plan.out == both and "stays pending" in plan.why()
    mixed = infer_concatenate((both, L(None, "dp")), ((3, 4), (5, 4)), 0, "float64")
    assert not mixed.out.partial and mixed.targets[0] == L(None, "dp")


def _refusals():
    mesh = Mesh(L, spmdsim.world())
    x = DTensor.from_global(mesh, np.ones((4, 8)), mesh.layout("dp", "tp"))
    w = DTensor.from_global(mesh, np.ones((3, 8)), mesh.layout(None, "tp"))
    cases = [
        (lambda: ops.concatenate([w, ops.transpose(w)], 0), ShapeError,
         "concatenate along dim 0: operand 1 of shape (8, 3) differs from operand 0 of shape (3, 8) in another dim"),
        (lambda: ops.concatenate(x, 0), OperatorError, "concatenate: xs must be a sequence of DTensors, got DTensor"),
        (lambda: ops.concatenate([], 0), OperatorError, "concatenate: no operands; give a sequence of DTensors"),
        (lambda: ops.concatenate([w, np.ones((3, 8))], 0), OperatorError,
         "concatenate: operand 1 must be a DTensor, got ndarray of shape (3, 8)"),
        (lambda: ops.narrow(w, 0, 4, 0), OperatorError,
         "narrow: start 4 is out of range for dim 0 of size 3 (expected an integer from -3 to 3)"),
        (lambda: ops.narrow(w, 0, 3, 1), OperatorError,
         "narrow: length 1 does not fit dim 0 of size 3 from start 3 (expected an integer from 0 to 0)"),
        (lambda: ops.narrow(w, 0, 1, 3), OperatorError,
         "narrow: length 3 does not fit dim 0 of size 3 from start 1 (expected an integer from 0 to 2)"),
        (lambda: ops.narrow(w, 1, -2, 4), OperatorError,
         "narrow: length 4 does not fit dim 1 of size 8 from start -2 (6) (expected an integer from 0 to 2)"),
        (lambda: ops.narrow(w, 2, 0, 1), OperatorError, "narrow: dim 2 is out of range for a tensor of 2 dims"),
        (lambda: ops.stack([w, x], 0), OperatorError,
         "stack: operand 1 of shape (4, 8) differs from operand 0 of shape (3, 8)"),
        (lambda: ops.stack([w, w], 3), OperatorError, "stack: dim 3 is out of range for a result of 3 dims"),
        (lambda: w[::2], OperatorError, "index slice(None, None, 2): slice slice(None, None, 2) has step 2"),
        (lambda: w[::0], OperatorError, "index slice(None, None, 0): slice slice(None, None, 0) is not one DTensor "
         "slices take: integer bounds (or None) and step 1"),
        (lambda: w[:, 1.5:], OperatorError, "slice slice(1.5, None, None) is not one DTensor slices take"),
        (lambda: w[w > 0], OperatorError, "x[mask] of a DTensor: a bool mask picks a number of elements"),
        (lambda: w[[0, 1]], OperatorError, "is not an int, a slice, '...' or None (DTensors take no fancy"),
        (lambda: w[0, 0, 0], OperatorError, "index (0, 0, 0) has 3 entries for a tensor of 2 dims"),
        (lambda: w[5], OperatorError, "index 5 is out of range for dim 0 of size 3"),
        (lambda: ops.broadcast_to(w, (2, 4, 8)), ShapeError,
         "broadcast_to: shape (3, 8) cannot broadcast to (2, 4, 8) (each dim must match, be 1, or be a new"),
        (lambda: ops.broadcast_to(w, (3, -8)), OperatorError,
         "broadcast_to: shape (3, -8) must hold non-negative integers"),
        (lambda: ops.where(False, x, x), OperatorError, "where: condition must be a bool DTensor, got bool False; "
         "a Python bool is not a mask: compare DTensors (a == b, a < b)"),
        (lambda: bool(x == 0.0), OperatorError, "the truth value of a DTensor of global shape (4, 8) is ambiguous"),
        (lambda: ops.clip(x), OperatorError, "clip: low None and high None: give at least one bound"),
        (lambda: ops.clip(x, "a"), OperatorError, "clip: low 'a' must be a real number, a DTensor or None"),
        (lambda: ops.split(x, 2, "linear", 1), DialectError,
         "split: size 2 must be a list or tuple of two positive integers (the weight's shape: ops.split is "
         "Paddle's distributed split layer); to cut a tensor along a dim use ops.narrow(x, dim, start, length)"),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind, match=re.escape(text)) as info:
            call()
        assert "\n" not in str(info.value)
    return True


def test_every_refusal_is_one_line_on_every_rank():
    assert all(spmdsim.simulate(8, _refusals))


def test_new_ops_keep_float32_and_index_like_numpy():
    src = SeededTensor((3, 4, 5), "float32", seed=2)

    def body():
        mesh = Mesh(L, spmdsim.world())
        x = DTensor.from_seeded(mesh, mesh.layout(None, "tp", None), src)
        outs = [ops.sigmoid(x), ops.silu(x), ops.sin(x), ops.rsqrt(ops.square(x) + 1.0), ops.clip(x, high=0.1),
                x[1], x[..., None, 2:4], x[-1:, :, 0], ops.stack([x, x], -1), x > 0.0,
                ops.broadcast_to(x[:, :, None, 1:2], (2, 3, 4, 2, 3)), x.reshape(3, 20), x.transpose(2, 0, 1),
                x.transpose(), ops.equal(x[:, :, :1], x)]
        assert x.shape == (3, 4, 5) and x.ndim == 3 and x.reshape((3, 4, 5, 1)).shape == (3, 4, 5, 1)
        return [(t.local.dtype, t.gather()) for t in outs]

    a = src.full()
    want = [1 / (1 + np.exp(-a)), a / (1 + np.exp(-a)), np.sin(a), 1 / np.sqrt(a * a + 1), np.minimum(a, 0.1),
            a[1], a[..., None, 2:4], a[-1:, :, 0], np.stack([a, a], -1), a > 0,
            np.broadcast_to(a[:, :, None, 1:2], (2, 3, 4, 2, 3)), a.reshape(3, 20), a.transpose(2, 0, 1), a.T,
            a[:, :, :1] == a]
    for (dtype, got), expected in zip(spmdsim.simulate(8, body)[0], want):
        assert dtype == expected.dtype and got.shape == expected.shape
        assert np.allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_llama_block_example_reads_no_local_shard():
    # tests/test_sim_cli.py runs it on 8 simulated ranks and asserts its "forward and 10 gradients" PASS line.
    assert ".local" not in (ROOT / "examples" / "llama_block.py").read_text()


# -- an encoder with a padding mask and a mean-pooled classifier, on a (dp, tp) mesh ---------------------------
B, S, H, Dh, C = 4, 6, 4, 4, 8
D, F = H * Dh, 32
LENGTHS = np.array([6, 3, 5, 2])
PAD = np.arange(S)[None, :] >= LENGTHS[:, None]  # (B, S): True on padding
LABELS = np.array([1, 7, 3, 0])
SHAPES = [(B, S, D), (D, D), (D, D), (D, D), (D, D), (D,), (D,), (D, F), (F, D), (D, C)]
SOURCES = [SeededTensor(s, "float64", seed=i, low=-b, high=b)
           for i, (s, b) in enumerate(zip(SHAPES, [1.0] + [s[0] ** -0.5 if len(s) == 2 else 1.0 for s in SHAPES[1:]]))]


def _encoder():
    mesh = Mesh(L, spmdsim.world())
    M = mesh.layout
    maps = [("dp", None, None), (None, "tp"), (None, "tp"), (None, "tp"), ("tp", None), (None,), (None,),
            (None, "tp"), ("tp", None), (None, "tp")]
    params = [DTensor.from_seeded(mesh, M(*m), s).requires_grad_() for m, s in zip(maps, SOURCES)]
    x, wq, wk, wv, wo, g, b, w1, w2, wc = params
    lengths = DTensor.from_global(mesh, LENGTHS.astype(float), M("dp"))
    positions = DTensor.from_global(mesh, np.arange(S, dtype=float), M(None))
    pad = ops.reshape(positions >= ops.reshape(lengths, (B, 1)), (B, 1, 1, S))  # built on the mesh, by comparison
    q, k, v = (ops.reshape(x @ w, (B, S, H, Dh)) for w in (wq, wk, wv))
    s = ops.masked_fill(ops.einsum("bqhd,bkhd->bhqk", q, k) * Dh ** -0.5, pad, -np.inf)
    h = ops.layer_norm(x + ops.reshape(ops.einsum("bhqk,bkhd->bqhd", ops.softmax(s, -1), v), (B, S, D)) @ wo, g, b)
    h = h + ops.gelu(h @ w1) @ w2
    valid = ops.where(ops.reshape(pad, (B, S, 1)), 0.0, 1.0)
    pooled = ops.sum(h * valid, 1) / ops.reshape(lengths, (B, 1))  # each sample's mean over its own tokens
    loss = ops.cross_entropy(pooled @ wc, DTensor.from_global(mesh, LABELS, M("dp")))  # classes split: vocab-parallel
    loss.backward()
    return float(ops.resolved(loss)), [t.grad.gather() for t in params]


def _numpy_encoder(x, wq, wk, wv, wo, g, b, w1, w2, wc):
    q, k, v = ((x @ w).reshape(B, S, H, Dh) for w in (wq, wk, wv))
    s = np.where(PAD[:, None, None, :], -np.inf, np.einsum("bqhd,bkhd->bhqk", q, k) * Dh ** -0.5)
    e = np.exp(s - s.max(-1, keepdims=True))
    h = x + np.einsum("bhqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), v).reshape(B, S, D) @ wo
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * g + b
    h = h + gelu(h @ w1) @ w2
    z = (h * ~PAD[:, :, None]).sum(1) / LENGTHS[:, None] @ wc
    z = z - z.max(-1, keepdims=True)
    return -(z[np.arange(B), LABELS] - np.log(np.exp(z).sum(-1))).mean()


def test_encoder_with_a_padding_mask_and_a_pooled_classifier_matches_numpy():
    loss, grads = spmdsim.simulate(8, _encoder)[0]
    arrays = [s.full() for s in SOURCES]
    assert abs(loss - _numpy_encoder(*arrays)) < 1e-12
    for got, want in zip(grads, numeric_grads(_numpy_encoder, *arrays)):
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7)


# -- a user's own op: a fused swish and a clamp with a straight-through gradient --------------------------------
class _Swish(spmdsim.nn.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        s = 1 / (1 + np.exp(-beta * x))
        ctx.save_for_backward(x, s)
        ctx.beta = beta
        return x * s

    @staticmethod
    def backward(ctx, dy):
        x, s = ctx.saved_tensors
        return dy * (s + ctx.beta * x * s * (1 - s))


class _ClampStraightThrough(spmdsim.nn.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return np.clip(x, -1, 1)

    @staticmethod
    def backward(ctx, dy):
        return dy


MLP_SOURCES = [SeededTensor(s, "float64", seed=10 + i) for i, s in enumerate([(4, 16), (16, 32), (32, 16)])]


def _custom_mlp():
    mesh = Mesh(L, spmdsim.world())
    x, w1, w2 = [DTensor.from_seeded(mesh, mesh.layout(*m), s).requires_grad_()
                 for m, s in zip([("dp", None), (None, "tp"), ("tp", None)], MLP_SOURCES)]
    y = _ClampStraightThrough.apply(ops.resolved(_Swish.apply(x @ w1, 1.5) @ w2))  # the row product is pending
    ops.sum(y * y).backward()
    return y.gather(), [t.grad.gather() for t in (x, w1, w2)]


def test_custom_functions_inside_a_sharded_mlp_match_numpy():
    def swish_mlp(x, w1, w2):
        z = x @ w1
        return z / (1 + np.exp(-1.5 * z)) @ w2

    y, grads = spmdsim.simulate(8, _custom_mlp)[0]
    arrays = [s.full() for s in MLP_SOURCES]
    clamped = np.clip(swish_mlp(*arrays), -1, 1)
    assert np.allclose(y, clamped, rtol=0, atol=1e-12)
    # Straight through: d sum(clip(u)^2) = 2 clip(u) du, the clamp's own derivative taken as 1.
    for got, want in zip(grads, numeric_grads(lambda *a: 2 * clamped * swish_mlp(*a), *arrays)):
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6)


class _Scaled(spmdsim.nn.autograd.Function):
    """k * x, its backward written as PyTorch's: one gradient per argument (None for the number)."""

    @staticmethod
    def forward(ctx, k, x):
        ctx.k = k
        return k * x

    @staticmethod
    def backward(ctx, dy):
        return ctx.wrong if hasattr(ctx, "wrong") else (None, ctx.k * dy)


def test_a_function_may_return_one_gradient_per_argument_as_pytorch():
    def body():
        mesh = Mesh(L, spmdsim.world())
        x = DTensor.from_global(mesh, np.arange(8.0).reshape(2, 4), mesh.layout("dp", "tp")).requires_grad_()
        ops.sum(_Scaled.apply(3.0, x)).backward()
        grad = x.grad.gather()

        class Wrong(_Scaled):
            @staticmethod
            def forward(ctx, k, x):
                ctx.k, ctx.wrong = k, (1.0, x)
                return k * x

        y = DTensor.from_global(mesh, np.ones((2, 4)), mesh.layout("dp", "tp")).requires_grad_()
        with pytest.raises(OperatorError, match=re.escape("Wrong.backward returned a gradient for argument 0 "
                                                          "(2.0), which is not a DTensor; return None there")):
            ops.sum(Wrong.apply(2.0, y)).backward()
        return grad

    assert np.array_equal(spmdsim.simulate(8, body)[0], np.full((2, 4), 3.0))


def test_iterating_a_dtensor_walks_its_first_dim_as_numpy_does():
    """x[i] past the end is an IndexError too (and an OperatorError), so ``for row in x`` stops there."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)), spmdsim.world())
        x = DTensor.from_global(mesh, np.arange(6.0).reshape(3, 2), mesh.layout(None, "tp"))
        rows = [row.gather() for row in x]
        with pytest.raises(IndexError, match=r"index 3 is out of range for dim 0 of size 3"):
            x[3]
        return [r.tolist() for r in rows]

    assert spmdsim.simulate(2, body)[0] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


@pytest.mark.parametrize("cut, devices, a_map, b_map, a_rows, b_rows", [
    ("even", (2,), "x", None, 2, 1),  # 3 rows do not divide over 2: the joined dim is whole
    ("chunk", (2,), "x", "x", 1, 2),  # a's one row on rank 0, none on rank 1
    ("balanced", (3,), "x", "x", 1, 4),
    ("chunk", (2, 2), ("x", "y"), "y", 3, 2)])
def test_the_gradient_of_a_join_of_split_pieces_broadcast_over_their_axis(cut, devices, a_map, b_map, a_rows,
                                                                          b_rows):
    """concatenate along a dim its operands split where the result holds it whole, the result then broadcast
    over a dim split by the same axis: its gradient is pending over that axis, and the backward put it in
    the operands' tensor maps as it was ("axis 'x' is used more than once ... partial ('x',)"), as narrow's
    did before (``x * x[0]``). Gradients against numpy's."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (a_rows, 3)), rng.uniform(-1, 1, (b_rows, 3))
    m = rng.uniform(-1, 1, (4, a_rows + b_rows, 3))

    def body():
        mesh = Mesh(Layout(devices, ("x", "y")[:len(devices)], cut=cut), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout(a_map, None)).requires_grad_()
        y = DTensor.from_global(mesh, b, mesh.layout(b_map, None)).requires_grad_()
        joined = ops.concatenate([x, y], 0)
        ops.sum(joined[None] * DTensor.from_global(mesh, m, mesh.layout("x", None, None))).backward()
        return joined.layout.tensor_map, x.grad.gather(), y.grad.gather()

    tensor_map, ga, gb = spmdsim.simulate(int(np.prod(devices)), body)[0]
    assert tensor_map == ((), ())
    assert np.allclose(ga, m.sum(0)[:a_rows], rtol=1e-14, atol=0)
    assert np.allclose(gb, m.sum(0)[a_rows:], rtol=1e-14, atol=0)


def test_broadcast_to_of_a_size_one_dim_split_by_an_uneven_cut_is_refused_in_one_line():
    """A chunk cut of a size-1 dim over 2 ranks leaves rank 1 no row to repeat: numpy's ValueError on that rank
    alone ("operands could not be broadcast together"); now one line on every rank, as the elementwise ops."""
    def body():
        mesh = Mesh(Layout((2,), ("x",), cut="chunk"), spmdsim.world())
        x = DTensor.from_global(mesh, np.ones((1, 4)), mesh.layout("x", None))
        with pytest.raises(OperatorError) as e:
            ops.broadcast_to(x, (2, 4))
        return str(e.value)

    assert set(spmdsim.simulate(2, body)) == {
        'broadcast_to: dim 0 has size 1 but is split over "x"; redistribute x so that dim is whole first'}
