"""State per simulation, not per process: debug settings and traces per rank; numpy, np.random and mpi4py untouched.

Two simulations run at once in one process (two threads each calling spmdsim.simulate):
one turns the divergence guard on, the other leaves it off, and neither sees the
other's settings or calls. A plain run and a replay capture leave numpy's array
creators, np.random's functions, mpi4py's module and DTensor.local the very objects
they were.
"""
from __future__ import annotations

import random
import sys
import threading
import types

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import RuntimeMismatchError
from spmdsim.runtime import Mesh, collect_trace, debug
from spmdsim.runtime import collectives as C
from spmdsim.runtime.replay import capture

WAIT_S = 60


@pytest.fixture(autouse=True)
def _process_settings_from_a_clean_environment(monkeypatch):
    monkeypatch.delenv("SPMDSIM_CHECK", raising=False)
    monkeypatch.delenv("SPMDSIM_WATCHDOG", raising=False)
    debug._reset()
    yield
    debug._reset()


def _both(runs: dict) -> dict:
    """Run each of `runs` (name -> (n, fn)) as a simulation in a thread of its own, at once; their results."""
    out: dict = {}

    def run(name: str, n: int, fn) -> None:
        try:
            out[name] = spmdsim.simulate(n, fn)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            out[name] = exc

    threads = [threading.Thread(target=run, args=(name, n, fn)) for name, (n, fn) in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT_S)
    assert not any(t.is_alive() for t in threads)
    return out


def test_two_simulations_at_once_each_keep_their_own_settings_and_trace():
    """The checked simulation's guard stops a mismatched allgather on all 4 of its ranks, while the
    other one, run between its configure() and that call, sees the guard off and runs plain."""
    configured, other_ran = threading.Event(), threading.Event()

    def checked():
        debug.configure(check=True)  # every rank of this simulation, as every MPI rank would
        mesh = Mesh(spmdsim.Layout((4,), ("x",)))
        with collect_trace() as trace:
            if mesh.rank == 0:
                configured.set()
                assert other_ran.wait(WAIT_S)  # the other simulation runs its calls now
            total = C.allreduce(mesh, np.full(2, mesh.rank + 1.0), "x")
            rows = 3 if mesh.rank == 3 else 2  # rank 3's block differs: the guard must catch it
            try:
                C.allgather(mesh, np.zeros(rows), "x", 0)
                caught = None
            except RuntimeMismatchError as exc:
                caught = str(exc)
        return (debug.check_enabled(), debug.quiet(), total.tolist(), caught, debug.current_seq(),
                [(e.op, e.group_size) for e in trace.entries])

    def plain():
        assert configured.wait(WAIT_S)  # the checked simulation has turned its guard on
        mesh = Mesh(spmdsim.Layout((2,), ("y",)))
        with collect_trace() as trace:
            settings = (debug.check_enabled(), debug.quiet(), debug.watchdog_seconds())
            totals = [C.allreduce(mesh, np.full(3, float(mesh.rank + i)), "y").tolist() for i in range(3)]
            gathered = C.allgather(mesh, np.array([mesh.rank]), "y", 0).tolist()
        if mesh.rank == 0:
            other_ran.set()
        return settings, totals, gathered, debug.current_seq(), [(e.op, e.group_size) for e in trace.entries]

    out = _both({"checked": (4, checked), "plain": (2, plain)})
    diverge = ("collectives diverge: rank 3 calls allgather on ('x',) float64 (3,) (0,) (seq 2) but rank 0 "
               "calls allgather on ('x',) float64 (2,) (0,) (seq 2) (3 of 4 ranks of the group agree)")
    # The guard's own exchange is no trace entry; the stopped allgather made none either.
    assert out["checked"] == [(True, False, [10.0, 10.0], diverge, 2, [("allreduce", 4)])] * 4
    assert out["plain"] == [((False, True, None), [[1.0] * 3, [3.0] * 3, [5.0] * 3], [0, 1], 4,
                             [("allreduce", 2)] * 3 + [("allgather", 2)])] * 2
    assert debug.check_enabled() is False and debug.quiet() is True  # the process's own: untouched


