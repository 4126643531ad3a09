"""The corners of mpi4py a lab meets (groups, predefined communicators, request copies, refused buffers,
the script as __main__) behave on simulated ranks as under MPICH: values from MPI's semantics, and
MPICH's own (tests/mpi4py_corners.py run under ``mpiexec -n 2``)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mpi4py_corners as corners
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate
from spmdsim.tools.cli.main import main
from testkit import MPICH, mpi_says

HERE = Path(__file__).resolve().parent


def _simulated(n: int) -> list:
    with swapped():
        return [json.loads(json.dumps(r)) for r in simulate(n, corners.run_all)]


@pytest.fixture(scope="module")
def simulated2():
    return _simulated(2)


def test_group_null_and_empty(simulated2):
    from mpi4py import MPI

    for res in simulated2:
        assert res["group_null_and_empty"] == [False, True, True, False, 2, True, False, 0, True, True, False,
                                               True, True, True, True, False, True]
    assert MPI.UNDEFINED != 0


def test_predefined_communicators_are_not_freed(simulated2):
    for res in simulated2:
        invalid = f"MPI.Exception {mpi_says('ERR_COMM')}"  # MPICH's "Invalid communicator"
        assert res["predefined_free"] == [True, False, invalid, invalid, 2, 1, True, False, True]


def test_request_copies(simulated2):
    for r, res in enumerate(simulated2):
        assert res["request_copies"] == [True, False, True, True, False, True, [r, r + 1.0, r + 2.0], r, 5,
                                         False, True, False]


def test_failed_requests_raise_err_in_status(simulated2):
    # A truncated receive among requests: Waitall, Testall and Waitsome raised the receive's own MPI.ERR_TRUNCATE
    # with every status's error 0 and empty, where MPICH (and MPI) raise MPI.ERR_IN_STATUS and write each status:
    # the failed one's source, tag, count and error, MPI.ERR_PENDING for one left active. MPICH's Testall completes
    # none (a later Wait of the failed one raises again); a truncated receive gets the bytes that fit (it got none).
    from mpi4py import MPI

    in_status = mpi_says("ERR_IN_STATUS").split(",")[0]
    got = [[0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 0.0]]
    for r, res in enumerate(simulated2):
        peer = 1 - r
        failed, pending = [MPI.ERR_TRUNCATE, peer, 0, 5], [MPI.ERR_PENDING, MPI.ANY_SOURCE, MPI.ANY_TAG, 0]
        assert res["failed_requests"] == [
            ["Waitall", in_status, [failed, pending], [False, True]], got,
            ["Waitall without statuses", in_status, [], [False, False]], got,
            ["Testall", in_status, [failed, pending], [True, True]], True, got,
            ["Waitsome", in_status, [failed], [False, True]], got,
            f"MPI.Exception {mpi_says('ERR_TRUNCATE')}", [peer, 2, 5, 0], got[0]]


def test_non_native_byte_order_is_refused(simulated2):
    for res in simulated2:
        assert res["byte_order"] == ["BufferError"] * 3


def test_predefined_ops_only_on_the_elements_mpi_defines_them_on(simulated2):
    # MPI.MAX of complex numbers gave numpy's maximum, MPI.SUM of booleans a logical or, MPI.BAND of floats a
    # TypeError: MPICH raises MPI.ERR_OP for each (compared with MPICH in test_same_results_as_mpich).
    bad = f"MPI.Exception {mpi_says('ERR_OP')}"
    for res in simulated2:
        assert res["op_types"] == [bad, bad, [True, True], bad,  # bool: only the logical ops
                                   [2, 2], [1, 1], [1, 1], [1, 1],  # int32: all of them
                                   [2.0, 2.0], [1.0, 1.0], bad, bad,  # float64: sums and orders
                                   "taken", bad, bad, bad]  # complex128: sums alone


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
def test_same_results_as_mpich(simulated2, tmp_path):
    out = tmp_path / "mpich.json"
    run = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", "2", sys.executable,
                          str(HERE / "mpi4py_corners.py"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    for r, (ours, theirs) in enumerate(zip(simulated2, json.loads(out.read_text()))):
        for name in theirs:
            assert ours[name] == theirs[name], f"{name} on rank {r}"


def _mpirun(tmp_path: Path, source: str, n: int = 2, *args: str) -> subprocess.CompletedProcess:
    """`spmdsim mpirun -n N prog.py ARGS` of `source` run in this process from tmp_path (the launch of
    `python -m spmdsim.emulator.mpirun` is tests/test_sim_mpirun.py's)."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(source))
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.chdir(tmp_path)
        code = main(["mpirun", "-n", str(n), str(script), *args])
    return subprocess.CompletedProcess(script, code, out.getvalue(), err.getvalue())


def test_script_runs_as_main_unittest_and_pickled_classes(tmp_path):
    """unittest.main() finds the script's tests (a failing one fails the run) and an object of a class the
    script defines travels by pickle, arriving as the receiving rank's own class."""
    run = _mpirun(tmp_path, """
        import sys, unittest
        from mpi4py import MPI

        class Point:
            def __init__(self, x):
                self.x = x

        comm = MPI.COMM_WORLD
        got = comm.sendrecv(Point(comm.rank), (comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
        print(comm.rank, type(got) is Point, got.x, sys.modules["__main__"].Point is Point)

        class T(unittest.TestCase):
            def test_rank_is_zero(self):
                self.assertEqual(MPI.COMM_WORLD.rank, 0)

        unittest.main()
        """)
    assert sorted(run.stdout.splitlines()) == ["0 True 1 True", "1 True 0 True"]
    assert run.stderr.count("Ran 1 test") == 2 and run.stderr.count("FAILED (failures=1)") == 1, run.stderr
    assert run.returncode == 1


def test_fortran_order_and_0d_counts(simulated2):
    for r, res in enumerate(simulated2):
        total, flat, got = res["fortran_order_and_0d_counts"]
        assert total == [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]
        assert flat == [(r + 1) * v for v in (0.0, 3.0, 1.0, 4.0, 2.0, 5.0)]
        assert got == [10 * j + r for j in range(2)]


def test_waitall_with_fewer_statuses(simulated2):
    for r, res in enumerate(simulated2):
        assert res["fewer_statuses"] == [[float(r), 10.0 + r, 20.0 + r], 0, r, 2]


def test_invalid_buffers_refused_with_mpi4pys_classes(simulated2):
    for res in simulated2:
        assert res["refused_buffers"] == ["BufferError", "BufferError", "BufferError", "ValueError", "ValueError",
                                          "ValueError", "KeyError", "KeyError", "TypeError", "TypeError",
                                          "TypeError", "ValueError", "ValueError", "ValueError"]


_LIFETIME = """
    import sys
    from mpi4py import rc
    rc.initialize = False
    from mpi4py import MPI

    before = MPI.Is_initialized(), MPI.Is_finalized()
    provided = MPI.Init_thread(MPI.THREAD_MULTIPLE)
    try:
        MPI.Init()
        twice = "no error"
    except MPI.Exception as exc:
        twice = MPI.Get_error_string(exc.Get_error_class())
    rank = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank)
    during = MPI.Is_initialized(), MPI.Is_finalized()
    MPI.Finalize()
    line = (f"{before} {provided == MPI.THREAD_MULTIPLE} {twice} {rank} {during} "
            f"{(MPI.Is_initialized(), MPI.Is_finalized())}")
    sys.stdout.write(line + "\\n")  # one write: MPICH interleaves the words of two ranks' print()
    """


def test_init_and_finalize_as_under_mpiexec(tmp_path):
    """Each rank's own MPI lifetime: not initialized with rc.initialize = False until Init_thread, Init twice
    is MPI's error, Finalize makes it finalized; as MPICH prints it."""
    run = _mpirun(tmp_path, _LIFETIME)
    line = f"(False, False) True {mpi_says('ERR_OTHER')} 1 (True, False) (True, True)"  # MPICH: "Other MPI error"
    assert run.stdout.splitlines() == [line, line], run.stderr
    assert run.returncode == 0
    if MPICH:
        mpich = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", "2", sys.executable,
                                str(tmp_path / "prog.py")], capture_output=True, text=True)
        assert mpich.stdout.count(line) == 2, (mpich.stdout, mpich.stderr[-2000:])  # MPICH may join two lines
    again = _mpirun(tmp_path, """
        from mpi4py import MPI
        assert MPI.Is_initialized() and not MPI.Is_finalized()
        MPI.Finalize()
        MPI.Init()
        """, n=1)
    assert again.returncode == 1
    assert f"MPI.Exception: {mpi_says('ERR_OTHER')}: Cannot call MPI_INIT or MPI_INIT_THREAD more than once" \
        in again.stderr


