"""A first MPI lab under `spmdsim mpirun -n 4`: students' programs, right and wrong, as mpiexec runs them.

The programs are in tests/data/lab/. The right ones print under `spmdsim mpirun`
the lines they print under MPICH's `mpiexec -n 4` (in any order); the wrong ones
end with the one-line report docs/howto/simulate.md shows ("What the simulator does
where MPI would hang or abort"), where MPI hangs or aborts.
"""
from __future__ import annotations

import io
import pickle
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import spmdsim
from spmdsim.tools.cli.main import main
from spmdsim.runtime.sim import engine
from spmdsim.runtime.sim.landing import sends_wait
from spmdsim.runtime.sim.report import unfold
from spmdsim.runtime.sim.unmatched import MISMATCH
from testkit import MPICH, mpi_says, mpich_batch, mpich_version

LAB = Path(__file__).resolve().parent / "data" / "lab"
PACKAGE = Path(spmdsim.__file__).resolve().parent
# test_loop_late.py's rank 1 computes 3 s before it sends, and test_loop_feeding.py's rank 0 feeds rank 1 a task
# every 0.5 s, each past POLL_STALL_S (2 s) in all; here 0.8 s and 0.2 s, each past _LATE_STALL_S (0.5 s) as
# these are past 2 s, with POLL_STALL_S at that (a polling rank spins a core all the while under MPICH).
ARGS = {"argv_files.py": ["inputs.txt"], "test_loop_late.py": ["0.8"], "test_loop_feeding.py": ["0.2"],
        "test_loop_all_late.py": ["0.8"], "win_puts_feed.py": ["0.8"]}
_LATE_STALL_S = 0.5
INPUTS = "1 2 3\n4 5 6\n7 8 9\n10 11 12\n"  # argv_files.py's, in the directory it runs in
SAME_AS_MPICH = ["hello.py", "ring_objects.py", "ring_buffers.py", "sendrecv.py", "any_source.py",
                 "collectives_objects.py", "collectives_buffers.py", "reduce_ops.py", "nonblocking.py",
                 "split.py", "pi.py", "main_guard.py", "argv_files.py", "truncate_caught.py", "cart.py",
                 "montecarlo.py", "master_worker.py", "modules/main.py", "test_loop_feeding.py",
                 "test_loop_late.py", "neighbors.py", "graphs.py", "alltoallw.py", "rma.py", "halo.py", "columns.py",
                 "partitioned.py", "reduce_derived.py", "reduce_derived_user.py",
                 "inplace_derived.py", "tag_bounds.py", "int_arguments.py",
                 "test_loop_all_late.py", "aliased.py",
                 "none_buffers.py", "win_puts_feed.py", "post_then_recv.py", "file_io.py",
                 "file_io_edges.py", "intercomm.py"]


#: Programs whose output under MPICH before 5 (4.2 checked) is not the standard's, and how; the emulator prints
#: MPICH 5's (the `mpi` extra's).
OLDER_MPICH = {
    "graphs.py": "it pairs a multigraph's repeated edges in the other order in Neighbor_alltoall and leaves blocks "
                 "of Neighbor_alltoallv unwritten",
    "grid.py": "its Cart_sub to no dimension gives MPI_COMM_NULL, not a 0-dimensional grid of one rank",
}


def _older_mpich(name: str) -> None:
    """Skip the comparison of `name` with an MPICH before 5 that departs from the standard there (OLDER_MPICH)."""
    version = mpich_version()
    if name in OLDER_MPICH and version is not None and version < (5, 0):
        pytest.skip(f"{name} under MPICH {version[0]}.{version[1]}: {OLDER_MPICH[name]} (the emulator prints what "
                    "MPICH 5 and the standard give)")


@pytest.fixture(scope="module")
def mpich_lines(tmp_path_factory):
    """{program: the lines it printed under MPICH's mpiexec -n 4, sorted}: one job for them all."""
    lab = tmp_path_factory.mktemp("lab")
    (lab / "inputs.txt").write_text(INPUTS)
    found = mpich_batch([(name, LAB / name, ARGS.get(name, [])) for name in SAME_AS_MPICH], 4, cwd=lab)
    return {name: sorted(line for lines in per_rank for line in lines) for name, per_rank in found.items()}


