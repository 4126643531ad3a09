"""Floating-point Reduce, Allreduce, Scan, Exscan and Reduce_scatter whose bytes depend on the association, and
mpi4py's object reductions whose values do (run under mpiexec for MPICH's and mpi4py's).

    timeout -k 5 120 mpiexec -n 5 python tests/mpi4py_orders.py OUT.json
"""
from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from mpi4py import MPI


def sums():
    """Rank 0's Reduce, Allreduce (64 values, and 32,768: MPICH's long-message algorithm) and Reduce to the last
    rank, as hex, of values spread over 16 orders of magnitude (every association gives other bits)."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(1234 + comm.rank)
    x = rng.standard_normal(64) * 10.0 ** rng.integers(-8, 8, 64)
    big = np.repeat(x, 512)
    red, allr, bred, last = np.zeros(64), np.zeros(64), np.zeros_like(big), np.zeros(64)
    comm.Reduce(x, red, op=MPI.SUM, root=0)
    comm.Allreduce(x, allr, op=MPI.SUM)
    comm.Allreduce(big, bred, op=MPI.SUM)
    comm.Reduce(x, last, op=MPI.SUM, root=comm.size - 1)
    return [red.tobytes().hex(), allr.tobytes().hex(), bred[::512].tobytes().hex(), last.tobytes().hex()]


def _digits(a, b):
    """An op that is not associative: 1, 2, 3, 4 fold to 1234 left to right, to 154 as (1 op 2) op (3 op 4)."""
    return a * 10 + b


def _hex(x):
    return None if x is None else float(x).hex()


def objects():
    """This rank's lowercase reduce (to the last rank), allreduce, scan and exscan of a float spread over 16
    orders of magnitude (as hex) and of its number plus 1 under `_digits`."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(99 + comm.rank)
    x = float(rng.standard_normal() * 10.0 ** rng.integers(-8, 8))
    last = comm.size - 1
    floats = [_hex(comm.reduce(x, root=last)), _hex(comm.allreduce(x)), _hex(comm.scan(x)), _hex(comm.exscan(x))]
    ints = [comm.reduce(comm.rank + 1, op=_digits, root=last), comm.allreduce(comm.rank + 1, op=_digits),
            comm.scan(comm.rank + 1, op=_digits), comm.exscan(comm.rank + 1, op=_digits)]
    return floats + ints


def scans():
    """This rank's Scan and Exscan (none on rank 0) of 64 values spread over 16 orders of magnitude, as hex."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(1234 + comm.rank)
    x = rng.standard_normal(64) * 10.0 ** rng.integers(-8, 8, 64)
    scan, exscan = np.zeros(64), np.zeros(64)
    comm.Scan(x, scan, op=MPI.SUM)
    comm.Exscan(x, exscan, op=MPI.SUM)
    return [scan.tobytes().hex(), exscan.tobytes().hex() if comm.rank else None]


def scattered():
    """This rank's blocks of Reduce_scatter_block, Reduce_scatter (counts 8, 9, 10, ...) and Ireduce_scatter_block
    of values spread over 16 orders of magnitude, as MD5 digests: 8 doubles a block (MPICH halves recursively) and
    20,000 (from 512 KiB in all MPICH's blocking calls run pairwise)."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(1234 + comm.rank)
    digests = []
    for b in (8, 20000):
        counts = [b + r for r in range(comm.size)]
        x = rng.standard_normal(sum(counts)) * 10.0 ** rng.integers(-8, 8, sum(counts))
        block, mine, nonblocking = np.zeros(b), np.zeros(counts[comm.rank]), np.zeros(b)
        comm.Reduce_scatter_block(x[:b * comm.size], block, op=MPI.SUM)
        comm.Reduce_scatter(x, mine, recvcounts=counts, op=MPI.SUM)
        comm.Ireduce_scatter_block(x[:b * comm.size], nonblocking, op=MPI.SUM).Wait()
        digests += [hashlib.md5(a.tobytes()).hexdigest() for a in (block, mine, nonblocking)]
    return digests


def reduces():
    """Reduce of 64, 257 and 4,096 doubles (MPICH: a binomial tree to 2 KiB, then a reduce-scatter and gather) to
    rank 0 and to the last rank, as MD5 digests on the root (None elsewhere)."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(99 + comm.rank)
    digests = []
    for n in (64, 257, 4096):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
        for root in (0, comm.size - 1):
            out = np.zeros(n)
            comm.Reduce(x, out, op=MPI.SUM, root=root)
            digests.append(hashlib.md5(out.tobytes()).hexdigest() if comm.rank == root else None)
    return digests


def results():
    """[sums(), objects(), scans(), scattered(), reduces()] of this rank."""
    return [sums(), objects(), scans(), scattered(), reduces()]


if __name__ == "__main__":
    gathered = MPI.COMM_WORLD.gather(results(), root=0)
    if MPI.COMM_WORLD.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(gathered, f)
