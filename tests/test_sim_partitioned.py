"""Partitioned point-to-point on simulated ranks (spmdsim.emulator.partitioned): partitions that arrive one
by one, counted otherwise on each side, readied before the receiver starts or before it is even made, MPI's
errors, and a receive whose partitions never come reported as a deadlock."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim.runtime.sim.engine import DeadlockError
from testkit import on_simulated_ranks as _run


def test_a_receive_partition_arrives_when_the_send_partitions_covering_it_are_ready():
    # 6 send partitions of 2 ints against 3 receive partitions of 4: receive partition 1 (ints 4-7) is send
    # partitions 2 and 3; it has arrived after both, not after one.
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        seen = []
        if comm.rank == 0:
            req = comm.Psend_init(np.arange(12, dtype="i"), 6, 1, tag=4)
            req.Start()
            comm.Barrier()
            for i in (2, 3, 0):
                req.Pready(i)
                comm.Barrier()  # the receiver looks
                comm.Barrier()
            req.Pready_list([1, 4, 5])
            req.Wait()
            req.Free()
            return None
        buf = np.full(12, -1, dtype="i")
        req = comm.Precv_init(buf, 3, 0, tag=4)
        req.Start()
        comm.Barrier()
        for _ in range(3):
            comm.Barrier()
            seen.append([req.Parrived(j) for j in range(3)])
            comm.Barrier()
        status = MPI.Status()
        req.Wait(status)
        req.Free()
        return seen, buf.tolist(), status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT)

    seen, got, source, tag, count = _run(2, body)[1]
    assert seen == [[False, False, False], [False, True, False], [False, True, False]]
    assert got == list(range(12)) and (source, tag, count) == (0, 4, 12)


def test_partitions_readied_before_the_receive_starts_or_is_made_go_when_it_starts():
    # The sender readies every partition of round 1 before the receiver has made its request; round 2's
    # before the receiver started it (it is still in round 1).
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            send = np.zeros(4)
            req = comm.Psend_init(send, 2, 1, tag=0)
            for value in (1.0, 2.0):
                req.Start()
                send[:] = value
                req.Pready_range(0, 1)
                comm.Barrier()
                req.Wait()
            return None
        comm.Barrier()
        recv = np.zeros(4)
        req = comm.Precv_init(recv, 4, 0, tag=0)
        got = []
        for _ in range(2):
            req.Start()
            req.Wait()
            got.append(recv.tolist())
            if not got[1:]:
                comm.Barrier()
        return got

    assert _run(2, body)[1] == [[1.0] * 4, [2.0] * 4]


def test_mpi_errors_of_partitioned_requests():
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        me = comm.rank
        send = comm.Psend_init(np.zeros(4), 2, me)
        recv = comm.Precv_init(np.zeros(2), 2, me, 0)  # half the bytes: MPI.ERR_OTHER at the receive's Wait
        classes = []

        def error(call):
            try:
                call()
            except MPI.Exception as exc:
                classes.append(MPI.Get_error_class(exc.Get_error_code()))
                return str(exc)
            classes.append(None)
            return ""

        error(lambda: send.Pready(0))  # inactive
        recv.Start()
        send.Start()
        send.Pready(1)
        twice = error(lambda: send.Pready(1))
        error(lambda: send.Pready_list([0, 0]))
        error(lambda: send.Pready(2))
        error(lambda: recv.Pready(0))
        error(lambda: send.Parrived(0))
        send.Pready(0)
        send.Wait()
        sizes = error(lambda: recv.Wait())
        error(lambda: comm.Psend_init(np.zeros(2), 1, MPI.PROC_NULL))
        return classes, twice, sizes, [MPI.ERR_REQUEST, MPI.ERR_OTHER, MPI.ERR_OTHER, MPI.ERR_OTHER,
                                       MPI.ERR_REQUEST, MPI.ERR_REQUEST, MPI.ERR_OTHER, MPI.ERR_RANK]

    classes, twice, sizes, want = _run(1, body)[0]
    assert classes == want
    assert "partition 1 was marked ready already" in twice
    assert "sends 32 bytes, rank 0 receives into 16" in sizes


def test_a_receive_whose_partitions_never_come_is_a_deadlock():
    def body():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            req = comm.Psend_init(np.zeros(4), 2, 1)
            req.Start()
            req.Pready(0)  # partition 1 never
            return None
        req = comm.Precv_init(np.zeros(4), 2, 0, 0)
        req.Start()
        req.Wait()

    with pytest.raises(DeadlockError, match="rank 1"):
        _run(2, body)