def _mpirun(capsys, *command: str) -> tuple:
    code = main(["mpirun", "-n", "4", "python", *command])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_lab(tmp_path, monkeypatch):
    """A lab directory as cwd: the input file argv_files.py reads by a relative path."""
    (tmp_path / "inputs.txt").write_text(INPUTS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
@pytest.mark.parametrize("name", SAME_AS_MPICH)
def test_right_programs_print_what_mpiexec_prints(name, in_lab, capsys, mpich_lines, monkeypatch):
    if name.startswith(("test_loop_", "win_puts_")):
        monkeypatch.setattr(engine, "POLL_STALL_S", _LATE_STALL_S)
    code, out, err = _mpirun(capsys, str(LAB / name), *ARGS.get(name, []))
    assert (code, err) == (0, "")
    _older_mpich(name)
    assert sorted(out.splitlines()) == mpich_lines[name] and out.strip()


def test_user_ops_made_by_every_rank_and_python_functions(capsys):
    # Each rank runs MPI.Op.Create itself (a handle per rank): not a mismatch. mpi4py's lowercase
    # reductions take a plain function of two objects.
    code, out, err = _mpirun(capsys, str(LAB / "reduce_ops.py"))
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == [f"rank {r}: max={3.5 if r == 0 else None} minloc=(0.5, 0) maxloc=(3.5, 1) "
                                        f"Allreduce MAX=3.5 absmax=-3.0 lambda=0123" for r in range(4)]


def test_the_mpi4py_runner_and_dash_c(in_lab, capsys):
    # `python -m mpi4py script.py` (its -rc options configure MPI_Init) and `python -c`: mpi4py's runner
    # used to rewrite the one sys.argv every rank shares and to arm the real MPI's abort at exit.
    script = str(LAB / "argv_files.py")
    for runner in (["-m", "mpi4py"], ["-m", "mpi4py", "-rc", "thread_level=single"], ["-m", "mpi4py.run"]):
        code, out, err = _mpirun(capsys, *runner, script, "inputs.txt")
        assert (code, err) == (0, "")
        assert sorted(out.splitlines())[0] == ("rank 0: argv0=argv_files.py args=['inputs.txt'] line=[1, 2, 3] "
                                               "sum=78")
    code, out, err = _mpirun(capsys, "-c", "import sys; from mpi4py import MPI; "
                                            "print(MPI.COMM_WORLD.rank, sys.argv, '__file__' in globals())", "x")
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == [f"{r} ['-c', 'x'] False" for r in range(4)]
    code, out, err = _mpirun(capsys, "-m", "mpi4py", "-", script)
    assert code == 2 and "(the program from stdin) is not supported" in err


def test_file_is_absolute_as_python_sets_it(in_lab, capsys):
    (in_lab / "where.py").write_text("import os\nprint(os.path.isabs(__file__), os.path.basename(__file__))\n")
    code, out, err = _mpirun(capsys, "where.py")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["True where.py"] * 4


DEADLOCK = "spmdsim mpirun: error: simulated ranks deadlock (every live rank waits, none can go on): "
# (program, arguments, exit code, stderr): where MPICH hangs or aborts (docs/howto/simulate.md has which), one line
# each. A rank polling (Test) what no rank left can send is reported after POLL_STALL_S (2 s) of it; these tests wait
# _STALL_S instead (the same report, found sooner).
_STALL_S = 0.3
WRONG = [
    ("headtohead.py", [], 1, DEADLOCK +
     "send to group rank 1 (tag 5) on the world: rank 0 waits in it; a message of 8000000 bytes; at headtohead.py:13 | "
     "send to group rank 0 (tag 5) on the world: rank 1 waits in it; a message of 8000000 bytes; at headtohead.py:13 | "
     "barrier on the world (call 1): ranks 2,3 wait in it; rank 0 is elsewhere, in send to group rank 1 (tag 5) on "
     "the world; rank 1 is elsewhere, in send to group rank 0 (tag 5) on the world; at headtohead.py:16 | "
     "a standard Send of 8 KiB or more waits for its receive, as MPICH's does past its eager limit: post the "
     "receive first on one side, or use Sendrecv or Isend/Irecv"),
    ("missing_send.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 3) on the world: rank 0 waits in it; rank 1 finished; no rank has sent to rank 0; at "
     "missing_send.py:6"),
    ("one_recv_too_many.py", [], 1, DEADLOCK +
     "recv from any rank (any tag) on the world: rank 0 waits in it; ranks 1-3 finished; no rank has "
     "sent to rank 0; at one_recv_too_many.py:6"),
    ("wrong_tag.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 3) on the world: rank 0 waits in it; rank 1's send to rank 0 has tag 4, not 3: no "
     "message matches; at wrong_tag.py:8 | barrier on the world (call 1): ranks 1-3 wait in it; rank 0 is "
     "elsewhere, in recv from group rank 1 (tag 3) on the world; at wrong_tag.py:9 | " + MISMATCH),
    ("exit_early.py", [], 3, DEADLOCK +
     "barrier on the world (call 1): ranks 0,2,3 wait in it; rank 1 exited (sys.exit(3)); at exit_early.py:9"),
    # os._exit on a rank ended the process, every rank with it, without a word (exit 3)
    ("os_exit_early.py", [], 3, DEADLOCK +
     "barrier on the world (call 1): ranks 0,2,3 wait in it; rank 1 exited (os._exit(3)); at os_exit_early.py:9"),
    ("test_loop.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 9) on the world: rank 0 polls it (Test), and no rank left can complete it; "
     "rank 1 finished; rank 1's send to rank 0 has tag 8, not 9: no message matches; at test_loop.py:9 | " + MISMATCH),
    ("test_loop_blocked.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 9) on the world: rank 0 polls it (Test), while every other live rank waits; no "
     "rank has sent to rank 0; at test_loop_blocked.py:9 | " + " | ".join(
         f"recv from group rank 0 (tag 5) on the world: rank {r} waits in it; rank 0 polls (Test) in vain; no rank "
         f"has sent to rank {r}; at test_loop_blocked.py:12" for r in (1, 2, 3))),
    ("test_loop_two.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 9) on the world: rank 0 polls it (Test), while every other live rank waits; no "
     "rank has sent to rank 0; at test_loop_two.py:8 | recv from group rank 0 (tag 5) on the world: rank "
     "1 waits in it; rank 0 polls (Test) in vain; no rank has sent to rank 1; at test_loop_two.py:11"),
    ("iprobe_loop_blocked.py", [], 1, DEADLOCK +
     "probe from group rank 1 (tag 9) on the world: rank 0 polls it (Iprobe), while every other live rank waits; no "
     "rank has sent to rank 0; at iprobe_loop_blocked.py:6 | recv from group rank 0 (tag 5) on the world: rank 1 waits "
     "in it; rank 0 polls (Iprobe) in vain; no rank has sent to rank 1; at iprobe_loop_blocked.py:9"),
    ("testany_loop_blocked.py", [], 1, DEADLOCK +
     "recv from group rank 1 (tag 9) on the world: rank 0 polls it (Testany), while every other live rank waits; no "
     "rank has sent to rank 0; at testany_loop_blocked.py:9 | recv from group rank 0 (tag 5) on the "
     "world: rank 1 waits in it; rank 0 polls (Testany) in vain; no rank has sent to rank 1; at "
     "testany_loop_blocked.py:12"),
    ("win_test_loop.py", [], 1, DEADLOCK +
     "a window's exposure epoch (the Complete of rank 1) on the world: rank 0 polls it (Win.Test), while every other "
     "live rank waits; at win_test_loop.py:12 | recv from group rank 0 (tag 5) on the world: rank 1 waits in it; "
     "rank 0 polls (Win.Test) in vain; no rank has sent to rank 1; at win_test_loop.py:15"),
    ("win_test_loop.py", ["finished"], 1, DEADLOCK +
     "a window's exposure epoch (the Complete of rank 1) on the world: rank 0 polls it (Win.Test), and no rank left "
     "can complete it; rank 1 finished; at win_test_loop.py:12"),
    ("win_poll_loop.py", ["Sync"], 1, DEADLOCK +
     "a window's memory on the world: rank 0 polls it (Win.Sync), while every other live rank waits or polls in "
     "vain; at win_poll_loop.py:15 | " + " | ".join(
         f"recv from group rank 0 (tag 5) on the world: rank {r} waits in it; rank 0 polls (Win.Sync) in vain; no "
         f"rank has sent to rank {r}; at win_poll_loop.py:22" for r in (1, 2, 3))),
    ("win_poll_loop.py", ["Get"], 1, DEADLOCK +
     "a window's memory on the world: rank 0 polls it (Win.Unlock), while every other live rank waits or polls in "
     "vain; at win_poll_loop.py:20 | " + " | ".join(
         f"recv from group rank 0 (tag 5) on the world: rank {r} waits in it; rank 0 polls (Win.Unlock) in vain; "
         f"no rank has sent to rank {r}; at win_poll_loop.py:22" for r in (1, 2, 3))),
    ("tag_string.py", [], 1, "spmdsim mpirun: error on simulated rank 0: TypeError: an integer is required: send "
                             "tag is 'x'"),
    ("tag_negative.py", [], 1, "spmdsim mpirun: error on simulated rank 1: MPI.Exception: {ERR_TAG}: receive tag "
                               "-5 is negative: tags are 0 or more; MPI.ANY_TAG matches any"),
    ("tag_above_ub.py", [], 1, "spmdsim mpirun: error on simulated rank 0: MPI.Exception: {ERR_TAG}: send tag "
                               "536870912 is above the largest tag, MPI.TAG_UB's 536870911"),
    ("truncate.py", [], 1, "spmdsim mpirun: error on simulated rank 1: MPI.Exception: {ERR_TRUNCATE}: rank 0 "
                           "sends 80 bytes (tag 0) but rank 1 receives into a buffer of 40"),
    ("bcast_count.py", [], 1, "spmdsim mpirun: error on simulated rank 1: MPI.Exception: {ERR_TRUNCATE}: Bcast: "
                              "rank 0 (the root) broadcasts 4 float64 (32 bytes) but rank 1 receives into a buffer "
                              "of 3 (24 bytes)"),
    ("bcast_count_more.py", [], 1, "spmdsim mpirun: error on simulated rank 1: MPI.Exception: {ERR_OTHER}: "
                                   "Bcast: rank 0 (the root) broadcasts 4 float64 (32 bytes) but rank 1 expects 5 "
                                   "(40 bytes)"),
    ("ring_no_modulo.py", [], 1, "spmdsim mpirun: error on simulated rank 3: MPI.Exception: {ERR_RANK}: dest rank 4 "
                                 "is outside the communicator of 4 ranks (0 to 3, or MPI.PROC_NULL)"),
    ("send_a_string.py", [], 1, "spmdsim mpirun: error on simulated rank 0: TypeError: send buffer: 'str' is not a "
                                "buffer (expected an array, or [buffer, count, datatype]; Python objects go with "
                                "the lowercase methods: send, recv, bcast, ...)"),
    ("exception.py", [], 1, "spmdsim mpirun: error on simulated rank 2: ValueError: bad input on rank 2"),
    ("abort.py", [], 2, "usage: abort.py N\nspmdsim mpirun: simulated rank 0 called Abort(2) on the world: every "
                        "rank was stopped"),
    ("reduce_dtype.py", [], 1, "spmdsim mpirun: error on simulated rank 0: DTypeError: Reduce: send dtype 'int32' "
                               "and receive dtype 'float64' differ"),
    ("buffer_to_recv.py", [], 1, "spmdsim mpirun: error on simulated rank 0: UnpicklingError: recv: the message "
                                 "from rank 1 (tag 7, 12 bytes) is not a pickled object (invalid load key, "
                                 "'\\x00'.); was it sent with Send, a buffer? Receive it with Recv into an array"),
    # values no rank sent, printed with exit 0 before (MPICH aborts on the second: an element cut in part)
    ("object_to_Recv.py", [], 1, "spmdsim mpirun: error on simulated rank 0: MPI.Exception: {ERR_TYPE}: rank 1 "
                                 "sends 22 bytes (tag 7) but rank 0 receives int64 (8 bytes each): the message is a "
                                 "pickled object (sent with send, lowercase); receive it with recv(), or send an "
                                 "array with Send"),
    # the doubles' bits read as integers, exit 0 (MPI calls it erroneous; no library checks it)
    ("doubles_to_ints.py", [], 1, "spmdsim mpirun: error on simulated rank 0: MPI.Exception: {ERR_TYPE}: rank 1 "
                                  "sends 3 float64 (tag 7) but rank 0 receives them as int64: their bytes would land "
                                  "as values no rank sent; receive into float64, or convert after receiving"),
    ("cart_too_big.py", [], 1, "spmdsim mpirun: error on simulated ranks 0-3: MPI.Exception: {ERR_ARG}: "
                               "Create_cart: dims [3, 2] make a grid of 6 ranks, more than the communicator's 4"),
    ("bytes_to_doubles.py", [], 1, "spmdsim mpirun: error on simulated rank 0: MPI.Exception: {ERR_TYPE}: rank 1 "
                                   "sends 3 bytes (tag 7) but rank 0 receives float64 (8 bytes each): 3 bytes are not "
                                   "a whole number of them; send and receive the same dtype"),
]


_TYPED = """import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.Send(np.arange(4).astype("{sent}"), dest=0)
elif comm.rank == 0:
    data = np.zeros(4 * np.dtype("{sent}").itemsize // np.dtype("{got}").itemsize, dtype="{got}")
    comm.Recv(data, source=1)
    print(data.view("{sent}").tolist())
"""


@pytest.mark.parametrize("sent, got, refused", [
    ("float64", "float32", True), ("int32", "float32", True), ("complex64", "float64", True),
    ("int16", "int32", True), ("float64", "float64", False), ("int32", "uint32", False), ("uint8", "int8", False),
    ("bool", "uint8", False)])
def test_a_typed_receive_of_other_elements_is_refused(sent, got, refused, tmp_path, capsys):
    """Whole elements of another type (a float received as an integer, float64 as twice as many float32) land as
    values no rank sent; MPI calls it erroneous, no library checks it. Signed and unsigned integers of one width, and
    bytes, are the same bits (delivered as every MPI library delivers them)."""
    program = tmp_path / "typed.py"
    program.write_text(_TYPED.format(sent=sent, got=got))
    code, out, err = _mpirun(capsys, str(program))
    if refused:
        assert code == 1 and f"rank 1 sends 4 {np.dtype(sent).name} (tag 0) but rank 0 receives them as " \
            f"{np.dtype(got).name}: their bytes would land as values no rank sent" in unfold(err), err
    else:
        assert (code, out) == (0, f"{np.arange(4).astype(sent).tolist()}\n"), err


@pytest.mark.parametrize("call, line", [("Testall", 12), ("test", 12), ("Get_status_all", 13), ("improbe", 14),
                                        ("Message.Iprobe", 15)])
def test_a_report_of_a_poll_in_vain_names_the_call_polled(call, line, capsys, monkeypatch):
    # Was "(Test)" for all but Testany, Testsome, Get_status_any/some (whose own names) and the probes ("Iprobe").
    monkeypatch.setattr(engine, "POLL_STALL_S", _STALL_S)
    code, out, err = _mpirun(capsys, str(LAB / "poll_loop_blocked.py"), call)
    kind = "probe" if "probe" in call.lower() else "recv"
    assert (code, unfold(err)) == (1, DEADLOCK + (
        f"{kind} from group rank 1 (tag 9) on the world: rank 0 polls it ({call}), while every other live rank waits; "
        f"no rank has sent to rank 0; at poll_loop_blocked.py:{line} | recv from group rank 0 (tag 5) on the world: "
        f"rank 1 waits in it; rank 0 polls ({call}) in vain; no rank has sent to rank 1; at poll_loop_blocked.py:19\n"))


def _tag_ub() -> int:
    """This process's MPI's largest tag, the bound simulated ranks meet."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)


@pytest.mark.parametrize("name, args, code, first", WRONG, ids=[" ".join([w[0], *w[1]]) for w in WRONG])
def test_wrong_programs_end_with_one_clear_report(name, args, code, first, capsys, monkeypatch):
    monkeypatch.setattr(engine, "POLL_STALL_S", _STALL_S)
    got, out, err = _mpirun(capsys, str(LAB / name), *args)
    assert got == code
    if "{ERR_" in first:  # MPI's own error class, as this process's MPI words it (MPICH's: "Invalid tag")
        first = first.format(**{c: mpi_says(c) for c in ("ERR_TAG", "ERR_TRUNCATE", "ERR_OTHER", "ERR_RANK", "ERR_TYPE",
                                                          "ERR_ARG")})
    if name == "tag_above_ub.py" and _tag_ub() >= 2 ** 31 - 1:  # Open MPI's MPI.TAG_UB (MPICH's: 2**29 - 1): one
        # past it is no C int, mpi4py's OverflowError, as under Open MPI's mpiexec
        first = ("spmdsim mpirun: error on simulated rank 0: OverflowError: value too large to convert to int: send "
                 f"tag is {2 ** 31}")
    if first.startswith(DEADLOCK):  # one call a line, folded within 100 columns (465 on one line before)
        assert err.startswith(DEADLOCK.rstrip() + "\n  ") and max(map(len, err.splitlines())) <= 100, err
        err = unfold(err)
    if "Traceback" not in err:  # a deadlock, Abort: the line(s) and nothing else
        assert err == first + "\n"
        return
    # An exception: its line, then the traceback from the program's frame down, without the
    # launcher's frames or (for MPI's and spmdsim's errors, and a wrong argument the emulator
    # refuses: a str to Send) the emulator's, as mpiexec shows it.
    assert err.startswith(first + "\nTraceback (most recent call last):\n  File \"" + str(LAB / name))
    core = err.split("\nspmdsim mpirun: also failed: ")[0]  # (ranks that failed otherwise: a line each)
    assert str(PACKAGE) not in err and (core if core == err else core + "\n").endswith(
        (" of 4\n", " every simulated rank\n"))  # one rank's error, or every rank's alike (cart_too_big.py)


def test_an_exception_whose_str_raises_is_reported_by_its_own_type(tmp_path, capsys):
    """A program's exception whose __str__ raises ended mpirun's report with that inner error's traceback. Each
    rank runs the program as a module of its own, so each raises its own Oops class: one error, every rank's."""
    (tmp_path / "oops.py").write_text("class Oops(Exception):\n    def __str__(self):\n"
                                      "        raise RuntimeError('no')\nraise Oops('x')\n")
    code, out, err = _mpirun(capsys, str(tmp_path / "oops.py"))
    assert code == 1 and err.startswith("spmdsim mpirun: error on simulated ranks 0-3: Oops: <its message could not "
                                        "be shown: its __str__ raised RuntimeError>\nTraceback"), err
    assert "raised on every simulated rank" in err and "also failed" not in err, err


def test_small_head_to_head_sends_and_ssend_cycles(capsys):
    # Below MPICH's eager limit both Sends complete (MPI buffers them); synchronous sends never do.
    code, out, err = _mpirun(capsys, str(LAB / "headtohead.py"), "100")
    assert (code, sorted(out.splitlines()), err) == (0, ["rank 0 got 1.0 x100", "rank 1 got 0.0 x100"], "")
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "comm.ssend(comm.rank, dest=comm.rank ^ 1)\ncomm.recv(source=comm.rank ^ 1)")
    err = unfold(err)
    assert code == 1
    assert err.startswith(DEADLOCK + "send to group rank 1 (tag 0) on the world: rank 0 waits in it; an Ssend; "
                                     "at <string>:3 | ")
    assert err.endswith(" | an Ssend waits until its receive is posted: post the receive first on one side\n")


