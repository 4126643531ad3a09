"""MPI's errors under each error handler on simulated ranks, as under MPICH: ERRORS_ARE_FATAL and
ERRORS_ABORT end the job (one line, the error class as exit code), ERRORS_RETURN raises MPI.Exception, a user's
handler is called and the call returns; mpi4py.rc.errors picks the handler communicators and sessions start
with; windows and files are refused."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spmdsim.tools.cli.main import main
from testkit import MPICH, mpi_says

_BAD_RANK = """
    import sys
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    if sys.argv[1] == "fatal":
        comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    elif sys.argv[1] == "abort":
        comm.Set_errhandler(MPI.ERRORS_ABORT)
    print("before", comm.rank, flush=True)
    comm.Barrier()
    if comm.rank == 0:
        try:
            comm.Send(np.zeros(3), dest=comm.size + 3)
        except MPI.Exception as exc:
            print("caught", exc.Get_error_class(), flush=True)
    comm.Barrier()
    print("after", comm.rank, flush=True)
    """

_START = """
    import sys
    import mpi4py
    mpi4py.rc.errors = sys.argv[1]
    from mpi4py import MPI

    NAMES = [(MPI.ERRORS_RETURN, "return"), (MPI.ERRORS_ARE_FATAL, "fatal"), (MPI.ERRORS_ABORT, "abort")]

    def name(comm):
        eh = comm.Get_errhandler()
        found = [text for handler, text in NAMES if handler == eh]
        eh.Free()
        return found[0] if found else "user"

    world = MPI.COMM_WORLD
    dup = world.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    print(sys.argv[1], name(world), name(MPI.COMM_SELF), name(dup), name(dup.Dup()), name(dup.Split(0, 0)),
          name(world.Dup()))
    """


def _run(tmp_path: Path, source: str, arg: str, simulated: bool, n: int = 2,
         process: bool = False) -> subprocess.CompletedProcess:
    """`source` as prog.py on n ranks from tmp_path: simulated, by `spmdsim mpirun` in this process, or with
    `process` in a Python of its own (`python -m spmdsim.emulator.mpirun`); else under MPICH's mpiexec."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(source))
    if simulated and not process:
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            mp.chdir(tmp_path)
            code = main(["mpirun", "-n", str(n), str(script), arg])
        return subprocess.CompletedProcess(script, code, out.getvalue(), err.getvalue())
    if simulated:
        cmd = [sys.executable, "-m", "spmdsim.emulator.mpirun", "-n", str(n), str(script), arg]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    # MPICH 4.2's job ends with the aborting rank's code but leaves the rank waiting in the Barrier running, in a
    # session of its own (it spun a core for as long as it was left): whatever still runs the script is killed.
    cmd = ["timeout", "-k", "5", "60", MPICH, "-n", str(n), sys.executable, str(script), arg]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        _kill_running(script)


