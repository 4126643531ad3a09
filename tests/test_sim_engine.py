"""The collective emulator (spmdsim.runtime.sim): every collective against numpy, groups, failures, scale."""
from __future__ import annotations

import functools
import os
import re
import sys

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import RuntimeMismatchError, ShapeError
from spmdsim.runtime.sim import DeadlockError, IN_PLACE, Request, SimComm, simulate, world
from spmdsim.runtime.sim.orders import allreduce_tree
from spmdsim.runtime.sim.landing import sends_wait
from spmdsim.runtime.sim.report import unfold
from spmdsim.runtime.sim.unmatched import MISMATCH

SIZES = (1, 2, 3, 4, 8)


def _data(rank: int, n: int = 6, dtype: str = "float64") -> np.ndarray:
    """Rank-dependent values whose float sums depend on the order of addition."""
    return (np.arange(n) * 0.1 + rank * 1.37 + 1e-3 * rank ** 2).astype(dtype)


@pytest.mark.parametrize("size", SIZES)
def test_buffer_collectives_match_numpy(size):
    def body():
        comm = world()
        r, g = comm.Get_rank(), comm.Get_size()
        x = _data(r)
        out = {}
        y = np.empty_like(x)
        comm.Allreduce(x, y, "sum")
        out["sum"] = y
        for op in ("max", "min", "prod"):
            z = np.empty_like(x)
            comm.Allreduce(x, z, op)
            out[op] = z
        inplace = x.copy()
        comm.Allreduce(IN_PLACE, inplace, "sum")
        out["inplace"] = inplace
        gathered = np.empty(6 * g)
        comm.Allgather(x, gathered)
        out["allgather"] = gathered
        send = np.arange(2 * g, dtype=np.int64) + 100 * r
        recv = np.empty_like(send)
        comm.Alltoall(send, recv)
        out["alltoall"] = recv
        full = np.arange(3 * g, dtype=np.float32) * (r + 1)
        block = np.empty(3, np.float32)
        comm.Reduce_scatter_block(full, block, "sum")
        out["reduce_scatter"] = block
        b = x.copy() if r == g - 1 else np.zeros_like(x)
        comm.Bcast(b, root=g - 1)
        out["bcast"] = b
        # Alltoallv: rank r sends j + 1 items to rank j, all of value 10 * r + j.
        sends = np.concatenate([np.full(j + 1, 10 * r + j, np.int32) for j in range(g)])
        recvv = np.empty((r + 1) * g, np.int32)
        comm.Alltoallv([sends, ([j + 1 for j in range(g)], None)],
                       [recvv, ([r + 1] * g, [(r + 1) * j for j in range(g)])])
        out["alltoallv"] = recvv
        return out

    results = simulate(size, body)
    xs = [_data(r) for r in range(size)]

    def mpichs(tree):  # world()'s Allreduce associates as MPICH 5 does (spmdsim.runtime.sim.orders)
        return xs[tree] if type(tree) is int else mpichs(tree[0]) + mpichs(tree[1])

    expected_sum = mpichs(allreduce_tree(size))
    for r, out in enumerate(results):
        assert np.array_equal(out["sum"], expected_sum)  # bit for bit
        assert np.array_equal(out["inplace"], expected_sum)
        assert np.array_equal(out["max"], np.max(xs, axis=0))
        assert np.array_equal(out["min"], np.min(xs, axis=0))
        assert np.allclose(out["prod"], np.prod(xs, axis=0))
        assert np.array_equal(out["allgather"], np.concatenate(xs))
        assert out["alltoall"].tolist() == [100 * j + 2 * r + k for j in range(size) for k in range(2)]
        assert np.allclose(out["reduce_scatter"],
                           sum(np.arange(3 * size, dtype=np.float32)[3 * r:3 * r + 3] * (j + 1)
                               for j in range(size)))
        assert np.array_equal(out["bcast"], xs[-1])
        assert out["alltoallv"].tolist() == [10 * j + r for j in range(size) for _ in range(r + 1)]


@pytest.mark.parametrize("size", SIZES)
def test_object_collectives_and_gather(size):
    def body():
        comm = world()
        r = comm.rank
        local = np.full(2, r, np.int16)
        stack = np.empty(2 * comm.size, np.int16) if r == 0 else None
        comm.Gather(local, stack, root=0)
        return (comm.allgather({"r": r}), comm.allreduce(r), comm.allreduce(r, "max"),
                comm.bcast(f"from {r}", root=size - 1), comm.gather(r * r, root=0),
                comm.scatter([i * 3 for i in range(size)] if r == 0 else None, root=0),
                None if stack is None else stack.tolist())

    results = simulate(size, body)
    for r, (allg, total, biggest, text, gathered, scattered, stack) in enumerate(results):
        assert allg == [{"r": i} for i in range(size)]
        assert (total, biggest, text, scattered) == (sum(range(size)), size - 1, f"from {size - 1}", 3 * r)
        assert gathered == ([i * i for i in range(size)] if r == 0 else None)
        assert stack == ([i for i in range(size) for _ in range(2)] if r == 0 else None)


