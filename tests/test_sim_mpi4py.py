"""Simulated ranks behave as mpi4py's intracommunicator: values from MPI's semantics, and MPICH's own.

The snippets (tests/mpi4py_snippets.py) are plain mpi4py code on MPI.COMM_WORLD;
here they run on simulated ranks with MPI.COMM_WORLD swapped, and the same file
runs under ``mpiexec -n N`` for MPICH's results.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpi4py_snippets as snippets
from spmdsim.runtime.sim import simulate
from spmdsim.emulator.mpi4py_world import swapped
from testkit import MPIEXEC, mpi_says

HERE = Path(__file__).resolve().parent


def _simulated(n: int) -> list:
    with swapped():
        return [json.loads(json.dumps(r)) for r in simulate(n, snippets.run_all)]


@pytest.mark.parametrize("p", [2, 4])
def test_values_mpi_defines(p):
    from mpi4py import MPI

    got = _simulated(p)
    for r, res in enumerate(got):
        # A count in Alltoall/Allgather/Gather/Reduce_scatter_block is per peer.
        assert res["alltoall_count_per_peer"] == [10 * j + 2 * r + k for j in range(p) for k in range(2)] + [0, 0]
        allg, gath = res["allgather_and_gather_count_per_peer"]
        assert allg == list(range(p)) + [0] * p
        assert gath == (list(range(p)) if r == 0 else []) + [0] * (2 * p if r else p)
        assert res["reduce_scatter_block_count"] == [p * k + p * (p - 1) / 2 for k in (2 * r, 2 * r + 1)] + [0.0]
        # Status: source, tag and count of the message; PROC_NULL's status.
        left = (r - 1) % p
        assert res["recv_status_and_proc_null"] == [left, 7, 3, [left, left + 1, left + 2, 0, 0], True, True, 0]
        # Requests: active until waited, then null; Wait returns True; Waitall fills the statuses.
        assert res["requests_null_after_wait"] == [[True, True], True, False, True, True, 2, left, [False, False]]
        comms = res["communicators"]
        assert comms[:5] == [True, True, p, True, p] and comms[5] == r
        assert comms[6] == (r // 2 if r % 2 == 0 else MPI.UNDEFINED)
        assert comms[7] == ((p + 1) // 2 if r % 2 == 0 else None)
        assert comms[8] == (list(range(0, p, 2)) if r % 2 == 0 else None)
        assert comms[9:] == [True, True, False, "MPI_COMM_WORLD", "mine"]
        # Pickled bytes sent as a buffer arrive as the object; bcast hands the root a copy.
        assert res["pickled_bytes_and_objects"] == [{"from": left, "x": [1, 2, 3]}, {"r": 0}, False]
        # DLPack and __cuda_array_interface__ buffers are written in place.
        assert res["dlpack_and_cai_in_place"] == [[float(p - 1)] * 3, [p * (p - 1) // 2] * 2]
        s, g, root = res["in_place_and_none"]
        assert s == [p * (p + 1) // 2] * 2 and g == [100 + j for j in range(p)]
        assert root == ([7] + list(range(1, p)) if r == 0 else None)
        assert res["alltoallv_forms"] == [[100 * j + 2 * r + k for j in range(p) for k in range(2)]] * 3
        assert res["bcast_bad_root"] is True
        assert res["eager_ring_of_small_sends"] == [[left] * 4, 10 * left, [left]]
        counts = [j + 1 for j in range(p)]
        full = list(range(sum(counts)))
        mine, block, back, every = res["scatter_gather_v"]
        assert mine == [float(v) for v in full[sum(counts[:r]):sum(counts[:r + 1])]]
        assert block == [2 * r, 2 * r + 1]
        assert back == ([2.0 * v for v in full] if r == p - 1 else None)
        assert every == [float(v) for v in full]
        inc, exc, rs, best, worst, land, scan, exscan = res["scans_and_reductions"]
        assert inc == [sum(j + 1 for j in range(r + 1)), sum(2 * j for j in range(r + 1))]
        assert exc == ([sum(j + 1 for j in range(r)), sum(2 * j for j in range(r))] if r else None)
        assert rs == [p * v for v in full[sum(counts[:r]):sum(counts[:r + 1])]]
        values = [(j * 3) % p for j in range(p)]
        assert best == [float(max(values)), values.index(max(values))]
        assert worst == [0.0, 0] and land == [0] and scan == sum(range(r + 1))
        assert exscan == (sum(range(r)) if r else None)
        assert res["p2p_more"] == [[left] * 3, {"r": left}, left, [left, 10], True, left]


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec beside this Python (pip install -e '.[mpi]')")
@pytest.mark.parametrize("p", [1, 3, 4])
def test_same_results_as_mpich(p, tmp_path):
    out = tmp_path / "mpich.json"
    run = subprocess.run(["timeout", "-k", "5", "120", MPIEXEC, "-n", str(p), sys.executable,
                          str(HERE / "mpi4py_snippets.py"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    mpich = json.loads(out.read_text())
    for r, (ours, theirs) in enumerate(zip(_simulated(p), mpich)):
        for name in theirs:
            assert ours[name] == theirs[name], f"{name} on rank {r} of {p}"


def test_request_api_on_simulated_requests():
    """MPI.Request's class methods take simulated requests; Testsome/Waitsome/any as mpi4py returns."""
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        r = comm.rank
        if r == 0:
            big = np.zeros(4096)  # above the eager limit: pending until rank 1 receives
            reqs = [comm.Isend(big, 1, 1), comm.Issend(np.ones(1), 1, 2)]
            first = MPI.Request.Testall(reqs), MPI.Request.Testsome(reqs), MPI.Request.Testany(reqs)
            comm.Barrier()
            done = MPI.Request.Waitsome(reqs)
            MPI.Request.Waitall(reqs)
            return [first[0], first[1], first[2], sorted(done) in ([0], [1], [0, 1]), [bool(q) for q in reqs],
                    MPI.Request.Waitany(reqs) == MPI.UNDEFINED, MPI.Request.Testsome(reqs)]
        comm.Barrier()
        comm.Recv(np.zeros(4096), 0, 1)
        comm.Recv(np.zeros(1), 0, 2)
        return None

    with swapped():
        result = simulate(2, body)[0]
    assert result == [False, [], (MPI.UNDEFINED, False), True, [False, False], True, None]


