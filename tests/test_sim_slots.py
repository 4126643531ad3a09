"""Run slots of simulated ranks: at most World.slots compute at once, and no program hangs for it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from spmdsim.runtime.sim import engine, simulate, world
from spmdsim.runtime.sim.rank_sleep import real_sleep


@pytest.fixture
def two_slots(monkeypatch):
    monkeypatch.setattr(engine, "run_slots", lambda size: min(size, 2))


def test_slots_follow_the_cores_within_bounds(monkeypatch):
    monkeypatch.setattr("spmdsim.base.threads.cores_available", lambda: 1)
    assert engine.run_slots(8) == 2 and engine.run_slots(1) == 1
    monkeypatch.setattr("spmdsim.base.threads.cores_available", lambda: 500)
    assert engine.run_slots(1024) == engine.MAX_SLOTS == 32


def test_at_most_the_slots_compute_at_once(two_slots):
    lock, now, most = threading.Lock(), [0], [0]

    def body():
        comm = world()
        for _ in range(5):
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            real_sleep(0.002)  # a rank computing outside the interpreter (time.sleep would give the slot away)
            with lock:
                now[0] -= 1
            comm.Barrier()
        return comm.allreduce(comm.rank)

    assert simulate(8, body) == [28] * 8
    assert most[0] == 2


def test_ranks_polling_test_let_the_ranks_in_line_run():
    # Ranks 0 and 1 take the two slots and spin on Test for messages that ranks 6 and 7 send:
    # they must let the ranks in line compute. Without that this never ends: a subprocess, so
    # that a regression fails on its timeout instead of hanging the suite.
    code = textwrap.dedent("""
        import numpy as np
        from spmdsim.runtime.sim import Request, engine, simulate, world

        engine.run_slots = lambda size: min(size, 2)

        def body():
            comm = world()
            r = comm.rank
            if r in (0, 1):
                buf = np.zeros(1)
                req = comm.Irecv(buf, source=r + 6, tag=3)
                while not req.Test():
                    pass
                pending = [comm.Irecv(np.zeros(1), source=r + 6, tag=4)]
                while not Request.Testall(pending):
                    pass
                return float(buf[0])
            if r in (6, 7):
                comm.Send(np.full(1, float(r)), dest=r - 6, tag=3)
                comm.Send(np.zeros(1), dest=r - 6, tag=4)
            return None

        print(simulate(8, body)[:2])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[6.0, 7.0]"


def test_a_deadlock_is_still_named_with_ranks_in_line(two_slots):
    from spmdsim.runtime.sim import DeadlockError

    def body():
        comm = world()
        if comm.rank != 5:
            comm.Barrier()

    with pytest.raises(DeadlockError, match="rank 5 finished"):
        simulate(8, body)


def test_a_failure_stops_the_ranks_in_line(two_slots):
    def body():
        comm = world()
        if comm.rank == 0:
            raise ValueError("rank 0 gives up")
        comm.Barrier()

    with pytest.raises(ValueError, match="rank 0 gives up"):
        simulate(8, body)


