"""Tolerances follow the magnitudes that entered a result, not its size.

A sum whose terms are far larger than the result (a gradient near a minimum, a
cancelling sum) rounds by up to k eps x the sum of |terms|; a check scaled by
|result| cries wolf there. `DTensor.check(..., scale=)` and the training check
(`ReferenceStep`'s scales) multiply rtol by the magnitudes instead, and still
fail an error above that bound.
"""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import spmdsim
from docs_commands import run_example
from spmdsim import Layout, Mesh
from spmdsim.errors import DTypeError, ShapeError, SpmdsimError
from spmdsim.runtime.check import local_stats
from spmdsim.references.tolerances import contraction_atol, sum_rtol


def _cancelling_sum(k: int = 1000) -> tuple[np.ndarray, float, float, float]:
    """(terms of size ~1e3 whose exact sum is tiny, that exact sum, the sum of |terms|, one in another order)."""
    rng = np.random.default_rng(5)
    head = rng.standard_normal(k - 1) * 1e3
    terms = np.append(head, -np.sum(head))
    exact = math.fsum(terms)
    sequential = 0.0
    for t in terms[::-1]:  # another order than numpy's pairwise sum
        sequential += float(t)
    return terms, exact, float(np.sum(np.abs(terms))), sequential


def test_a_tiny_sum_of_large_terms_passes_within_its_terms_rounding():
    terms, exact, scale, other = _cancelling_sum()
    rtol = sum_rtol(terms.size, "float64")
    err = abs(other - exact)
    assert abs(exact) < 1e-9 and err > 0  # the result is far below its terms, the orders differ
    assert err > rtol * abs(exact)  # scaled by the result, real rounding fails: the wolf cry
    actual, expected = np.array([other]), np.array([exact])
    assert local_stats(actual, expected, rtol, 0.0)[0] == 0.0
    assert local_stats(actual, expected, rtol, 0.0, np.array([scale]))[0] == 1.0
    assert err <= rtol * scale


def test_an_error_above_the_terms_bound_still_fails():
    terms, exact, scale, _ = _cancelling_sum()
    k = terms.size
    rtol = sum_rtol(k, "float64")
    eps = float(np.finfo(np.float64).eps)
    expected = np.array([exact])
    inside = np.array([exact + (k - 1) * eps * scale])  # one term's rounding short of the bound
    above = np.array([exact + (k + 1) * eps * scale])  # one ulp per term beyond it (one more term's eps)
    wrong = np.array([exact + 1.0])
    assert local_stats(inside, expected, rtol, 0.0, np.array([scale]))[0] == 1.0
    assert local_stats(above, expected, rtol, 0.0, np.array([scale]))[0] == 0.0
    assert local_stats(wrong, expected, rtol, 0.0, np.array([scale]))[0] == 0.0


def test_a_scale_never_loosens_below_the_reference_itself():
    # The larger of scale and |ref| is multiplied: a scale of 0 is the old rule, not a free pass.
    expected, actual = np.array([1.0, -2.0]), np.array([1.0 + 1e-10, -2.0])
    assert local_stats(actual, expected, 1e-9, 0.0, np.zeros(2))[0] == 1.0
    assert local_stats(actual, expected, 1e-11, 0.0, np.zeros(2))[0] == 0.0
    assert local_stats(actual, expected, 1e-9, 0.0, np.zeros(3))[0] == 0.0  # a scale of the wrong shape fails