def _kill_running(script: Path) -> None:
    """SIGKILL to every process of this user whose command line runs `script` (Linux /proc; elsewhere none)."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid == os.getuid() and \
                    str(script).encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone, or not ours to read
            pass


@pytest.mark.parametrize("handler", ["fatal", "abort"])
def test_a_fatal_handler_ends_the_job(tmp_path, handler):
    """Send to rank 5 of 2 under ERRORS_ARE_FATAL / ERRORS_ABORT: no rank goes on, one line, exit 6
    (MPI.ERR_RANK), as MPICH's job aborts with 6; the program's except clause never runs."""
    run = _run(tmp_path, _BAD_RANK, handler, simulated=True)
    assert run.returncode == 6, run.stderr
    assert sorted(run.stdout.split("\n")) == ["", "before 0", "before 1"]
    name = "MPI.ERRORS_ARE_FATAL" if handler == "fatal" else "MPI.ERRORS_ABORT"
    assert run.stderr.replace("\n  ", " ") == (
        f"spmdsim mpirun: fatal error on simulated rank 0: {mpi_says('ERR_RANK')}: dest rank 5 is outside the "
        "communicator "
        f"of 2 ranks (0 to 1, or MPI.PROC_NULL) (in Send on the world, whose error handler is {name}; at "
        "prog.py:15): every rank was stopped\n")
    assert max(map(len, run.stderr.splitlines())) <= 100
    if MPICH:
        mpich = _run(tmp_path, _BAD_RANK, handler, simulated=False)
        assert mpich.returncode == 6 and "caught" not in mpich.stdout and "after" not in mpich.stdout
        # MPICH's abort can end the job before its own message is forwarded (seen under load: exit 6, an
        # empty stderr, 2 runs in 5): what it prints, when it prints, names the error.
        assert "Invalid rank" in mpich.stderr or mpich.stderr.strip() == "", mpich.stderr


_USER_HANDLER = """
    import sys
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    seen = []

    def handler(c, code):
        if sys.argv[1] == "raising":
            raise ValueError("no")
        seen.append((c == comm, [n for n in ("ERR_RANK", "ERR_ARG", "ERR_TRUNCATE")
                                 if getattr(MPI, n) == MPI.Get_error_class(code)]))

    comm.Set_errhandler(MPI.Comm.Create_errhandler(handler))
    got = [comm.Send(np.zeros(1), dest=9), comm.Isend(np.zeros(1), dest=9) == MPI.REQUEST_NULL,
           comm.Iprobe(source=9), comm.Create_cart([5]) == MPI.COMM_NULL]
    if comm.rank == 0:
        comm.Send(np.zeros(4), dest=1, tag=7)
    else:
        got.append(comm.Recv(np.zeros(1), source=0, tag=7))
    comm.Barrier()
    sys.stdout.write(f"{comm.rank} {got} {seen}\\n")  # one write: no interleaving
    sys.stdout.flush()
    """


def test_a_users_handler_is_called_and_the_call_returns(tmp_path):
    """Under a handler made by Create_errhandler(fn), MPI's error in a call (a bad rank, a bad size, a truncated
    message) calls fn(comm, code) once and the call returns, with MPI.REQUEST_NULL for a request, MPI.COMM_NULL
    for a communicator, as under MPICH (the error was raised as MPI.Exception and fn never called)."""
    run = _run(tmp_path, _USER_HANDLER, "", simulated=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    called = "(True, ['ERR_RANK']), (True, ['ERR_RANK']), (True, ['ERR_RANK']), (True, ['ERR_ARG'])"
    assert sorted(run.stdout.splitlines()) == [
        f"0 [None, True, False, True] [{called}]",
        f"1 [None, True, False, True, None] [{called}, (True, ['ERR_TRUNCATE'])]"]
    if MPICH:
        mpich = _run(tmp_path, _USER_HANDLER, "", simulated=False)
        assert sorted(mpich.stdout.splitlines()) == sorted(run.stdout.splitlines()), mpich.stderr[-2000:]


def test_a_users_handler_that_raises_ends_the_job(tmp_path):
    """mpi4py makes an exception in a user's handler a fatal error (MPICH's job exits 1): every rank stops, one
    line naming the handler's exception and where it was raised."""
    run = _run(tmp_path, _USER_HANDLER, "raising", simulated=True)
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert run.stderr.replace("\n  ", " ") in [
        f"spmdsim mpirun: simulated rank {r}: the error handler of the world raised ValueError: no (at prog.py:11); "
        "as mpi4py makes that a fatal error: every rank was stopped\n" for r in (0, 1)]
    if MPICH:  # (its words, "exception in user-defined error handler", may be cut off by the job's end)
        mpich = _run(tmp_path, _USER_HANDLER, "raising", simulated=False)
        assert mpich.returncode == 1, mpich.stderr


