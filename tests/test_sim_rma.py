"""One-sided communication on simulated ranks (spmdsim.emulator.window): locks that exclude, derived
datatypes that accumulate in their element type, a lock never released reported as a deadlock, a target
past the window refused, and mpi4py.util.sync's mutex, whose ranks poll the window for each other."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim.runtime.sim.engine import DeadlockError
from testkit import on_simulated_ranks as _run


def test_an_exclusive_lock_makes_a_read_modify_write_atomic():
    # Get, add one, Put under an exclusive lock: every increment counts only if no two ranks interleave.
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        win = MPI.Win.Allocate(8 if comm.rank == 0 else 0, 8, MPI.INFO_NULL, comm)
        comm.Barrier()
        value = np.zeros(1, "q")
        for _ in range(20):
            win.Lock(0, MPI.LOCK_EXCLUSIVE)
            win.Get(value, 0)
            win.Flush(0)
            value += 1
            win.Put(value, 0)
            win.Unlock(0)
        comm.Barrier()
        total = int(np.frombuffer(win.tomemory(), "q")[0]) if comm.rank == 0 else None
        win.Free()
        return total

    assert _run(4, body)[0] == 80


def test_a_derived_target_accumulates_in_its_element_type():
    # An indexed type of ints at elements 1 and 3; -1 added to 256 carries across bytes (300 - 1 = 299).
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        mem = np.full(4, 300, "i")
        win = MPI.Win.Create(mem, 4, MPI.INFO_NULL, comm)
        picked = MPI.INT.Create_indexed_block(1, [1, 3]).Commit()
        win.Fence()
        win.Accumulate(np.array([-1, -2], "i"), (comm.rank + 1) % comm.size, [0, 1, picked], MPI.SUM)
        win.Fence()
        picked.Free()
        win.Free()
        return mem.tolist()

    assert _run(2, body) == [[300, 299, 300, 298]] * 2


def test_a_lock_never_released_is_a_deadlock_naming_the_lock():
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        win = MPI.Win.Allocate(8, 8, MPI.INFO_NULL, comm)
        if comm.rank == 0:
            win.Lock(1)  # and never Unlock before the Barrier rank 1 cannot reach
            comm.Barrier()
        else:
            comm.Barrier()  # rank 0 is in it already: then rank 1 locks what rank 0 holds
            win.Lock(1)
        comm.Barrier()

    with pytest.raises(DeadlockError, match="Win.Lock of rank 1"):
        _run(2, body)


def test_outside_the_window_and_outside_an_epoch_are_mpi_errors():
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        win = MPI.Win.Allocate(16, 4, MPI.INFO_NULL, comm)
        seen = []
        for call in (lambda: win.Put(np.zeros(1, "i"), 0),  # no epoch yet
                     lambda: (win.Fence(), win.Put(np.zeros(2, "i"), 0, 3)),  # ints 3 and 4 of 4
                     lambda: win.Put(np.zeros(1, "i"), 0, -1),
                     lambda: win.Unlock(0),
                     lambda: win.Accumulate(np.zeros(1, "i"), 0, op=MPI.MAXLOC)):  # a pair type's op
            try:
                call()
                seen.append(None)
            except MPI.Exception as exc:
                seen.append(exc.Get_error_class())
        win.Fence()
        win.Free()
        return seen == [MPI.ERR_RMA_SYNC, MPI.ERR_RMA_RANGE, MPI.ERR_DISP, MPI.ERR_RMA_SYNC, MPI.ERR_OP]

    assert _run(2, body) == [True, True]


def test_util_sync_mutex_and_counter_on_more_ranks_than_cores():
    # mpi4py.util.sync's Mutex spins on its window (Sync, Flush) for the rank ahead of it in the queue,
    # which may stand in line for a run slot: the poll points let it run.
    def body():
        from mpi4py import MPI
        from mpi4py.util.sync import Counter, Mutex

        comm = MPI.COMM_WORLD
        mutex, counter = Mutex(comm=comm), Counter(comm=comm)
        win = MPI.Win.Allocate(8 if comm.rank == 0 else 0, 8, MPI.INFO_NULL, comm)
        comm.Barrier()
        taken = []
        for _ in range(3):
            with mutex:  # a plain read-modify-write, safe only while the mutex excludes the others
                value = np.zeros(1, "q")
                win.Lock(0, MPI.LOCK_SHARED)
                win.Get(value, 0)
                win.Unlock(0)
                win.Lock(0, MPI.LOCK_SHARED)
                win.Put(value + 1, 0)
                win.Unlock(0)
            taken.append(next(counter))
        comm.Barrier()
        total = int(np.frombuffer(win, "q")[0]) if comm.rank == 0 else None  # memoryview(win): the window
        values = sorted(sum(comm.allgather(taken), []))
        mutex.free()
        counter.free()
        win.Free()
        return total, values

    results = _run(6, body)
    assert results[0] == (18, list(range(18)))


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_fence_epochs_operations_are_done_by_the_fence_that_ends_it(ranks):
    # As MPICH does them: what a target reads of its window, and what a Get brought, before the closing Fence
    # are the bytes as they were, on every run; after it, every member's operations are done.
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        counts = np.zeros(2 if comm.rank == 0 else 0, "q")
        win = MPI.Win.Create(counts, comm=comm)
        got = np.full(2, -1, "q")
        win.Fence()
        win.Accumulate(np.ones(2, "q"), 0, op=MPI.SUM)
        before = counts.copy()
        win.Fence()
        after = counts.copy()
        win.Get(got, 0)
        brought = got.copy()
        win.Fence()
        win.Free()
        return before.tolist(), after.tolist(), brought.tolist(), got.tolist()

    results = _run(ranks, body)
    assert results[0][:2] == ([0, 0], [ranks, ranks])
    assert all(r[2:] == ([-1, -1], [ranks, ranks]) for r in results)


def test_a_request_based_operation_in_a_fence_epoch_is_done_by_its_wait():
    # MPICH completes an Rget by its Wait, not at the Fence (`mpiexec -n 2` of the same program: [11, 11], [10, 10]).
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        buf = np.full(2, comm.rank + 10, "i")
        win = MPI.Win.Create(buf, comm=comm)
        got = np.zeros(2, "i")
        win.Fence()
        win.Rget(got, (comm.rank + 1) % comm.size).Wait()
        seen = got.tolist()
        win.Fence()
        win.Free()
        return seen

    assert _run(2, body) == [[11, 11], [10, 10]]