def test_a_simulation_starts_from_the_process_settings_and_keeps_its_changes_to_itself():
    debug.configure(check=True, watchdog=30)

    def turn_off():
        before = (debug.check_enabled(), debug.watchdog_seconds())
        debug.configure(check=False, watchdog=0)
        return before, (debug.check_enabled(), debug.watchdog_seconds(), debug.quiet())

    assert spmdsim.simulate(2, turn_off) == [((True, 30.0), (False, None, True))] * 2
    assert (debug.check_enabled(), debug.watchdog_seconds(), debug.quiet()) == (True, 30.0, False)
    # A dry run's rank starts from the process's settings too.
    assert spmdsim.simulate(4, debug.check_enabled, dry_run=True) == [True] * 4
    debug.configure(check=False, watchdog=0)
    assert spmdsim.simulate(2, lambda: (debug.check_enabled(), debug.quiet())) == [(False, True)] * 2


def test_each_rank_configures_its_own_settings_as_an_mpi_rank_does():
    def one_rank_turns_it_on():
        if spmdsim.world().Get_rank() == 1:
            debug.configure(check=True)
        return debug.check_enabled()

    assert spmdsim.simulate(3, one_rank_turns_it_on) == [False, True, False]


# numpy's public names but its submodules: its array creators (np.zeros, np.asarray, ...) among them
_NUMPY_NAMES = tuple(name for name in np.__all__ if not isinstance(getattr(np, name), types.ModuleType))


def _module_objects() -> dict:
    """What a simulation or a capture must leave as it found it: numpy's functions, np.random's
    and random's module functions, mpi4py.MPI (the module, its type, its names) and DTensor.local."""
    from mpi4py import MPI

    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.emulator.mpi4py_world import SWAPPED

    seen = {f"np.{name}": getattr(np, name) for name in _NUMPY_NAMES}
    seen.update({f"np.random.{name}": getattr(np.random, name) for name in np.random.__all__})
    seen.update({f"random.{name}": getattr(random, name) for name in random.__all__})
    seen.update({"mpi4py.MPI": sys.modules["mpi4py.MPI"], "type(MPI)": type(MPI),
                 "DTensor.local": DTensor.__dict__["local"]})
    seen.update({f"MPI.{name}": getattr(MPI, name) for name in SWAPPED})
    return seen


def _same(seen: dict, before: dict) -> list:
    return sorted(name for name in before if seen[name] is not before[name])


def test_module_objects_stay_the_same_before_during_and_after_a_run_and_a_capture():
    """The identity of each object, seen from the ranks and from the caller, while they run and while
    they capture a step (docs/howto/replay.md, "How it records")."""
    from spmdsim.runtime.dtensor import DTensor

    before = _module_objects()
    during: list = []

    def run():
        mesh = Mesh(spmdsim.Layout((2,), ("x",)))
        total = C.allreduce(mesh, np.full(3, mesh.rank + 1.0), "x")
        during.append(_same(_module_objects(), before))
        return total.tolist()

    assert spmdsim.simulate(2, run) == [[3.0] * 3] * 2
    assert during == [[], []] and _same(_module_objects(), before) == []

    def captured():
        mesh = Mesh(spmdsim.Layout((2,), ("x",)))
        x = DTensor.from_local(mesh, np.full(3, float(mesh.rank)), mesh.layout(None))

        def step(t):
            during.append(_same(_module_objects(), before))
            return C.allreduce(mesh, t.local * 2.0, "x")

        graph = capture(step, x)
        x.local[...] = 1.0
        return graph(x).tolist(), graph.operations

    during.clear()
    assert spmdsim.simulate(2, captured) == [([4.0] * 3, 2)] * 2
    assert during == [[], []] and _same(_module_objects(), before) == []


def test_spmdsim_mpiruns_own_generators_are_its_ranks_and_come_back_after_overlapping_blocks():
    """Only the ranks that adopt them (spmdsim mpirun's) draw from their own generators; a plain simulation's
    ranks use numpy's global one; overlapping blocks leave numpy's and random's functions as they were."""
    import random

    from spmdsim.emulator.rank_random import adopt, own_generators

    before = (np.random.seed, np.random.rand, random.random)

    def body(adopting: bool) -> float:
        if adopting:
            adopt()
        np.random.seed(5)
        return float(np.random.rand())

    expected = float(np.random.RandomState(5).rand())
    with own_generators():
        with own_generators():
            np.random.seed(11)
            state = np.random.get_state()[1].copy()
            assert spmdsim.simulate(1, body, True) == [expected]  # its own generator
            assert np.array_equal(np.random.get_state()[1], state)  # numpy's global one untouched
        assert np.random.seed is not before[0]  # still swapped: the outer block is open
        assert spmdsim.simulate(1, body, False) == [expected]
        assert not np.array_equal(np.random.get_state()[1], state)  # a plain rank seeded the global one
    assert (np.random.seed, np.random.rand, random.random) == before