_THREAD_LEVEL = """
    import sys, threading
    import mpi4py
    mode = sys.argv[1]
    if mode == "init":
        mpi4py.rc.initialize = False
    elif mode == "nothreads":
        mpi4py.rc.threads = False
    else:
        mpi4py.rc.thread_level = mode
    from mpi4py import MPI
    got = [MPI.Init_thread(MPI.THREAD_FUNNELED)] if mode == "init" else []
    got += [MPI.Query_thread(), MPI.Is_thread_main()]
    thread = threading.Thread(target=lambda: got.append(MPI.Is_thread_main()))
    thread.start()
    thread.join()
    sys.stdout.write(f"{got}\\n")
    sys.stdout.flush()
    if mode == "init":  # MPI initialized by the program, not by mpi4py: finalized by it too (else MPICH may end
        MPI.Finalize()  # the job as this rank exits, before the other rank's line is out)
    """


@pytest.mark.parametrize("mode, line", [("multiple", "[3, True, False]"), ("serialized", "[2, True, False]"),
                                        ("nothreads", "[0, True, False]"), ("init", "[1, 1, True, False]")])
def test_thread_level_and_main_thread_as_under_mpiexec(tmp_path, mode, line):
    """A rank's Query_thread is the level it started MPI with (mpi4py.rc.thread_level, rc.threads, or what
    Init_thread asked for, as MPICH provides it), and Is_thread_main is True on the rank's own thread only, as
    on an MPI process's main thread (it was False there, and Query_thread THREAD_MULTIPLE whatever was asked)."""
    run = _mpirun(tmp_path, _THREAD_LEVEL, 2, mode)
    script = tmp_path / "prog.py"
    assert run.stdout.splitlines() == [line, line], run.stderr
    assert run.returncode == 0
    if MPICH:
        mpich = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", "2", sys.executable, str(script), mode],
                               capture_output=True, text=True)
        assert mpich.stdout.count(line) == 2, (mpich.stdout, mpich.stderr[-2000:])