def test_dtensor_check_slices_the_scale_to_each_rank():
    from spmdsim.runtime import Mesh

    rng = np.random.default_rng(2)
    big = rng.standard_normal((8, 4, 50)) * 1e4
    big[..., -1] = -big[..., :-1].sum(axis=-1)
    exact = np.array([[math.fsum(row) for row in block] for block in big])  # tiny
    other = big[..., ::-1].cumsum(axis=-1)[..., -1]  # the same sums in another order
    scale = np.abs(big).sum(axis=-1)
    rtol = sum_rtol(50, "float64")
    wrong = other.copy()
    wrong[5, 2] = exact[5, 2] + 2 * rtol * scale[5, 2]

    def body():
        mesh = Mesh(Layout((4,), ("mp",)))
        layout = mesh.layout("mp", None)
        mine = spmdsim.runtime.DTensor.from_global(mesh, other, layout)
        bad = spmdsim.runtime.DTensor.from_global(mesh, wrong, layout)
        by_result = mine.check(exact, rtol=rtol, atol=0.0)
        by_terms = mine.check(exact, rtol=rtol, atol=0.0, scale=scale)
        by_region = mine.check(exact, rtol=rtol, atol=0.0, scale=lambda region: scale[region])
        caught = bad.check(exact, rtol=rtol, atol=0.0, scale=scale)
        with pytest.raises(ShapeError, match="scale of shape"):
            mine.check(exact, rtol=rtol, scale=scale[:4])
        return by_result, by_terms, by_region, caught

    for by_result, by_terms, by_region, caught in spmdsim.simulate(4, body):
        assert not by_result.passed
        assert by_terms.passed and by_region.passed, by_terms
        assert "x the magnitudes that entered it" in str(by_terms)
        assert not caught.passed and caught.failed_ranks == (2,), caught
        assert "x the magnitudes that entered" in str(caught)


@pytest.mark.parametrize("as_callable", [False, True])
def test_a_negative_scale_is_refused(as_callable):
    """A negative scale was taken as its absolute value: refused with the entry named, a global one before any
    collective on every rank, a callable's on the rank whose region holds it (which ends the run)."""
    exact = np.arange(64.0).reshape(8, 8)
    scale = np.ones((8, 8))
    scale[3, 5] = -1e9

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        x = spmdsim.runtime.DTensor.from_global(mesh, exact + 0.5, mesh.layout("dp", "mp"))
        x.check(exact, rtol=1e-4, scale=(lambda region: scale[region]) if as_callable else scale)

    where = r"scale\(region\) holds -1000000000.0 at \(3, 1\)" if as_callable else \
        r"check: scale holds -1000000000.0 at \(3, 5\)"
    with pytest.raises(spmdsim.SpmdsimError, match=where):
        spmdsim.simulate(8, body)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_scale_that_overflowed_fails_its_element_as_non_finite(bad):
    """An infinite scale passed any value (every element off by 100 passed); a NaN failed exact values with
    'max abs err 0' and no word of why. Such a magnitude (an overflowed one, as a diverging run's) now fails its
    element as non-finite, and the verdict says so; the finite elements still pass."""
    exact = np.arange(64.0).reshape(8, 8)
    scale = np.ones((8, 8))
    scale[3, 5] = bad

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        x = spmdsim.runtime.DTensor.from_global(mesh, exact, mesh.layout("dp", "mp"))
        return x.check(exact, rtol=1e-4, scale=scale), x.check(exact, rtol=1e-4, scale=np.ones((8, 8)))

    for broken, plain in spmdsim.simulate(8, body):
        assert not broken.passed and broken.nonfinite == 1 and broken.failed_ranks == (2,)
        assert "1 non-finite value (NaN/Inf; none in the reference)" in str(broken)
        assert plain.passed


@pytest.mark.parametrize("dtype, cut, rows", [("float64", "even", 8), ("int64", "even", 8), ("float32", "chunk", 7)])
def test_a_failed_check_names_the_element_it_failed_on(dtype, cut, rows):
    """A check that failed said on which rank ("worst rank 5"), not where: the user had to search that rank's block
    by hand. It now names the worst rank's worst element by its index in the whole tensor: the first non-finite
    one, else the one furthest past its tolerance (an integer tensor's: the largest difference)."""
    exact = np.arange(rows * 8).reshape(rows, 8).astype(dtype)

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp"), cut=cut))
        x = spmdsim.runtime.DTensor.from_global(mesh, exact, mesh.layout("dp", "mp"))
        off, nan = x.local.copy(), x.local.astype("float64")
        if mesh.rank == 5:  # rows 4:8 (4:7 cut "chunk"), columns 2:4
            off[1, 0] += 1
            off[2, 1] += 3
            nan[0, 1] = np.nan
        moved = spmdsim.runtime.DTensor.from_local(mesh, off, x.layout, x.shape).check(exact)
        return moved, spmdsim.runtime.DTensor.from_local(mesh, nan, x.layout, x.shape).check(exact)

    moved, nan = spmdsim.simulate(8, body)[0]
    assert (moved.failed_ranks, moved.worst_element, nan.worst_element) == ((5,), (6, 3), (4, 3))
    assert "(worst rank 5, element [6, 3]; atol " in str(moved)
    assert "(worst rank 5, element [4, 3]; atol " in str(nan)


