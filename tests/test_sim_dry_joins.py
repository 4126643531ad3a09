"""A dry run's joins, slices, broadcasts and transposes make no block (spmdsim.runtime.sim.dry): ``ops.concatenate``,
``ops.stack``, ``ops.broadcast_to``, ``x[..., a:b]`` (a narrow of an inner dim), ``ops.transpose``, a narrow or
a join along a split dim (rows moved by one Alltoallv) and ``ops.causal_mask`` give the dry engine's zeros of
their blocks, and so do their gradients and the reductions' (sum's dY spread over x, max's share among ties);
each made a real array of its block's size (a copy, np.concatenate, broadcast_to's copy, the split path's rows
written and its send buffer packed). The real run is unchanged, and a dry run counts the same products, kernels
and fresh blocks (spmdsim.base.flops) as the real run of one program.
"""
from __future__ import annotations

import resource

import spmdsim
from spmdsim.nn import ops
from spmdsim.base.flops import counting
from spmdsim.runtime import DTensor, Mesh


def _status(key: str) -> int:
    """A byte count of this process's /proc/self/status: VmRSS (resident now), VmHWM (its peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no {key} line in /proc/self/status")


def _peak_above_now(fn) -> tuple:
    """(how far the process's resident bytes rose above where they were while `fn` ran, the page faults of this
    thread meanwhile, its result): the peak reset first (Linux's clear_refs 5), so a block made and freed
    inside counts too; a page only read (a lazy block's: the kernel's zero page) faults but is not resident."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before, faults = _status("VmRSS"), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    out = fn()
    return _status("VmHWM") - before, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults, out


R, C = 2048, 8192  # a (R, C) float64 operand is 128 MiB: its joins and broadcasts 128-256 MiB a rank


def _cases(mesh: Mesh) -> dict:
    """name -> a function giving (the op's result, the operands that take gradients)."""
    whole, split = mesh.layout(None, None), mesh.layout("tp", None)

    def seeded(shape, seed, layout=whole):
        return DTensor.from_seeded(mesh, layout, spmdsim.SeededTensor(shape, "float64", seed)).requires_grad_()

    def two(layout=whole):
        return seeded((R, C), 1, layout), seeded((R, C), 2, layout)

    def joined(layout, dim):
        a, b = two(layout)
        return ops.concatenate([a, b], dim), (a, b)

    def stacked():
        a, b = two()
        return ops.stack([a, b], 0), (a, b)

    def broadcast():
        col = seeded((R, 1), 3)
        return ops.broadcast_to(col, (R, 2 * C)), (col,)

    def sliced():
        a = seeded((R, C), 4)
        return a[..., C // 4:], (a,)

    def transposed():
        a = seeded((R, C), 5)
        return ops.transpose(a), (a,)

    def narrowed():
        a = seeded((R, C), 6, split)
        return ops.narrow(a, 0, 2, R // 2), (a,)

    def largest():  # a reduction's gradient: dY where x met the maximum, shared among ties (x's block)
        a = seeded((R, C), 7)
        return ops.max(a, 1), (a,)

    return {"concatenate": lambda: joined(whole, 1), "stack": stacked, "broadcast_to": broadcast,
            "x[..., a:]": sliced, "transpose": transposed, "narrow of a split dim": narrowed,
            "concatenate along a split dim": lambda: joined(split, 0),
            "causal_mask": lambda: (ops.causal_mask(mesh, (R, 2 * C)), ()), "max's gradient": largest}


def test_a_dry_runs_joins_slices_and_broadcasts_write_no_page_of_their_blocks_or_gradients():
    """Each op at a shape whose result or gradient block is 32-256 MiB, then the backward of a sum of it: the
    process's peak rises by less than 8 MiB (it rose by the result's size, and by the gradients' for the joins,
    transposes, slices and split narrows; the sum's gradient, its dY spread over the result, was a copy too, and
    max's gradient a mask and a quotient of x's block), and the rank reads fewer than 1,000 pages (broadcast_to's
    gradient summed its dY's 65,536)."""

    def body():
        mesh = Mesh(spmdsim.Layout((2,), ("tp",)))
        out = {}
        for name, case in _cases(mesh).items():
            def run(case=case):
                y, xs = case()
                if xs:
                    ops.sum(y * 1.0).backward()
                grads = [x.grad.local for x in xs]
                return max([y.local.nbytes] + [g.nbytes for g in grads]), [g.shape == x.local.shape
                                                                           for g, x in zip(grads, xs)]

            grown, faults, (nbytes, grads) = _peak_above_now(run)
            out[name] = (grown, faults, nbytes, grads)
        return out

    seen = spmdsim.simulate(2, body, dry_run=True)[0]
    assert all(nbytes >= 32 << 20 and all(grads) for _, _, nbytes, grads in seen.values()), seen
    rose = {name: f"peak +{grown >> 20} MiB, {faults} page faults, block {nbytes >> 20} MiB"
            for name, (grown, faults, nbytes, _) in seen.items() if grown >= 8 << 20 or faults >= 1000}
    assert not rose, rose


def _program(dry: bool) -> list:
    """Per rank: the fresh blocks, products and kernels (spmdsim.base.flops) of a forward and backward through every
    op above, at blocks of 64-256 KiB (large enough for the dry engine's zeros), and two gradients' shapes."""

    def body():
        mesh = Mesh(spmdsim.Layout((2,), ("tp",)))
        whole, split = mesh.layout(None, None), mesh.layout("tp", None)

        def seeded(shape, seed, layout=whole):
            return DTensor.from_seeded(mesh, layout, spmdsim.SeededTensor(shape, "float64", seed)).requires_grad_()

        a, b, s = seeded((128, 128), 1), seeded((128, 128), 2), seeded((128, 128), 3, split)
        col, w = seeded((128, 1), 4), seeded((256, 128), 5, mesh.layout(None, "tp"))
        with counting(blocks=True) as flops:
            h = ops.concatenate([a, ops.broadcast_to(col, (128, 128)) * b], 1)  # (128, 256)
            h = ops.gelu(ops.matmul(h, w))  # (128, 128), columns split
            h = ops.stack([h, ops.transpose(a)], 0)[..., 32:96]  # (2, 128, 64)
            j = ops.concatenate([ops.narrow(s, 0, 8, 64), s], 0)  # (192, 128), rows split
            h = ops.masked_fill(h, ops.causal_mask(mesh, (2, 128, 64)), 0.0)
            t = ops.sum(ops.sum(h * h)) + ops.mean(ops.mean(j * j)) + ops.sum(ops.max(a, 1)) + ops.sum(ops.min(j, 0))
            t.backward()
        return set(flops.fresh()), dict(flops.counts), dict(flops.kernels), a.grad.local.shape, s.grad.local.shape

    return spmdsim.simulate(2, body, dry_run=dry)


def test_a_dry_run_of_the_ops_counts_what_the_real_run_allocates():
    real, dry = _program(False), _program(True)
    assert len(real) == len(dry) == 2
    for rank, (ours, theirs) in enumerate(zip(dry, real)):
        fresh, got = ours[0], theirs[0]
        assert fresh == got, (rank, sorted(map(str, fresh - got)), sorted(map(str, got - fresh)))
        assert ours[1:] == theirs[1:] and ours[3:] == ((128, 128), (64, 128)), rank
    assert real[0][1] and real[0][2]  # products and kernels were counted
