#!/usr/bin/env python
"""What 2 MiB transparent huge pages under the send and receive buffers change for MPI.

Run under MPI (every mpiexec under a timeout):

    timeout -k 5 300 mpiexec -n 8 python scripts/bench_hugepages.py
    timeout -k 5 300 mpiexec -n 2 python scripts/bench_hugepages.py --op sendrecv --json

Four cases with plain mpi4py (``Alltoall``; ``--op sendrecv`` sends to the
next rank and receives from the previous one): send and receive buffer each on
4 KiB pages (advised ``MADV_NOHUGEPAGE``) or on 2 MiB huge pages (advised
``MADV_HUGEPAGE``), both starting 16 bytes into a page as spmdsim.base.buffers
places its own. The cases run in a random order per repeat on the same four
allocations; a time is the median over repeats of the slowest rank, and
`ratio` is against 4 KiB pages on both sides in the same run. `huge_share` is
the share of the huge-advised buffers' pages the kernel really backed with
huge pages (Linux, read from /proc/self/smaps; None elsewhere). Between
processes on one node MPICH copies large messages with the kernel's
cross-memory attach, which pins the sender's pages for each copy
(docs/explanation/performance.md, "Huge pages").
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The raw calls, their timing and the argument types are bench_placement.py's and
# _bench_args.py's (this folder is on sys.path when the script runs; added for
# imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser  # noqa: E402
from bench_placement import add_pair_arguments, pair_calls, slowest_medians, whole_blocks  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

SIZES = (1 << 20, 8 << 20)
CASES = (("4K", "4K"), ("huge", "huge"), ("4K", "huge"), ("huge", "4K"))  # (send, receive)
_HUGE = 2 << 20
_maps: list = []  # kept alive until the process ends


def _buffer(pages: str, nbytes: int, offset: int) -> np.ndarray:
    """`nbytes` of fresh anonymous memory `offset` bytes into a 2 MiB-aligned stretch, advised `pages`."""
    size = -(-(offset + nbytes) // _HUGE) * _HUGE
    m = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _maps.append(m)
    whole = np.frombuffer(m, np.uint8)
    start = (-whole.ctypes.data) % _HUGE
    m.madvise(mmap.MADV_HUGEPAGE if pages == "huge" else mmap.MADV_NOHUGEPAGE, start, size)
    buf = whole[start + offset:start + offset + nbytes]
    buf.fill(1)  # fault the pages in now, as the advice says
    return buf


def _anon_huge_kib() -> int | None:
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bench(sizes: list[int], repeats: int, op: str) -> list[dict]:
    from mpi4py import MPI

    from spmdsim.base.buffers import PAGE_OFFSET

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(0)  # the same order on every rank
    records = []
    for nbytes in whole_blocks(sizes, size):  # whole blocks for Alltoall
        before = _anon_huge_kib()
        bufs = {(side, pages): _buffer(pages, nbytes, PAGE_OFFSET)
                for side in ("send", "recv") for pages in ("4K", "huge")}
        after = _anon_huge_kib()
        share = None if before is None else min(1.0, (after - before) * 1024 / (2 * nbytes))
        share = comm.allreduce(share if share is not None else -1.0, op=MPI.MIN)
        calls = pair_calls(comm, op, [(bufs["send", s], bufs["recv", r]) for s, r in CASES])
        # A random order per repeat: with more ranks than cores a fixed
        # rotation of four contenders favoured some positions.
        med = slowest_medians(comm, calls, repeats, lambda rep: rng.permutation(len(calls)))
        records += [{"op": op, "bytes_per_rank": nbytes, "send_pages": s, "recv_pages": r,
                     "seconds": float(t), "ratio": float(t / med[0]),
                     "huge_share": None if share < 0 else round(share, 3)}
                    for (s, r), t in zip(CASES, med)]
    return records if rank == 0 else []


def _table(records: list[dict]) -> str:
    lines = [f"{'op':<10}{'bytes/rank':>12}{'send':>6}{'recv':>6}{'ms':>10}{'ratio':>8}{'huge share':>12}"]
    for r in records:
        lines.append(f"{r['op']:<10}{r['bytes_per_rank']:>12}{r['send_pages']:>6}{r['recv_pages']:>6}"
                     f"{r['seconds'] * 1e3:>10.3f}{r['ratio']:>8.2f}{str(r['huge_share']):>12}")
    lines.append("ratio: against 4 KiB pages on both sides in this run; huge share: of the huge-advised "
                 "buffers' bytes, on huge pages (smallest over ranks)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_arguments(p, SIZES, "alltoall")
    args = p.parse_args(argv)
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        p.error("this OS has no transparent huge pages to advise (mmap.MADV_HUGEPAGE is missing)")
    return args


def run(args: argparse.Namespace) -> int:
    records = bench(args.sizes, args.repeats, args.op)
    if records:
        print(json.dumps(records, indent=1) if args.json else _table(records), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(run_script(main))