def test_eager_limit_0_buffers_no_standard_send_so_small_head_to_head_sends_deadlock(capsys):
    # MPI's test of a safe program: with no standard Send buffered, the 100-value head-to-head Sends that pass
    # above (MPICH buffers them) deadlock, and the report says the program relies on that buffering.
    code = main(["mpirun", "-n", "4", "--eager-limit", "0", "python", str(LAB / "headtohead.py"), "100"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert unfold(err) == DEADLOCK + (
        "send to group rank 1 (tag 5) on the world: rank 0 waits in it; a message of 800 bytes; at headtohead.py:13 | "
        "send to group rank 0 (tag 5) on the world: rank 1 waits in it; a message of 800 bytes; at headtohead.py:13 | "
        "barrier on the world (call 1): ranks 2,3 wait in it; rank 0 is elsewhere, in send to group rank 1 (tag 5) on "
        "the world; rank 1 is elsewhere, in send to group rank 0 (tag 5) on the world; at headtohead.py:16 | "
        "no standard Send is buffered here (eager limit 0): the program relies on MPI buffering its standard Sends, "
        "which the MPI standard calls unsafe (it deadlocks once the messages outgrow MPI's buffer, or under another "
        "MPI): post the receive first on one side, or use Sendrecv or Isend/Irecv\n")
    # A limit of 801 bytes buffers the 800-byte Sends again; a negative one is refused in one line.
    code = main(["mpirun", "-n", "2", "--eager-limit", "801", "python", str(LAB / "headtohead.py"), "100"])
    assert (code, capsys.readouterr().err) == (0, "")
    code = main(["mpirun", "-n", "2", "--eager-limit", "-1", "python", str(LAB / "headtohead.py")])
    assert (code, capsys.readouterr().err) == (
        2, "spmdsim mpirun: error: --eager-limit -1 must be a number of bytes, 0 or more\n")


_P2P = "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\na = np.zeros(4)\n"
# (what the ranks do, ranks, eager limit, the report's calls); the programs are _P2P, then these lines from line 5.
UNMATCHED = [
    ("tag", "if comm.rank == 0:\n    comm.Send(a, dest=1, tag=1)\nelse:\n    comm.Recv(a, source=0, tag=2)\n", 2,
     [], "recv from group rank 0 (tag 2) on the world: rank 1 waits in it; rank 0 finished; rank 0's send to rank 1 "
         "has tag 1, not 2: no message matches; at <string>:8 | " + MISMATCH),
    ("tag", "if comm.rank == 0:\n    comm.Send(a, dest=1, tag=1)\nelse:\n    comm.Recv(a, source=0, tag=2)\n", 2,
     ["--eager-limit", "0"], "send to group rank 1 (tag 1) on the world: rank 0 waits in it; at <string>:6 | recv "
     "from group rank 0 (tag 2) on the world: rank 1 waits in it; rank 0's send to rank 1 has tag 1, not 2: no "
     "message matches; at <string>:8 | " + MISMATCH),
    ("source", "if comm.rank == 0:\n    comm.Send(a, dest=1, tag=0)\nelif comm.rank == 1:\n    comm.Recv(a, source=2, "
     "tag=0)\n", 3, [], "recv from group rank 2 (tag 0) on the world: rank 1 waits in it; rank 2 finished; the "
     "message pending for rank 1 is from rank 0 (tag 0), not from rank 2: no message matches; at <string>:8 | "
     + MISMATCH),
    ("communicator", "dup = comm.Dup()\nif comm.rank == 0:\n    dup.Send(a, dest=1)\nelse:\n    comm.Recv(a, "
     "source=0)\n", 2, [], "recv from group rank 0 (any tag) on the world: rank 1 waits in it; rank 0 finished; rank "
     "0's send to rank 1 (tag 0) is on a Dup of the world, not the world: no message matches; at <string>:9 | "
     + MISMATCH),
    ("sendrecv", "comm.Sendrecv(a, dest=1 - comm.rank, sendtag=1, recvbuf=a.copy(), source=1 - comm.rank, "
     "recvtag=2)\n", 2, ["--eager-limit", "0"], "".join(
         f"send to group rank {1 - r} (tag 1) on the world: rank {r} waits in it; rank {1 - r}'s receive from rank "
         f"{r} has tag 2, not 1: no message matches; at <string>:5 | " for r in (0, 1)) + MISMATCH),
    ("nobody sends", "comm.Recv(a, source=1 - comm.rank)\ncomm.Send(a, dest=1 - comm.rank)\n", 2, [], " | ".join(
        f"recv from group rank {1 - r} (any tag) on the world: rank {r} waits in it; no rank has sent to rank {r}; at "
        "<string>:5" for r in (0, 1))),
    ("never sent", "if comm.rank == 1:\n    comm.Recv(a, source=0, tag=3)\n", 2, [], "recv from group rank 0 (tag 3) "
     "on the world: rank 1 waits in it; rank 0 finished; no rank has sent to rank 1; at <string>:6"),
    ("buffering", "comm.Send(a, dest=1 - comm.rank)\ncomm.Recv(a, source=1 - comm.rank)\n", 2, ["--eager-limit", "0"],
     "".join(f"send to group rank {1 - r} (tag 0) on the world: rank {r} waits in it; a message of 32 bytes; at "
             "<string>:5 | " for r in (0, 1)) + sends_wait(0)),
]


@pytest.mark.parametrize("what, lines, n, options, said", UNMATCHED,
                         ids=[f"{u[0]}{' unbuffered' if u[3] else ''}" for u in UNMATCHED])
def test_a_deadlock_of_messages_that_do_not_match_says_what_differs(what, lines, n, options, said, capsys):
    # The report advised "post the receive first on one side, or use Sendrecv or Isend/Irecv" to a Sendrecv whose
    # tags differ, and said "rank 1 has an unreceived message from rank 0 (tag 1)" of a Recv of tag 2: each waiting
    # rank's line now says what differs (tag, source, communicator) or that no rank has sent to it, and the advice is
    # to check those; only Sends that wait for receives posted later keep the advice on MPI's buffering.
    code = main(["mpirun", "-n", str(n), *options, "python", "-c", _P2P + lines])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "") and max(map(len, err.splitlines())) <= 100, err
    assert unfold(err) == DEADLOCK + said + "\n"


def test_collectives_that_differ_name_both_lines(capsys):
    # MPICH lets the root's bcast pass unmatched here and prints results (the program is wrong all the same).
    code, out, err = _mpirun(capsys, str(LAB / "bcast_on_root_only.py"))
    assert code == 1 and out == ""
    assert re.fullmatch(r"spmdsim mpirun: error: collectives diverge on the world \(call 1 on that communicator\): "
                        r"rank 0 calls bcast\(obj\) root 0 but rank ([123]) calls allreduce\(obj\) sum; "
                        r"at bcast_on_root_only.py:6 \(rank 0\), bcast_on_root_only.py:9 \(rank \1\)\n", err), err


def test_messages_never_received_are_a_warning(capsys):
    # MPI leaves them undefined (MPICH drops a small one without a word, exit 0): the same exit, one line.
    code, out, err = _mpirun(capsys, str(LAB / "unmatched_send.py"))
    assert code == 0 and sorted(out.splitlines()) == [f"rank {r} done" for r in range(4)]
    assert err == ("spmdsim mpirun: warning: when the ranks ended, a message from rank 0 to rank 1 (tag 3, 20 bytes) "
                   "was never received\n")
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "sub = comm.Split(comm.rank % 2)\n"
                                           "if comm.rank == 3: sub.Irecv(bytearray(8), source=MPI.ANY_SOURCE)")
    assert code == 0 and err == ("spmdsim mpirun: warning: when the ranks ended, a receive of group rank 1 (world "
                                 "rank 3) from any rank (tag any) on the group of ranks 1,3 was never matched\n"
                                 "spmdsim mpirun: warning: when the ranks ended, an Irecv of group rank 1 (world rank "
                                 "3) from any rank (tag any) on the group of ranks 1,3 at <string>:4 was never "
                                 "completed (no Wait or Test)\n")