def test_a_nan_in_one_replica_only_is_named_in_the_verdict():
    """A replica's record has its element counts zeroed (each global element counted once, by its first holder), the
    non-finite count with them: a NaN in rank 3's copy of a block rank 0 holds right failed the check with "max abs
    err 0" and no word of the NaN. The replica's own count now reaches the verdict."""
    exact = np.arange(64.0).reshape(8, 8)

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        x = spmdsim.runtime.DTensor.from_global(mesh, exact, mesh.layout("dp", None))  # 4 copies of each half
        local = x.local.copy()
        if mesh.rank == 3:
            local[0, 2] = np.nan
        return spmdsim.runtime.DTensor.from_local(mesh, local, x.layout, x.shape).check(exact)

    for verdict in spmdsim.simulate(8, body):
        assert (verdict.passed, verdict.failed_ranks, verdict.worst_rank, verdict.nonfinite) == (False, (3,), 3, 1)
        assert str(verdict).startswith("check FAILED on ranks [3]: 1 non-finite value (NaN/Inf; none in the "
                                       "reference); finite values: max abs err 0")


def test_the_verdict_says_whether_the_reference_holds_the_non_finite_values():
    """A NaN in the reference (a bad reference) and one in the result (a bad program) read alike: "1 non-finite
    values (NaN/Inf)". The verdict now counts those of the reference; an element NaN in both counts once."""
    exact = np.arange(64.0).reshape(8, 8)
    bad_ref, bad_out, both = exact.copy(), exact.copy(), np.full((8, 8), np.nan)
    bad_ref[3, 5] = bad_ref[0, 0] = np.nan
    bad_out[6, 1] = np.inf

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        layout = mesh.layout("dp", "mp")
        x = spmdsim.runtime.DTensor.from_global(mesh, exact, layout)
        y = spmdsim.runtime.DTensor.from_global(mesh, bad_out, layout)
        z = spmdsim.runtime.DTensor.from_global(mesh, both, mesh.layout(None, None))  # 8 replicas, counted once
        return x.check(bad_ref), y.check(exact), z.check(both)

    ref, out, nan = spmdsim.simulate(8, body)[0]
    assert (ref.nonfinite, ref.nonfinite_reference, out.nonfinite, out.nonfinite_reference) == (2, 2, 1, 0)
    assert (nan.nonfinite, nan.nonfinite_reference, nan.passed) == (64, 64, False)
    assert str(ref).startswith("check FAILED on ranks [0, 2]: 2 non-finite values (NaN/Inf; 2 in the reference); ")
    assert str(out).startswith("check FAILED on ranks [4]: 1 non-finite value (NaN/Inf; none in the reference); ")


def test_integers_past_2_53_are_compared_exactly():
    """Integers compare exactly (atol and rtol 0), but the check compared float64 copies: an int64 result of 2**62
    against a reference of 2**62 + 1 (one float64) passed with "max abs err 0". Now it fails, with the exact error;
    equal integers, a signed beside an unsigned one too, still pass."""
    got = np.array([2 ** 62, 1, -2 ** 62, 2 ** 63 - 1], dtype=np.int64)
    ref = np.array([2 ** 62 + 1, 1, -2 ** 62 - 1, 2 ** 63 - 1], dtype=np.int64)
    record = local_stats(got, ref, 0.0, 0.0)
    assert record[0] == 0.0 and record[1] == 1.0 and 0 < record[2] < 1e-18
    assert local_stats(np.array([2 ** 64 - 1], np.uint64), np.array([2 ** 64 - 2], np.uint64), 0.0, 0.0)[0] == 0.0
    assert local_stats(got[3:], got[3:].astype(np.uint64), 0.0, 0.0)[0] == 1.0

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        return str(spmdsim.runtime.DTensor.from_global(mesh, got, mesh.layout("x")).check(ref))

    assert spmdsim.simulate(2, body)[0].startswith("check FAILED on ranks [0, 1]: max abs err 1, max rel err 2.17e-19")


