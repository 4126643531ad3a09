#!/usr/bin/env python
"""How far apart in their pages a send and a receive buffer start, and what that costs MPI.

Run under MPI (every mpiexec under a timeout):

    timeout -k 5 300 mpiexec -n 2 python scripts/bench_placement.py
    timeout -k 5 300 mpiexec -n 8 python scripts/bench_placement.py --op alltoall --json

Each rank sends one buffer to the next rank and receives the previous rank's
(``Sendrecv``; ``--op alltoall`` runs an Alltoall instead) with plain mpi4py.
Only the placement changes between cases: the receive buffer starts `delta`
bytes after the send buffer, modulo the page size. All cases run interleaved on
the same two allocations; a time is the median over repeats of the slowest
rank, and `ratio` is against delta 0 in the same run. Between processes on one
node MPICH copies large messages with the kernel's cross-memory attach, whose
copy can be much slower for some deltas (docs/performance.md, "Buffer
placement"); this script shows whether the machine at hand has that trap.
spmdsim.buffers places what spmdsim allocates PAGE_OFFSET bytes into a page:
delta 0 between its own buffers and against the arrays glibc maps on its own.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Iterable, Sequence

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spmdsim.cli.calibrate import parse_size  # noqa: E402

DELTAS = (0, 8, 16, 32, 48, 64, 112, -112, 2048)
SIZES = (1 << 20, 16 << 20)


def _at_offset(buf: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """The `nbytes` of `buf` that start `offset` bytes into a page."""
    from spmdsim.buffers import PAGE

    start = (offset - buf.ctypes.data) % PAGE
    return buf[start:start + nbytes]


def pair_calls(comm: Any, op: str, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[Callable[[], None]]:
    """One raw mpi4py call per (send, receive) pair: ``Alltoall``, or ``Sendrecv`` to the next rank from the previous."""
    if op == "alltoall":
        return [lambda s=s, r=r: comm.Alltoall(s, r) for s, r in pairs]
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    return [lambda s=s, r=r: comm.Sendrecv(s, right, 0, r, left, 0) for s, r in pairs]


def slowest_medians(comm: Any, calls: Sequence[Callable[[], None]], repeats: int,
                    order: Callable[[int], Iterable[int]]) -> np.ndarray:
    """Per call, the median over `repeats` of the slowest rank's seconds.

    Each call runs once first (MPI's buffers and the pages), then every repeat
    runs all calls in ``order(repeat)``, each after a barrier. `order` must
    give every rank the same sequence. Shared with bench_hugepages.py.
    """
    from mpi4py import MPI

    for call in calls:
        call()
    times = np.empty((len(calls), repeats))
    for rep in range(repeats):
        for k in order(rep):
            comm.Barrier()
            t0 = MPI.Wtime()
            calls[k]()
            times[k, rep] = MPI.Wtime() - t0
    slowest = np.empty_like(times)
    comm.Allreduce(times, slowest, MPI.MAX)
    return np.median(slowest, axis=1)


def bench(sizes: list[int], deltas: list[int], repeats: int, op: str) -> list[dict]:
    from mpi4py import MPI

    from spmdsim.buffers import PAGE, PAGE_OFFSET

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    records = []
    for nbytes in sizes:
        nbytes -= nbytes % (size * 8)  # whole blocks for Alltoall
        send_mem = np.ones(nbytes + 2 * PAGE, np.uint8)
        recv_mem = np.empty(nbytes + 2 * PAGE, np.uint8)
        pairs = [(_at_offset(send_mem, PAGE_OFFSET, nbytes),
                  _at_offset(recv_mem, (PAGE_OFFSET + d) % PAGE, nbytes)) for d in deltas]
        n = len(pairs)
        # Every case goes first equally often.
        med = slowest_medians(comm, pair_calls(comm, op, pairs), repeats,
                              lambda rep: list(range(rep % n, n)) + list(range(rep % n)))
        base = med[deltas.index(0)] if 0 in deltas else med[0]
        records += [{"op": op, "bytes_per_rank": nbytes, "delta": d, "seconds": float(t),
                     "ratio": float(t / base)} for d, t in zip(deltas, med)]
    return records if rank == 0 else []


def _table(records: list[dict]) -> str:
    lines = [f"{'op':<10}{'bytes/rank':>12}{'delta':>7}{'ms':>10}{'ratio':>8}"]
    for r in records:
        lines.append(f"{r['op']:<10}{r['bytes_per_rank']:>12}{r['delta']:>7}"
                     f"{r['seconds'] * 1e3:>10.3f}{r['ratio']:>8.2f}")
    lines.append("delta: receive buffer start minus send buffer start, modulo the page; "
                 "ratio: against delta 0 in this run")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(f"{s >> 20}M" for s in SIZES),
                   help="bytes per rank, comma-separated (K/M suffixes)")
    p.add_argument("--deltas", default=",".join(map(str, DELTAS)),
                   help="receive-minus-send offsets in bytes, comma-separated")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--op", choices=("sendrecv", "alltoall"), default="sendrecv")
    p.add_argument("--json", action="store_true", help="print a JSON list of records")
    args = p.parse_args()
    # Every rank parses the same arguments, so a bad one stops all of them here, before MPI.
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        deltas = [int(d) for d in args.deltas.split(",")]
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(f"--sizes {args.sizes!r} / --deltas {args.deltas!r}: {e}")
    if args.repeats < 1 or any(s < 1 for s in sizes):
        p.error(f"--repeats {args.repeats} and every size in --sizes {args.sizes!r} must be >= 1")
    records = bench(sizes, deltas, args.repeats, args.op)
    if records:
        print(json.dumps(records, indent=1) if args.json else _table(records), flush=True)


if __name__ == "__main__":
    main()