def test_a_receive_buffer_read_before_wait_holds_what_it_held(capsys):
    # MPI forbids the read; MPICH on one node has copied the message by then ("before Wait: 7.0", every run here),
    # a cluster may not have. Was 7.0 here too: the message landed when matched, and the bug passed unseen.
    code, out, err = _mpirun(capsys, str(LAB / "read_before_wait.py"))
    assert (code, err) == (0, "") and sorted(out.splitlines()) == ["rank 1 after Wait: 7.0", "rank 1 before Wait: 0.0"]


def test_a_collective_result_read_before_wait_holds_what_it_held(capsys):
    # MPI: undefined until the request completes. MPICH 5 on one node prints the sum (10.0) or a partial one (3.0)
    # before Wait, from run to run, and with 1000000 values partial sums (1.0, 3.0, 7.0). Was 10.0 here every run:
    # the collective ran into the buffer when posted.
    code, out, err = _mpirun(capsys, str(LAB / "read_before_wait_collective.py"))
    assert (code, err) == (0, "") and sorted(out.splitlines()) == [
        f"rank {r} {when} Wait: {got}" for r in range(4) for when, got in (("after", 10.0), ("before", 0.0))]


def test_requests_never_completed_are_a_warning(capsys):
    # MPICH prints "rank 1 got 7.0" and, at MPI_Finalize, "MPICH: Builtin communicator 44000000 has pending 1
    # references." (exit 0). Was: no word, and rank 1 got 7.0.
    code, out, err = _mpirun(capsys, str(LAB / "no_wait.py"))
    assert code == 0 and sorted(out.splitlines()) == [f"rank {r} got 0.0" for r in range(4)]
    assert err == ("spmdsim mpirun: warning: when the ranks ended, an Isend of rank 0 to rank 1 (tag 3) at "
                   "no_wait.py:10 was never completed (no Wait or Test); an Irecv of rank 1 from rank 0 (tag 3) at "
                   "no_wait.py:12 was never completed (no Wait or Test: the message it matched never reached its "
                   "buffer)\n")


def test_a_nonblocking_collective_never_completed_is_a_warning(capsys):
    # MPICH prints the lines and, at MPI_Finalize, "MPICH: Builtin communicator 44000000 has pending 6
    # references." on each rank (exit 0). Was: no word (the emulator's nonblocking collectives complete at once).
    code, out, err = _mpirun(capsys, str(LAB / "no_wait_collective.py"))
    assert code == 0 and sorted(out.splitlines()) == [f"rank {r} done" for r in range(4)]
    assert err == ("spmdsim mpirun: warning: when the ranks ended, an Ibarrier of rank 0 at no_wait_collective.py:7 "
                   "was never completed (no Wait or Test); an Ibarrier of rank 1 at no_wait_collective.py:7 was never "
                   "completed (no Wait or Test); an Ibarrier of rank 2 at no_wait_collective.py:7 was never completed "
                   "(no Wait or Test); and 1 more\n")


@pytest.mark.parametrize("size, got", [(None, "7.0"), ("100000", "-1.0")])
def test_a_send_buffer_written_before_wait_is_a_warning(capsys, size, got):
    # MPICH 5 prints "rank 1 got 7.0" (a small message, copied as it is sent: the bug passes unseen) and "rank 1
    # got -1.0" with 100000 doubles (read from the buffer after the write), exit 0, and says nothing. Was: the
    # same lines here, and no word either.
    code, out, err = _mpirun(capsys, str(LAB / "write_before_wait.py"), *([size] if size else []))
    assert (code, out) == (0, f"rank 1 got {got}\n")
    assert err == ("spmdsim mpirun: warning: when the ranks ended, rank 0 wrote into the buffer of its Isend to rank 1 "
                   "(tag 3) at write_before_wait.py:14 before the send completed (Wait at write_before_wait.py:17): "
                   "MPI forbids changing a send buffer until then; the receiver may get the old contents, the new or "
                   "a mix\n")


@pytest.mark.parametrize("buffer, mpi4py_class, text", [
    ("np.arange(16.0).reshape(4, 4)[:, 0]", "BufferError", "send buffer: buffer of shape (4,) and strides (32,) is "
                                                           "not contiguous; MPI moves one block (np.ascontiguousarray "
                                                           "makes one)"),
    ("np.array([1, 'a'], dtype=object)", "KeyError", "send buffer: cannot map dtype '|O' (Python objects) to an MPI "
                                                     "datatype; send objects with the lowercase methods (send, bcast, "
                                                     "...)")])
def test_a_buffer_mpi4py_refuses_is_named_by_mpi4pys_class(buffer, mpi4py_class, text, capsys):
    # mpi4py: "BufferError: dlpack: buffer is not contiguous", "KeyError: \"cannot map 'O' to MPI datatype\"". The
    # report's traceback ended with spmdsim.runtime.sim._buffers.BufferSpecError (DatatypeMapError), a private
    # module's class.
    code, out, err = _mpirun(capsys, "-c", f"import numpy as np\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 0:\n"
                                           f"    MPI.COMM_WORLD.Send({buffer}, dest=1)")
    assert code == 1 and str(PACKAGE) not in err
    assert err.startswith(f"spmdsim mpirun: error on simulated rank 0: {mpi4py_class}: {text}\nTraceback")
    assert err.endswith(f'\n  File "<string>", line 4, in <module>\n{mpi4py_class}: {text}\nraised on simulated '
                        f"rank 0 of 4\n")