def test_256_ranks_multiplying_at_once_do_not_corrupt_blas():
    # Without the slots, numpy's OpenBLAS printed "BLAS : Bad memory unallocation!" here and glibc
    # aborted the process ("corrupted size vs. prev_size"). A subprocess: a crash must fail the test.
    code = textwrap.dedent("""
        import numpy as np
        from spmdsim import simulate, world

        def body():
            comm = world()
            a = np.random.default_rng(comm.rank).standard_normal((96, 96))
            total = 0.0
            for _ in range(20):
                total += float((a @ a.T)[0, 0])
                comm.Barrier()
            return total

        out = simulate(256, body)
        want = [float(sum((np.random.default_rng(r).standard_normal((96, 96)) ** 2)[0].sum()
                          for _ in range(20))) for r in range(256)]
        print("ok" if np.allclose(out, want) else "WRONG")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
    assert "Bad memory" not in done.stderr


def test_an_error_every_rank_raises_is_every_ranks_even_from_the_line(two_slots):
    # Ranks in line for a slot are not stopped by the first rank's error: like MPI ranks they
    # run on and raise it too, so it is reported once, as every rank's (the CLI's one line).
    def body():
        raise ValueError(f"width 480 does not split over {world().size} ranks")

    with pytest.raises(ValueError, match="does not split over 8 ranks") as info:
        simulate(8, body)
    assert info.value.__notes__ == ["raised on every simulated rank"]


def _count_wakes(monkeypatch, counts=lambda: True) -> list:
    """[the wake-ups of simulated ranks (World._sleep returning) for which `counts()` holds], kept up to date."""
    wakes = [0]
    sleep = engine.World._sleep

    def counted(self, key):
        sleep(self, key)
        wakes[0] += bool(counts())
    monkeypatch.setattr(engine.World, "_sleep", counted)
    return wakes


def test_waitall_wakes_its_rank_once_when_the_last_request_completes(monkeypatch):
    """A rank in Waitall is let go when its last request completes, not at each: woken at each, it took the
    interpreter from the sender still posting the rest (up to Python's 5 ms switch interval a time), and
    osu_bw's windows of 64 Irecvs spent most of the run there (13.3 s simulated, 3.1 s once woken once)."""
    from spmdsim.runtime.sim import Request, current_rank

    wakes = _count_wakes(monkeypatch, lambda: current_rank() == 1)
    n = 8

    def body():
        comm = world()
        if comm.Get_rank() == 1:
            got = [np.zeros(1) for _ in range(n)]
            Request.Waitall([comm.Irecv(g, 0, tag) for tag, g in enumerate(got)])
            return [float(g[0]) for g in got]
        time.sleep(0.05)  # rank 1 waits in Waitall by now
        for tag in range(n):  # one at a time, each after rank 1 could have woken for the one before
            comm.Send(np.full(1, float(tag)), 1, tag)
            time.sleep(0.01)
        return []

    assert simulate(2, body) == [[], [float(tag) for tag in range(n)]]
    assert wakes[0] <= 1, wakes[0]  # 0 if rank 1 came late, after every message


def test_a_collective_wakes_each_waiting_member_once(monkeypatch):
    """Released members go straight into the line for a run slot, woken once, when a slot is theirs.

    Waking every member at once, for most to find no free slot and wait again, woke 1,024 ranks
    about twice per call (20,434 wake-ups for these 10 calls), and cost 2.5x the time.
    """
    wakes = _count_wakes(monkeypatch)

    def body():
        comm = world()
        return [comm.allreduce(comm.Get_rank()) for _ in range(10)]

    ranks, calls = 1024, 10
    assert simulate(ranks, body) == [[ranks * (ranks - 1) // 2] * calls] * ranks
    # One wake-up per rank per call (object allreduces meet once), plus the slot
    # hand-offs of the ranks that start in line: 11,254 here.
    assert wakes[0] <= calls * ranks + 2 * ranks, wakes[0]


def test_the_rendezvous_benchmark_times_a_case_and_refuses_bad_counts():
    """scripts/bench_rendezvous.py (docs/explanation/performance.md quotes its medians), one short launch."""
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_rendezvous.py"
    run = subprocess.run([sys.executable, str(script), "--repeat", "1", "--calls", "3", "--case", "Send+Recv@2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("Send+Recv @2")]
    assert len(rows) == 1 and rows[0][2:4] == ["this", "checkout"], run.stdout
    assert all(float(x) > 0 for x in rows[0][4:]), run.stdout
    bad = subprocess.run([sys.executable, str(script), "--repeat", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--repeat 0 and --calls 2000 must be 1 or more" in bad.stderr.splitlines()[-1]


def test_a_neighbour_collective_meets_once_and_fills_each_member_from_its_neighbours(monkeypatch):
    """Cartcomm's neighbour collectives meet once, as the other buffer collectives do: the last member to
    arrive fills every member's receive blocks (one wake-up per waiting member, not two), and a member whose
    block is too small gets its error in its own thread while the others complete."""
    wakes = _count_wakes(monkeypatch)
    calls = 20

    def body():
        cart = world().Create_cart([2, 4], periods=[True, False])
        me = cart.Get_rank()
        got = np.full(4, -1.0)
        for _ in range(calls):
            cart.Neighbor_allgather(np.full(1, float(me)), got)
        return [int(v) for v in got], [-1 if nb < 0 else nb for nb in cart.inedges]

    before = wakes[0]
    for values, neighbours in simulate(8, body):
        assert values == neighbours  # each block from its neighbour (-1: none there, left unwritten)
    assert wakes[0] - before <= calls * 8, wakes[0] - before  # two meetings a call woke ~2 x 7 x 20

    def short():
        cart = world().Create_cart([2, 2], periods=[True, True])
        counts = [2, 1, 1, 1] if cart.Get_rank() == 0 else [1, 1, 1, 1]  # rank 0 waits for 2 items, gets 1
        out = np.zeros(sum(counts))
        try:
            cart.Neighbor_allgatherv(np.ones(1), [out, (counts, [sum(counts[:i]) for i in range(4)])])
        except Exception as exc:  # noqa: BLE001 - the emulator's MPI error
            return type(exc).__name__
        return out.tolist()

    results = simulate(4, short)
    assert results[1:] == [[1.0] * 4] * 3 and isinstance(results[0], str) and "Deadlock" not in results[0], results


def test_ranks_in_a_line_that_stands_still_get_a_slot_anyway(two_slots):
    """Ranks 0 and 1 take the two slots and wait outside MPI (a threading.Barrier, as a loop on a flag) for all
    four to begin: ranks 2 and 3 stood in line until the barrier broke (20 s), as ranks computing long between
    MPI calls held back the others' first lines. After PATIENCE_S of a line standing still its ranks get a slot
    beyond the two, and each slot given back while they hold it pays one back."""
    met = threading.Barrier(4, timeout=20)
    worlds = []

    def body():
        comm = world()
        worlds.append(comm._group.world)
        try:
            met.wait()
        except threading.BrokenBarrierError:
            return "alone"
        comm.Barrier()
        return "met"

    assert simulate(4, body) == ["met"] * 4
    w = worlds[0]
    assert (w._overdrawn, w._free, list(w._queue)) == (0, w.slots, [])  # settled back to the two slots


def test_an_overdraft_goes_up_to_the_most_computing_and_is_paid_back(two_slots, monkeypatch):
    # No threads: World's bookkeeping itself, at chosen times (time.monotonic() readings).
    from spmdsim.runtime.sim import sleepers

    monkeypatch.setattr(sleepers, "MOST_COMPUTING", 3)
    w = engine.World(5)
    start, patience = w._stood[0], sleepers.PATIENCE_S
    with w.lock:
        for rank in range(5):
            w._line_up(rank)  # 0 and 1 get the slots, 2, 3 and 4 stand in line
    assert w.overdraw(start + patience / 2) == 0  # not yet
    assert w.overdraw(start + patience) == 1  # one more: three compute, the most
    assert (w._overdrawn, list(w._queue)) == (1, [3, 4])
    with w.lock:
        for rank in (0, 1, 2):
            w._await_slot(rank)  # (granted: takes it at once)
        w._give_slot(0)  # pays the overdraft back: the line does not move
        assert (w._overdrawn, list(w._queue)) == (0, [3, 4])
        w._give_slot(1)  # a slot of the two: rank 3's
        assert list(w._queue) == [4] and 3 in w._granted
    assert w.overdraw(start + 2 * patience) == 0  # the line moved: it stands still from now on
    assert w.overdraw(start + 2.5 * patience) == 0
    assert w.overdraw(start + 3 * patience) == 1 and list(w._queue) == [] and w._overdrawn == 1


def test_a_rank_in_line_aborts_the_job_while_the_others_compute(tmp_path):
    """The last of 3 ranks calls Abort while ranks 0 and 1 hold the two slots in a loop of many seconds: its
    print and Abort waited for the loops to end (under mpiexec they come at once). A subprocess: its run ends as
    the Abort ends the job, the loops unfinished."""
    prog = tmp_path / "starve.py"
    prog.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\nif comm.rank == comm.size - 1:\n"
                    "    print('rank', comm.rank, 'aborts', flush=True)\n    comm.Abort(3)\ntotal = 0\n"
                    "for i in range(200_000_000):\n    total += i\nprint('rank', comm.rank, 'looped', flush=True)\n")
    code = ("import sys\nfrom spmdsim.runtime.sim import engine\nengine.run_slots = lambda size: min(size, 2)\n"
            "from spmdsim.emulator.mpirun import main\nsys.exit(main(['-n', '3', 'python', sys.argv[1]]))\n")
    run = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-c", code, str(prog)],
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 3, run
    assert run.stdout.splitlines() == ["rank 2 aborts"], run
