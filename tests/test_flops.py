"""spmdsim.base.flops: the matrix products each rank executes, counted exactly, on real and dry runs alike.

The GPT's counts are Narayanan et al. 2021's GEMM FLOPs (eq. 3 of "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM"): per layer forward QKV 6Bsh², scores 2Bs²h, probs·V 2Bs²h,
out-projection 2Bsh², MLP 16Bsh²; the tied head 2BshV; backward twice the forward; full recomputation
the layers' forward once more. Summed over the ranks of one step they are exactly

    without recomputation   72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    full recomputation      96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))

B the global batch (split over dp, so nothing is replicated over dp), s sequence, l layers, h d_model,
V vocabulary. Selective recomputation (Korthikanti et al. 2022) adds l·2Bs²h: spmdsim's backward makes
the scores q·kᵀ again (their softmax and dropout follow), not probs·V, whose product the backward never
reads (dV = probsᵀ·dY and dprobs = dY·Vᵀ need the probabilities, not the attention's output).
"""
from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, SeededTensor
from spmdsim.base import flops
from spmdsim.nn import ops
from spmdsim.base.context import current
from spmdsim.errors import SpmdsimError
from spmdsim.base.flop_counts import PHASES, FlopCounter, Gemm
from spmdsim.base.flops import counting, gemm
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import train

IDS = encode(load_text(20_000))
CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, vocab=128, dropout=0.1)


def test_gemm_shapes_flops_and_totals():
    g = Gemm(3, 4, 5, 6, "float64", "forward")
    assert g.flops == 2 * 3 * 4 * 5 * 6 and str(g) == "3 x (4x6)@(6x5) float64 forward"
    c = FlopCounter()
    c.add(g)
    c.add(Gemm(1, 2, 2, 2, "float32", "backward"), 2)
    assert c.total() == 720 + 32 and c.total("forward") == 720 and c.total("recompute") == 0
    d = FlopCounter()
    d.merge(c, 3)
    assert d.counts == {g: 3, Gemm(1, 2, 2, 2, "float32", "backward"): 6}
    for bad, match in [(lambda: c.total("sideways"), "phase 'sideways'"), (lambda: c.add(g, -1), "times -1"),
                       (lambda: Gemm(1, 2, 2, 2, "float64", "later"), "phase 'later'"),
                       (lambda: Gemm(1, 2.0, 2, 2, "float64", "forward"), "m 2.0")]:
        with pytest.raises(SpmdsimError, match=match):
            bad()


def test_gemm_reads_matmul_shapes_like_numpy():
    """Batch dims broadcast, a 1-d operand a row (left) or a column (right); each call counted once in every
    counter open on this rank, the inner one only while it is open."""
    with counting() as outer:
        gemm((7, 1, 2, 3), (5, 3, 4), np.float64)
        with counting() as inner:
            gemm((3,), (3, 4), np.float32)
            gemm((2, 3), (3,), "float32")
        gemm((2, 3), (3,), "float32")
    assert inner.counts == {Gemm(1, 1, 4, 3, "float32", "forward"): 1, Gemm(1, 2, 1, 3, "float32", "forward"): 1}
    assert outer.counts == {Gemm(35, 2, 4, 3, "float64", "forward"): 1, Gemm(1, 1, 4, 3, "float32", "forward"): 1,
                            Gemm(1, 2, 1, 3, "float32", "forward"): 2}
    gemm((2, 3), (3, 4), np.float64)  # nothing open: nothing recorded, no error
    assert current().flops == [] and outer.total() == 2 * (35 * 24 + 12 + 2 * 6)


def test_each_simulated_rank_counts_its_own_local_products():
    """x (8, 6) split on rows over dp, w (6, 10) on columns over tp: each of 4 ranks multiplies (4, 6)
    @ (6, 5) forward, and dX = dY wᵀ (4, 5) @ (5, 6), dW = xᵀ dY (6, 4) @ (4, 5) backward."""
    xs, ws = SeededTensor((8, 6), "float64", seed=1), SeededTensor((6, 10), "float64", seed=2)

    def rank() -> tuple:
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_seeded(mesh, mesh.layout("dp", None), xs).requires_grad_()
        w = DTensor.from_seeded(mesh, mesh.layout(None, "tp"), ws).requires_grad_()
        before = ops.matmul(x, w)  # no counter open: not counted anywhere
        with counting() as c:
            y = ops.matmul(x, w)
            ops.sum(y).backward()
        mesh.close()
        return before.local.shape, c.counts

    for dry in (False, True):
        results = spmdsim.simulate(4, rank, dry_run=dry)
        assert len(results) == 4
        for shape, counts in results:
            assert shape == (4, 5)
            assert counts == {Gemm(1, 4, 5, 6, "float64", "forward"): 1, Gemm(1, 4, 6, 5, "float64", "backward"): 1,
                              Gemm(1, 6, 5, 4, "float64", "backward"): 1}