def test_a_python_list_to_send_says_what_to_send(capsys):
    # mpi4py: "TypeError: a bytes-like object is required, not 'int'"; was "ShapeError: datatype 3 is not an
    # MPI datatype or a typecode" (the list read as [buffer, count, datatype]).
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\nif MPI.COMM_WORLD.rank == 0:\n"
                                           "    MPI.COMM_WORLD.Send([1, 2, 3], dest=1)")
    assert code == 1 and str(PACKAGE) not in err  # the program's frame, not the emulator's
    assert err.startswith("spmdsim mpirun: error on simulated rank 0: TypeError: send buffer: [1, 2, 3] is read as "
                          "[buffer, count, datatype] and 1 is not a buffer; pass a numpy array "
                          "(np.array([1, 2, 3])), or send Python objects with the lowercase methods (send, recv, "
                          "bcast, ...)\n")


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
def test_cartesian_grids_as_mpich_makes_them(tmp_path, capsys):
    # Create_cart was an AttributeError. A 3 x 2 grid on 6 ranks; a grid smaller than the communicator
    # (COMM_NULL outside), one too large (MPI.ERR_ARG), Sub to no dimension, Dup, Get_coords out of range.
    prog = tmp_path / "grid.py"
    prog.write_text(
        "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
        "try:\n    comm.Create_cart([comm.size, 2])\nexcept MPI.Exception as e:\n"
        "    print(comm.rank, 'too large', e.Get_error_class() == MPI.ERR_ARG)\n"
        "c = comm.Create_cart([comm.size - 1], periods=[True])\n"
        "print(comm.rank, 'outside', c == MPI.COMM_NULL)\n"
        "if c != MPI.COMM_NULL:\n"
        "    s, d = c.Sub([False]), c.Dup()\n"
        "    print(comm.rank, 'sub', s.size, s.dims, s.topo, 'dup', d.dims, d.topology == MPI.CART, c.Shift(0, 2))\n"
        "    try:\n        c.Get_coords(comm.size)\n    except MPI.Exception as e:\n"
        "        print(comm.rank, 'coords', e.Get_error_class() == MPI.ERR_RANK)\n")
    for script, n in ((str(LAB / "cart.py"), "6"), (str(prog), "4")):
        if script == str(prog):
            _older_mpich("grid.py")  # cart.py compared
        mpi = mpich_batch([("it", script, [])], int(n))["it"]
        assert main(["mpirun", "-n", n, "python", script]) == 0
        out, err = capsys.readouterr()
        assert err == "" and sorted(out.splitlines()) == sorted(line for lines in mpi for line in lines)


def test_a_report_names_a_peer_by_its_rank_in_the_communicator_and_in_the_world(capsys, monkeypatch):
    # A request on a communicator other than the world: its peer's world rank too (was "recv from group rank 0" of
    # a group whose rank 0 is world rank 2). A Waitany of requests on two communicators names each one's own (was
    # "recv from group rank 1 (tag 1) | recv from group rank 2 (tag 2) on the group of ranks 1,3": a rank 2 of
    # a group of 2).
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "sub = comm.Split(comm.rank // 2, comm.rank)\n"
                                           "if comm.rank == 3:\n    sub.Recv(np.empty(1), source=0, tag=7)")
    assert code == 1 and unfold(err) == (
        DEADLOCK + "recv from group rank 0 (world rank 2; tag 7) on the group of ranks 2,3: rank 3 waits in it; rank 2 "
                   "finished; no rank has sent to group rank 1 (world rank 3); at <string>:6\n")
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "sub = comm.Create_group(comm.group.Incl([3, 1])) if comm.rank in (1, 3) "
                                           "else None\nif comm.rank == 3:\n"
                                           "    MPI.Request.Waitany([sub.Irecv(np.empty(1), 1, 1), "
                                           "comm.Irecv(np.empty(1), 2, 2)])")
    assert code == 1 and unfold(err) == (
        DEADLOCK + "recv from group rank 1 (world rank 1; tag 1) on the group of ranks 1,3 | recv from group rank 2 "
                   "(tag 2) on the world: rank 3 waits in it; rank 1 finished; no rank has sent to group rank 0 (world "
                   "rank 3); rank 2 finished; no rank has sent to rank 3; at <string>:6\n")


def test_a_poll_of_a_persistent_request_is_the_polling_ranks(capsys, monkeypatch):
    # A persistent request (and a copy, MPI.Request(req)) polled in vain was a poll of world rank 0, "persistent",
    # whatever rank polled it: rank 3's loop below ran forever (rank 0 had finished; rank 3 was never "alone").
    monkeypatch.setattr(engine, "POLL_STALL_S", _STALL_S)
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "if comm.rank == 3:\n    r = comm.Recv_init(np.empty(1), 2, 1)\n"
                                           "    r.Start()\n    while not r.Test():\n        pass\n"
                                           "elif comm.rank == 2:\n    comm.Recv(np.empty(1), 0, 1)")
    assert code == 1 and unfold(err) == (
        DEADLOCK + "recv from group rank 2 (tag 1) on the world: rank 3 polls it (Test), while every other live rank "
                   "waits; no rank has sent to rank 3; at <string>:7 | recv from group rank 0 (tag 1) on the world: "
                   "rank 2 waits in it; rank 0 finished; no rank has sent to rank 2; at <string>:10\n")
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "if comm.rank == 1:\n    r = MPI.Request(comm.Irecv(np.empty(1), 3, 1))\n"
                                           "    while not r.Test():\n        pass")
    assert code == 1 and unfold(err) == (
        DEADLOCK + "recv from group rank 3 (tag 1) on the world: rank 1 polls it (Test), and no rank left can "
                   "complete it; rank 3 finished; no rank has sent to rank 1; at <string>:6\n")


def test_an_iprobe_loop_for_a_finished_rank_ends(capsys, monkeypatch):
    monkeypatch.setattr(engine, "POLL_STALL_S", _STALL_S)
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "if comm.rank == 0:\n    while not comm.Iprobe(source=3):\n        pass")
    assert code == 1 and unfold(err) == (
        DEADLOCK + "probe from group rank 3 (any tag) on the world: rank 0 polls it (Iprobe), "
                   "and no rank left can complete it; rank 3 finished; no rank has sent to rank 0; at <string>:4\n")


def test_a_polling_loop_naps_while_it_waits(capsys, monkeypatch):
    # test_loop_late.py's rank 0 polls (Testany, then Iprobe) while rank 1 works 0.3 s: past SPIN_S of polls in
    # vain it naps NAP_S after each (it spun a core and held the interpreter all the while); the answer is the same.
    naps, sleep = [], engine.real_sleep  # the engine naps with Python's own sleep (time.sleep gives the slot away)
    monkeypatch.setattr(engine, "NAP_S", 0.00097)  # a nap is a sleep of this length; the program's are others

    def counted(seconds):
        if seconds == engine.NAP_S:
            naps.append(seconds)
        sleep(seconds)
    monkeypatch.setattr(engine, "real_sleep", counted)
    code, out, err = _mpirun(capsys, str(LAB / "test_loop_late.py"), "0.3")
    assert (code, out, err) == (0, "rank 0 got 2.0 2.0 done\n", "")
    assert naps


def test_stdin_goes_to_rank_zero(monkeypatch, capsys):
    # mpiexec forwards stdin to rank 0; MPICH leaves another rank's input() waiting forever. It was every
    # rank reading the next line (rank 1 got 'b').
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\nc\nd\n"))
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ntry:\n    line = input()\n"
                                           "except EOFError as e:\n    line = str(e)\nprint(MPI.COMM_WORLD.rank, line)")
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == ["0 a"] + [f"{r} simulated rank {r} reads stdin, which goes to rank 0 only "
                                                  f"(as mpiexec forwards it): read it on rank 0 and send it on "
                                                  f"(comm.bcast)" for r in (1, 2, 3)]


def test_each_rank_has_its_own_random_generators(capsys):
    # random.seed(rank) / np.random.seed(rank) seeded one generator all ranks drew from (montecarlo.py above
    # compares the draws with MPICH's); after the run the modules' own generators are back.
    import random

    import numpy as np

    before = random.random, np.random.rand, np.random.seed
    code, out, err = _mpirun(capsys, "-c", "import random\nimport numpy as np\nfrom mpi4py import MPI\n"
                                           "random.seed(7)\nnp.random.seed(7)\nMPI.COMM_WORLD.Barrier()\n"
                                           "print(random.random(), np.random.rand())")
    assert (code, err) == (0, "") and len(set(out.splitlines())) == 1
    assert out.splitlines()[0] == f"{random.Random(7).random()} {np.random.RandomState(7).rand()}"
    assert (random.random, np.random.rand, np.random.seed) == before


def test_a_long_deadlock_line_describes_six_calls_and_counts_the_rest(capsys):
    # A ring of 12 ranks each Sending 800 KB before receiving: 12 blocked sends, one line all the same.
    code = main(["mpirun", "-n", "12", "python", "-c",
                 "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                 "comm.Send(np.zeros(100000), dest=(comm.rank + 1) % comm.size)\n"
                 "comm.Recv(np.zeros(100000), source=(comm.rank - 1) % comm.size)"])
    err = capsys.readouterr().err
    # One call a line (7 and the hint), each folded within 100 columns; unfold() gives the one line back.
    lines = err.splitlines()
    assert lines[0] == DEADLOCK.rstrip() and max(map(len, lines)) <= 100
    assert [line for line in lines if line.startswith("  ") and not line.startswith("   ")][-2:] == [
        "  and 6 more calls, where ranks 6-11 wait",
        "  a standard Send of 8 KiB or more waits for its receive, as MPICH's does past its eager limit: post"]
    err = unfold(err)
    assert code == 1 and err.count("\n") == 1 and err.count("send to group rank") == 6
    assert err.endswith("; a message of 800000 bytes; at <string>:4 | and 6 more calls, where ranks 6-11 wait | a "
                        "standard Send of 8 KiB or more waits for its receive, as MPICH's does past its eager limit: "
                        "post the receive first on one side, or use Sendrecv or Isend/Irecv\n")