def test_a_complex_scale_is_refused():
    def body():
        mesh = Mesh(Layout((2,), ("mp",)))
        x = spmdsim.runtime.DTensor.from_global(mesh, np.ones(4), mesh.layout("mp"))
        x.check(np.ones(4), scale=np.ones(4) * 1j)

    with pytest.raises(spmdsim.SpmdsimError, match="dtype complex128 must hold real magnitudes"):
        spmdsim.simulate(2, body)


def test_reference_scales_cover_every_value():
    from spmdsim.models.nets import mindspore_tutorial
    from spmdsim.models.nets.digits import load_digits
    from spmdsim.models.nets.reference import ReferenceTrainer

    net = mindspore_tutorial(8, dtype="float64", seed=0)
    data = load_digits(seed=0, synthetic=True)
    for optimizer in ("sgd", "adam"):
        ref = ReferenceTrainer(net, optimizer=optimizer, lr=1e-2 if optimizer == "sgd" else 1e-3)
        for step in range(3):
            out = ref.step(*data.batch(step, net.source.shape[0]))
            assert out.loss_scale >= abs(out.loss) > 0
            assert len(out.grad_scales) == len(out.grads) == len(out.param_scales) == 3
            for value, scale in zip(out.grads + out.params, out.grad_scales + out.param_scales):
                assert scale.shape == value.shape and np.all(scale >= np.abs(value))


def test_training_check_passes_rounding_and_fails_an_error_above_its_bound():
    from spmdsim.models.nets import mindspore_tutorial
    from spmdsim.models.nets.digits import load_digits
    from spmdsim.models.nets.train import NetworkTrainer
    from spmdsim.models.nets.reference import ReferenceTrainer

    data = load_digits(seed=0, synthetic=True)
    rtol = 1e-12

    def body():
        comm = spmdsim.world()
        net = mindspore_tutorial(comm.size, dtype="float64", seed=0)
        trainer = NetworkTrainer(net, comm, optimizer="sgd", lr=1e-2)
        x, labels = data.batch(0, net.source.shape[0])
        result = trainer.step(x, labels)
        ref = ReferenceTrainer(net, optimizer="sgd", lr=1e-2).step(x, labels)
        where = np.unravel_index(np.argmax(ref.grad_scales[0]), ref.grads[0].shape)

        def moved(by):
            grads = [g.copy() for g in ref.grads]
            grads[0][where] += by * rtol * ref.grad_scales[0][where]
            return replace(ref, grads=tuple(grads))

        verdicts = [trainer.check(result, r, rtol) for r in (ref, moved(0.5), moved(1.01))]
        trainer.close()
        return [[v.passed for v in vs] for vs in verdicts]

    for exact, half, above in spmdsim.simulate(8, body):
        assert all(exact) and all(half)
        assert above == [True, False] + [True] * 5  # the loss, then gradient 0 fails, the rest pass