def test_create_with_disjoint_groups_makes_one_communicator_a_group():
    """MPI_Comm_create takes disjoint groups (MPI 2.2): ranks 0,1 pass [1, 0] and ranks 2,3 pass [3, 2], and MPICH
    gives two communicators of 2 in those orders, where the emulator made one of all 4 ([1, 3, 0, 2]). A group
    with a rank outside the parent (in Create_group too), or groups that overlap and differ, are refused in one
    line."""
    from mpi4py import MPI

    group = mpi_says("ERR_GROUP") + ": "  # MPICH's "Invalid group: ", Open MPI's "MPI_ERR_GROUP: invalid group: "

    def body():
        comm = MPI.COMM_WORLD
        r = comm.rank
        world = comm.Get_group()
        new = comm.Create(world.Incl([1, 0] if r < 2 else [3, 2]))
        out = [new.rank, new.allgather(r)]
        half = comm.Split(r // 2, r)  # ranks 0,1 and 2,3
        for parent, bad in ((half, world),  # ranks outside each half
                            (comm, world.Incl([2, 3] if r > 1 else [0, 1] if r == 0 else [1, 0]))):  # 0,1 differ
            try:
                parent.Create(bad)
            except MPI.Exception as exc:
                out.append((exc.Get_error_class() == MPI.ERR_GROUP, str(exc).removeprefix(group)))
        try:
            half.Create_group(world)
        except MPI.Exception as exc:
            out.append(str(exc).removeprefix(group).split(", which")[0])
        return out

    with swapped():
        got = simulate(4, body)
    assert [g[:2] for g in got] == [[1, [1, 0]], [0, [1, 0]], [1, [3, 2]], [0, [3, 2]]]
    assert [g[2] for g in got] == [(True, f"Create: the group holds world ranks {'2,3' if r < 2 else '0,1'}, which "
                                          "are not in this communicator (the group of ranks "
                                          f"{'0,1' if r < 2 else '2,3'}): a new communicator's group is a subset "
                                          "of its parent's") for r in range(4)]
    assert [g[3:-1] for g in got] == [[], [(True, "Create: rank 1 passed the group of world ranks [1, 0], which "
                                                  "overlaps a group another rank passed and differs from it (together "
                                                  "they make [0, 1]): MPI_Comm_create takes the same group on every "
                                                  "member, or disjoint groups")], [], []]
    assert [g[-1] for g in got] == [f"Create_group: the group holds world ranks {'2,3' if r < 2 else '0,1'}"
                                    for r in range(4)]


def test_create_from_group():
    """MPI 4.0's Intracomm.Create_from_group (a class method, called by the group's members alone) was an
    AttributeError on simulated ranks; MPICH makes the communicator in the group's order."""
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        r = comm.rank
        c = MPI.Intracomm.Create_from_group(comm.Get_group().Incl([2, 0, 1]))
        out = [c.rank, c.allgather(r)]
        if r < 2:
            d = MPI.Intracomm.Create_from_group(comm.Get_group().Incl([1, 0]), stringtag="pair")
            out += [d.rank, d.allgather(r)]
        return out

    with swapped():
        got = simulate(3, body)
    assert got == [[1, [2, 0, 1], 1, [1, 0]], [2, [2, 0, 1], 0, [1, 0]], [0, [2, 0, 1]]]


def test_unmodified_script_sees_its_own_world():
    """Outside simulated ranks mpi4py is untouched; inside, MPI.COMM_WORLD is the rank's."""
    from mpi4py import MPI

    real = MPI.COMM_WORLD
    with swapped():
        ranks = simulate(3, lambda: (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(),
                                     MPI.COMM_SELF.Get_size(), MPI.Is_finalized()))
        assert MPI.COMM_WORLD is real
    assert ranks == [(0, 3, 1, False), (1, 3, 1, False), (2, 3, 1, False)]
    assert MPI.COMM_WORLD is real and type(MPI).__name__ == "module"


def test_buffer_errors_are_named_by_a_public_module():
    # A traceback names a class by its module: was spmdsim.runtime.sim._buffers.BufferSpecError. `except BufferError`
    # (and KeyError, as mpi4py's) still catches them.
    import pickle
    import traceback

    from mpi4py import MPI

    import spmdsim.runtime.sim

    def body():
        try:
            MPI.COMM_WORLD.Send(np.zeros((2, 2))[:, 0], dest=0)
        except BufferError as exc:
            return exc

    exc = _run_swapped(body)
    assert (isinstance(exc, spmdsim.runtime.sim.BufferSpecError)
            and issubclass(spmdsim.runtime.sim.DatatypeMapError, KeyError))
    assert traceback.format_exception_only(type(exc), exc)[0].startswith(
        "spmdsim.runtime.sim.BufferSpecError: send buffer: ")
    assert type(pickle.loads(pickle.dumps(exc))) is spmdsim.runtime.sim.BufferSpecError


def _run_swapped(body):
    with swapped():
        return simulate(1, body)[0]


def test_an_empty_cuda_array_interface_at_address_0_is_an_empty_buffer():
    """An empty array.array's address is 0, and so is the __cuda_array_interface__ made of it (mpi4py's
    FakeGPUArrayBasic): numpy before 2.3 takes no interface without memory, so array_of makes the empty array
    itself (read-only as the interface says); an address 0 with entries is refused in one line."""
    from spmdsim.runtime.sim._datatypes import array_of
    from spmdsim.runtime.sim._mpi import BufferSpecError

    class Cai:
        def __init__(self, shape, address, readonly):
            self.__cuda_array_interface__ = {"version": 0, "data": (address, readonly), "typestr": "<i4",
                                             "shape": shape}

    empty = array_of(Cai((0,), 0, False), "Bcast buffer", readonly=False)
    assert empty.shape == (0,) and empty.dtype == np.int32 and empty.flags.writeable
    assert not array_of(Cai((0,), 0, True), "send buffer").flags.writeable
    with pytest.raises(BufferSpecError, match=r"^recv buffer: __cuda_array_interface__ of shape \(3,\) at address "
                                              r"0; expected the address of its memory$"):
        array_of(Cai((3,), 0, False), "recv buffer", readonly=False)


def test_a_matched_message_refused_buffer_and_null_message_as_mpi4py_reports_them():
    # mpi4py reads the buffer before MPI_Mrecv: a refused one raises BufferError and the message stays to be
    # received (was: taken, then lost; the next Recv said MPI.MESSAGE_NULL). On MPI.MESSAGE_NULL MPICH names
    # MPI_Mrecv for Recv and recv, MPI_Imrecv for Irecv and irecv ("Invalid MPI_Request, error stack: ...
    # MPI_Mrecv_c(...) failed ... Null MPI_Request"), a bad buffer's BufferError coming first.
    from mpi4py import MPI

    def body():
        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            comm.Send(np.full(2, 5.0), 0, 5)
            return None
        msg = comm.Mprobe(1, 5)
        out = []
        for buf in (np.zeros((2, 2))[:, 0], np.zeros(2)):
            try:
                msg.Recv(buf)
                out.append(buf[0])
            except BufferError:
                out.append(("BufferError", msg != MPI.MESSAGE_NULL))
        calls = {"Recv": lambda: msg.Recv(np.zeros(2)), "Irecv": lambda: msg.Irecv(np.zeros(2)),
                 "recv": msg.recv, "irecv": msg.irecv, "bad buffer": lambda: msg.Recv(np.zeros((2, 2))[:, 0])}
        for name, call in calls.items():
            try:
                call()
            except MPI.Exception as exc:
                out.append((name, exc.Get_error_class() == MPI.ERR_REQUEST, str(exc).split(": the message")[0]))
            except BufferError:
                out.append((name, "BufferError"))
        return out

    request = mpi_says("ERR_REQUEST")  # MPICH's "Invalid MPI_Request", Open MPI's "MPI_ERR_REQUEST: invalid request"
    assert simulate_swapped(2, body)[0] == [
        ("BufferError", True), 5.0, ("Recv", True, f"{request}: Recv (MPI_Mrecv)"),
        ("Irecv", True, f"{request}: Irecv (MPI_Imrecv)"),
        ("recv", True, f"{request}: recv (MPI_Mrecv)"), ("irecv", True, f"{request}: irecv (MPI_Imrecv)"),
        ("bad buffer", "BufferError")]


def simulate_swapped(n, body):
    with swapped():
        return simulate(n, body)