_ABORT = """
    import sys, threading, time
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    how = sys.argv[1]
    if comm.rank == 1:
        try:
            if how == "thread":
                thread = threading.Thread(target=comm.Abort, args=(4,))
                thread.start()
                thread.join()
            elif how == "fatal":
                comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
                comm.Send(np.zeros(1), dest=comm.size + 3)
            else:
                comm.Abort(4)
        except Exception as exc:
            print("caught", type(exc).__name__, flush=True)
    elif comm.rank == 0:
        time.sleep(2)
        print("slept", flush=True)
    else:
        start = time.monotonic()
        while time.monotonic() < start + 3:
            pass
        print("computed", flush=True)
    comm.Barrier()
    print("after", comm.rank, flush=True)
    """


@pytest.mark.parametrize("how", ["abort", "thread", "fatal"])
def test_abort_ends_every_rank_at_once_whatever_catches_it(tmp_path, how):
    """MPI_Abort, from the rank or a thread it started, and an error under MPI.ERRORS_ARE_FATAL end the job at
    once, as MPICH kills every process: the program's `except Exception` never runs, nor does a rank sleeping or
    computing go on to print. The Abort was an Exception: caught, the program went on (exit 0); from a thread,
    Python printed it and the ranks went on; ranks computing ran to their next MPI call, printing as they went."""
    # in a process of its own: the rank computing outside MPI stops as that process exits
    run = _run(tmp_path, _ABORT, how, simulated=True, n=3, process=True)
    assert run.returncode == (6 if how == "fatal" else 4), run.stderr
    assert run.stdout == "", run.stdout
    if how == "fatal":
        assert run.stderr.startswith("spmdsim mpirun: fatal error on simulated rank 1: "), run.stderr
    else:
        assert run.stderr == "spmdsim mpirun: simulated rank 1 called Abort(4) on the world: every rank was stopped\n"
    if MPICH:
        mpich = _run(tmp_path, _ABORT, how, simulated=False, n=3)
        assert mpich.returncode == run.returncode and mpich.stdout == "", (mpich.stdout, mpich.stderr)


def test_errors_return_raises(tmp_path):
    run = _run(tmp_path, _BAD_RANK, "return", simulated=True)
    assert run.returncode == 0 and run.stderr == ""
    assert sorted(run.stdout.splitlines()) == ["after 0", "after 1", "before 0", "before 1", "caught 6"]


_NULL_TYPE = """
    import sys
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    for args in ((np.zeros(2), 2, MPI.DATATYPE_NULL), (np.zeros(2), MPI.DATATYPE_NULL),
                 (np.zeros(2), 1, 1, MPI.DATATYPE_NULL)):
        try:
            comm.Send(list(args), dest=1 - comm.rank)
        except MPI.Exception as exc:
            said = f"MPI.Exception {comm.rank} {exc.Get_error_class() == MPI.ERR_TYPE}"
        except ValueError as exc:
            said = f"ValueError {comm.rank} {str(exc).endswith('datatype is null')}"
        sys.stdout.write(said + "\\n")  # one write: mpiexec's ranks' lines do not run together
        sys.stdout.flush()
    """