def test_an_einsum_of_three_operands_counts_as_one_batched_gemm():
    """ij,jk,kl->il: 2 x i*j*k*l FLOPs, rows the kept letters (i, l), depth the summed ones (j, k)."""
    sources = [SeededTensor(shape, "float64", seed=i) for i, shape in enumerate([(2, 3), (3, 4), (4, 5)])]

    def rank() -> dict:
        mesh = Mesh(Layout((1,), ("x",)), spmdsim.world())
        a, b, c = (DTensor.from_seeded(mesh, mesh.layout(None, None), s) for s in sources)
        with counting() as counter:
            ops.einsum("ij,jk,kl->il", a, b, c)
        mesh.close()
        return counter.counts

    assert spmdsim.simulate(1, rank)[0] == {Gemm(1, 10, 1, 12, "float64", "forward"): 1}


def _narayanan(cfg: GPTConfig, recompute: str) -> int:
    """Narayanan et al. 2021, eq. 3 (and its full-recomputation form), as an exact integer."""
    B, s, l, h, V = cfg.batch, cfg.seq, cfg.layers, cfg.d_model, cfg.vocab
    if recompute == "full":
        value = 96 * B * s * l * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * l * h))
    else:
        value = 72 * B * s * l * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * l * h))
    assert value.denominator == 1
    return int(value)


def _by_gemm(cfg: GPTConfig, recompute: str) -> dict:
    """The same count per phase, product by product."""
    B, s, l, h, V = cfg.batch, cfg.seq, cfg.layers, cfg.d_model, cfg.vocab
    layer = 6 * B * s * h * h + 2 * B * s * s * h + 2 * B * s * s * h + 2 * B * s * h * h + 16 * B * s * h * h
    forward = l * layer + 2 * B * s * h * V
    recomputed = {"none": 0, "selective": l * 2 * B * s * s * h, "full": l * layer}[recompute]
    return {"forward": forward, "backward": 2 * forward, "recompute": recomputed}


def _gpt_counts(dp: int, tp: int, sp: bool, recompute: str, dry: bool) -> list:
    def rank() -> dict:
        with counting() as c:
            model, _ = train(CFG, spmdsim.world(), dp, tp, 1, IDS, sp=sp, check=False, recompute=recompute)
        model.mesh.close()
        return {p: c.total(p) for p in PHASES}

    return list(spmdsim.simulate(dp * tp, rank, dry_run=dry))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("dp, tp, sp", [(1, 1, False), (2, 2, True), (1, 4, False)])
