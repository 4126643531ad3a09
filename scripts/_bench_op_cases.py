"""bench.py's operator cases: MatMul, column/row Linear, the fused MLP, vocab-parallel Embedding,
and a training step of the MLP (forward, backward, SGD)."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from spmdsim import Layout, SeededTensor
from spmdsim.tools.cli.collective_timing import Waiter

from _bench_harness import Case, Raw, placed, traced

__all__ = ["op_cases"]


# -- operators ------------------------------------------------------------------------------
class _Cases:
    """What every operator case needs: the rank's communicator and 1-d mesh over "x", the raw side's wait, and
    `add`, which checks a case's raw result against spmdsim's once (also a warm-up) and keeps the case."""

    def __init__(self, comm: Any, waiter: Waiter, wait: str) -> None:
        from spmdsim import Mesh

        self.comm, self.waiter, self.rank = comm, waiter, comm.Get_rank()
        self.world, self.root = comm.Get_size(), self.rank == 0
        self.layout = Layout((self.world,), ("x",))
        self.mesh = Mesh(self.layout, comm, wait=wait)
        self.cases: list[Case] = []

    def add(self, name: str, nbytes: int, fn_s, fn_r, raw: Raw, fn_n) -> None:
        # The raw code must compute what spmdsim computes: compare once (also a warm-up).
        got, want = fn_r(), fn_s().local
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"bench: raw version of {name!r} differs from spmdsim on rank {self.rank}")
        entries: list = []
        self.cases.append(Case(name, nbytes, traced(fn_s, entries), raw.timed(fn_r), fn_n, {"_trace": entries}))


def op_cases(comm: Any, waiter: Waiter, wait: str, sz: dict) -> list[Case]:
    """The operator cases on `comm` (sizes `sz`): MatMul, column and row Linear, the MLP, the embedding, a step."""
    c = _Cases(comm, waiter, wait)
    _matmul(c, sz["matmul"])
    b, d_in, d_out = sz["batch"], sz["hidden"], sz["ffn"]
    xsrc = SeededTensor((b, d_in), seed=3)
    _linears(c, xsrc, d_out)
    _mlp(c, xsrc, d_out)
    _embedding(c, sz["vocab"], sz["emb_dim"], sz["tokens"])
    _training_step(comm, c.mesh, waiter, xsrc, d_in, d_out, c.add)
    return c.cases


def _matmul(c: _Cases, m: int) -> None:
    """MatMul: X (m, m) split on K (columns), W (m, m) split on K (rows): Allreduce of (m, m)."""
    from mpi4py import MPI

    from spmdsim import DTensor
    from spmdsim.nn.ops import matmul

    comm, layout = c.comm, c.layout
    xs, ws = SeededTensor((m, m), seed=1), SeededTensor((m, m), seed=2)
    X = DTensor.from_seeded(c.mesh, layout(None, "x"), xs)
    W = DTensor.from_seeded(c.mesh, layout("x", None), ws)
    raw = Raw(c.waiter)
    part, out = placed((m, m)), placed((m, m))
    xf, wf = (xs.full(), ws.full()) if c.root else (None, None)

    def raw_matmul(xl=X.local, wl=W.local, raw=raw):
        np.matmul(xl, wl, out=part)
        raw(comm.Allreduce, comm.Iallreduce, part, out, MPI.SUM)
        return out
    c.add(f"matmul {m}x{m} K-split", part.nbytes, lambda: matmul(X, W), raw_matmul, raw,
          lambda xf=xf, wf=wf: xf @ wf)


def _linears(c: _Cases, xsrc: Any, d_out: int) -> None:
    """Column-parallel Linear in -> out, batch b, its output split and gathered (Allgather on columns); then
    row-parallel Linear out -> in, input already split on its last dim: Allreduce of (b, in)."""
    from mpi4py import MPI

    from spmdsim import DTensor
    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear

    comm, layout, world = c.comm, c.layout, c.world
    (b, d_in), xin_f = xsrc.shape, xsrc.full()
    xin = DTensor.from_seeded(c.mesh, layout(None, None), xsrc)
    for gather in (False, True):
        col = ColumnParallelLinear(c.mesh, d_in, d_out, gather_output=gather, seed=10)
        wl, bl = col.weight.local, col.bias.local
        wf, bf = (col.weight_source.full(), col.bias_source.full()) if c.root else (None, None)
        raw = Raw(c.waiter)
        blocks = placed((world, b, d_out // world))
        y = placed((b, wl.shape[1]))

        def raw_col(wl=wl, bl=bl, gather=gather, y=y, blocks=blocks, raw=raw):
            np.matmul(xin.local, wl, out=y)
            y += bl
            if gather:  # the unpack is timed with the Allgather, as spmdsim's trace times it
                t0 = time.perf_counter()
                raw.w.call(comm.Allgather, comm.Iallgather, y, blocks)
                full = np.ascontiguousarray(blocks.transpose(1, 0, 2)).reshape(b, d_out)
                raw.add(t0, time.perf_counter())
                return full
            return y
        tag = "gather" if gather else "split"
        c.add(f"column_linear {d_in}->{d_out} b{b} {tag}", b * d_out * 4 if gather else 0,
              lambda col=col: col(xin), raw_col, raw, lambda wf=wf, bf=bf: xin_f @ wf + bf)
    row = RowParallelLinear(c.mesh, d_out, d_in, input_is_parallel=True, seed=20)
    hsrc = SeededTensor((b, d_out), seed=4)
    h = DTensor.from_seeded(c.mesh, layout(None, "x"), hsrc)
    hf = hsrc.full() if c.root else None
    rwf, rbf = (row.weight_source.full(), row.bias_source.full()) if c.root else (None, None)
    raw = Raw(c.waiter)
    rpart, rout = placed((b, d_in)), placed((b, d_in))

    def raw_row(wl=row.weight.local, bl=row.bias.local, raw=raw):
        np.matmul(h.local, wl, out=rpart)
        raw(comm.Allreduce, comm.Iallreduce, rpart, rout, MPI.SUM)
        np.add(rout, bl, out=rout)
        return rout
    c.add(f"row_linear {d_out}->{d_in} b{b}", rpart.nbytes, lambda: row(h), raw_row, raw,
          lambda: hf @ rwf + rbf)


def _mlp(c: _Cases, xsrc: Any, d_out: int) -> None:
    """Fused MLP: column (no gather) -> gelu -> row, one Allreduce."""
    from mpi4py import MPI

    from spmdsim import DTensor
    from spmdsim.nn.ops import ParallelMLP
    from spmdsim.references import activations
    from spmdsim.references.forward import gelu

    comm, (b, d_in), xin_f = c.comm, xsrc.shape, xsrc.full()
    xin = DTensor.from_seeded(c.mesh, c.layout(None, None), xsrc)
    mlp = ParallelMLP(c.mesh, d_in, d_out, seed=30)
    f1, f2 = mlp.linear_fc1, mlp.linear_fc2
    full_w = ([s.full() for s in (f1.weight_source, f1.bias_source, f2.weight_source,
                                  f2.bias_source)] if c.root else None)
    raw = Raw(c.waiter)
    mpart, mout = placed((b, d_in)), placed((b, d_in))

    def raw_mlp(raw=raw):
        hid = activations.gelu(xin.local @ f1.weight.local + f1.bias.local)  # spmdsim's local kernel
        np.matmul(hid, f2.weight.local, out=mpart)
        raw(comm.Allreduce, comm.Iallreduce, mpart, mout, MPI.SUM)
        np.add(mout, f2.bias.local, out=mout)
        return mout

    def numpy_mlp():
        w1, b1, w2, b2 = full_w
        return gelu(xin_f @ w1 + b1) @ w2 + b2
    c.add(f"mlp {d_in}->{d_out}->{d_in} b{b}", mpart.nbytes, lambda: mlp(xin), raw_mlp, raw, numpy_mlp)


def _embedding(c: _Cases, vocab: int, dim: int, tokens: int) -> None:
    """Vocab-parallel Embedding (N, M): masked local lookup, Allreduce of (tokens, M)."""
    from mpi4py import MPI

    from spmdsim import DTensor
    from spmdsim.nn.ops import VocabParallelEmbedding

    comm = c.comm
    emb = VocabParallelEmbedding(c.mesh, vocab, dim, seed=40)
    idsrc = SeededTensor((tokens,), "int64", seed=5, low=0, high=vocab)
    ids = DTensor.from_seeded(c.mesh, c.layout(None), idsrc)
    table_f = emb.weight_source.full() if c.root else None
    ids_f = idsrc.full()
    raw = Raw(c.waiter)
    eout, looked = placed((tokens, dim)), placed((tokens, dim))
    padded, start, stop = emb.padded_weight, emb.vocab_start_index, emb.vocab_end_index

    def raw_emb(raw=raw):
        owned = (ids.local >= start) & (ids.local < stop)
        np.take(padded, np.where(owned, ids.local - start, stop - start), axis=0, out=looked, mode="clip")
        raw(comm.Allreduce, comm.Iallreduce, looked, eout, MPI.SUM)
        return eout
    c.add(f"vocab_embedding {vocab}x{dim} t{tokens}", eout.nbytes, lambda: emb(ids), raw_emb, raw,
          lambda: table_f[ids_f])


def _training_step(comm: Any, mesh: Any, waiter: Waiter, xsrc: Any, d_in: int, d_out: int, add) -> None:
    """One training step of the fused MLP: forward, mse_loss, backward, SGD (docs/howto/train.md).

    x requires grad (a layer inside a network), so the backward has the
    Allreduce answering Megatron's f; the raw code does the same math in the
    same order (the loss's value, every gradient, then that Allreduce) and the
    same two Allreduces by hand. Both sides update their own copy of the weights.
    """
    from mpi4py import MPI

    from spmdsim.nn.ops import ParallelMLP, mse_loss
    from spmdsim.nn.optim import SGD
    from spmdsim.references.activations import gelu, gelu_backward
    from spmdsim import DTensor

    lr = 1e-4
    mlp = ParallelMLP(mesh, d_in, d_out, seed=50)
    x = DTensor.from_seeded(mesh, mesh.layout(None, None), xsrc).requires_grad_()
    target = DTensor.from_seeded(mesh, x.layout, SeededTensor(xsrc.shape, seed=6))
    params = [mlp.linear_fc1.weight, mlp.linear_fc1.bias, mlp.linear_fc2.weight, mlp.linear_fc2.bias]
    opt = SGD(params, lr)

    def spmdsim_step():
        opt.zero_grad()
        x._ag.grad = None
        mse_loss(mlp(x), target).backward()
        opt.step()
        return x.grad

    w1, b1, w2, b2 = (p.local.copy() for p in params)
    raw = Raw(waiter)
    y, part, dx, dx_part = (placed(x.local.shape) for _ in range(4))
    n = float(np.prod(x.global_shape))

    def raw_step(raw=raw):
        a = x.local @ w1 + b1
        h = gelu(a)
        np.matmul(h, w2, out=part)
        raw(comm.Allreduce, comm.Iallreduce, part, y, MPI.SUM)
        np.add(y, b2, out=y)
        diff = y - target.local
        float((diff * diff).sum())  # the loss's value, as mse_loss computes it
        dy = diff * np.float32(2.0 / n)
        # spmdsim's order: every gradient of the MLP, then the sum of x's partial gradients
        # (the work between two collectives is what the later one waits for).
        gw2, gb2 = h.T @ dy, dy.sum(0)
        da = gelu_backward(a, dy @ w2.T)
        np.matmul(da, w1.T, out=dx_part)
        gw1, gb1 = x.local.T @ da, da.sum(0)
        raw(comm.Allreduce, comm.Iallreduce, dx_part, dx, MPI.SUM)
        for p, g in ((w2, gw2), (b2, gb2), (w1, gw1), (b1, gb1)):
            p -= np.float32(lr) * g
        return dx

    add(f"train step mlp {d_in}->{d_out}->{d_in} b{x.global_shape[0]}", 2 * part.nbytes, spmdsim_step,
        raw_step, raw, None)