def _adam_step_verdicts(anchored: bool, moved: float = 0.0, lr_error: float = 0.0) -> list:
    """Each of 8 simulated ranks' verdicts (loss, gradients, parameters) of Seed 003's first Adam step, the run's
    gradients moved by `moved` x each block's largest entry (alike on every replica: another machine's rounding)
    or its learning rate off by `lr_error` (relative), checked anchored or free-running."""
    from spmdsim.models.nets import mindspore_tutorial
    from spmdsim.models.nets.digits import load_digits
    from spmdsim.models.nets.train import NetworkTrainer
    from spmdsim.models.nets.reference import ReferenceTrainer

    data = load_digits(seed=0, synthetic=True)

    def body():
        comm = spmdsim.world()
        net = mindspore_tutorial(comm.size, dtype="float64", seed=0)
        trainer = NetworkTrainer(net, comm, optimizer="adam", lr=1e-3 * (1 + lr_error))
        step = trainer.optimizer.step

        def moved_step():
            rng = np.random.default_rng(0)
            for p in trainer.flat_params:
                noise = rng.standard_normal(p.global_shape)[p.slices]
                p.grad._local += moved * np.abs(p.grad._local).max() * noise
            step()

        trainer.optimizer.step = moved_step
        x, labels = data.batch(0, net.source.shape[0])
        result = trainer.step(x, labels, anchor=anchored)
        ref = ReferenceTrainer(net, optimizer="adam", lr=1e-3).step(x, labels, anchor=result.anchor)
        verdicts = trainer.check(result, ref, 1e-12, param_rtol=None if anchored else 1e-9)
        trainer.close()
        return [v.passed for v in verdicts]

    return spmdsim.simulate(8, body)


def test_an_anchored_adam_check_holds_where_the_free_running_one_cries_wolf():
    # Gradients moved by 1e-16 of each block's largest entry (a rounding another machine's sums can have) pass
    # the gradient check; Adam's first update is about lr x sign(g), so where such a move flips a tiny
    # gradient's sign a free-running reference (its own gradients) differs by 2 lr: a correct run fails. The
    # anchored reference updates with the run's gradients and passes.
    free = _adam_step_verdicts(anchored=False, moved=1e-16)
    anchored = _adam_step_verdicts(anchored=True, moved=1e-16)
    for verdicts in free + anchored:
        assert verdicts[0] and all(verdicts[1::2]), verdicts  # the loss and the three gradients pass
    assert all(all(v) for v in anchored), anchored
    assert not all(all(v) for v in free), free  # some updated parameter fails free-running


def test_an_anchored_adam_check_fails_an_update_off_by_1e9():
    # The update on the run's own inputs rounds by a few eps: a learning rate off by one part in 1e9 fails every
    # parameter, while the loss and gradients pass.
    for verdicts in _adam_step_verdicts(anchored=True, lr_error=1e-9):
        assert verdicts[0] and all(verdicts[1::2]) and not any(verdicts[2::2]), verdicts


def _example(*args: str) -> subprocess.CompletedProcess:
    """`python examples/train_mindspore_tutorial.py --ranks 8 ARGS`, in this process (docs_commands.run_example)."""
    return run_example("examples/train_mindspore_tutorial.py", "--ranks", "8", *args)


