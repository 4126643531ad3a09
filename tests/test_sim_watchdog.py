"""The watchdog (SPMDSIM_WATCHDOG) on simulated ranks: every wait of a rank is timed (spmdsim.runtime.sim.engine's
World.wait), so spmdsim's collectives, its point-to-point and mpi4py's calls through the emulator report a
rank left waiting as they do under MPI; a deadlock is still the engine's report, at once; a join is not timed.

The rank that keeps the others waiting blocks on an Event the test sets once simulate() returned (the watchdog
ends the run and leaves a rank that never reaches a wait, as MPI's Abort ends the job), so no case waits for a
sleep; the deadline is a fraction of a second (debug.MIN_WATCHDOG_S lowered), but where a deadlock must be
declared before it, 1 s.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.errors import RuntimeMismatchError
from spmdsim.runtime import Mesh, collectives, debug
from spmdsim.runtime.door import point_to_point
from spmdsim.runtime.sim import DeadlockError, engine, simulate

HERE = "test_sim_watchdog.py"


@pytest.fixture
def held(monkeypatch):
    """An Event a rank waits on (its "long computation"), set when the test ends; a short watchdog allowed."""
    monkeypatch.setattr(debug, "MIN_WATCHDOG_S", 0.01)
    monkeypatch.setattr(engine, "LEFT_AFTER_S", 0.0)  # simulate() leaves the held rank at once
    monkeypatch.delenv("SPMDSIM_WATCHDOG", raising=False)
    monkeypatch.delenv("SPMDSIM_CHECK", raising=False)
    debug._reset()
    event = threading.Event()
    yield event
    event.set()
    debug._reset()


def _report(fn, *args) -> str:
    with pytest.raises(RuntimeMismatchError) as caught:
        simulate(2, fn, *args)
    assert not isinstance(caught.value, DeadlockError)
    return str(caught.value).replace("\n  ", " ")


def test_spmdsim_collective_waiting_for_a_busy_rank(held):
    def main():
        mesh = Mesh(Layout((2,), ("mp",)))
        x = collectives.allreduce(mesh, np.ones(3), "mp")  # the group exists: the next call is an allreduce
        # On the rank, its own setting (Hooks.world marks the simulation); after the setup, whose waits a
        # loaded machine may make long
        debug.configure(watchdog=0.2)
        if mesh.rank == 1:
            held.wait(30)  # rank 1 computes
        return collectives.allreduce(mesh, x, "mp")

    text = _report(main)
    # (the mesh's group, split from the world with every rank in order, named so: not 'the world', the call counts
    # its own)
    assert text.startswith("[rank 0] spmdsim: allreduce on the mesh's group over ('mp',) of the world (call 2) did "
                           "not complete within 0.2 s: rank 0 waits in it; rank 1 is computing (at ")
    assert f"(at {HERE}:" in text and text.count(HERE) == 2  # both ranks' lines


def test_mpi4py_calls_through_the_emulator(monkeypatch, held):
    from mpi4py import MPI

    monkeypatch.setenv("SPMDSIM_WATCHDOG", "0.2")  # the process's setting, copied by every rank

    def collective():
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            held.wait(30)
        return comm.allreduce(comm.rank)

    def receive():
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            held.wait(30)
            comm.send(1, dest=0)
            return None
        return comm.recv(source=1, tag=4)

    with swapped():
        texts = [_report(collective), _report(receive)]
    assert texts[0].startswith("[rank 0] spmdsim: allreduce(obj) on the world (call 1) did not complete within "
                               "0.2 s: rank 0 waits in it; rank 1 is computing (at ")
    assert texts[1].startswith("[rank 0] spmdsim: recv from group rank 1 (tag 4) on the world did not complete "
                               "within 0.2 s: rank 0 waits in it; rank 1 is computing (at ")


def test_the_printed_report_keeps_each_clause_whole_after_its_prefix(held, capsys):
    """`SPMDSIM_WATCHDOG=2 python prog.py --ranks 4` printed "spmdsim: error on simulated rank 0: [rank 0] spmdsim:
    allreduce ... did not\n  complete within 2.0 s: ranks 0,2,3 wait in\n  it; rank 1 is computing": the head's
    line, folded once in the report and again with the prefix, cut its clause in two. The clause is the line
    after the head."""
    from spmdsim.runtime.sim.launch import run_on_ranks

    def main():
        debug.configure(watchdog=0.2)
        mesh = Mesh(Layout((4,), ("mp",)))
        if mesh.rank == 1:
            held.wait(30)
        return collectives.allreduce(mesh, np.ones(3), "mp")

    assert run_on_ranks(4, main) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("spmdsim: error on simulated rank ") and lines[1].endswith(" within 0.2 s:")
    assert lines[2].startswith("  ranks 0,2,3 wait in it; rank 1 is computing (at "), lines


def test_a_thread_a_rank_started_is_watched_and_a_join_is_not(held):
    from mpi4py import MPI

    def main():
        debug.configure(watchdog=0.2)
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            held.wait(30)
            return None
        got = []
        receiver = threading.Thread(target=lambda: got.append(comm.recv(source=1)))
        receiver.start()
        receiver.join()  # not timed: the receive's own wait reports
        return got

    with swapped():
        text = _report(main)
    assert text.startswith("[rank 0, a thread it started] spmdsim: recv from group rank 1 (any tag) on the world "
                           "did not complete within 0.2 s: a thread of rank 0 waits in it; rank 1 is computing")


def test_spmdsim_point_to_point_deadlock_is_the_engines_report(held):
    # Each rank receives from the other and sends nothing: the engine's report, at once, not the watchdog's
    # (which polled before, and at 1 s came before the engine saw the polls stall, at POLL_STALL_S).
    def main():
        debug.configure(watchdog=1)
        mesh = Mesh(Layout((2,), ("mp",)))
        got = np.zeros(2)
        point_to_point(mesh, mesh.comm, ("mp",), [(got, 1 - mesh.rank, 7)], [], "swap")

    with pytest.raises(DeadlockError, match=r"^simulated ranks deadlock \(every live rank waits"):
        simulate(2, main)


def test_spmdsim_point_to_point_waiting_for_a_busy_rank(held):
    def main():
        mesh = Mesh(Layout((2,), ("mp",)))
        got = np.zeros(2)
        debug.configure(watchdog=0.2)
        if mesh.rank == 1:
            held.wait(30)
            point_to_point(mesh, mesh.comm, ("mp",), [], [(got, 0, 7)], "send")
            return
        point_to_point(mesh, mesh.comm, ("mp",), [(got, 1, 7)], [], "recv")

    text = _report(main)
    assert text.startswith("[rank 0] spmdsim: recv from group rank 1 (tag 7) on the world did not complete within "
                           "0.2 s: rank 0 waits in it; rank 1 is computing (at ")


def test_a_deadlock_stays_the_engines_report_with_the_watchdog_on(monkeypatch, held):
    from mpi4py import MPI

    monkeypatch.setenv("SPMDSIM_WATCHDOG", "1")

    def main():
        comm = MPI.COMM_WORLD
        return comm.recv(source=1 - comm.rank)

    with swapped(), pytest.raises(DeadlockError, match=r"^simulated ranks deadlock \(every live rank waits"):
        simulate(2, main)
