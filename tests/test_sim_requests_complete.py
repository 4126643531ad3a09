"""A nonblocking receive lands in its buffer when its request completes, and a request never completed is a warning.

MPI forbids reading an Irecv's buffer before the receive completes (Wait, a Test that returns true, ...): on one
node MPICH often has the message there already, a cluster's rendezvous receive may not. The emulator lands it
only at completion, every run, so that a program reading early reads what the buffer held before. A request the
program never completes (no Wait, Test or Free) is a warning when the ranks end, as a message never received is.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spmdsim.tools.cli.main import main
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate


def _run(body, n=2):
    with swapped():
        return simulate(n, body)


def test_an_irecv_buffer_holds_its_old_contents_until_the_receive_completes():
    # Was: the message landed when matched (a send pending at Irecv, or arriving after it), so reading the buffer
    # before Wait showed the message, and a program with that bug passed.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            comm.Send(np.full(4, 1.0), 1, 1)  # eager: pending when rank 1 posts its Irecv
            comm.Barrier()
            comm.Send(np.full(4, 2.0), 1, 2)  # arrives after rank 1 posted (Test)
            big = np.full(4096, 3.0)  # past the eager limit: the sender's own buffer until matched
            req = comm.Isend(big, 1, 3)
            comm.Barrier()
            req.Wait()
            big[:] = -1.0  # reused once its send completed: the receiver must still get 3.0
            comm.Barrier()
            comm.Send(np.full(2, 4.0), 1, 4)
            comm.Send(np.full(2, 5.0), 1, 5)
            comm.send({"six": 6}, 1, 6)
            comm.Send(np.full(2, 7.0), 1, 7)
            comm.Send(np.full(2, 8.0), 1, 8)
            comm.Barrier()
            return None
        out = []
        a = np.zeros(4)
        req = comm.Irecv(a, 0, 1)
        out.append(a[0])  # 0: before Wait
        req.Wait()
        out.append(a[0])  # 1
        comm.Barrier()
        b = np.zeros(4)
        req = comm.Irecv(b, 0, 2)
        while b[0] == 0 and not req.Test():  # a loop that reads the buffer for its answer: the Test ends it
            pass
        out.append(b[0])  # 2
        c = np.zeros(4096)
        req = comm.Irecv(c, 0, 3)
        comm.Barrier()
        comm.Barrier()
        out.append(c[0])  # 0: matched, the sender's Wait returned and it reused its buffer
        MPI.Request.Waitall([req])
        out.append(c[0])  # 3
        d, e, g, h = np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2)
        reqs = [comm.Irecv(d, 0, 4), comm.Irecv(e, 0, 5)]
        raw = bytearray(64)
        obj = comm.irecv(raw, 0, 6)  # an object into the program's buffer
        msg = comm.Mprobe(0, 7)
        matched = msg.Irecv(g)
        persistent = comm.Recv_init(h, 0, 8)
        persistent.Start()
        comm.Barrier()
        out += [d[0], e[0], bytes(raw[:8]) == bytes(8), g[0], h[0]]  # every one the old contents
        out.append(MPI.Request.Waitany(reqs))  # one of the two lands, the other stays as it was
        out.append(sorted([d[0], e[0]]))
        out += [MPI.Request.Get_status(reqs[1]), e[0]]  # complete: MPI lets the program read it
        reqs[1].Wait()
        out += [obj.wait(), bytes(raw[:8]) != bytes(8), matched.Wait() and g[0], persistent.Wait() and h[0]]
        return out

    got = _run(body)[1]
    assert got == [0.0, 1.0, 2.0, 0.0, 3.0, 0.0, 0.0, True, 0.0, 0.0, 0, [0.0, 4.0], True, 5.0, {"six": 6}, True,
                   7.0, 8.0]


def test_a_freed_irecv_and_the_blocking_receives_land_as_the_message_arrives():
    # A freed receive still completes (MPI_Request_free): its message lands when it arrives. Recv, Sendrecv and
    # a receive the program already waits for never hold one.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        other = 1 - comm.rank
        if comm.rank == 0:
            comm.Send(np.full(2, 9.0), 1, 1)
            comm.Barrier()
            buf = np.zeros(2)
            comm.Sendrecv(np.full(2, 1.0), 1, 2, buf, 1, 2)
            return buf[0]
        a = np.zeros(2)
        comm.Irecv(a, 0, 1).Free()
        comm.Barrier()
        buf = np.zeros(2)
        comm.Sendrecv(np.full(2, 2.0), other, 2, buf, other, 2)
        return [a[0], buf[0]]

    assert _run(body) == [2.0, [9.0, 1.0]]


def test_requests_never_completed_are_named_when_the_ranks_end():
    # Was: no word (MPICH's MPI_Finalize says "Builtin communicator 44000000 has pending 1 references").
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            comm.Isend(np.ones(2), 1, 3)  # matched, never waited (line A)
            comm.Isend(np.ones(2), 1, 4).Wait()
            comm.isend("x", 1, 5).Free()  # freed: complete as far as the program goes
            comm.Barrier()
        else:
            comm.Irecv(np.zeros(2), 0, 3)  # (line B)
            req = comm.Irecv(np.zeros(2), 0, 4)
            while not req.Test():
                pass
            MPI.Request.Waitall([comm.irecv(source=0, tag=5)])
            comm.Barrier()
            comm.Irecv(np.zeros(1), MPI.ANY_SOURCE, 9)  # never matched either (line C)
            persistent = comm.Recv_init(np.zeros(1), 0, 11)
            persistent.Start()  # (line D)
        return None

    done = _run(body)
    at = {mark: f"{Path(__file__).name}:{i}" for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
          for mark in "ABCD" if line.endswith(f"(line {mark})")}
    assert done.uncompleted == (
        f"an Isend of rank 0 to rank 1 (tag 3) at {at['A']} was never completed (no Wait or Test)",
        f"an Irecv of rank 1 from rank 0 (tag 3) at {at['B']} was never completed (no Wait or Test: the message it "
        "matched never reached its buffer)",
        f"an Irecv of rank 1 from any rank (tag 9) at {at['C']} was never completed (no Wait or Test)",
        f"a Recv_init (started) of rank 1 from rank 0 (tag 11) at {at['D']} was never completed (no Wait or Test)")
    assert done.unreceived == ("a receive of rank 1 from any rank (tag 9) was never matched",
                               "a receive of rank 1 from rank 0 (tag 11) was never matched")


def test_mpirun_warns_of_requests_never_completed(tmp_path, capsys):
    prog = tmp_path / "nowait.py"
    prog.write_text("import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                    "if comm.rank == 0:\n    comm.Isend(np.ones(4), dest=1, tag=3)\n"
                    "elif comm.rank == 1:\n    comm.Irecv(np.zeros(4), source=0, tag=3)\n"
                    "elif comm.rank == 2:\n    comm.issend('x', 0, 5)\n"
                    "else:\n    r = comm.Recv_init(np.zeros(4), source=1)\n    MPI.Prequest.Startall([r])\n"
                    "print(comm.rank, 'done')\n")
    code = main(["mpirun", "-n", "4", "python", str(prog)])
    out, err = capsys.readouterr()
    assert code == 0 and sorted(out.splitlines()) == [f"{r} done" for r in range(4)]
    assert err.splitlines() == [
        "spmdsim mpirun: warning: when the ranks ended, a message from rank 2 to rank 0 (tag 5, 16 bytes) was never "
        "received; a receive of rank 3 from rank 1 (tag any) was never matched",
        "spmdsim mpirun: warning: when the ranks ended, an Isend of rank 0 to rank 1 (tag 3) at nowait.py:5 was never "
        "completed (no Wait or Test); an Irecv of rank 1 from rank 0 (tag 3) at nowait.py:7 was never completed (no "
        "Wait or Test: the message it matched never reached its buffer); an issend of rank 2 to rank 0 (tag 5) at "
        "nowait.py:9 was never completed (no Wait or Test); and 1 more"]


def test_the_warnings_list_by_rank_then_in_post_order_every_run():
    # Was: the never-received list went communicator by communicator in a WeakSet's order (by the groups'
    # addresses), which changed from run to run: here the six communicators' lines came in any order.
    from mpi4py import MPI

    def body():
        world = MPI.COMM_WORLD
        comms = [world.Dup() for _ in range(6)]
        if world.rank == 1:
            for i, comm in enumerate(reversed(comms)):
                comm.Irecv(np.zeros(1), 0, 20 + i).Free()  # freed: only the receive's line
        else:
            for i, comm in enumerate(comms[::2] + comms[1::2]):
                comm.send(i, 1, i)
        world.Barrier()

    done = _run(body)  # each on a Dup of the world (was: 'on the world', which they are not)
    assert done.unreceived == tuple(
        [f"a message from rank 0 to rank 1 (tag {i}, 5 bytes) on a Dup of the world was never received"
         for i in range(6)]
        + [f"a receive of rank 1 from rank 0 (tag {20 + i}) on a Dup of the world was never matched"
           for i in range(6)])


def test_nonblocking_collectives_and_partitioned_requests_never_completed_are_named():
    # Was: no word for them (a nonblocking collective's request is complete at once here; MPI still requires
    # the program to complete it, and MPICH's MPI_Finalize reports the pending references).
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        comm.Ibarrier()  # (line E)
        comm.Iallreduce(np.ones(1), np.zeros(1)).Wait()
        req = comm.Ibcast(np.ones(2), root=0)
        while not req.Test():  # completed (once every rank posted it): not named
            pass
        out = np.zeros(1)
        if comm.rank == 1:
            comm.Iallreduce(np.ones(1), out, op=MPI.MAX)  # (line F)
        else:
            comm.Iallreduce(np.ones(1), out, op=MPI.MAX).Free()
        persistent = comm.Allreduce_init(np.ones(1), np.zeros(1))
        persistent.Start()  # (line G)
        comm.Idup()[0].Free()  # (line H)
        buf = np.zeros(4)
        if comm.rank == 0:
            part = comm.Psend_init(np.ones(4), 2, 1, 7)
            part.Start()  # (line I)
            part.Pready_range(0, 1)
        else:
            part = comm.Precv_init(buf, 2, 0, 7)
            part.Start()
            part.Wait()
        return out[0]

    done = _run(body)
    at = {mark: f"{Path(__file__).name}:{i}" for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
          for mark in "EFGHI" if line.endswith(f"(line {mark})")}
    assert list(done) == [1.0, 0.0]  # a collective's result lands when completed or freed: rank 1's never did
    assert done.uncompleted == (
        f"an Ibarrier of rank 0 at {at['E']} was never completed (no Wait or Test)",
        f"an Allreduce_init (started) of rank 0 at {at['G']} was never completed (no Wait or Test: its result "
        "never reached its receive buffer)",
        f"an Idup of rank 0 at {at['H']} was never completed (no Wait or Test)",
        f"a Psend_init (started) of rank 0 to rank 1 (tag 7) at {at['I']} was never completed (no Wait or Test)",
        f"an Ibarrier of rank 1 at {at['E']} was never completed (no Wait or Test)",
        f"an Iallreduce of rank 1 at {at['F']} was never completed (no Wait or Test: its result never reached its "
        "receive buffer)",
        f"an Allreduce_init (started) of rank 1 at {at['G']} was never completed (no Wait or Test: its result "
        "never reached its receive buffer)",
        f"an Idup of rank 1 at {at['H']} was never completed (no Wait or Test)")


def test_a_send_buffer_written_before_the_send_completes_is_named():
    # MPI: "the sender should not modify any part of the send buffer after a nonblocking send operation is called,
    # until the send completes". Was: no word, and a small message (copied at the Isend, as MPICH's eager one) or
    # one whose receive was posted arrived as it was, so the bug passed every run.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            for tag in (1, 2, 3, 4, 4, 6, 7):
                comm.Recv(np.zeros(40000), 0, tag)
            comm.Sendrecv(np.zeros(8), 0, 9, np.zeros(8), 0, 8)
            return None
        small, big, sync, legal = np.ones(4), np.ones(40000), np.ones(4), np.ones(4)
        reqs = [comm.Isend(small, 1, 1)]  # (line J)
        small[0] = 2.0
        reqs.append(comm.Isend(big, 1, 2))  # past CHECK_BYTES: sampled (line K)
        big[20000:] = 3.0
        reqs.append(comm.Issend(sync, 1, 3))
        reqs[-1].Wait()
        sync[:] = 4.0  # after its Wait: right
        persistent = comm.Send_init(legal, 1, 4)
        persistent.Start()  # (line L)
        legal[1] = 5.0
        persistent.Wait()  # (line M)
        persistent.Start()  # the buffer's contents when started are sent: right
        persistent.Wait()
        persistent.Free()
        kept = np.ones(4)
        comm.Isend(kept, 1, 6).Free()
        kept[0] = 6.0  # freed: MPI forbids it all the same, but the program alone knows when the send is done
        vector = MPI.DOUBLE.Create_vector(4, 1, 2).Commit()
        strided = np.ones(8)
        req = comm.Isend([strided, 1, vector], 1, 7)  # (line N)
        strided[1] = 7.0  # between the vector's items: no part of the message
        strided[2] = 7.0
        req.Wait()
        vector.Free()
        pair = np.ones(8)
        both = comm.Isendrecv(pair, 1, 8, np.zeros(8), 1, 9)  # (line O)
        pair[7] = 8.0
        MPI.Request.Waitall(reqs[:2])  # (line P)
        while not both.Test():  # (line Q)
            pass
        return None

    done = _run(body)
    at = {mark: f"{Path(__file__).name}:{i}" for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
          for mark in "JKLMNOPQ" if line.endswith(f"(line {mark})")}
    rule = "MPI forbids changing a send buffer until then; the receiver may get the old contents, the new or a mix"
    assert done.rewritten == (
        f"rank 0 wrote into the buffer of its Isend to rank 1 (tag 1) at {at['J']} before the send completed "
        f"(Waitall at {at['P']}): {rule}",
        f"rank 0 wrote into the buffer of its Isend to rank 1 (tag 2) at {at['K']} before the send completed "
        f"(Waitall at {at['P']}): {rule}",
        f"rank 0 wrote into the buffer of its Send_init (started) to rank 1 (tag 4) at {at['L']} before the send "
        f"completed (Wait at {at['M']}): {rule}",
        f"rank 0 wrote into the buffer of its Isend to rank 1 (tag 7) at {at['N']} before the send completed "
        f"(Wait at {at['N'][:-2]}{int(at['N'][-2:]) + 3}): {rule}",
        f"rank 0 wrote into the buffer of its Isendrecv to rank 1 (tag 8) at {at['O']} before the send completed "
        f"(Test at {at['Q']}): {rule}")


def test_a_nonblocking_collective_lands_its_result_when_the_request_completes():
    # Was: posting ran the collective into the receive buffer, so a program reading it before Wait always saw the
    # whole result, where MPI leaves it undefined until completion (MPICH's large messages land later).
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        me = comm.rank
        out = []
        a = np.zeros(2)
        req = comm.Iallreduce(np.ones(2), a)
        out.append(a[0])  # 0: before Wait
        req.Wait()
        out.append(a[0])  # 2
        b = np.full(2, 5.0 + me)  # in place: its own data until completed
        req = comm.Iallreduce(MPI.IN_PLACE, b)
        out.append(b[0])
        while not req.Test():
            pass
        out.append(b[0])  # 11
        c, d = np.full(3, -1.0), np.zeros(4)  # the root's Ibcast sends; a gather fills every block but its own
        reqs = [comm.Ibcast(c if me else np.arange(3.0), root=0), comm.Iallgather(np.full(2, 1.0 + me), d)]
        out += [c[2], list(d)]
        MPI.Request.Waitall(reqs)
        out += [c[2], list(d)]
        e = np.zeros(2)
        req = comm.Ialltoall(np.array([10.0 + me, 20.0 + me]), e)
        copy = MPI.Request(req)  # mpi4py's copy of the handle: completing it completes the operation
        out.append(list(e))
        while not MPI.Request.Testall([copy]):  # True once every rank posted it
            pass
        out += [True, list(e)]
        persistent = comm.Allreduce_init(np.full(1, 1.0 + me), f := np.zeros(1))
        for _ in range(2):
            persistent.Start()
            out.append(f[0])  # 0, then 3 (the first's)
            MPI.Prequest.Waitall([persistent])
            out.append(f[0])  # 3
        persistent.Free()
        g = np.zeros(1)
        comm.Iexscan(np.ones(1), g).Free()  # freed: it lands once every rank posted it (MPI forbids freeing it;
        comm.Barrier()  # MPICH lands it): by this barrier's end
        h = np.zeros(1)
        req = comm.Iscan(np.ones(1), h)
        out += [g[0], h[0]]
        while not req.Get_status():  # True once every rank posted it
            pass
        out += [True, h[0]]
        req.Wait()
        cart = comm.Create_cart([2], [True])
        k = np.zeros(2)
        req = cart.Ineighbor_allgather(np.full(1, 7.0 + me), k)
        out.append(list(k))
        req.Wait()
        out.append(list(k))
        return out

    assert _run(body) == [
        [0.0, 2.0, 5.0, 11.0, -1.0, [0.0] * 4, -1.0, [1.0, 1.0, 2.0, 2.0], [0.0, 0.0], True, [10.0, 11.0],
         0.0, 3.0, 3.0, 3.0, 0.0, 0.0, True, 1.0, [0.0, 0.0], [8.0, 8.0]],
        [0.0, 2.0, 6.0, 11.0, -1.0, [0.0] * 4, 2.0, [1.0, 1.0, 2.0, 2.0], [0.0, 0.0], True, [20.0, 21.0],
         0.0, 3.0, 3.0, 3.0, 1.0, 0.0, True, 2.0, [0.0, 0.0], [7.0, 7.0]]]


def test_the_warnings_name_a_dup_of_the_world_as_one():
    # Was: 'on the world' for a Dup of the world (and for a Dup of that, or a window made on it).
    from mpi4py import MPI

    def body():
        world = MPI.COMM_WORLD
        dup, half = world.Dup(), world.Split(world.rank % 2, 0)
        again, win = dup.Dup(), MPI.Win.Create(np.zeros(1), comm=dup)
        for tag, comm in enumerate((world, dup, again)):
            if world.rank == 0:
                comm.send(None, 1, tag)
        text = [repr(dup), repr(again), repr(win), repr(half.Dup())]
        win.Free()
        return text

    done = _run(body, 3)
    assert done[0] == ["<simulated Intracomm rank 0 of 3 (a Dup of the world)>",
                       "<simulated Intracomm rank 0 of 3 (a Dup of a Dup of the world)>",
                       "<simulated Win rank 0 of 3 (a Dup of the world)>",
                       "<simulated Intracomm rank 0 of 2 (a Dup of the group of ranks 0,2)>"]
    assert done.unreceived == tuple(f"a message from rank 0 to rank 1 (tag {tag}, 4 bytes){where} was never received"
                                    for tag, where in enumerate(("", " on a Dup of the world",
                                                                 " on a Dup of a Dup of the world")))


def test_request_based_rma_never_completed_is_named():
    # Was: no word for an Rput, Rget, Raccumulate or Rget_accumulate never completed (their requests were not noted).
    from mpi4py import MPI

    def body():
        world = MPI.COMM_WORLD
        got = np.zeros(1)
        wins = [MPI.Win.Create(np.zeros(2), comm=world),  # one on the world, one on each pair
                MPI.Win.Create(np.zeros(2), comm=world.Split(world.rank // 2, 0))]
        win = wins[world.rank // 2]
        for w in wins:
            w.Fence()
        if world.rank in (0, 2):
            reqs = [win.Rput(np.ones(1), 1), win.Rget(got, 1),  # (line R)
                    win.Raccumulate(np.ones(1), 1, op=MPI.SUM), win.Rget_accumulate(np.ones(1), got, 1)]  # (line S)
            reqs[0].Wait()
            MPI.Request.Waitall(reqs[2:] if world.rank == 0 else reqs[3:])
        for w in wins:
            w.Fence()
            w.Free()

    done = _run(body, 4)
    at = {mark: f"{Path(__file__).name}:{i}" for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
          for mark in "RS" if line.endswith(f"(line {mark})")}
    assert done.uncompleted == (
        f"an Rget of rank 0 at {at['R']} was never completed (no Wait or Test)",
        f"an Rget of group rank 0 (world rank 2) on the group of ranks 2,3 at {at['R']} was never completed (no "
        "Wait or Test)",
        f"an Raccumulate of group rank 0 (world rank 2) on the group of ranks 2,3 at {at['S']} was never completed "
        "(no Wait or Test)")


def test_posting_a_nonblocking_collective_does_not_wait_for_the_other_members():
    # Was: posting waited until every member had posted, so a valid program whose ranks need the posted collective
    # to let them go on reported a deadlock (rank 0 waiting in the barrier, rank 1 in its 800 kB Send, past the
    # eager limit). MPI: posting must not block; MPICH runs all three parts below.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        me = comm.rank
        big = np.zeros(100000)
        if me == 0:
            req = comm.Ibarrier()
            comm.Recv(big, source=1)
            req.Wait()
        else:
            comm.Send(np.full(100000, 7.0), dest=0)
            comm.Ibarrier().Wait()
        total = np.zeros(1)
        req = comm.Iallreduce(np.full(1, 1.0 + me), total)
        if me == 0:  # completed before rank 1 completes its own: rank 1 waits for this message meanwhile
            req.Wait()
            comm.Send(total, dest=1)
        else:
            comm.Recv(big[:1], source=0)
            req.Wait()
        a = np.full(2, 10.0 * (me + 1))  # a blocking collective while a nonblocking one is pending: posting order
        first = comm.Iallreduce(MPI.IN_PLACE, a)
        b = comm.allreduce(me)
        first.Wait()
        return [big[0], total[0], b, list(a)]

    assert _run(body) == [[7.0, 3.0, 1, [30.0, 30.0]], [3.0, 3.0, 1, [30.0, 30.0]]]


def test_a_nonblocking_collective_a_rank_never_posts_is_a_deadlock_that_names_the_call(monkeypatch):
    # Was: 'barrier on the world' for an Ibarrier; now the call as the program wrote it, the ranks waiting for it,
    # and where the rank that never posted it is. A blocking collective does not match a nonblocking one.
    import pytest
    from mpi4py import MPI

    from spmdsim.errors import RuntimeMismatchError
    from spmdsim.runtime.sim import DeadlockError

    def never_posted():
        comm = MPI.COMM_WORLD
        if comm.rank != 1:
            comm.Ibarrier().Wait()

    with pytest.raises(DeadlockError) as info:
        _run(never_posted, 3)
    text = " ".join(str(info.value).split())
    assert "Ibarrier on the world (call 1): ranks 0,2 wait in it; rank 1 finished; at test_sim_requests_complete.py:" \
           in text, text

    def polled():
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            req = comm.Iallreduce(MPI.IN_PLACE, np.zeros(1))
            while not req.Test():
                pass

    from spmdsim.runtime.sim import engine

    monkeypatch.setattr(engine, "POLL_STALL_S", 0.3)
    with pytest.raises(DeadlockError) as info:
        _run(polled)
    text = " ".join(str(info.value).split())
    assert "Iallreduce on the world: rank 0 polls it (Test), and no rank left can complete it; rank 1 finished" \
           in text, text

    def mixed():
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            comm.Ibarrier().Wait()
        else:
            comm.Barrier()

    with pytest.raises(RuntimeMismatchError, match="rank 0 calls Ibarrier but rank 1 calls barrier"):
        _run(mixed)


def test_a_nonblocking_collective_into_mpi_bottom_lands_its_result_when_the_request_completes():
    # Was: a receive buffer at MPI.BOTTOM (a block per absolute address: Ialltoallw, Ineighbor_alltoallw) got its
    # result when posted, where every other buffer gets it at completion.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        send, got = np.array([10 * comm.rank, 10 * comm.rank + 1], "i"), np.zeros(2, "i")
        a, b = MPI.Get_address(send), MPI.Get_address(got)
        req = comm.Ialltoallw([MPI.BOTTOM, ([1, 1], [a, a + 4]), [MPI.INT] * 2],
                              [MPI.BOTTOM, ([1, 1], [b, b + 4]), [MPI.INT] * 2])
        before = got.tolist()
        req.Wait()
        return [before, got.tolist()]

    assert _run(body) == [[[0, 0], [0, 10]], [[0, 0], [1, 11]]]


def test_a_split_of_every_rank_in_order_is_named_as_a_split_not_the_world():
    # Was: 'on the world' for a Split (Create, Create_group, Create_cart, ...) keeping every rank in its order, whose
    # messages do not match the world's.
    from mpi4py import MPI

    def body():
        world = MPI.COMM_WORLD
        split, group = world.Split(0, world.rank), world.Create_group(world.Get_group())
        cart = world.Create_cart([world.size])
        for tag, comm in enumerate((split, group, cart, split.Dup())):
            if world.rank == 0:
                comm.send(None, 1, tag)
        return [repr(split), repr(group)]

    done = _run(body)
    assert done[0] == ["<simulated Intracomm rank 0 of 2 (a Split of the world)>",
                       "<simulated Intracomm rank 0 of 2 (a Create_group of the world)>"]
    assert done.unreceived == tuple(f"a message from rank 0 to rank 1 (tag {tag}, 4 bytes) on {where} was never "
                                    "received" for tag, where in enumerate((
                                        "a Split of the world", "a Create_group of the world",
                                        "a Create_cart of the world", "a Dup of a Split of the world")))


def test_a_nonblocking_collective_freed_through_a_copy_or_its_persistent_request_still_lands_its_result():
    # MPI_Request_free: the operation still completes. Was: freeing MPI.Request(req) (a copy of the handle) or a
    # started Allreduce_init left the collective's request active and its result never landed (out stayed 0);
    # Request.free landed only a part of no communicator (the old collective requests, complete when posted).
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        out, out2, out3 = np.zeros(1), np.zeros(1), np.zeros(1)
        MPI.Request(comm.Iallreduce(np.ones(1), out)).Free()
        persistent = comm.Allreduce_init(np.ones(1), out2)
        persistent.Start()
        persistent.Free()
        comm.Iallreduce(np.ones(1), out3).Free()
        comm.Barrier()
        return [out[0], out2[0], out3[0]]

    done = _run(body)
    assert list(done) == [[2.0, 2.0, 2.0]] * 2 and done.uncompleted == ()