# Adam failed from about step 25 (loss near 1e-8: "FAILED (121 of 700)" over 100 steps); the
# other combinations of docs/howto/train.md with fewer steps (layout with adam: its 100 documented steps,
# below, whose first 40 are these).
@pytest.mark.parametrize("args", [
    ("--net", "tutorial", "--optimizer", "adam", "--steps", "40"),
    ("--net", "tutorial", "--optimizer", "sgd", "--steps", "10"),
    ("--net", "layout", "--optimizer", "sgd", "--steps", "10"),
    ("--dtype", "float32", "--explain", "--steps", "10"),
    ("--dtype", "float32", "--optimizer", "adam", "--steps", "20"),
])
def test_training_example_checks_pass(args):
    out = _example(*args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert ": PASS\n" in out.stdout, out.stdout[-2000:]


@pytest.mark.slow
def test_documented_adam_command_passes_all_100_steps():
    out = _example("--net", "layout", "--optimizer", "adam")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "check: 700 tensors over 100 steps (loss, 3 gradients, 3 parameters per step) vs one process: PASS" \
        in out.stdout


def test_cross_entropy_resolves_pending_logits_as_softmax_does():
    """Logits that are still a pending sum are added up first (one Allreduce)."""
    from spmdsim.references import backward as rg
    from spmdsim.nn.ops import cross_entropy
    from spmdsim.runtime import DTensor, Mesh
    from spmdsim.runtime.trace import collect_trace

    rng = np.random.default_rng(3)
    whole = rng.standard_normal((8, 6))
    parts = rng.standard_normal((4, 8, 6))
    parts[-1] = whole - parts[:-1].sum(axis=0)  # the four ranks' addends sum to `whole`
    labels = rng.integers(0, 6, 8)
    expected_loss, expected_grad = rg.cross_entropy(whole, labels)

    def body():
        mesh = Mesh(Layout((4,), ("mp",)))
        layout = mesh.layout(None, None, partial=("mp",))
        logits = DTensor(mesh, parts[mesh.rank].copy(), layout, whole.shape).requires_grad_()
        with collect_trace() as trace:
            loss = cross_entropy(logits, DTensor.from_global(mesh, labels, mesh.layout(None)))
        loss.backward()
        return (loss.check(np.asarray(expected_loss)).passed, trace.counts(),
                logits.grad.check(expected_grad).passed)

    for loss_ok, counts, grad_ok in spmdsim.simulate(4, body):
        assert loss_ok and grad_ok
        assert counts == {"allreduce": 1}, counts


def test_the_finite_fast_path_gives_the_general_paths_record_bit_for_bit(monkeypatch):
    """runtime.check.local_stats answers finite differences in about half the passes (`_finite_stats`); its
    record (passed, max abs, max rel, ...) is the general path's, bit for bit, also with zeros in either
    tensor, float32 against float64, complex values and magnitudes; a non-finite value or an overflowing
    difference goes to the general path."""
    from spmdsim.runtime import check

    fast = check._finite_stats
    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(1, 40))
        b = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8)
        a = b + rng.standard_normal(n) * 10.0 ** rng.integers(-20, 0) * (rng.random(n) < 0.5)
        kind = trial % 5
        if kind == 1:
            b[rng.random(n) < 0.3] = 0.0
        elif kind == 2:
            a[rng.random(n) < 0.3] = 0.0
            b[rng.random(n) < 0.5] = 0.0
        elif kind == 3:
            a = a.astype(np.float32)
        elif kind == 4:
            a, b = a + 1j * rng.standard_normal(n) * 1e-12, b.astype(np.complex128)
        scale = None if trial % 2 else np.abs(b) * rng.random(n) * 3
        rtol, atol = float(10.0 ** rng.integers(-16, -2)), (0.0, 1e-12)[trial % 3 == 0]
        monkeypatch.setattr(check, "_finite_stats", fast)
        quick = check.local_stats(a, b, rtol, atol, scale)
        monkeypatch.setattr(check, "_finite_stats", lambda *args: None)
        assert quick.tobytes() == check.local_stats(a, b, rtol, atol, scale).tobytes(), (trial, quick)
    for a, b in (([np.nan, 1.0], [1.0, 1.0]), ([np.inf, 1.0], [1.0, 1.0]), ([1e308], [-1e308])):
        assert fast(np.array(a), np.array(b), 1e-12, 0.0, None) is None
    with np.errstate(over="ignore"):  # the general path's overflow, as ever
        overflow = check.local_stats(np.array([1e308]), np.array([-1e308]), 1e-12, 0.0)
    assert overflow[:3].tolist() == [0.0, np.inf, np.inf]
    assert check.local_stats(np.float64(2.0), np.array(2.0), 0.0, 0.0)[:3].tolist() == [1.0, 0.0, 0.0]  # 0-d


def _python_verdict(table, rtol, atol, shape):
    """The check's rule read row by row in Python (as spmdsim.runtime.check read a table before): the failing
    ranks, the worst (failing, else any) by the largest error with a non-finite one infinite and a NaN winning,
    the first of equals; the largest errors, NaN when one is."""
    from spmdsim.runtime.check import Verdict

    def first_largest(indices, values):
        best = None
        for i in indices:
            if values[i] != values[i]:
                return i
            if best is None or values[i] > values[best]:
                best = i
        return best

    rows = table.tolist()
    failed = tuple(r for r, row in enumerate(rows) if not row[0] > 0)
    score = [math.inf if row[7] > 0 else row[1] for row in rows]
    largest = [[row[k] for row in rows] for k in (1, 2)]
    worst = first_largest(failed or range(len(rows)), score)
    at = int(rows[worst][8])
    element = tuple(int(i) for i in np.unravel_index(at, shape)) if at >= 0 else ()
    return Verdict(passed=not failed, max_abs_error=largest[0][first_largest(range(len(rows)), largest[0])],
                   max_rel_error=largest[1][first_largest(range(len(rows)), largest[1])],
                   worst_rank=worst, atol=float(atol), rtol=float(rtol), worst_element=element,
                   nonfinite=max(int(sum(row[3] for row in rows)), int(max(row[7] for row in rows))),
                   elements=int(sum(row[4] for row in rows)),
                   failed_ranks=failed, scaled=False, nonfinite_reference=int(sum(row[6] for row in rows)))