def test_gpt_step_is_narayanans_gemm_count(dp, tp, sp, recompute):
    """One step's products over all ranks (the batch is split over dp, the products over tp: nothing is
    counted twice) equal the formula; every rank does 1/(dp·tp) of them; a dry run counts the same."""
    B, s, l, h = CFG.batch, CFG.seq, CFG.layers, CFG.d_model
    want = _by_gemm(CFG, recompute)
    extra = {"none": 0, "selective": l * 2 * B * s * s * h, "full": 0}[recompute]  # the scores again only
    assert sum(want.values()) == _narayanan(CFG, recompute) + extra
    real = _gpt_counts(dp, tp, sp, recompute, False)
    dry = _gpt_counts(dp, tp, sp, recompute, True)
    assert real == dry
    assert {p: sum(r[p] for r in real) for p in PHASES} == want
    assert all(r == {p: want[p] // (dp * tp) for p in PHASES} for r in real)


def test_the_formula_figures():
    """The model of the tests above, its counts written out."""
    assert _narayanan(CFG, "none") == 23_592_960 and _narayanan(CFG, "full") == 30_408_704
    assert _by_gemm(CFG, "selective")["recompute"] == 262_144


@pytest.mark.parametrize("pp, dp, tp, sp, schedule, m, v", [
    (2, 2, 1, False, "1f1b", 4, 1),
    (2, 1, 2, True, "gpipe", 4, 1),
    (2, 1, 1, False, "interleaved", 4, 2),
])
def test_pipelined_step_counts_the_same_real_and_dry(pp, dp, tp, sp, schedule, m, v):
    """More microbatches than stages: a dry run runs each chunk's first forward and backward and repeats
    them, adding the measured cell's products; every rank's count equals its stage representative's,
    and the ranks' sum is the formula (the tied embedding's two copies add gradients, not products)."""
    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8, vocab=128, dropout=0.1)
    counts: dict = {}
    lock = threading.Lock()

    def rank(dry: bool) -> None:
        with counting() as c:
            run, _ = train_pipelined(cfg, spmdsim.world(), pp, dp, tp, 1, IDS, sp=sp, schedule=schedule,
                                     microbatches=m, virtual=v, check=False)
        run.close()
        with lock:
            counts[(dry, spmdsim.world().Get_rank())] = {p: c.total(p) for p in PHASES}

    n = pp * dp * tp
    spmdsim.simulate(n, rank, False)
    spmdsim.simulate(n, rank, True, dry_run=True)
    per_stage = dp * tp
    representatives = {r for dry, r in counts if dry}
    assert representatives == set(range(0, n, per_stage))  # one dry rank per stage
    for r in range(n):
        assert counts[(False, r)] == counts[(True, r // per_stage * per_stage)]
    want = _by_gemm(cfg, "none")
    assert {p: sum(counts[(False, r)][p] for r in range(n)) for p in PHASES} == want
    assert sum(want.values()) == _narayanan(cfg, "none")


def test_no_counter_costs_one_test():
    """With no counter open in the process, gemm returns after reading one module global."""
    assert flops._OPEN == 0
    assert gemm((2, 3), (3, 4), "float64") is None


def test_sweep_counts_each_operators_operands_and_result_by_hand():
    """An add with a broadcast bias, a layer norm and their gradients on 2 simulated ranks, counted by hand."""
    import numpy as np

    import spmdsim
    from spmdsim.nn import ops
    from spmdsim.base.flop_counts import Kernel
    from spmdsim.base.flops import counting

    def body():
        mesh = spmdsim.Mesh(spmdsim.Layout((2,), ("tp",)), spmdsim.world())
        L = mesh.layout
        x = spmdsim.DTensor.from_global(mesh, np.ones((4, 6)), L("tp", None)).requires_grad_()
        b = spmdsim.DTensor.from_global(mesh, np.ones(6), L(None)).requires_grad_()
        with counting() as c:
            y = ops.layer_norm(x + b, kept="megatron")
            y.sum().backward()
        return dict(c.kernels)

    kernels = spmdsim.simulate(2, body)[0]
    f, bw = "forward", "backward"
    expected = {
        Kernel("add", f, "activations", "float64", 2 * 6 + 6, 2 * 6): 1,  # x's (2, 6) block + b read, (2, 6)
        Kernel("layer_norm", f, "activations", "float64", 12, 12 + 2 + 2): 1,  # y, each row's mean and root
        Kernel("sum", f, "activations", "float64", 12, 1): 1,
        Kernel("sum", bw, "activations", "float64", 1, 12): 1,  # its gradient spread over the block
        Kernel("layer_norm", bw, "activations", "float64", 12 + 12 + 2 + 2, 12): 1,  # dy, x, stats -> dx
        Kernel("add", bw, "activations", "float64", 12, 6): 1,  # b's gradient: dy summed over rows (x's: dy)
        Kernel("add", bw, "grads", "float64", 2 * 12, 12): 1,  # the leaves' .grad: x's block
        Kernel("add", bw, "grads", "float64", 2 * 6, 6): 1,  # and b's
    }
    assert kernels == expected


def test_a_block_read_and_written_in_place_is_one_block_of_the_moment():
    """`FlopCounter.fresh` counts an array once per call however many of its operands and results it is: an
    in-place add (a += b: a read and written) holds a and b, 2 blocks, not 3; a held block stays out
    (spmdsim.base.flops.hold) even read and written; the traffic still counts a read and a written (bytes that move).
    A (shape, dtype) pair is a block of its own each time it is given (one pair stands for several blocks)."""
    from spmdsim.base.flop_counts import Fresh, Kernel
    from spmdsim.base.flops import hold, sweep

    def body():
        a, b, w = np.zeros((4, 8)), np.zeros((4, 8)), np.zeros((8,))
        with counting(blocks=True) as c:
            sweep("add", (a, b), (a,))
            sweep("bias", (a, w), (a,))
            hold(w)
            pair = ((4, 8), np.float64)
            sweep("softmax", (pair, pair), (pair,))
            mask = np.zeros((4, 8), bool)
            sweep("dropout", (a, mask, mask), (a, mask))
        return c.fresh(), dict(c.kernels)

    fresh, kernels = spmdsim.simulate(1, body)[0]
    assert fresh == (Fresh("add", "forward", 64, 0), Fresh("bias", "forward", 32, 0),
                     Fresh("softmax", "forward", 96, 0), Fresh("dropout", "forward", 32, 32))
    assert kernels[Kernel("add", "forward", "activations", "float64", 64, 32)] == 1


def test_a_bfloat16_block_is_floating_not_a_mask():
    """A bfloat16 block (ml_dtypes' dtype, named "bfloat16", numpy kind "V") is an activation: its elements are
    a `Fresh` record's floating ones, priced at the precision's activation width, not bytes of a mask or ids at
    their own width (its name does not start with "float": it was counted as 2 bytes of "other" an element)."""
    pytest.importorskip("ml_dtypes")
    from spmdsim.base.flop_counts import Fresh
    from spmdsim.base.flops import sweep
    from spmdsim.base.precision import bfloat16

    def body():
        a, mask = np.zeros((4, 8), bfloat16()), np.zeros((4, 8), bool)
        with counting(blocks=True) as c:
            sweep("dropout", (a,), (a, mask))
            gemm((4, 8), (8, 2), bfloat16(), (a, ((8, 2), bfloat16()), ((4, 2), np.float32)))
        return c.fresh()

    assert spmdsim.simulate(1, body)[0] == (Fresh("dropout", "forward", 32, 32),
                                           Fresh(Gemm(1, 4, 2, 8, "bfloat16", "forward"), "forward", 32 + 16 + 8, 0))
