"""mpi4py corners a lab meets, whose per-rank results are compared: simulated ranks against MPICH.

    timeout -k 5 120 mpiexec -n 2 python tests/mpi4py_corners.py OUT.json   # MPICH's results

Each function takes nothing, uses ``MPI.COMM_WORLD`` as an mpi4py program does and
returns a JSON-able value; tests/test_sim_mpi4py_corners.py runs them on simulated
ranks (MPI.COMM_WORLD swapped), compares rank by rank with MPICH's, and checks
the values MPI's semantics give. The names of exception classes are compared,
so a refusal must be mpi4py's class (BufferError, ValueError, TypeError, ...).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from mpi4py import MPI


def _raises(fn) -> str:
    """The first of mpi4py's exception classes `fn` raises ('' if none)."""
    try:
        fn()
    except MPI.Exception as exc:
        return f"MPI.Exception {MPI.Get_error_string(exc.Get_error_class()).split(',')[0]}"
    except Exception as exc:  # noqa: BLE001 - the class is the answer
        for kind in (BufferError, KeyError, TypeError, ValueError, NotImplementedError):
            if isinstance(exc, kind):
                return kind.__name__
        return type(exc).__name__
    return ""


def group_null_and_empty():
    comm = MPI.COMM_WORLD
    world = comm.Get_group()
    null = MPI.Group()
    union = MPI.Group.Union(MPI.GROUP_EMPTY, world)
    inter = MPI.Group.Intersection(world, MPI.GROUP_EMPTY)
    copy = MPI.Group(world)
    out = [bool(null), null == MPI.GROUP_NULL, MPI.Group(MPI.GROUP_NULL) == MPI.GROUP_NULL,
           bool(MPI.Group(MPI.GROUP_NULL)), union.size, MPI.Group.Compare(union, world) == MPI.IDENT,
           union == world, inter.size, inter == MPI.GROUP_EMPTY, world == comm.Get_group(),
           world.Incl([0]) == world.Incl([0]), world.Incl([]) == MPI.GROUP_EMPTY, copy == world,
           MPI.Group.Difference(world, world) == MPI.GROUP_EMPTY,
           MPI.Group.Translate_ranks(world, list(range(comm.size)), MPI.GROUP_EMPTY) == [MPI.UNDEFINED] * comm.size]
    world.Free()
    return out + [bool(world), world == MPI.GROUP_NULL]


def predefined_free():
    comm = MPI.COMM_WORLD
    comm.free()
    MPI.COMM_SELF.free()
    out = [bool(comm), comm == MPI.COMM_NULL, _raises(comm.Free), _raises(MPI.COMM_SELF.Free)]
    out += [comm.allreduce(1), MPI.COMM_SELF.allreduce(1), bool(comm)]
    dup = comm.Dup()
    dup.free()
    return out + [bool(dup), dup == MPI.COMM_NULL]


def request_copies():
    comm = MPI.COMM_WORLD
    r = comm.rank
    req = comm.Isend(np.arange(3.0) + r, r, 5)
    copy = MPI.Request(req)
    out = [copy == req, copy is req, bool(copy)]
    null = MPI.Request(MPI.REQUEST_NULL)
    out += [null == MPI.REQUEST_NULL, bool(null), MPI.Request() == MPI.REQUEST_NULL]
    got = np.zeros(3)
    recv = comm.Irecv(got, r, 5)
    rcopy = MPI.Request(recv)
    status = MPI.Status()
    rcopy.Wait(status)
    copy.Wait()
    return out + [got.tolist(), status.Get_source(), status.Get_tag(), bool(rcopy), bool(recv), recv == rcopy]


def byte_order():
    comm = MPI.COMM_WORLD
    big = np.arange(1, 4, dtype=">i4")
    return [_raises(lambda: comm.Send(big, comm.rank, 1)),
            _raises(lambda: comm.Allreduce(big, np.zeros(3, ">i4"))),
            _raises(lambda: comm.Bcast(np.zeros(2, ">f8")))]


ALL = (group_null_and_empty, predefined_free, request_copies, byte_order)


def run_all():
    return {fn.__name__: fn() for fn in ALL}


if __name__ == "__main__":
    results = run_all()
    gathered = MPI.COMM_WORLD.gather(results, root=0)
    if MPI.COMM_WORLD.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(gathered, f)
