#!/usr/bin/env python
"""spmdsim next to PyTorch DTensor (gloo, CPU) on the same redistributions and TP layers.

Not part of CI. Needs torch (>= 2.4, with torch.distributed.tensor); without
it the script says so and exits 0. Run under MPI (mpi4py hands each rank its
rank and the gloo rendezvous address), always under a timeout:

    timeout -k 5 600 mpiexec -n 8 python scripts/bench_peers.py
    timeout -k 5 120 mpiexec -n 8 python scripts/bench_peers.py --quick
    timeout -k 5 300 mpiexec -n 8 python scripts/bench_peers.py --train-only

Each case runs spmdsim and DTensor in turn (rotating order, barrier before
each call); a time is the median over repeats of the slowest rank. The ratio
is spmdsim / DTensor (below 1: spmdsim is faster). The training step also
runs a third time, written by hand in numpy with one mpi4py Allreduce: the
floor for any numpy implementation of that step. Where the environment pins
numpy's OpenBLAS kernels (OPENBLAS_CORETYPE, as this project's VM does for older
builds), time a current numpy with both variables unset in that command alone:
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE timeout ...``; the last line
names the kernels numpy ran.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402

from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, launcher_rank, output_path  # noqa: E402
from spmdsim.base.threads import blas_kernels_text  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

FULL = dict(shape=(4096, 1024), matmul=2048, batch=64, hidden=1024, ffn=4096, vocab=32000,
            emb_dim=1024, tokens=2048, repeats=7, warmup=2)
QUICK = dict(shape=(256, 64), matmul=256, batch=8, hidden=128, ffn=512, vocab=1000, emb_dim=64,
             tokens=64, repeats=2, warmup=1)


def _torch_or_none() -> Optional[Any]:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if importlib.util.find_spec("torch.distributed.tensor") is None:
        return None
    return torch


def _init_gloo(comm: Any, torch: Any) -> None:
    """Start torch.distributed (gloo) with the rank and size MPI gave this process."""
    import socket

    import torch.distributed as dist

    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = None
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    torch.set_num_threads(1)


def _timeit(comm: Any, waiter: Any, calls: dict[str, Callable[[], Any]], warmup: int,
            repeats: int) -> dict[str, float]:
    from mpi4py import MPI

    names = list(calls)
    local = np.zeros((len(names), repeats))
    for rep in range(-warmup, repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            waiter.barrier(comm)
            t0 = time.perf_counter()
            calls[name]()
            if rep >= 0:
                local[names.index(name), rep] = time.perf_counter() - t0
    slowest = np.empty_like(local)
    comm.Allreduce(local, slowest, MPI.MAX)
    return {n: statistics.median(slowest[i]) for i, n in enumerate(names)}


def _synced(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Wait for DTensor's asynchronous (functional) collectives before the clock stops."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor as TDT

    def call() -> Any:
        out = fn()
        if isinstance(out, TDT):
            out = out.to_local()
        if isinstance(out, AsyncCollectiveTensor):
            out = out.wait()
        return out

    return call


def cases(comm: Any, torch: Any, cfg: dict) -> list[tuple[str, Callable, Callable]]:
    """(name, spmdsim call, DTensor call) pairs on the same shapes and data."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor as TDT
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from spmdsim import Layout, SeededTensor
    from spmdsim.nn.ops import (ColumnParallelLinear, ParallelMLP, RowParallelLinear,
                             VocabParallelEmbedding, matmul)
    from spmdsim import DTensor, Mesh

    world, rank = comm.Get_size(), comm.Get_rank()
    layout = Layout((world,), ("x",))
    mesh = Mesh(layout, comm)
    tmesh = init_device_mesh("cpu", (world,))
    out = _move_cases(mesh, layout, rank, tmesh, torch, cfg["shape"])

    # MatMul (m, m) with K split on both operands: partial sum, then Allreduce.
    m = cfg["matmul"]
    X = DTensor.from_seeded(mesh, layout(None, "x"), SeededTensor((m, m), seed=1))
    W = DTensor.from_seeded(mesh, layout("x", None), SeededTensor((m, m), seed=2))
    tX = TDT.from_local(torch.from_numpy(X.local.copy()), tmesh, [Shard(1)], run_check=False)
    tW = TDT.from_local(torch.from_numpy(W.local.copy()), tmesh, [Shard(0)], run_check=False)
    out.append((f"matmul {m}x{m} K-split", lambda: matmul(X, W),
                lambda: torch.matmul(tX, tW).redistribute(tmesh, [Replicate()]).to_local()))

    # Column / row Linear, MLP, vocab-parallel Embedding (Megatron layouts on both sides).
    b, d_in, d_ff = cfg["batch"], cfg["hidden"], cfg["ffn"]
    xs = SeededTensor((b, d_in), seed=3)
    xin = DTensor.from_seeded(mesh, layout(None, None), xs)
    t_in = torch.from_numpy(xs.full())
    col = ColumnParallelLinear(mesh, d_in, d_ff, gather_output=True, seed=10)
    tcol = parallelize_module(nn.Linear(d_in, d_ff), tmesh,
                              ColwiseParallel(output_layouts=Replicate()))
    out.append((f"column_linear {d_in}->{d_ff} b{b} gather", lambda: col(xin),
                lambda: tcol(t_in)))
    row = RowParallelLinear(mesh, d_ff, d_in, input_is_parallel=True, seed=20)
    hs = SeededTensor((b, d_ff), seed=4)
    hin = DTensor.from_seeded(mesh, layout(None, "x"), hs)
    t_h = torch.from_numpy(hin.local.copy())  # RowwiseParallel takes the local Shard(-1)
    trow = parallelize_module(nn.Linear(d_ff, d_in), tmesh, RowwiseParallel())
    out.append((f"row_linear {d_ff}->{d_in} b{b}", lambda: row(hin), lambda: trow(t_h)))
    mlp = ParallelMLP(mesh, d_in, d_ff, seed=30)
    tmlp = parallelize_module(
        nn.Sequential(nn.Linear(d_in, d_ff), nn.GELU(approximate="tanh"), nn.Linear(d_ff, d_in)),
        tmesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out.append((f"mlp {d_in}->{d_ff}->{d_in} b{b}", lambda: mlp(xin), lambda: tmlp(t_in)))
    vocab, dim, tokens = cfg["vocab"], cfg["emb_dim"], cfg["tokens"]
    emb = VocabParallelEmbedding(mesh, vocab, dim, seed=40)
    ids_src = SeededTensor((tokens,), "int64", seed=5, low=0, high=vocab)
    ids = DTensor.from_seeded(mesh, layout(None), ids_src)
    temb = parallelize_module(nn.Embedding(vocab, dim), tmesh,
                              RowwiseParallel(input_layouts=Replicate()))
    t_ids = torch.from_numpy(ids_src.full())
    out.append((f"vocab_embedding {vocab}x{dim} t{tokens}", lambda: emb(ids),
                lambda: temb(t_ids)))
    return [(name, fn_s, _synced(fn_t)) for name, fn_s, fn_t in out]


def _move_cases(mesh: Any, layout: Any, rank: int, tmesh: Any, torch: Any,
                shape: tuple) -> list[tuple[str, Callable, Callable]]:
    """(name, spmdsim call, DTensor call) of the redistributions of a `shape` float32 tensor on `mesh` (of
    `layout`, this rank `rank`) and on torch's `tmesh`."""
    from torch.distributed.tensor import DTensor as TDT
    from torch.distributed.tensor import Partial, Replicate, Shard

    from spmdsim import DTensor, SeededTensor
    from spmdsim.runtime.executor import redistribute

    out = []
    src = SeededTensor(shape, seed=7)
    moves = [
        ("S(0)->B", layout("x", None), [Shard(0)], layout(None, None), [Replicate()]),
        ("S(0)->S(1)", layout("x", None), [Shard(0)], layout(None, "x"), [Shard(1)]),
        ("P->B", layout(None, None, partial=("x",)), [Partial()], layout(None, None),
         [Replicate()]),
        ("P->S(0)", layout(None, None, partial=("x",)), [Partial()], layout("x", None),
         [Shard(0)]),
    ]
    for name, s_l, s_p, d_l, d_p in moves:
        if s_l.partial:
            x = DTensor(mesh, src.region(s_l.slices(rank, shape)), s_l, shape)
        else:
            x = DTensor.from_seeded(mesh, s_l, src)
        tx = TDT.from_local(torch.from_numpy(x.local.copy()), tmesh, s_p, run_check=False,
                            shape=torch.Size(shape), stride=(shape[1], 1))
        out.append((f"redist {name} {shape}", lambda x=x, d=d_l: redistribute(x, d),
                    lambda tx=tx, d=d_p: tx.redistribute(tmesh, d).to_local()))
    return out


def _peak_rss_mib(comm: Any) -> tuple[float, float]:
    """(min, max) over ranks of this process's peak RSS so far (VmHWM), in MiB."""
    from spmdsim.programs.memory import peak_rss

    peaks = comm.allgather(peak_rss() / 2**20)
    return min(peaks), max(peaks)


def training_case(comm: Any, torch: Any, cfg: dict,
                  waiter: Any) -> tuple[tuple[str, Callable, Callable], Callable, dict]:
    """MLP training step (forward, mse loss, backward, SGD) on both sides, and memory per rank.

    spmdsim is built and stepped first, then DTensor; the peak RSS is the process's
    peak so far, so DTensor's figure includes spmdsim's. The local parameter
    bytes per rank show that neither side holds a whole weight. The second
    item is the same step written by hand in numpy + mpi4py (`_numpy_step`).
    """
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from spmdsim import Layout, SeededTensor
    from spmdsim.nn.ops import ParallelMLP, mse_loss
    from spmdsim.nn.optim import SGD
    from spmdsim import DTensor, Mesh

    world = comm.Get_size()
    layout = Layout((world,), ("x",))
    mesh = Mesh(layout, comm)
    b, d_in, d_ff, lr = cfg["batch"], cfg["hidden"], cfg["ffn"], 1e-4
    mem = {"rss_start_mib": _peak_rss_mib(comm)}
    xs, ts = SeededTensor((b, d_in), seed=3), SeededTensor((b, d_in), seed=6)
    x = DTensor.from_seeded(mesh, layout(None, None), xs)
    target = DTensor.from_seeded(mesh, layout(None, None), ts)
    mlp = ParallelMLP(mesh, d_in, d_ff, seed=60)
    params = [mlp.linear_fc1.weight, mlp.linear_fc1.bias, mlp.linear_fc2.weight,
              mlp.linear_fc2.bias]
    opt = SGD(params, lr)

    def spmdsim_step() -> Any:
        opt.zero_grad()
        mse_loss(mlp(x), target).backward()
        opt.step()
        return params[0].local

    by_hand = _numpy_step(comm, waiter, x.local, target.local, [p.local.copy() for p in params], lr)
    spmdsim_step()
    mem["spmdsim_param_mib"] = sum(p.local.nbytes for p in params) / 2**20
    mem["rss_spmdsim_mib"] = _peak_rss_mib(comm)
    tmesh = init_device_mesh("cpu", (world,))
    t_in, t_target = torch.from_numpy(xs.full()), torch.from_numpy(ts.full())
    tmlp = parallelize_module(
        nn.Sequential(nn.Linear(d_in, d_ff), nn.GELU(approximate="tanh"), nn.Linear(d_ff, d_in)),
        tmesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    topt = torch.optim.SGD(tmlp.parameters(), lr=lr)

    def dtensor_step() -> Any:
        topt.zero_grad(set_to_none=True)
        F.mse_loss(tmlp(t_in), t_target).backward()
        topt.step()
        return tmlp[0].weight

    dtensor_step()
    mem["dtensor_param_mib"] = sum(p.to_local().nbytes for p in tmlp.parameters()) / 2**20
    mem["rss_dtensor_mib"] = _peak_rss_mib(comm)
    mem["whole_w1_mib"] = d_in * d_ff * 4 / 2**20
    name = f"train step mlp {d_in}->{d_ff}->{d_in} b{b}"
    return (name, spmdsim_step, _synced(dtensor_step)), by_hand, mem


def _numpy_step(comm: Any, waiter: Any, x: np.ndarray, target: np.ndarray, params: list,
                lr: float) -> Callable[[], Any]:
    """The training step's math by hand on this rank's blocks: numpy and one mpi4py Allreduce.

    The floor for any numpy implementation of the step: spmdsim's local math
    (GELU and its gradient from spmdsim.references.activations, the kernels its operators
    run) without its Python around it, waiting as spmdsim waits. It updates
    its own copies of the weights.
    """
    from mpi4py import MPI

    from spmdsim.references.activations import gelu, gelu_backward

    w1, b1, w2, b2 = params
    y = np.empty(target.shape, target.dtype)
    scale, rate = np.float32(2.0 / (target.size)), np.asarray(lr, w1.dtype)

    def step() -> Any:
        a = x @ w1
        a += b1
        h = gelu(a)
        part = h @ w2
        waiter.call(comm.Allreduce, comm.Iallreduce, part, y, MPI.SUM)
        np.add(y, b2, out=y)
        diff = y - target
        np.sum(diff * diff)  # the loss (its Allreduce: none, y is replicated)
        dy = diff * scale
        da = gelu_backward(a, dy @ w2.T)
        for p, g in ((w2, h.T @ dy), (b2, dy.sum(0)), (w1, x.T @ da), (b1, da.sum(0))):
            p -= rate * g
        return w1

    return step


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0],
                       epilog="e.g. timeout -k 5 600 mpiexec -n 8 python scripts/bench_peers.py")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats")
    p.add_argument("--train-only", action="store_true",
                   help="only the MLP training-step case (its memory figures are then its own)")
    p.add_argument("--json", type=output_path, default=None, help="write the records to this file")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    torch = _torch_or_none()
    if torch is None:
        if launcher_rank() == 0:
            print("bench_peers: PyTorch with torch.distributed.tensor is not installed; nothing "
                  "to compare (pip install torch to run it). Skipping.")
        return 0
    return run_guarded(lambda: run(args, torch))