def test_matched_probes(simulated2):
    for r, res in enumerate(simulated2):
        left = (r - 1) % 2
        assert res["matched_probes"] == [left, 2, 3, True, False, [10.0 * left + 1] * 3, [10.0 * left + 2] * 3,
                                         {"from": left}, True, True, True, True]


def test_error_handlers(simulated2):
    for res in simulated2:
        assert res["errhandlers"] == [True, True, True, True, True, True,
                                      f"MPI.Exception {mpi_says('ERR_ERRHANDLER')}",  # MPICH's "Invalid errhandler"
                                      False, f"MPI.Exception {mpi_says('ERR_COMM')}"]


def test_attributes(simulated2):
    for r, res in enumerate(simulated2):
        assert res["attributes"] == [None, True, "a", None, True, 42, [[r], "b", [r]], None, True, True, True]


def test_pkl5_on_simulated_ranks(simulated2):
    """mpi4py.util.pkl5's communicator over a simulated one: out-of-band pickles, matched probes, collectives."""
    last = 299_999
    for r, res in enumerate(simulated2):
        left = (r - 1) % 2
        assert res["pkl5_comm"] == [last * (left + 1), {"r": left}, last, [0, 1], [0, 1] if r == 0 else None,
                                    "Intracomm", True]


def test_cartesian_queries(simulated2):
    from mpi4py import MPI

    null = MPI.PROC_NULL
    for r, res in enumerate(simulated2):
        other = 1 - r
        assert res["cartesian_queries"] == [r, True, True, 2, [other, other], [other, other], [other, other],
                                            [null if r == 0 else 0, 1 if r == 0 else null, r, r], "ValueError"]


def test_persistent_requests(simulated2):
    """Send_init/Recv_init started twice (each Start sends the buffer as it is then), a persistent Allreduce;
    an inactive request stays true, a second Start of an active one is MPI's error, Free makes it null."""
    for r, res in enumerate(simulated2):
        left = 1 - r
        assert res["persistent_requests"] == [True, True, True, [[10.0 * left] * 3, [10.0 * left + 1] * 3], True,
                                              [3.0], f"MPI.Exception {mpi_says('ERR_REQUEST')}", False, True]


