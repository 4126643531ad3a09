"""A single-head attention block on DTensors: column-parallel Q/K/V, softmax, row-parallel output.

x (8, 16) replicated, head width 4 per rank. Run: timeout -k 5 120 mpiexec -n 8 python examples/attention.py
"""
import sys

from mpi4py import MPI

from spmdsim import Layout, SeededTensor, reference
from spmdsim.holdings import holdings
from spmdsim.ops import matmul, softmax, transpose
from spmdsim.runtime import DTensor, Mesh, collect_trace, install_excepthook

comm = MPI.COMM_WORLD
# An error on some ranks only ends the whole job instead of hanging the others.
install_excepthook(comm)
p = comm.size
seq, d_model, head = 8, 16, 4 * p

mesh = Mesh(Layout((p,), ("mp",)), comm)
L = mesh.layout
srcs = {name: SeededTensor(shape, "float64", seed, low=-1, high=1)
        for name, shape, seed in (("x", (seq, d_model), 1), ("Wq", (d_model, head), 2),
                                  ("Wk", (d_model, head), 3), ("Wv", (d_model, head), 4),
                                  ("Wo", (head, d_model), 5))}
x = DTensor.from_seeded(mesh, L(None, None), srcs["x"])  # replicated input
# Q, K, V are column-parallel: rank r holds columns 4r:4r+4 of each weight and
# computes those columns of q, k, v with no communication.
wq, wk, wv = (DTensor.from_seeded(mesh, L(None, "mp"), srcs[n]) for n in ("Wq", "Wk", "Wv"))
# The output projection is row-parallel: its rows match the columns of v each rank holds.
wo = DTensor.from_seeded(mesh, L("mp", None), srcs["Wo"])

with collect_trace() as trace:
    q, k, v = matmul(x, wq), matmul(x, wk), matmul(x, wv)
    # q @ k^T contracts over the split head dim: each rank holds a partial sum of every
    # score, so one Allreduce gives all ranks the whole (seq, seq) scores.
    scores = matmul(q, transpose(k))
    # softmax along the key dim, which every rank now holds whole: no communication.
    probs = softmax(scores)
    # probs (whole) @ v (split columns) stays split; @ Wo (split rows) is a partial sum
    # over the head dim: the second Allreduce.
    y = matmul(matmul(probs, v), wo)

full = {n: t.full() for n, t in srcs.items()}
qf, kf, vf = (full["x"] @ full[w] for w in ("Wq", "Wk", "Wv"))
verdict = y.check(reference.softmax(qf @ kf.T) @ vf @ full["Wo"])
expected = {"allreduce": 2} if p > 1 else {}
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "Wq": wq, "Wo": wo, "scores": scores, "y": y}))
    print(f"collectives {trace.counts()}")
    print(trace.summary())
    print(verdict)
    print("PASS" if verdict.passed and trace.counts() == expected else "FAIL")
sys.exit(0 if verdict.passed and trace.counts() == expected else 1)