def test_a_null_datatype_is_mpis_invalid_datatype_error(tmp_path):
    """MPI.DATATYPE_NULL in a message with its count is MPI.Exception of class ERR_TYPE, as MPICH's, which a
    program's ``except MPI.Exception`` catches (it was spmdsim's ShapeError, a ValueError: the program ended);
    without a count or with a displacement, mpi4py's ValueError (mpi4py's own tests, test_msgspec, ask it)."""
    run = _run(tmp_path, _NULL_TYPE, "return", simulated=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert sorted(run.stdout.splitlines()) == ["MPI.Exception 0 True", "MPI.Exception 1 True"] + [
        "ValueError 0 True"] * 2 + ["ValueError 1 True"] * 2
    if MPICH:
        mpich = _run(tmp_path, _NULL_TYPE, "return", simulated=False)
        assert sorted(mpich.stdout.splitlines()) == sorted(run.stdout.splitlines()), mpich.stderr[-2000:]


@pytest.mark.parametrize("errors", ["default", "exception", "abort", "fatal"])
def test_rc_errors_picks_the_starting_handlers(tmp_path, errors):
    """mpi4py sets rc.errors's handler on every communicator it makes, but under "default" (MPI's: fatal on
    the predefined ones, a new one inherits its parent's); compared with MPICH's."""
    expected = {"default": "fatal fatal return return return fatal", "exception": "return " * 5 + "return",
                "abort": "abort abort return abort abort abort", "fatal": "fatal fatal return fatal fatal fatal"}
    run = _run(tmp_path, _START, errors, simulated=True, n=1)
    assert run.stdout == f"{errors} {expected[errors]}\n", run.stderr
    if MPICH and errors in ("default", "abort"):
        mpich = _run(tmp_path, _START, errors, simulated=False, n=1)
        assert mpich.stdout == run.stdout, mpich.stderr[-2000:]


def test_files_windows_and_sessions_are_made_with_rc_errors_handler(tmp_path):
    """Files and windows are made on simulated communicators (MPI.WIN_NULL is a window too), a file with the
    handler of the rank's rc.errors (MPI.FILE_NULL's stays ERRORS_RETURN), as mpi4py sets it; a session gets the
    handler of the rank's rc.errors."""
    run = _run(tmp_path, """
        import os
        import mpi4py
        mpi4py.rc.errors = "fatal"
        from mpi4py import MPI
        for win in (MPI.Win.Create(MPI.BOTTOM, 1, MPI.INFO_NULL, MPI.COMM_SELF),
                    MPI.Win.Allocate(8, 1, MPI.INFO_NULL, MPI.COMM_WORLD)):
            print(win.flavor in (MPI.WIN_FLAVOR_CREATE, MPI.WIN_FLAVOR_ALLOCATE), win.attrs[1])
            win.Free()
        f = MPI.File.Open(MPI.COMM_SELF, os.devnull, MPI.MODE_WRONLY)
        print(f.Get_errhandler() == MPI.ERRORS_ARE_FATAL, MPI.FILE_NULL.Get_errhandler() == MPI.ERRORS_RETURN)
        f.Close()
        print(isinstance(MPI.WIN_NULL, MPI.Win), MPI.Win.__name__)
        session = MPI.Session.Init()
        print(session.Get_errhandler() == MPI.ERRORS_ARE_FATAL, isinstance(session, MPI.Session))
        session.Finalize()
        """, "", simulated=True, n=1)
    assert run.stdout.splitlines() == ["True 0", "True 8", "True True",
                                                                                "True Win", "True True"], run.stderr


def test_a_communicator_from_an_mpi_handle_is_refused_in_one_line(tmp_path):
    """Comm.f2py was an AttributeError of the simulated communicator's class; it raises NotImplementedError (what
    mpi4py raises where MPI lacks a call), naming the call (a simulated communicator has no MPI handle: its py2f
    is -1). Spawn, Accept and Connect run (tests/test_sim_spawn.py)."""
    run = _run(tmp_path, """
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        try:
            MPI.Comm.f2py(comm.py2f())
        except NotImplementedError as exc:
            if comm.rank == 0:
                print(comm.py2f(), str(exc).split(":")[0])
        """, "", simulated=True, n=2)
    assert run.stdout.splitlines() == [
        "-1 a communicator from an MPI handle (Comm.fromint, Comm.f2py, Comm.fromhandle)"], run.stderr


def test_an_intercommunicators_bad_ranks_are_mpis_errors(tmp_path):
    """An intercommunicator's ranks name its remote group: a destination, source or root outside it is MPI's
    error (ERR_RANK, ERR_ROOT) naming the value; groups that overlap are ERR_GROUP; an intracommunicator's
    calls that are not simulated on one (Scan) are refused in one line."""
    run = _run(tmp_path, """
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        color = world.rank % 2
        local = world.Split(color, world.rank)
        inter = local.Create_intercomm(0, world, 1 - color, tag=5)
        calls = [lambda: inter.send(1, dest=2), lambda: inter.recv(source=3), lambda: inter.bcast(1, root=2),
                 lambda: world.Create_intercomm(0, world, 0, 6), lambda: inter.Scan(None, None)]
        for call in calls:
            try:
                call()
            except (MPI.Exception, NotImplementedError) as exc:
                if world.rank == 0:
                    print(str(exc).split(";")[0])
        inter.Free()
        """, "", simulated=True, n=4)
    assert run.stdout.splitlines() == [
        "Invalid rank: destination rank 2 is outside the remote group of 2 ranks (0 to 1, or MPI.PROC_NULL)",
        "Invalid rank: source rank 3 is outside the remote group of 2 ranks (0 to 1, MPI.ANY_SOURCE or "
        "MPI.PROC_NULL)",
        "Invalid root: bcast: root 2 is not MPI.ROOT, MPI.PROC_NULL or a rank of the remote group (0 to 1)",
        "Invalid group: Create_intercomm: world ranks 0-3 are in both the local group (world ranks 0-3) and the "
        "remote group (world ranks 0-3): an intercommunicator's groups are disjoint",
        "Intercomm.Scan: not simulated"], run.stderr


def test_an_error_class_this_mpi_lacks_is_err_arg():
    """Open MPI has no MPI_ERR_ERRHANDLER: mpi4py gives it MPI.ERR_LASTCODE, whose code reads back as ERR_UNKNOWN
    (mpi4py's own test of Set_errhandler(ERRHANDLER_NULL) failed so on simulated ranks there); the emulator's
    error is then ERR_ARG, the class Open MPI gives. Under MPICH, which has it, the class stays."""
    from types import SimpleNamespace

    from mpi4py import MPI

    from spmdsim.runtime.sim._mpi import mpi_error

    like_open_mpi = SimpleNamespace(**{name: getattr(MPI, name) for name in
                                       ("Exception", "ERR_ARG", "ERR_OTHER", "ERR_UNKNOWN", "ERR_LASTCODE")},
                                    ERR_ERRHANDLER=MPI.ERR_LASTCODE)
    made = mpi_error(like_open_mpi, like_open_mpi.ERR_ERRHANDLER, "the error handler is MPI.ERRHANDLER_NULL")
    assert isinstance(made, MPI.Exception) and made.Get_error_class() == MPI.ERR_ARG
    assert str(made).endswith(": the error handler is MPI.ERRHANDLER_NULL")
    if MPI.ERR_ERRHANDLER != MPI.ERR_LASTCODE:  # this MPI has the class (MPICH): it stays
        assert mpi_error(MPI, MPI.ERR_ERRHANDLER, "x").Get_error_class() == MPI.ERR_ERRHANDLER


def test_an_objects_own_error_as_it_is_unpickled_is_raised_as_it_is(tmp_path):
    """recv of an object whose rebuilding raises (its __reduce__ calls divmod(1, 0)) raises that error, as mpi4py
    does (mpi4py.futures' test_exc_unpickle): only bytes that are no pickle are the UnpicklingError that asks
    whether a buffer was sent."""
    run = _run(tmp_path, """
        from mpi4py import MPI
        import numpy as np


        class Bad:
            def __reduce__(self):
                return divmod, (1, 0)


        comm = MPI.COMM_WORLD
        if comm.rank == 0:
            comm.send(Bad(), dest=1)
            comm.Send(np.arange(4.0), dest=1)
        else:
            for _ in range(2):
                try:
                    comm.recv(source=0)
                except Exception as exc:
                    print(type(exc).__name__)
        """, "", simulated=True, n=2)
    assert run.stdout.splitlines() == ["ZeroDivisionError", "UnpicklingError"], run.stderr