def test_reductions_refuse_a_send_count_other_than_the_receive_count(capsys):
    # mpi4py: "ValueError: mismatch in send count 2 and receive count 3" on every rank; the simulator summed
    # the 2 and left the third item as it was ([4. 4. 0.]).
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\n"
                                           "MPI.COMM_WORLD.Allreduce(np.ones(2), np.zeros(3))")
    assert (code, out) == (1, "")
    assert err.startswith("spmdsim mpirun: error on simulated ranks 0-3: ShapeError: Allreduce: 2 items are sent but "
                          "the receive buffer takes 3\n")


_LOCK_IN_TURN = """# Rank 0 holds rank 0's window's lock while rank 1 asks for it, then unlocks and locks again at once:
# rank 1 asked first, so it gets the lock first and its Put comes before rank 0's Get (MPICH's locks grant in turn).
import time

import numpy as np
from mpi4py import MPI

from spmdsim.base import context

comm = MPI.COMM_WORLD
mem = np.zeros(1, "i")
win = MPI.Win.Create(mem if comm.rank == 0 else None, 4, comm=comm)
if comm.rank == 0:
    win.Lock(0)
    comm.send("locked", dest=1)
    world = context.simulated().comm._group.world  # spmdsim's engine: is rank 1 waiting in Lock yet?
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "Win.Lock" not in (world.waiting[1].text() if 1 in world.waiting else ""):
        time.sleep(0.01)
    print("rank 1 waits in", world.waiting[1].text())
    win.Unlock(0)
    win.Lock(0)
    got = np.zeros(1, "i")
    win.Get(got, 0)
    win.Unlock(0)
    print("rank 0 read", got[0])
elif comm.rank == 1:
    comm.recv(source=0)
    win.Lock(0)
    win.Put(np.full(1, 7, "i"), 0)
    win.Unlock(0)
win.Free()
"""


def test_a_window_lock_goes_first_to_the_rank_that_asked_first(tmp_path, capsys):
    """A rank that unlocks and locks again at once no longer takes the lock before a rank waiting for it (the
    program checks, in spmdsim's engine, that rank 1 waits in Lock before rank 0 unlocks): rank 0 read 0 there,
    and mpi4py's nxtval-scalable demo, whose mutex loops so on two ranks, ran forever now and then."""
    program = tmp_path / "lock_in_turn.py"
    program.write_text(_LOCK_IN_TURN)
    assert main(["mpirun", "-n", "2", str(program)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("rank 1 waits in Win.Lock of rank 0 on the world\nrank 0 read 7\n", "")


def test_the_programs_own_modules_are_each_ranks_own(capsys):
    # mpi_utils.py's `rank = comm.Get_rank()` ran once, in the first rank to import it: every rank printed 0.
    # modules/main.py above compares the whole output with MPICH's; here: the stand-ins are gone after the run.
    # announce.py, imported and never used, printed on the first rank to import it alone: each rank's copy ran
    # on its first use, and the other ranks never used it. Now each rank runs it at its own import statement.
    code, out, err = _mpirun(capsys, str(LAB / "modules" / "main.py"))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert sorted(line.split(" ")[:2] for line in lines if "hello" in line) == [[str(r), "hello"] for r in range(4)]
    for r in range(4):  # each rank's import printed before its own last line
        assert lines.index(f"announce imported on rank {r}") < next(i for i, line in enumerate(lines)
                                                                    if line.startswith(f"{r} hello"))
    assert len(lines) == 8
    assert "mpi_utils" not in sys.modules and "geom" not in sys.modules and "announce" not in sys.modules


def test_a_rank_waiting_on_another_ranks_communicator_is_named():
    # Ranks sharing one rank's communicator (kept in a module that every rank imports once, say) waited as
    # that rank, two threads as one, forever.
    from spmdsim.runtime.sim import SimulationError, simulate
    from spmdsim.runtime.sim import world

    shared = {}

    def body():
        comm = world()
        if comm.rank == 0:
            shared["comm"] = comm
        comm.Barrier()
        shared["comm"].Barrier()

    with pytest.raises(SimulationError, match=r"simulated rank [123] waits in barrier on the world \(call \d\) as "
                                              r"rank 0, on rank 0's communicator: each rank must use its own"):
        simulate(4, body)


@pytest.mark.parametrize("call, first", [
    ("comm.Sendd(1, dest=1)", "AttributeError: 'Intracomm' object has no attribute 'Sendd'"),
    ("comm.Send()", "TypeError: Intracomm.Send() missing 2 required positional arguments: 'buf' and 'dest'"),
    ("comm.Rsend()", "TypeError: Intracomm.Send() missing 2 required positional arguments: 'buf' and 'dest'"),
    ("comm.bcast(1, 0, 3)", "TypeError: Intracomm.bcast() takes from 1 to 3 positional arguments but 4 were given"),
    ("comm.Get_group().Foo()", "AttributeError: 'Group' object has no attribute 'Foo'"),
    ("MPI.Request.Testall()", "TypeError: Request.Testall() missing 1 required positional argument: 'requests'"),
    ("comm.Create_cart([1, 1]).Shift()",
     "TypeError: Cartcomm.Shift() missing 2 required positional arguments: 'direction' and 'disp'"),
    ("print(comm, comm.Get_group(), comm.Create_cart([1]))", None),
])
def test_errors_and_reprs_name_mpi4pys_classes(call, first, capsys):
    # As mpi4py's do ('mpi4py.MPI.Intracomm' object has no attribute ...), never SimComm or PointToPoint.Send.
    code = main(["mpirun", "-n", "1", "python", "-c", f"import numpy as np\nfrom mpi4py import MPI\n"
                                                       f"comm = MPI.COMM_WORLD\n{call}\n"])
    out, err = capsys.readouterr()
    if first is None:
        assert (code, err, out) == (0, "", "<simulated Intracomm rank 0 of 1 (the world)> <simulated Group (0,)> "
                                           "<simulated Cartcomm rank 0 of 1, dims [1]>\n")
        return
    assert code == 1 and err.startswith(f"spmdsim mpirun: error on simulated rank 0: {first}\n"), err
    assert "Sim" not in err and "PointToPoint" not in err


def test_graph_neighbour_collectives_by_hand(capsys):
    # graphs.py's general graph of 3 nodes on 4 ranks: 0 - 1 twice (a multigraph), 1 - 2, 2 - 0; rank 3 is left
    # out. Rank 0's neighbours are [1, 2, 1]: from its first edge to 1 it receives rank 1's block for rank 1's
    # first edge to 0 (its block 0), from its second edge rank 1's block 2; from 2, rank 2's block 1.
    # (test_right_programs_print_what_mpiexec_prints runs it under MPICH too: the same lines.)
    code, out, err = _mpirun(capsys, str(LAB / "graphs.py"))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "0 graph alltoall [10.0, 21.0, 12.0]" in lines and "3 graph: none" in lines
    assert "0 graph alltoallv [100, 201, 202, 103, 104, 105]" in lines  # rank 1 sends block j as j + 1 items
    assert "2 adjacent alltoall [101.0, 2.0]" in lines  # from 1 (its first destination), from 0 (its second)
    assert "2 dist (3, 3, False) [2, 3, 3] [1, 1, 2]" in lines


def test_a_graph_whose_edges_do_not_match_is_one_error_not_a_hang(tmp_path, capsys):
    program = tmp_path / "one_way.py"
    program.write_text("import numpy as np\nfrom mpi4py import MPI\n"
                       "g = MPI.COMM_WORLD.Create_graph([1, 1], [1])  # node 0 lists 1; node 1 lists none\n"
                       "got = np.full(g.nneighbors, -1.0)\n"
                       "g.Neighbor_allgather(np.array([float(g.rank)]), got)\n")
    code = main(["mpirun", "-n", "2", "python", str(program)])
    out, err = capsys.readouterr()
    assert code == 1 and err.startswith(
        f"spmdsim mpirun: error on simulated rank 0: MPI.Exception: {mpi_says('ERR_TOPOLOGY')}: group rank 0 "
        "receives from "
        "group rank 1 1 time(s), but group rank 1 sends to it 0 time(s): the graph's edges do not match\n"), err


def test_alltoallw_blocks_that_disagree_are_one_error_and_bottom_blocks_are_absolute_addresses(tmp_path, capsys):
    # From MPI.BOTTOM each block's displacement is an absolute address (MPI.Get_address): rank j's int j of
    # each rank's pair lands at int (sender) of the receiver's (spmdsim.emulator.derived.wblocks). Then rank
    # 1 sends rank 0 two int32s (8 bytes) where rank 0 receives one (4 bytes): MPI's truncation, named in
    # bytes (Alltoallw's counts are of different datatypes).
    program = tmp_path / "w.py"
    program.write_text(textwrap.dedent("""\
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        send, got = np.array([10 * comm.rank, 10 * comm.rank + 1], "i"), np.zeros(2, "i")
        a, b = MPI.Get_address(send), MPI.Get_address(got)
        comm.Alltoallw([MPI.BOTTOM, ([1, 1], [a, a + 4]), [MPI.INT] * 2],
                       [MPI.BOTTOM, ([1, 1], [b, b + 4]), [MPI.INT] * 2])
        print(comm.rank, "bottom:", got.tolist())
        mine = 2 if comm.rank == 1 else 1
        comm.Alltoallw([np.zeros(4, "i"), ([mine, mine], [0, 8]), [MPI.INT] * 2],
                       [np.zeros(4, "i"), ([1, 1], [0, 8]), [MPI.INT] * 2])
        """))
    code = main(["mpirun", "-n", "2", "python", str(program)])
    out, err = capsys.readouterr()
    assert sorted(line for line in out.splitlines() if "bottom" in line) == ["0 bottom: [0, 10]", "1 bottom: [1, 11]"]
    assert code == 1 and "Alltoallw counts disagree: rank 1 sends 8 bytes to rank 0, which expects 4" in err, err


def test_neighbour_collectives_by_hand(capsys):
    # Rank 0 of a 2 x 2 grid periodic in dimension 0: neighbours rank 2 (back and forward: a dimension of 2),
    # MPI.PROC_NULL (back, dimension 1: its receive block stays -1), rank 1. The block from the one back
    # is what it sent forward. (test_right_programs_print_what_mpiexec_prints runs it under MPICH too.)
    code, out, err = _mpirun(capsys, str(LAB / "neighbors.py"))
    assert (code, err) == (0, "")
    mine = sorted(line for line in out.splitlines() if line.startswith("[2, 2] [True, False] rank 0:"))
    assert mine == ["[2, 2] [True, False] rank 0: allgather [2.0, 2.0, -1.0, 1.0]",
                    "[2, 2] [True, False] rank 0: allgatherv [2, 20, 2, 20, -1, -1, 1, 10]",
                    "[2, 2] [True, False] rank 0: alltoall [201.0, 200.0, -1.0, 102.0]",
                    "[2, 2] [True, False] rank 0: alltoallv [201, -1, 200, -1, -1, -1, -1, 102, 103]"]
    assert "0 objects [2, 2, None, 1] ['2>1', '2>0', None, '1>2']" in out.splitlines()


def test_a_receive_from_proc_null_has_mpichs_status(capsys):
    # MPICH: source MPI.PROC_NULL (-1), tag MPI.ANY_TAG (-1), count 0 for every receive from MPI.PROC_NULL.
    # Sendrecv and Sendrecv_replace gave source -2 (MPI.ANY_SOURCE): their request's own empty status.
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        import numpy as np
        from mpi4py import MPI
        comm, b = MPI.COMM_WORLD, np.zeros(2)
        for name, call in [
                ("Sendrecv", lambda st: comm.Sendrecv(np.ones(2), dest=MPI.PROC_NULL, sendtag=4, recvbuf=b,
                                                      source=MPI.PROC_NULL, recvtag=5, status=st)),
                ("Sendrecv_replace", lambda st: comm.Sendrecv_replace(b, dest=MPI.PROC_NULL, source=MPI.PROC_NULL,
                                                                      status=st)),
                ("Recv", lambda st: comm.Recv(b, source=MPI.PROC_NULL, tag=7, status=st))]:
            st = MPI.Status()
            call(st)
            if comm.rank == 0:
                print(name, st.Get_source() == MPI.PROC_NULL, st.Get_tag() == MPI.ANY_TAG, st.Get_count(MPI.DOUBLE))
        """))
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"{name} True True 0" for name in ("Sendrecv", "Sendrecv_replace", "Recv")]


def test_a_root_is_taken_as_mpi4py_takes_it(capsys):
    # A float root is truncated, as mpi4py's C int takes it (tests/data/lab/int_arguments.py compares more with
    # MPICH); a str is mpi4py's TypeError on every rank. Both were MPI.Exception: Invalid root: root 1.0 is outside
    # the communicator of 2 ranks.
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "print(comm.rank, comm.bcast(comm.rank, root=comm.size / 2))\n"
                                           "comm.bcast(comm.rank, root='0')\n")
    assert sorted(out.splitlines()) == [f"{r} 2" for r in range(4)]
    assert code == 1 and err.startswith("spmdsim mpirun: error on simulated ranks 0-3: TypeError: an integer is "
                                        "required: bcast root is '0'\n"), err


def test_a_wildcard_is_mpi_any_source_or_tag_never_none(capsys):
    # mpi4py's receives and probes take a C int, MPI.ANY_SOURCE / MPI.ANY_TAG their defaults: None is its TypeError
    # (it was read as the wildcard, so such a program ran here and failed under MPICH). A probe's source outside
    # the communicator is MPI's invalid rank (the probe waited for it, and the deadlock report failed).
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        from mpi4py import MPI
        import numpy as np
        comm, buf = MPI.COMM_WORLD, np.zeros(1)
        calls = {"recv": lambda: comm.recv(source=None), "irecv": lambda: comm.irecv(tag=None),
                 "Recv": lambda: comm.Recv(buf, tag=None), "Recv_init": lambda: comm.Recv_init(buf, source=None),
                 "Probe": lambda: comm.Probe(source=None), "improbe": lambda: comm.improbe(tag=None),
                 "Message.probe": lambda: MPI.Message.probe(comm, source=None),
                 "Sendrecv": lambda: comm.Sendrecv(buf, 0, recvbuf=buf, source=None),
                 "sendrecv": lambda: comm.sendrecv(1, 0, recvtag=None),
                 "Precv_init": lambda: comm.Precv_init(buf, 1, 0, tag=None),
                 "probe 9": lambda: comm.probe(source=9), "Iprobe -5": lambda: comm.Iprobe(source=-5)}
        for name, call in calls.items():
            try:
                call()
            except (TypeError, MPI.Exception) as e:
                print(comm.rank, name, type(e).__name__, e)
        comm.send(comm.rank, dest=comm.rank ^ 1)
        print(comm.rank, "got", comm.recv(), comm.Iprobe())
        """))
    assert (code, err) == (0, "")
    none = "TypeError an integer is required: {} is None"
    outside = (f"Exception {mpi_says('ERR_RANK')}: source rank {{}} is outside the communicator of 4 ranks (0 to 3, "
               "or MPI.PROC_NULL)")
    said = ["recv " + none.format("source"), "irecv " + none.format("tag"), "Recv " + none.format("tag"),
            "Recv_init " + none.format("source"), "Probe " + none.format("source"), "improbe " + none.format("tag"),
            "Message.probe " + none.format("source"), "Sendrecv " + none.format("source"),
            "sendrecv " + none.format("recv tag"), "Precv_init " + none.format("tag"), "probe 9 " + outside.format(9),
            "Iprobe -5 " + outside.format(-5)]
    for r in range(4):
        assert [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(f"{r} ")] == [
            *said, f"got {r ^ 1} False"]