def test_buffers_released(simulated2):
    """Once a call returns, no other simulated rank's thread holds a view of its buffers (a view dropped
    there later released the buffer while its owner ran: mpi4py's DLPack test buffers saw their reference
    count change, and test_cco_pr_buf's in-place persistent Allgather hung once in a full run)."""
    for res in simulated2:
        # the last of 20 rounds: rank j's block is 4 bytes of 10 j + 19 % 10
        assert res["buffers_released"] == [[], [9] * 4 + [19] * 4]


def test_derived_datatypes_point_to_point(simulated2):
    """A column (Create_vector) arrives as 4 doubles; an indexed upper triangle lands in its places; a
    column received into the vector type fills a column."""
    for r, res in enumerate(simulated2):
        a = [[100.0 * (1 - r) + 5 * i + j for j in range(5)] for i in range(4)]
        upper = [[a[i][j] if (i, j) in {(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)} else 0.0 for j in range(5)]
                 for i in range(4)]
        column = [[2.0 + 5 * i if (j == 0 and r == 1) else 0.0 for j in range(5)] for i in range(4)]
        assert res["derived_datatypes"] == [[a[i][1] for i in range(4)], 4, 1, upper, column]


def test_copy_of_a_freed_communicator(simulated2):
    for res in simulated2:
        assert res["comm_copy_after_free"] == [True, False, True, True, False, False]


def test_a_float_destination_is_truncated(simulated2):
    for r, res in enumerate(simulated2):
        assert res["float_ranks"] == [(1 - r) + 0.5]


def test_buffers_mpi4py_cannot_map_are_refused(simulated2):
    # A text, void or structured array without a datatype moved its bytes, and so did a datetime array, where
    # mpi4py finds no MPI datatype for its buffer format ('2w': KeyError) or no format at all (BufferError, from
    # DLPack); one-character text maps, and a datatype given moves any dtype (compared with MPICH's too).
    for res in simulated2:
        assert res["unmapped_dtypes"] == ["KeyError"] * 9 + ["BufferError"] * 2 + ["", ["x", "y"], True,
                                                                                  ["ab", "cd"], [1, 2]]


def test_an_unmapped_buffer_names_its_format_and_the_way_out():
    import numpy as np
    from mpi4py import MPI

    def prog():
        comm = MPI.COMM_WORLD
        out = []
        for buf in (np.array(["ab", "cd"]), np.zeros(2, "M8[s]")):
            try:
                comm.Send(buf, dest=comm.rank)
            except (KeyError, BufferError) as exc:
                out.append(str(exc))
        return out

    with swapped():
        got = simulate(2, prog)[0]
    assert got == ["Send buffer: cannot map '2w' to MPI datatype (numpy dtype '<U2': mpi4py has no MPI datatype for "
                   "it); name a datatype to move its bytes, e.g. [buffer, MPI.BYTE]",
                   "Send buffer: dtype '<M8[s]' (datetime64[s]) has no buffer format, and DLPack only supports "
                   "signed/unsigned integers, float and complex dtypes; name a datatype to move its bytes, e.g. "
                   "[buffer, MPI.BYTE]"]


def test_receives_into_derived_datatypes_get_the_elements_that_come(simulated2):
    # A message that fills a derived datatype in part (5 doubles into 2 vectors of 3, 2 into 1) wrote only its
    # whole items (nothing of a last item in part), and a truncated one (5 into 1 vector, 4 into an indexed type
    # of 3) wrote nothing and counted 0: MPICH writes each element that comes where the type puts it, a truncated
    # receive's those that fit, counted (compared with MPICH's in test_same_results_as_mpich too).
    truncated = f"MPI.Exception {mpi_says('ERR_TRUNCATE')}"
    for r, res in enumerate(simulated2):
        peer, a, b, c, d, e, f = 1 - r, *(10.0 * (1 - r) + v for v in range(1, 6)), -1.0
        assert res["derived_truncation"] == [
            ["", [a, f, b, f, c, d, f, e, f, f, f, f], 5, True, peer, 0],
            ["", [a, f, b, f, f, f], 2, True, peer, 1],
            [truncated, [a, f, b, f, c, f], 3, False, peer, 2],
            [truncated, [a, b, f, f, c, f], 3, False, peer, 3]]
