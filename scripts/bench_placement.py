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
copy can be much slower for some deltas (docs/explanation/performance.md, "Buffer
placement"); this script shows whether the machine at hand has that trap.
spmdsim.base.buffers places what spmdsim allocates PAGE_OFFSET bytes into a page:
delta 0 between its own buffers and against the arrays glibc maps on its own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spmdsim.base.buffers import PAGE  # noqa: E402
from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, byte_sizes, int_at_least  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

DELTAS = (0, 8, 16, 32, 48, 64, 112, -112, 2048)
SIZES = (1 << 20, 16 << 20)


def _at_offset(buf: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """The `nbytes` of `buf` that start `offset` bytes into a page."""
    start = (offset - buf.ctypes.data) % PAGE
    return buf[start:start + nbytes]


def whole_blocks(sizes: Sequence[int], ranks: int) -> list[int]:
    """`sizes` cut to whole 8-byte Alltoall blocks per rank; a size that leaves none is refused.

    Raised on every rank alike before any collective. Shared with bench_hugepages.py.
    """
    from spmdsim.errors import SpmdsimError

    block = 8 * ranks
    small = [n for n in sizes if n < block]
    if small:
        raise SpmdsimError(f"--sizes {small[0]}: below one 8-byte block per rank for {ranks} "
                           f"ranks; expected at least {block} bytes")
    return [n - n % block for n in sizes]


def pair_calls(comm: Any, op: str, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[Callable[[], None]]:
    """One raw mpi4py call per (send, receive) pair: ``Alltoall``, or ``Sendrecv`` to the next rank from the
    previous."""
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

    from spmdsim.base.buffers import PAGE_OFFSET

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    records = []
    for nbytes in whole_blocks(sizes, size):  # whole blocks for Alltoall
        send_mem = np.ones(nbytes + 2 * PAGE, np.uint8)
        recv_mem = np.empty(nbytes + 2 * PAGE, np.uint8)
        pairs = [(_at_offset(send_mem, PAGE_OFFSET, nbytes),
                  _at_offset(recv_mem, (PAGE_OFFSET + d) % PAGE, nbytes)) for d in deltas]
        n = len(pairs)
        # Every case goes first equally often.
        med = slowest_medians(comm, pair_calls(comm, op, pairs), repeats,
                              lambda rep: list(range(rep % n, n)) + list(range(rep % n)))
        base = med[deltas.index(0)]
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


def _deltas(text: str) -> list[int]:
    """An argparse type: distinct offsets within a page (negative: back from the page's end), 0 among them."""
    try:
        deltas = [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of whole byte offsets "
                                         "like 0,16,-112") from None
    seen: dict[int, int] = {}
    for d in deltas:
        if not -PAGE < d < PAGE:
            raise argparse.ArgumentTypeError(f"delta {d} is not within a page; expected "
                                             f"-{PAGE} < delta < {PAGE}")
        if d % PAGE in seen:  # the same placement twice
            prev = seen[d % PAGE]
            how = "is given twice" if d == prev else f"is delta {prev} in {PAGE}-byte pages"
            raise argparse.ArgumentTypeError(f"delta {d} {how}; expected distinct deltas")
        seen[d % PAGE] = d
    if 0 not in deltas:
        raise argparse.ArgumentTypeError(f"{text!r} lacks 0; expected 0 among the deltas "
                                         "(the ratios are against delta 0)")
    return deltas


def add_pair_arguments(p: argparse.ArgumentParser, sizes: Sequence[int], op: str) -> None:
    """--sizes, --repeats, --op and --json, as this script and bench_hugepages.py take them."""
    p.add_argument("--sizes", type=byte_sizes(1), default=",".join(f"{s >> 20}M" for s in sizes),
                   help="bytes per rank, comma-separated (K/M suffixes)")
    p.add_argument("--repeats", type=int_at_least(1), default=30)
    p.add_argument("--op", choices=("sendrecv", "alltoall"), default=op)
    p.add_argument("--json", action="store_true", help="print a JSON list of records")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_arguments(p, SIZES, "sendrecv")
    p.add_argument("--deltas", type=_deltas, default=",".join(map(str, DELTAS)),
                   help="receive-minus-send offsets in bytes, comma-separated (0 among them)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    records = bench(args.sizes, args.deltas, args.repeats, args.op)
    if records:
        print(json.dumps(records, indent=1) if args.json else _table(records), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(run_script(main))