def test_every_rank_polling_in_vain_is_a_deadlock(capsys, monkeypatch):
    # Every rank polls (Test, napping) for a message nobody sends: it ran until killed. Reported once every rank
    # has polled idly for POLL_STALL_S, no message moving; each rank named with its line (the Test or the nap:
    # where its thread is). test_loop_all_late.py (above, against MPICH) polls while one rank computes, then
    # sleeps, before it sends: never reported.
    monkeypatch.setattr(engine, "POLL_STALL_S", _STALL_S)
    code, out, err = _mpirun(capsys, str(LAB / "test_loop_all.py"))
    assert code == 1 and out == "" and err.startswith(DEADLOCK.rstrip() + "\n  "), err
    clauses = unfold(err)[len(DEADLOCK):].rstrip("\n").split(" | ")
    assert len(clauses) == 4, err
    assert re.fullmatch(r"recv from group rank (\d) \(tag 3\) on the world: rank (\d) polls it \(Test\), while every "
                        r"other live rank waits or polls in vain; rank \1 polls \(Test\) in vain; no rank has sent to "
                        r"rank \2; at test_loop_all.py:(9|10)", clauses[0]), clauses[0]
    ranks = set()
    for clause in clauses:
        found = re.search(r"recv from group rank (\d) \(tag 3\) on the world: rank (\d) polls it "
                          r"\(Test\)(,| in vain;).*at test_loop_all.py:(9|10)$", clause)
        assert found and int(found[1]) == (int(found[2]) + 1) % 4, clause
        ranks.add(int(found[2]))
    assert ranks == {0, 1, 2, 3}