def test_the_verdict_read_with_numpy_is_the_rule_read_row_by_row():
    """Every rank reads the check's table with numpy (4,096 simulated ranks each reading 4,096 rows in Python took
    two thirds of a check's time): the same Verdict as the rule read row by row, NaN and infinite errors,
    failures, ties and non-finite counts included."""
    from dataclasses import asdict

    from spmdsim.runtime.check import _verdict

    rng = np.random.default_rng(7)
    for case in range(200):
        n = int(rng.integers(1, 90))
        table = np.zeros((n, 9))
        table[:, 0] = rng.random(n) > (0.1 if case % 2 else 0.0)
        table[:, 1] = rng.choice([0.0, 1e-3, 2e-3, np.inf, np.nan], n, p=[0.3, 0.3, 0.3, 0.05, 0.05] if case % 3
                                 else [0.35, 0.3, 0.35, 0, 0])
        table[:, 2] = rng.random(n)
        table[:, 3] = rng.random(n) < 0.05
        table[:, 4] = rng.integers(0, 100, n)
        table[:, 5] = 1.0
        table[:, 6] = table[:, 3] * (rng.random(n) < 0.5)
        table[:, 7] = np.where(rng.random(n) < 0.05, rng.integers(0, 9, n), table[:, 3])  # a copy's own NaNs
        table[:, 8] = np.where(table[:, 0] > 0, -1, rng.integers(0, 6 * 7, n))  # a failed element's flat index
        few = asdict(_python_verdict(table, 1e-9, 1e-12, (6, 7)))
        many = asdict(_verdict(table, 1e-9, 1e-12, False, (6, 7)))
        for key in few:
            same = few[key] == many[key] or (isinstance(few[key], float) and math.isnan(few[key])
                                             and math.isnan(many[key]))
            assert same, (case, key, few[key], many[key])


def test_the_demo_training_row_checks_each_gradient_element_within_its_terms_rounding():
    # spmdsim.tools.demo.training's row held every element to 1e-4 x max|grad| (+ 1e-4 x |grad|): an element whose
    # terms are larger than the gradient's largest entry may round by more than that in float32 (cried wolf).
    # It follows ReferenceStep.grad_scales now, as NetworkTrainer.check: within the bound passes, past it fails.
    from spmdsim.tools.demo.training import training_job
    from spmdsim.models.nets import oneflow_2d_sbp

    def body():
        comm = spmdsim.world()
        job = training_job(oneflow_2d_sbp(comm.size, dtype="float32", seed=0), comm)
        grad = job.forward()
        ref = job.reference(tuple(slice(None) for _ in grad.global_shape))
        scale = job.scale(tuple(slice(None) for _ in grad.global_shape))
        old = 1e-4 * (np.abs(ref).max() + np.abs(ref))  # what the row allowed before
        where = np.unravel_index(np.argmax(scale / old), ref.shape)  # terms largest beside the old allowance
        verdicts = [grad.check(job.reference, rtol=job.rtol, atol=job.atol, scale=job.scale).passed]
        exact = grad._local.copy()
        for by in (0.9, 1.1):  # the run's element moved by 0.9 and 1.1 times its bound
            move = np.zeros(ref.shape)
            move[where] = by * job.rtol * scale[where]
            grad._local = (exact + move[grad.slices]).astype(exact.dtype)
            verdicts.append(grad.check(job.reference, rtol=job.rtol, atol=job.atol, scale=job.scale).passed)
        return verdicts, bool(0.9 * job.rtol * scale[where] > old[where])

    for verdicts, old_cried_wolf in spmdsim.simulate(4, body):
        assert verdicts == [True, True, False]
        assert old_cried_wolf  # 0.9 of the bound is beyond what the row allowed before