def run(args: argparse.Namespace, torch: Any) -> int:
    from mpi4py import MPI

    from spmdsim.tools.cli.collective_timing import Waiter

    comm = MPI.COMM_WORLD
    cfg = QUICK if args.quick else FULL
    _init_gloo(comm, torch)
    waiter = Waiter(comm)
    records = []
    train, by_hand, mem = training_case(comm, torch, cfg, waiter)
    todo = [train] if args.train_only else cases(comm, torch, cfg) + [train]
    for name, fn_s, fn_t in todo:
        calls = {"spmdsim": fn_s, "dtensor": fn_t, **({"numpy": by_hand} if fn_s is train[1] else {})}
        t = _timeit(comm, waiter, calls, cfg["warmup"], cfg["repeats"])
        records.append({"name": name, "spmdsim_s": t["spmdsim"], "dtensor_s": t["dtensor"],
                        "ratio_spmdsim_vs_dtensor": t["spmdsim"] / t["dtensor"],
                        **({"memory": mem, "numpy_by_hand_s": t["numpy"],
                            "ratio_numpy_by_hand_vs_dtensor": t["numpy"] / t["dtensor"]}
                           if name == train[0] else {})})
        if comm.Get_rank() == 0:
            print(f"bench_peers: {name} done", file=sys.stderr, flush=True)
    if comm.Get_rank() == 0:
        print(f"{'case':<44}{'spmdsim ms':>11}{'DTensor ms':>11}{'ratio':>7}")
        for r in records:
            print(f"{r['name'][:43]:<44}{r['spmdsim_s'] * 1e3:>11.2f}{r['dtensor_s'] * 1e3:>11.2f}"
                  f"{r['ratio_spmdsim_vs_dtensor']:>7.2f}")
        hand = next(r for r in records if "numpy_by_hand_s" in r)
        print(f"same training step by hand (numpy + one mpi4py Allreduce): "
              f"{hand['numpy_by_hand_s'] * 1e3:.2f} ms, {hand['ratio_numpy_by_hand_vs_dtensor']:.2f}x "
              "DTensor's")
        print("peak RSS/rank MiB (min-max, peak so far): start "
              "{0:.0f}-{1:.0f}, spmdsim step {2:.0f}-{3:.0f}, DTensor step {4:.0f}-{5:.0f}".format(
                  *mem["rss_start_mib"], *mem["rss_spmdsim_mib"], *mem["rss_dtensor_mib"]))
        print(f"training parameters per rank, MiB: spmdsim {mem['spmdsim_param_mib']:.2f}, "
              f"DTensor {mem['dtensor_param_mib']:.2f} (a whole W1: {mem['whole_w1_mib']:.2f})")
        print(f"torch {torch.__version__} gloo, {comm.Get_size()} ranks, wait={waiter.mode}, "
              f"{blas_kernels_text()}; "
              "ratio = spmdsim / DTensor")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(records, fh, indent=1)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