def test_aliased_buffers_are_mpichs_error(capsys):
    # Allreduce(a, a) reduced into a (every rank [4.0, 4.0, 4.0], exit 0), where MPICH refuses a send buffer that
    # shares the receive buffer's memory: MPI.Exception (MPI.ERR_BUFFER) "Invalid buffer pointer ... Buffers must
    # not be aliased". aliased.py (above, against MPICH) tries each collective; here the values and the line. A
    # block of the receive buffer other than the rank's own is not checked, as MPICH does not.
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        a = np.ones(8) * comm.rank
        for name, call in [("in place", lambda: comm.Allreduce(MPI.IN_PLACE, a[:3])),
                           ("Allgather", lambda: comm.Allgather(a[2 * comm.rank:][:2], a)),
                           ("Scatter", lambda: MPI.COMM_SELF.Scatter(a[:2], a[:2], root=0)),
                           ("Allgather other", lambda: comm.Allgather(a[2:4] if comm.rank == 0 else a[:2], a))]:
            try:
                call()
                print(comm.rank, name, "ran", a[:3].tolist() if name == "in place" else "")
            except MPI.Exception as e:
                print(comm.rank, name, e.Get_error_class() == MPI.ERR_BUFFER)
        comm.Allreduce(a, a)
        """))
    assert sorted(out.splitlines()) == sorted(line for r in range(4) for line in (
        f"{r} in place ran [6.0, 6.0, 6.0]", f"{r} Allgather True", f"{r} Scatter True",
        f"{r} Allgather other ran ")), out
    assert code == 1 and err.startswith(
        f"spmdsim mpirun: error on simulated ranks 0-3: MPI.Exception: {mpi_says('ERR_BUFFER')}: Allreduce: buffers "
        "must not be aliased: the data sent and the receive buffer share memory (the MPI standard forbids it); pass "
        "MPI.IN_PLACE as the send buffer\n"), err


def test_irecv_without_a_buffer_takes_mpi4pys_32_kib(capsys):
    # mpi4py's irecv() receives into a buffer of mpi4py.rc.irecv_bufsz bytes (32 KiB) of its own: a longer pickle
    # is MPI's "Message truncated" when the request completes (MPICH 5: 32800 bytes of b"x" fails, 32700 passes),
    # where the emulator received any size. recv and sendrecv (which probe first) and an irecv given a buffer large
    # enough take it. A truncation names what irecv was given (an irecv given a buffer or a size said "given none"),
    # and the bytes land in a buffer given, those that fit when truncated, as MPICH writes them (the buffer was left
    # as it was; a read-only one is mpi4py's BufferError, where it was taken).
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            for n in (32700, 32800, 40000, 40000, 40000, 40000):
                comm.send(b"x" * n, dest=1)
        elif comm.rank == 1:
            buf = bytearray(40000)
            for recv in (lambda: comm.irecv(source=0).wait(), lambda: comm.irecv(source=0).wait(),
                         lambda: comm.irecv(bytearray(50000), source=0).wait(), lambda: comm.recv(source=0),
                         lambda: comm.irecv(buf, source=0).wait(), lambda: comm.irecv(100, source=0).wait(),
                         lambda: comm.irecv(bytes(50000), source=0)):
                try:
                    print(len(recv()))
                except MPI.Exception as e:
                    print(e.Get_error_class() == MPI.ERR_TRUNCATE, e)
                except BufferError as e:
                    print("BufferError", e)
            print(buf[:2], buf.count(b"x"))
        """))
    assert (code, err) == (0, "")
    truncated = f"True {mpi_says('ERR_TRUNCATE')}: rank 0 sends"
    assert out.splitlines() == [
        "32700", f"{truncated} 32818 bytes (tag 0) but rank 1 receives into a buffer of 32768 (irecv's; given "
        "none, mpi4py's own of mpi4py.rc.irecv_bufsz bytes: give irecv a buffer large enough, or receive with recv, "
        "which takes any size)", "40000", "40000",
        f"{truncated} 40018 bytes (tag 0) but rank 1 receives into a buffer of 40000 (the buffer given to irecv: "
        "give it one large enough, or receive with recv, which takes any size)",
        f"{truncated} 40018 bytes (tag 0) but rank 1 receives into a buffer of 100 (irecv's of the 100 bytes "
        "asked for: ask for enough, or receive with recv, which takes any size)",
        "BufferError Object is not writable.", "bytearray(b'\\x80\\x05') 39984"]


def test_irecv_takes_an_integer_as_its_buffers_size(capsys):
    # mpi4py's irecv(100) receives into a buffer of 100 bytes of its own (its test_p2p_obj's irecv(0, MPI.PROC_NULL));
    # the emulator read the integer as a buffer: TypeError, "memoryview: a bytes-like object is required, not 'int'".
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            comm.send("hello", dest=1)
            comm.send("x" * 100, dest=1)
        elif comm.rank == 1:
            print(comm.irecv(100, source=0).wait(), comm.irecv(0, MPI.PROC_NULL).wait())
            try:
                comm.irecv(20, source=0).wait()
            except MPI.Exception as e:
                print(e.Get_error_class() == MPI.ERR_TRUNCATE)
            try:
                comm.irecv(-1, source=0)
            except ValueError as e:
                print(e)
        """))
    assert (code, err) == (0, "")
    assert out.splitlines() == ["hello None", "True", "irecv: buffer size -1 is negative (an integer buf is a size in "
                                                      "bytes)"]


def test_a_persistent_requests_rank_and_tag_are_checked_when_made(capsys):
    # MPICH's Send_init / Recv_init refuse a rank outside the communicator or a negative tag at once; the emulator
    # made the request (the error came at Start, or never: Recv_init took any source).
    code, out, err = _mpirun(capsys, "-c", textwrap.dedent("""\
        import numpy as np
        from mpi4py import MPI
        comm, b = MPI.COMM_WORLD, np.zeros(1)
        for call in (lambda: comm.Send_init(b, dest=99), lambda: comm.Recv_init(b, source=99),
                     lambda: comm.Ssend_init(b, dest=0, tag=-3), lambda: comm.Recv_init(b, source=0, tag=-3)):
            try:
                call()
            except MPI.Exception as e:
                print(comm.rank, e.Get_error_class() in (MPI.ERR_RANK, MPI.ERR_TAG), e)
        """))
    assert (code, err) == (0, "")
    assert [line for line in out.splitlines() if line.startswith("0 ")] == [
        f"0 True {mpi_says('ERR_RANK')}: dest rank 99 is outside the communicator of 4 ranks (0 to 3, "
        "or MPI.PROC_NULL)",
        f"0 True {mpi_says('ERR_RANK')}: source rank 99 is outside the communicator of 4 ranks (0 to 3, or "
        "MPI.PROC_NULL)",
        f"0 True {mpi_says('ERR_TAG')}: send tag -3 is negative: tags are 0 or more",
        f"0 True {mpi_says('ERR_TAG')}: receive tag -3 is negative: tags are 0 or more; MPI.ANY_TAG matches any"]


def test_a_partial_overlap_is_refused_as_the_standard_forbids_it(capsys):
    # Buffers that overlap from another address: MPICH does not check them (Exscan and Reduce_scatter run as if the
    # data sent were copied first, Alltoall gives an answer that changes from run to run, Allreduce and Scan abort
    # on an assertion); MPI forbids them, so they stay refused, the line saying so (was: "share memory", as if
    # MPICH refused them too).
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\na = np.ones(5)\n"
                                           "MPI.COMM_WORLD.Exscan(a[1:], a[:4])\n")
    assert code == 1 and out == "" and err.startswith(
        f"spmdsim mpirun: error on simulated ranks 0-3: MPI.Exception: {mpi_says('ERR_BUFFER')}: Exscan: buffers "
        "must not be aliased: the data sent and the receive buffer overlap (the MPI standard forbids it; MPICH "
        "refuses only buffers that start at one address, and runs this overlap with its copying order's answer, or "
        "aborts); pass MPI.IN_PLACE as the send buffer\n"), err


def test_a_none_buffer_is_mpi4pys_type_error(capsys):
    # None where a buffer goes was read as an empty uint8 message: "Allreduce: send dtype 'float64' and receive
    # dtype 'uint8' differ", a Bcast(None) that ran, or "collectives diverge ... uint8". mpi4py raises TypeError
    # ("message: expecting buffer or list/tuple") but where MPI reads no buffer or None is MPI.IN_PLACE;
    # none_buffers.py (above, against MPICH) tries each collective, here the line.
    code, out, err = _mpirun(capsys, "-c", "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                                           "a = np.ones(4)\n"
                                           "comm.Reduce(a, None if comm.rank else np.zeros(4), root=0)\n"
                                           "comm.Bcast(None)\n")
    assert code == 1 and out == "" and err.startswith(
        "spmdsim mpirun: error on simulated ranks 0-3: TypeError: Bcast buffer: message: expecting buffer or "
        "list/tuple, got None (Python objects go with the lowercase methods: send, bcast, allreduce, ...)\n"), err


def _local_pickled() -> str:
    """What pickle says of main's local function f in this Python ("Can't pickle local object 'main.<locals>.f'";
    3.13 says "Can't get local object")."""
    def main():
        def f(x):
            return x
        return pickle.dumps(f)
    try:
        main()
    except AttributeError as exc:
        return str(exc).replace("_local_pickled.<locals>.", "")
    raise AssertionError("a local function pickled")


@pytest.mark.parametrize("program, first", [
    ("def main():\n    def f(x):\n        return x\n    comm.send(f, dest=1)\nif comm.rank == 0:\n    main()\n"
     "elif comm.rank == 1:\n    comm.recv(source=0)",
     f"spmdsim mpirun: error on simulated rank 0: AttributeError: {_local_pickled()}"),
    ("if comm.rank == 1:\n    input()\n",
     "spmdsim mpirun: error on simulated rank 1: EOFError: simulated rank 1 reads stdin, which goes to rank 0 only "
     "(as mpiexec forwards it): read it on rank 0 and send it on (comm.bcast)"),
])
def test_an_object_that_does_not_pickle_or_stdin_off_rank_0_shows_the_programs_frames_only(program, first, capsys,
                                                                                          monkeypatch):
    """The traceback ended in the emulator's frames (spmdsim/emulator/p2p.py, runtime/sim/p2p.py, rank_streams.py)
    for an error of the program's: a local function sent with send, input() on rank 1."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, out, err = _mpirun(capsys, "-c", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n" + program)
    assert code == 1 and err.startswith(first + "\nTraceback (most recent call last):\n  File \"<string>\""), err
    assert str(PACKAGE) not in err, err