def test_a_bfloat16_shard_is_checked_at_bfloat16s_tolerance():
    """A shard of ml_dtypes' bfloat16 (numpy kind "V", which no float test sees) against a float64 reference:
    five unit roundoffs (rtol 2^-8 x 5, atol a tenth), so the cast alone passes and a 5% error fails; it was
    checked at exact integers' (0, 0) and a correct cast failed."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from spmdsim.references.tolerances import default_tolerances

    assert default_tolerances(ml_dtypes.bfloat16) == (5 * 2.0 ** -8, 5 * 2.0 ** -8 / 10)
    assert default_tolerances(np.float64, ml_dtypes.bfloat16) == default_tolerances("bfloat16")
    assert default_tolerances(ml_dtypes.float8_e5m2)[0] == 5 * 2.0 ** -3  # kind "f" in numpy: by its name

    def run():
        mesh = spmdsim.Mesh(Layout((2,), ("dp",)), spmdsim.world())
        ref = np.random.default_rng(0).standard_normal((4, 6))
        cast, off = (spmdsim.DTensor.from_global(mesh, (ref * k).astype(ml_dtypes.bfloat16), mesh.layout("dp", None))
                     for k in (1.0, 1.05))
        return cast.check(ref).passed, off.check(ref).passed

    assert spmdsim.simulate(2, run) == [(True, False)] * 2


@pytest.mark.parametrize("code, said", [
    ("print(default_tolerances('bfloat16'), contraction_atol(8, 'bfloat16'), sum_rtol(2, 'bfloat16'))",
     "(0.01953125, 0.001953125) 0.0625 0.015625"),
    ("sys.modules['ml_dtypes'] = None  # as where it is not installed\n"
     "try:\n    default_tolerances('bfloat16')\nexcept SpmdsimError as e:\n    print(e)",
     "default_tolerances: dtype 'bfloat16' needs ml_dtypes: pip install -e '.[bf16]'"),
    ("from spmdsim.base.validate import dtype_arg\nprint(dtype_arg('bfloat16'))", "bfloat16"),
    ("sys.modules['ml_dtypes'] = None\nfrom spmdsim.base.validate import dtype_arg\n"
     "try:\n    dtype_arg('bfloat16')\nexcept SpmdsimError as e:\n    print(e)",
     "dtype 'bfloat16' needs ml_dtypes: pip install -e '.[bf16]'"),
])
def test_bfloat16_by_name_needs_no_ml_dtypes_import_first(code, said):
    """The names resolve through spmdsim.base.precision: numpy knows "bfloat16" only once ml_dtypes is imported,
    and raised TypeError "data type 'bfloat16' not understood" before."""
    if "None" not in code:
        pytest.importorskip("ml_dtypes")
    prelude = ("import sys\nfrom spmdsim.errors import SpmdsimError\n"
               "from spmdsim.references.tolerances import contraction_atol, default_tolerances, sum_rtol\n"
               "assert 'ml_dtypes' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == said


@pytest.mark.parametrize("args, kind, said", [
    ((8, "int32"), DTypeError, "contraction_atol: dtype 'int32' has no rounding to allow for; expected a float or "
                               "complex dtype (integers and bools compare exactly: tolerance 0)"),
    ((8, "foo"), DTypeError, "contraction_atol: dtype 'foo' is not a numpy dtype (nor bfloat16, float8_e4m3fn or "
                             "float8_e5m2)"),
    ((-1, "float32"), SpmdsimError, "contraction_atol: k (products summed) -1 must be an integer >= 0"),
    ((float("nan"), "float32"), SpmdsimError, "contraction_atol: k (products summed) nan must be an integer >= 0"),
])
def test_contraction_atol_refuses_what_it_cannot_bound(args, kind, said):
    with pytest.raises(kind) as caught:
        contraction_atol(*args)
    assert str(caught.value) == said