def test_object_allreduce_reduces_once_and_hands_each_rank_its_own_copy():
    """Lists add in rank order; a rank changing its result changes no other rank's; a reduction
    that fails raises the same error on every rank."""
    def body():
        comm = world()
        got = comm.allreduce([comm.rank])
        got.append("mine")
        try:
            comm.allreduce({"a": 1})  # dicts do not add
        except TypeError as exc:
            return got, str(exc)

    results = simulate(4, body)
    assert [r[0] for r in results] == [[0, 1, 2, 3, "mine"]] * 4
    assert {r[1] for r in results} == {"unsupported operand type(s) for +: 'dict' and 'dict'"}


def test_reductions_repeat_bit_for_bit():
    def body():
        x = np.random.default_rng(world().rank).standard_normal(1001).astype(np.float32)
        y = np.empty_like(x)
        world().Allreduce(x, y, "sum")
        return y

    first, second = simulate(8, body), simulate(8, body)
    assert all(np.array_equal(a, first[0]) for a in first + second)


def test_split_groups_and_dup():
    def body():
        comm = world()
        r = comm.rank
        rows = comm.Split(r // 4, -r)  # key reversed: rank 3 first in its row
        cols = comm.Split(r % 4, r)
        none = comm.Split(0 if r == 0 else spmdsim.runtime.sim._mpi.special("UNDEFINED"), 0)
        dup = rows.Dup()
        return (rows.rank, rows.size, rows.allgather(r), cols.allgather(r), dup.allreduce(r),
                none.Get_size() if isinstance(none, SimComm) else "null")

    for r, (row_rank, row_size, row, col, total, none) in enumerate(simulate(8, body)):
        lo = r // 4 * 4
        assert (row_rank, row_size) == (3 - r % 4, 4)
        assert row == list(range(lo + 3, lo - 1, -1))
        assert col == [r % 4, r % 4 + 4]
        assert total == sum(range(lo, lo + 4))
        assert none == (1 if r == 0 else "null")  # MPI.COMM_NULL (None without mpi4py)


def test_point_to_point_ring_and_any_source():
    def body():
        comm = world()
        r, g = comm.rank, comm.size
        send = np.full(3, r, np.float64)
        recv = np.empty(3)
        comm.Sendrecv(send, (r + 1) % g, 5, recv, (r - 1) % g, 5)
        reqs = [comm.Isend(np.array([r, j], np.int64), j, tag=1) for j in range(g) if j != r]
        bufs = [np.empty(2, np.int64) for j in range(g) if j != r]
        reqs += [comm.Irecv(b, tag=1) for b in bufs]  # from any source (the default)
        Request.Waitall(reqs)
        token = comm.sendrecv(("hello", r), dest=(r + 1) % g, source=(r - 1) % g)
        return recv.tolist(), sorted(tuple(b) for b in bufs), token

    for r, (ring, got, token) in enumerate(simulate(4, body)):
        assert ring == [(r - 1) % 4] * 3
        assert got == sorted((j, r) for j in range(4) if j != r)
        assert token == ("hello", (r - 1) % 4)


def test_messages_between_two_ranks_do_not_overtake():
    def body():
        comm = world()
        if comm.rank == 0:
            for i in range(5):
                comm.send(i, dest=1, tag=7)
            return None
        return [comm.recv(source=0, tag=7) for _ in range(5)]

    assert simulate(2, body)[1] == [0, 1, 2, 3, 4]


def test_sends_that_need_buffering_are_a_deadlock():
    """Both ranks Send first a message above the eager limit (8 KiB): MPICH hangs there too."""
    def body():
        comm = world()
        comm.Send(np.zeros(1024), dest=1 - comm.rank)
        comm.Recv(np.zeros(1024), source=1 - comm.rank)

    with pytest.raises(DeadlockError, match=r"send to group rank 1 \(tag 0\).*rank 0 waits"):
        simulate(2, body)


def test_a_deadlock_the_program_catches_still_ends_the_run():
    """A program whose `except Exception` caught the DeadlockError (a student's try around main) ended its ranks
    normally: simulate returned, `spmdsim mpirun` exited 0 and the report was lost, where MPI hangs. The deadlock
    is the run's failure now, reported as it is when not caught."""
    def body():
        comm = world()
        try:
            comm.Recv(np.zeros(2), source=1 - comm.rank)
        except Exception as exc:  # noqa: BLE001 - what the program does
            return type(exc).__name__
        return "received"

    with pytest.raises(DeadlockError, match=r"recv from group rank 1 \(any tag\) on the world: rank 0 waits"):
        simulate(2, body)


def test_collectives_that_diverge_end_the_run_though_the_program_catches_them():
    """Rank 0 broadcasts where rank 1 meets a barrier (MPI hangs): caught by the program, the error was lost and
    simulate returned; it is the run's failure now, as a deadlock the program catches is."""
    def body():
        comm = world()
        try:
            if comm.rank == 0:
                comm.bcast(1, root=0)
            else:
                comm.Barrier()
        except Exception as exc:  # noqa: BLE001 - what the program does
            return type(exc).__name__
        return "met"

    with pytest.raises(RuntimeMismatchError, match="collectives diverge on the world"):
        simulate(2, body)


def test_eager_limit_sets_which_sends_are_buffered_and_0_buffers_none():
    """A standard Send under the world's eager limit completes at once; with limit 0 none does (MPI's test of a
    safe program), and 64-byte head-to-head Sends deadlock with the advice to stop relying on buffering."""
    def body():
        comm = world()
        got = np.zeros(8)
        comm.Send(np.full(8, float(comm.rank)), dest=1 - comm.rank)
        comm.Recv(got, source=1 - comm.rank)
        return got[0]

    assert simulate(2, body) == [1.0, 0.0]
    assert simulate(2, body, eager_limit=65) == [1.0, 0.0]
    with pytest.raises(DeadlockError) as info:
        simulate(2, body, eager_limit=64)
    assert "a standard Send of 64 bytes or more waits for its receive" in unfold(str(info.value))
    with pytest.raises(DeadlockError) as info:
        simulate(2, body, eager_limit=0)
    text = unfold(str(info.value))
    assert "rank 0 waits in it; a message of 64 bytes" in text
    assert "the program relies on MPI buffering its standard Sends, which the MPI standard calls unsafe" in text
    assert text.endswith("post the receive first on one side, or use Sendrecv or Isend/Irecv")
    for bad in (-1, "8", True, 1.5):
        with pytest.raises(spmdsim.SpmdsimError, match=r"^simulate: eager_limit .* must be a number of bytes, 0 or "
                                                       r"more$"):
            simulate(2, body, eager_limit=bad)


def _tag_mismatch():
    comm = world()
    if comm.rank == 0:
        comm.Send(np.zeros(4), dest=1, tag=1)
    else:
        comm.Recv(np.zeros(4), source=0, tag=2)


def _source_mismatch():
    comm = world()
    if comm.rank == 0:
        comm.Send(np.zeros(4), dest=1)
    elif comm.rank == 1:
        comm.Recv(np.zeros(4), source=2)


def _communicator_mismatch():
    comm = world()
    dup = comm.Dup()
    if comm.rank == 0:
        dup.Send(np.zeros(4), dest=1)
    else:
        comm.Recv(np.zeros(4), source=0)


def _both_receive_first():
    comm = world()
    comm.Recv(np.zeros(4), source=1 - comm.rank)
    comm.Send(np.zeros(4), dest=1 - comm.rank)


def _never_sent():
    if world().rank == 1:
        world().Recv(np.zeros(4), source=0)


def _sendrecv_tags():
    comm = world()
    comm.Sendrecv(np.zeros(4), dest=1 - comm.rank, sendtag=1, recvbuf=np.zeros(4), source=1 - comm.rank, recvtag=2)


def _sends_first():
    comm = world()
    comm.Send(np.zeros(4), dest=1 - comm.rank)
    comm.Recv(np.zeros(4), source=1 - comm.rank)


def _waitany_never_sent():
    comm = world()
    Request.Waitany([comm.Irecv(np.zeros(4), source=0, tag=9) for _ in range(2)])


def _waitsome_tags():
    comm = world()
    if comm.rank == 0:
        comm.Send(np.zeros(4), dest=1, tag=1)
    else:
        Request.Waitsome([comm.Irecv(np.zeros(4), source=0, tag=2)])


def _wait_never_sent():
    comm = world()
    comm.Irecv(np.zeros(4), source=0, tag=9).Wait()


MISMATCHES = [  # (body, ranks, eager limit, what the report says of it; None: no mismatch hint, but the buffering one)
    (_tag_mismatch, 2, None, "recv from group rank 0 (tag 2) on the world: rank 1 waits in it; rank 0 finished; rank "
                             "0's send to rank 1 has tag 1, not 2: no message matches; at "),
    (_tag_mismatch, 2, 0, "recv from group rank 0 (tag 2) on the world: rank 1 waits in it; rank 0's send to rank 1 "
                          "has tag 1, not 2: no message matches; at "),
    (_source_mismatch, 3, None,
     "recv from group rank 2 (any tag) on the world: rank 1 waits in it; rank 2 finished; the message pending for rank "
     "1 is from rank 0 (tag 0), not from rank 2: no message matches; at "),
    (_communicator_mismatch, 2, None, "recv from group rank 0 (any tag) on the world: rank 1 waits in it; rank 0 "
                                      "finished; rank 0's send to rank 1 (tag 0) is on a Dup of the world, not the "
                                      "world: no message matches; at "),
    (_sendrecv_tags, 2, 0, "send to group rank 1 (tag 1) on the world: rank 0 waits in it; rank 1's receive from rank "
                           "0 has tag 2, not 1: no message matches; at "),
    (_both_receive_first, 2, None,
     "recv from group rank 1 (any tag) on the world: rank 0 waits in it; no rank has sent to rank 0; at "),
    (_never_sent, 2, None,
     "recv from group rank 0 (any tag) on the world: rank 1 waits in it; rank 0 finished; no rank has "
     "sent to rank 1; at "),
    (_sends_first, 2, 0, "send to group rank 1 (tag 0) on the world: rank 0 waits in it; a message of 32 bytes; at "),
    # a Waitany or Waitsome says it as a Recv does (it said only which requests it waits for)
    (_waitany_never_sent, 2, None,
     "recv from group rank 0 (tag 9) | recv from group rank 0 (tag 9) on the world: rank 1 waits in it; no rank has "
     "sent to rank 1; at "),
    (_waitsome_tags, 2, None,
     "recv from group rank 0 (tag 2) on the world: rank 1 waits in it; rank 0 finished; rank 0's send to rank 1 has "
     "tag 1, not 2: no message matches; at "),
    (_wait_never_sent, 2, None, "recv from group rank 0 (tag 9) on the world: rank 1 waits in it; no rank has sent to "
                                "rank 1; at "),
]


@pytest.mark.parametrize("body, ranks, limit, said", MISMATCHES,
                         ids=[f"{m[0].__name__[1:]}-{'mpich' if m[2] is None else 'unbuffered'}" for m in MISMATCHES])
def test_a_deadlock_of_messages_that_do_not_match_names_what_differs(body, ranks, limit, said):
    """A receive that waits names the sends pending for its rank and what differs from what it takes (tag, source,
    communicator), or that no rank has sent to it, and the report advises checking them, not MPI buffering (which
    helps none of them); Sends that wait for receives posted later keep the buffering advice."""
    with pytest.raises(DeadlockError) as info:
        simulate(ranks, body, **({} if limit is None else {"eager_limit": limit}))
    text = unfold(str(info.value))
    assert said in text, text
    if "no message matches" in said:
        assert text.endswith(" | " + MISMATCH) and "buffering" not in text, text
    elif "a message of" in said:  # the genuine case: today's advice, and no mismatch
        assert text.endswith(" | " + sends_wait(0)) and "no message matches" not in text, text
    else:
        assert " | a " not in text and "no message matches" not in text, text


def test_skipped_collective_names_who_waits_and_who_finished():
    def body():
        comm = world()
        if comm.rank != 2:
            comm.Allreduce(np.ones(2), np.empty(2), "sum")

    with pytest.raises(DeadlockError) as info:
        simulate(4, body)
    text = unfold(str(info.value))
    assert "allreduce on the world (call 1): ranks 0,1,3 wait in it; rank 2 finished" in text
    assert "raised on simulated ranks 0,1,3 of 4" in info.value.__notes__[0]


def test_a_rank_that_exits_while_the_others_wait_is_a_deadlock_naming_it():
    """sys.exit() on one rank ends that rank, as it ends an MPI process, and the ranks left waiting for it
    deadlock. It used to stop every rank and raise SystemExit(0) from simulate(): `python prog.py` exited 0
    without a word (and without the program's next line) although three ranks had waited for the fourth."""
    from spmdsim import Layout, Mesh
    from spmdsim.runtime import collectives as C

    def body():
        mesh = Mesh(Layout((4,), ("mp",)))
        if mesh.rank == 1:
            raise SystemExit(0)
        return C.allreduce(mesh, np.ones(2), ("mp",))

    with pytest.raises(DeadlockError) as info:
        simulate(4, body)
    assert "ranks 0,2,3 wait in it; rank 1 exited (SystemExit(0))" in unfold(str(info.value))
    assert info.value.__notes__ == ["raised on simulated ranks 0,2,3 of 4"]
    assert info.value.simulated_ranks == (0, 2, 3)


def test_os_exit_on_one_rank_ends_that_rank_as_sys_exit_does():
    """os._exit(1) on rank 1 inside simulate() ended the whole process at once (exit 1, not a line: a notebook's
    kernel died); it now ends that rank as sys.exit does, the ranks left waiting naming it, and every rank's
    os._exit(3) is simulate()'s SystemExit(3)."""

    def body():
        if world().rank == 1:
            os._exit(1)
        return world().allreduce(1)

    with pytest.raises(DeadlockError) as info:
        simulate(4, body)
    assert "ranks 0,2,3 wait in it; rank 1 exited (os._exit(1))" in unfold(str(info.value))
    with pytest.raises(SystemExit) as info:
        simulate(2, lambda: os._exit(3))
    assert info.value.code == 3 and info.value.__notes__ == ["raised on every simulated rank"]


# Two simulations in two threads of one process: the first to end undid the os._exit swap while the other ran, so
# the other's rank 1, calling os._exit(3) after it, ended the process (exit 3, no line).
_OS_EXIT_IN_TWO_SIMULATIONS = """
import os, threading
from spmdsim.runtime.sim import DeadlockError, simulate, world
pythons, said = os._exit, []
first_runs, second_runs, first_ended = threading.Event(), threading.Event(), threading.Event()
def first_body():
    first_runs.set()
    second_runs.wait(60)  # (the second entered simulate() while this one runs)
def first():
    simulate(2, first_body)
    first_ended.set()
def second_body():
    second_runs.set()
    if world().rank == 1:
        first_ended.wait(60)
        os._exit(3)
    return world().allreduce(1)
def second():
    try:
        simulate(2, second_body)
    except DeadlockError as exc:
        said.append(" ".join(str(exc).split()))
one = threading.Thread(target=first)
one.start()
first_runs.wait(60)
two = threading.Thread(target=second)
two.start()
one.join(); two.join()
print(said, os._exit is pythons)
"""


def test_os_exit_after_another_threads_simulation_ended_still_ends_the_rank_alone():
    import subprocess

    done = subprocess.run(["timeout", "-k", "5", "120", sys.executable, "-c", _OS_EXIT_IN_TWO_SIMULATIONS],
                          capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "rank 1 exited (os._exit(3))" in done.stdout and done.stdout.rstrip().endswith("] True"), done.stdout


def test_an_exit_the_others_do_not_wait_for_is_raised_once_the_ranks_end():
    """Every rank exiting is the process exiting: simulate() raises the SystemExit, as one process would;
    codes that differ give the largest exit status, as mpiexec's, the others' collectives done first."""
    def body(code):
        comm = world()
        comm.Barrier()
        raise SystemExit(code(comm.rank))

    with pytest.raises(SystemExit) as info:
        simulate(4, body, lambda rank: 3)
    assert info.value.code == 3 and info.value.__notes__ == ["raised on every simulated rank"]
    with pytest.raises(SystemExit) as info:
        simulate(4, body, lambda rank: {1: 2, 2: 5, 3: 5}.get(rank))  # rank 0: sys.exit()
    assert info.value.code == 5 and info.value.simulated_ranks == (2, 3)
    assert info.value.__notes__ == ["raised on simulated ranks 2,3 of 4"]

    def some(rank):
        world().Barrier()
        if rank == 2:
            sys.exit("rank 2 is done")  # a message: status 1, as the interpreter exits
        return rank

    with pytest.raises(SystemExit, match="rank 2 is done") as info:
        simulate(4, lambda: some(world().rank))
    assert info.value.__notes__ == ["raised on simulated rank 2 of 4"]


# A collection started while sys._current_frames() holds the thread-list lock (its frame objects' allocation)
# that frees a threading.local takes that lock again: Python 3.11 deadlocks, the interpreter lock held
# (CPython gh-106883). Garbage of locals is left pending and the threshold set so the frames' allocation
# starts the collection; other threads run fresh frames, which it must make objects of.
_FRAMES_DURING_A_COLLECTION = """
import gc, sys, threading, time
from spmdsim.runtime.sim.report import current_frames
stop = threading.Event()
def nap():
    time.sleep(0.0002)
def loop():
    while not stop.is_set():
        nap()
for _ in range(2):
    threading.Thread(target=loop, daemon=True).start()
class Cycle:
    pass
for offset in (1, 2, 3) * 40:
    gc.disable()
    for _ in range(50):
        c = Cycle(); c.me = c; c.local = threading.local(); del c
    gc.set_threshold(gc.get_count()[0] + offset)
    gc.enable()
    current_frames()
    gc.set_threshold(700)
stop.set()
print("ok")
"""


def test_the_deadlock_reports_frames_survive_a_collection_that_frees_a_thread_local():
    import subprocess

    done = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-c", _FRAMES_DURING_A_COLLECTION],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", (done.returncode, done.stderr[-2000:])


def test_rank_elsewhere_is_named():
    def body():
        comm = world()
        sub = comm.Split(comm.rank % 2, comm.rank)
        if comm.rank == 3:
            sub.Barrier()  # rank 3 waits on its group while the world waits for it
        comm.Barrier()

    with pytest.raises(DeadlockError) as info:
        simulate(4, body)
    assert re.search(r"barrier on the world \(call 2\): ranks 0-2 wait in it; "
                     r"rank 3 is elsewhere, in barrier on the group of ranks 1,3", unfold(str(info.value)))


def test_mismatched_collective_names_both_calls():
    def body():
        comm = world()
        x = np.ones(3)
        if comm.rank == 1:
            comm.Allgather(x, np.empty(3 * comm.size))
        else:
            comm.Allreduce(x, np.empty(3), "sum")

    # Which pair meets first depends on the threads' timing; rank 1 is in it either way.
    with pytest.raises(RuntimeMismatchError, match=r"rank (0|2) calls allreduce float64 x3 sum but rank 1 calls "
                                                   r"allgather float64 x3|rank 1 calls allgather float64 x3 but "
                                                   r"rank (2|3) calls allreduce float64 x3 sum"):
        simulate(4, body)


@pytest.mark.parametrize("late", [0, 3])
def test_mismatch_is_found_whoever_arrives_last(late):
    """A member that differs only in its reduction op or dtype, arriving last, is still refused."""
    import time

    def body(op, dtype):
        comm = world()
        if comm.rank == late:
            time.sleep(0.2)
            op, dtype = "max", np.float32
        comm.Allreduce(IN_PLACE, np.ones(4, dtype), op)

    with pytest.raises(RuntimeMismatchError, match=rf"rank {late} calls allreduce float32 x4 max"):
        simulate(4, body, "sum", np.float64)


def test_exception_on_one_rank_ends_all_and_names_it():
    def body():
        comm = world()
        comm.Barrier()
        if comm.rank == 5:
            raise ValueError("rank five broke")
        comm.Barrier()
        comm.Barrier()

    with pytest.raises(ValueError, match="rank five broke") as info:
        simulate(8, body)
    assert info.value.__notes__ == ["raised on simulated rank 5 of 8"]


def test_an_error_every_rank_raises_after_its_collective_is_every_ranks():
    """As MPI ranks do, a rank whose collective can still complete goes on after another rank failed.

    Ranks 0 and 1 raise after their pair's Allreduce while ranks 2 and 3 are still on their way to
    theirs, where they used to be stopped: the error was reported as ranks 0,1's alone (exit 1 from
    --ranks N, where MPI says every rank's, exit 2).
    """
    import time

    from spmdsim.errors import SpmdsimError

    def body():
        comm = world()
        pair = comm.Split(comm.rank // 2, comm.rank)
        if comm.rank >= 2:
            time.sleep(0.2)
        total = np.empty(1)
        pair.Allreduce(np.ones(1), total, "sum")
        raise SpmdsimError(f"{int(total[0])} labels outside the range")

    with pytest.raises(SpmdsimError, match="2 labels outside the range") as info:
        simulate(4, body)
    assert info.value.__notes__ == ["raised on every simulated rank"]


def test_a_rank_waiting_on_a_failed_one_still_stops():
    def body():
        comm = world()
        pair = comm.Split(comm.rank // 2, comm.rank)
        if comm.rank == 0:
            raise ValueError("rank zero broke")
        pair.Barrier()  # rank 1 waits for rank 0, which is gone; ranks 2 and 3 complete theirs
        comm.Barrier()  # and then wait for ranks 0 and 1

    with pytest.raises(ValueError, match="rank zero broke") as info:
        simulate(4, body)
    assert info.value.__notes__ == ["raised on simulated rank 0 of 4"]


def test_ranks_that_never_need_the_failed_one_again_still_stop(monkeypatch):
    """Ranks going on after a failure do so for GO_ON_S at most, as MPI's guard aborts the job by then:
    a pair that loops on its own collectives forever (never again needing rank 0) stops too. GO_ON_S is
    shortened here (3 s of two ranks spinning on Barrier, 2 CPU-s a run): the pair stops by it all the same."""
    import threading

    from spmdsim.runtime.sim import engine

    monkeypatch.setattr(engine, "GO_ON_S", 0.2)

    def body():
        comm = world()
        pair = comm.Split(comm.rank // 2, comm.rank)
        if comm.rank == 0:
            raise ValueError("rank zero broke")
        while comm.rank >= 2:
            pair.Barrier()
        pair.Barrier()

    caught = []
    runner = threading.Thread(target=lambda: caught.append(pytest.raises(ValueError, simulate, 4, body)))
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "ranks 2 and 3 went on past the failure for a minute"
    assert caught and "rank zero broke" in str(caught[0].value)


def test_layout_that_does_not_fit_fails_before_any_collective():
    from spmdsim.runtime import Mesh

    def body():
        return Mesh(spmdsim.Layout((2, 4), ("dp", "mp")))

    with pytest.raises(RuntimeMismatchError, match=r"needs 8 ranks but the communicator has 6") as info:
        simulate(6, body)
    assert info.value.__notes__ == ["raised on every simulated rank"]
    # and how to get 8 (said for a 1-rank run only); a sub-communicator's size is the program's: no hint
    assert str(info.value).endswith("has 6 (simulate 8 ranks with `--ranks 8` / spmdsim.simulate(8, main), or launch "
                                    "them with `mpiexec -n 8 ...`)")

    def half():
        world = spmdsim.world()
        return Mesh(spmdsim.Layout((4,), ("dp",)), world.Split(world.Get_rank() % 2, 0))

    with pytest.raises(RuntimeMismatchError, match=r"^device matrix \(4,\) needs 4 ranks but the communicator has 2\n"):
        simulate(4, half)


def test_each_rank_traces_only_its_own_calls():
    from spmdsim.runtime import Mesh, allreduce, collect_trace

    def body():
        mesh = Mesh(spmdsim.Layout((4,), ("mp",)))
        with collect_trace() as trace:
            for _ in range(mesh.rank + 1):  # rank r makes r + 1 calls on its own group of one
                allreduce(mesh, np.ones(4), (), label="mine")
            allreduce(mesh, np.ones(4, np.float32), "mp")
        return [(e.op, e.group_size, e.bytes_sent) for e in trace.entries]

    for r, entries in enumerate(simulate(4, body)):
        assert entries == [("allreduce", 1, 0)] * (r + 1) + [("allreduce", 4, 24)]


def test_world_outside_simulate_is_mpi_and_guards_are_harmless():
    from spmdsim.runtime import abort_on_error, install_excepthook

    def body():
        before = sys.excepthook
        install_excepthook()
        with pytest.raises(KeyError):
            with abort_on_error():
                raise KeyError("passes through")
        return sys.excepthook is before

    assert simulate(2, body) == [True, True]
    from mpi4py import MPI

    assert world() is MPI.COMM_WORLD


def test_simulate_refuses_bad_counts_and_nesting():
    with pytest.raises(spmdsim.SpmdsimError, match="rank count 0 must be an integer"):
        simulate(0, lambda: None)
    with pytest.raises(spmdsim.SpmdsimError, match="already running"):
        simulate(1, lambda: simulate(1, lambda: None))
    with pytest.raises(spmdsim.SpmdsimError, match=r"^simulate: dry_run 'no' must be True or False$"):
        simulate(8, lambda: None, dry_run="no")  # a truthy string ran a dry run
    # A notebook's simulate(8, main()): main ran once in the cell, and "simulate: 0 is not callable" followed
    with pytest.raises(spmdsim.SpmdsimError) as info:
        simulate(8, 0)
    assert str(info.value) == "simulate: fn 0 is not callable: expected the function (main, not main())"


@pytest.mark.parametrize("launcher_rank, said", [(0, 1), (1, 0)])
def test_simulate_under_mpiexec_warns_once_per_job(monkeypatch, recwarn, launcher_rank, said):
    """simulate(4, main) in a program started with mpiexec -n 2 ran all 4 ranks in each process, without a word
    (--ranks there is refused): launcher rank 0 now warns, and each process still returns its own list."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", str(launcher_rank))
    monkeypatch.setenv("PMI_SIZE", "2")
    assert simulate(4, lambda: world().allreduce(1)) == [4] * 4
    assert [str(w.message) for w in recwarn if w.category is RuntimeWarning] == [
        "simulate(4, ...) runs all 4 simulated ranks in each of the 2 processes mpiexec started (2 x 4 ranks, each "
        "process its own list); run the program without mpiexec, or let mpiexec -n 4 start the ranks and call fn() "
        "without simulate"] * said


@pytest.mark.parametrize("dry_run", [False, True])
def test_simulate_refuses_a_function_its_arguments_do_not_fit_before_any_rank_starts(dry_run):
    # A new user's fn(rank) (as multiprocessing and torch.multiprocessing.spawn pass it) raised TypeError on every
    # rank, with each rank's traceback through spmdsim's frames in a notebook.
    started = []

    def by_rank(rank):
        started.append(rank)

    with pytest.raises(spmdsim.SpmdsimError) as refused:
        simulate(4, by_rank, dry_run=dry_run)
    assert str(refused.value) == (
        "simulate: by_rank() cannot be called as by_rank(): missing a required argument: 'rank'; simulate(n, fn, "
        "*args, **kwargs) calls fn(*args, **kwargs) on every rank, and spmdsim.world().Get_rank() is its rank")
    with pytest.raises(spmdsim.SpmdsimError, match=r"^simulate: <lambda>\(\) cannot be called as "
                                                   r"<lambda>\(1, b=2\): too many positional arguments; "):
        simulate(2, lambda: None, 1, b=2, dry_run=dry_run)
    assert started == []
    assert simulate(2, lambda a, *more, b: (a, more, b), 1, 2, b=3, dry_run=dry_run) == [(1, (2,), 3)] * 2
    assert simulate(2, max, 1, 2, dry_run=dry_run) == [2, 2]  # a builtin that tells no signature: called

    @functools.wraps(by_rank)
    def given_its_rank():  # a wrapper that gives the function its rank: bound as the wrapper, not as by_rank
        return by_rank(spmdsim.world().Get_rank())

    simulate(2, given_its_rank, dry_run=dry_run)
    assert sorted(started) == ([0] if dry_run else [0, 1])  # a dry run: rank 0 runs for all


def test_64_ranks_allreduce_and_split():
    def body():
        comm = world()
        rows = comm.Split(comm.rank // 8, comm.rank)
        y = np.empty(8)
        rows.Allreduce(np.full(8, float(comm.rank)), y, "sum")
        return y[0], comm.allreduce(1)

    results = simulate(64, body)
    assert [r[0] for r in results] == [sum(range(r // 8 * 8, r // 8 * 8 + 8)) for r in range(64)]
    assert {r[1] for r in results} == {64}


def test_bad_buffers_raise_shape_errors():
    def body():
        world().Allgather(np.ones(3), np.empty(2))

    with pytest.raises(ShapeError, match="smaller than 2 x 3"):
        simulate(2, body)


def test_readme_library_example_runs_on_8_simulated_ranks(tmp_path):
    """README's library example, as README quotes it, with `--ranks 8` (one process, no launcher)."""
    import subprocess

    from testkit import readme_library_example

    (tmp_path / "my_matmul.py").write_text(readme_library_example())
    run = subprocess.run([sys.executable, "my_matmul.py", "--ranks", "8"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "rank 1 (0, 1): x[0:32, 24:48], w[24:48, 0:32], y[0:32, 0:32]" in lines
    at = lines.index("ranks 0-7:")  # every rank's verdict and counts are the same: one folded entry
    assert lines[at + 1].startswith("  check passed: ") and lines[-1] == "  {'allreduce': 1}"


class _Picky(Exception):
    def __init__(self, a, b):  # not rebuilt from its args alone
        super().__init__(f"{a}/{b}")


class _Odd:
    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        raise _Picky(self.v, other.v)


def test_a_reduction_error_that_cannot_be_rebuilt_still_reaches_every_rank():
    def body():
        try:
            world().allreduce(_Odd(world().rank))
        except Exception as exc:  # noqa: BLE001
            return type(exc).__name__, str(exc)

    assert simulate(3, body) == [("SimulationError", "_Picky: 0/1")] * 3


def test_a_half_imported_mpi4py_is_not_read_for_its_constants(monkeypatch):
    """While one thread imports mpi4py.MPI its module sits in sys.modules before its names exist; a
    simulated rank in a collective then read MPI.IN_PLACE from it and failed (an AttributeError from a
    'partially initialized module', seen once in CI). Until the import finishes it is not there."""
    import sys
    import types
    from importlib.machinery import ModuleSpec

    from spmdsim.runtime.sim import _mpi

    half = types.ModuleType("mpi4py.MPI")
    half.__spec__ = ModuleSpec("mpi4py.MPI", None)
    half.__spec__._initializing = True
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", half)
    assert _mpi.mpi_module() is None
    assert _mpi.in_place(object()) is False and _mpi.special("ANY_SOURCE") == _mpi._DEFAULTS["ANY_SOURCE"]
    half.__spec__._initializing = False
    half.IN_PLACE = marker = object()
    assert _mpi.mpi_module() is half and _mpi.in_place(marker)


class _RefusingOp:
    """A user reduction whose function raises (as MPI.Op.Create's does when the user's function raises)."""

    def Reduce_local(self, inbuf, inoutbuf):  # noqa: N802 - mpi4py's name
        raise ValueError("this op refuses")


@pytest.mark.parametrize("count", [1, 6])
def test_a_buffer_reduction_that_raises_raises_on_every_rank(count):
    """The fold of an Allreduce raises on every member, fewer items than members or more: each rank
    folded its own share of the items, and a rank whose share was empty returned a buffer never written."""
    from spmdsim.runtime.sim._reductions import Reduction
    from spmdsim.runtime.sim.bodies import all_reduce

    red = Reduction("user op", None, None, _RefusingOp())

    def body():
        got = np.full(count, -1.0)
        try:
            all_reduce(world(), np.ones(count), got, red, datatype="d")
        except ValueError as exc:
            return str(exc)
        return got.tolist()

    assert simulate(4, body) == ["this op refuses"] * 4


def test_a_gather_the_root_refuses_completes_on_the_others():
    """A root whose receive blocks do not fit raises; the others' Gather completes, as under MPI, and
    all go on (the others waited for the root to finish reading, and the root never did: a deadlock)."""
    def body():
        comm = world()
        got = np.zeros(3 * comm.size) if comm.rank == 0 else None
        try:
            comm.Gather(np.full(2, float(comm.rank)), got, root=0)
            raised = None
        except ShapeError as exc:
            raised = str(exc)
        comm.Barrier()
        return raised

    assert simulate(3, body) == ["Gather: a block of 2 x float64 is sent where 3 x float64 are received",
                                 None, None]


def test_a_ranks_error_keeps_its_type_where_python_has_no_add_note():
    """Python 3.10 has no BaseException.add_note: the note goes on the same __notes__ list and the rank's own
    exception is raised (not a SimulationError wrapping it), so its type, message and simulated_ranks, and
    the launcher's exit code, are the same on every Python."""
    from spmdsim.runtime.sim.run import _add_note

    class NoAddNote(ValueError):  # as an exception is on 3.10
        @property
        def add_note(self):
            raise AttributeError("add_note")

    exc = NoAddNote("bad")
    _add_note(exc, "raised on every simulated rank")
    _add_note(exc, "and again")
    assert exc.__notes__ == ["raised on every simulated rank", "and again"]

    def body():
        raise NoAddNote("bad size")

    with pytest.raises(NoAddNote, match="^bad size") as info:
        simulate(3, body)
    assert info.value.__notes__ == ["raised on every simulated rank"] and info.value.simulated_ranks == (0, 1, 2)


def test_a_rank_making_a_mesh_group_alone_is_named_so():
    """Rank 0 alone redistributes (its mesh makes the 'tp' group at that first use) while the others gather:
    the report names the group being made, not a bare 'split' the program never wrote."""
    from spmdsim import DTensor, Layout, Mesh

    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_global(mesh, np.ones((4, 4)), mesh.layout("tp", None))
        if mesh.rank == 0:
            x = x.redistribute(mesh.layout(None, "tp"))
        return x.gather()

    with pytest.raises(RuntimeMismatchError) as caught:
        simulate(4, main)
    assert re.search(r"collectives diverge on the world \(call 3 on that communicator\): rank 0 calls split "
                     r"\(the mesh's group over \('tp',\), made at its first use\) but rank [1-3] calls allgather "
                     r"float64 x8; at test_sim_engine\.py:\d+ \(rank 0\)", unfold(str(caught.value)))


def test_a_mesh_group_or_split_of_every_rank_in_order_is_named_for_what_made_it_not_the_world():
    """The thread engine's own split and a mesh's group over axes that keep every rank of the world in its order
    were named 'the world' (in reports and repr), whose calls they do not count ('allreduce on the world (call 2)'
    for the group's second call); the emulator names such a Split 'a Split of the world'. Now these are named for
    what made them; a group of fewer ranks keeps its ranks' name."""
    from spmdsim import Layout, Mesh
    from spmdsim.runtime.sim.thread_engine import THREADS

    def names():
        mesh = Mesh(Layout((2, 1), ("dp", "tp")))
        return [repr(mesh.group("dp")), repr(mesh.group("tp")), repr(THREADS.split(mesh.comm, 0, mesh.rank))]

    assert simulate(2, names)[1] == ["<simulated group member 1 of 2 (the mesh's group over ('dp',) of the world)>",
                                     "<simulated group member 0 of 1 (the group of rank 1)>",
                                     "<simulated group member 1 of 2 (a split of the world)>"]

    def main():
        dp = Mesh(Layout((2, 1), ("dp", "tp"))).group("dp")
        THREADS.all_reduce(dp, np.ones(2), np.ones(2), "sum", None)  # call 1 on that group
        if spmdsim.world().rank == 0:
            THREADS.all_reduce(dp, np.ones(2), np.ones(2), "sum", None)
        else:
            THREADS.barrier(dp, None)

    with pytest.raises(RuntimeMismatchError) as caught:
        simulate(2, main)
    assert unfold(str(caught.value)).startswith(
        "collectives diverge on the mesh's group over ('dp',) of the world (call 2 on that communicator): rank 0 "
        "calls allreduce float64 x2 sum but rank 1 calls barrier")
