"""Dynamic processes on simulated ranks: `Intracomm.Spawn` and `Spawn_multiple` start new simulated ranks running
a Python program, joined to their parents by an intercommunicator (spmdsim.emulator.spawn)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spmdsim.tools.cli.main import main
from spmdsim.runtime import debug
from spmdsim.runtime.sim.report import unfold
from testkit import MPICH, MPIEXEC

LAB = Path(__file__).resolve().parent / "data" / "lab"


def _mpirun(capsys, n: int, *command: str) -> tuple:
    code = main(["mpirun", "-n", str(n), "python", *command])
    out, err = capsys.readouterr()
    return code, out, err


def _program(tmp_path: Path, source: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
def test_a_master_and_its_spawned_workers_print_what_mpiexec_prints(tmp_path, capsys):
    """tests/data/lab/spawn_master.py spawns 3 workers from a world of one, scatters, broadcasts, gathers, reduces,
    receives, merges and disconnects: the lines of `mpiexec -n 1` under MPICH's own Spawn."""
    mpich = subprocess.run(["timeout", "-k", "5", "60", MPIEXEC, "-n", "1", sys.executable,
                            str(LAB / "spawn_master.py")], capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert mpich.returncode == 0, mpich.stderr
    code, out, err = _mpirun(capsys, 1, str(LAB / "spawn_master.py"))
    assert (code, err) == (0, "")
    assert out.splitlines() == mpich.stdout.splitlines() and "spawned 3 workers" in out


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
@pytest.mark.parametrize("ranks", [1, 3])
def test_the_spawn_example_prints_what_mpiexec_prints(tmp_path, capsys, ranks):
    """examples/mpi4py/spawn_pi.py (the README's command): its ranks spawn 4 workers, the same file, which sum pi
    onto the parents' root."""
    example = str(Path(__file__).resolve().parents[1] / "examples" / "mpi4py" / "spawn_pi.py")
    mpich = subprocess.run(["timeout", "-k", "5", "60", MPIEXEC, "-n", str(ranks), sys.executable, example],
                           capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert mpich.returncode == 0, mpich.stderr
    code, out, err = _mpirun(capsys, ranks, example)
    assert (code, err) == (0, "")
    assert out.splitlines() == mpich.stdout.splitlines() and "spawned 4 workers, each in a world of 4" in out
    assert "pi is about 3.1415926536, error 8.3e-12" in out


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
def test_a_spawned_program_imports_the_modules_beside_it_first(tmp_path, capsys):
    """A worker in a folder of its own imports its neighbours (`helper`, only there) and its own `utils` where the
    master's folder has another: the first on its python's sys.path is its own folder, as under mpiexec (a
    spawned rank found neither, or the master's `utils`)."""
    (tmp_path / "workers").mkdir()
    (tmp_path / "utils.py").write_text('WHO = "the master\'s utils"\n')
    (tmp_path / "workers" / "utils.py").write_text('WHO = "the worker\'s utils"\n')
    (tmp_path / "workers" / "helper.py").write_text("def square(x):\n    return x * x\n")
    (tmp_path / "workers" / "worker.py").write_text(textwrap.dedent("""\
        from mpi4py import MPI
        import helper
        import utils
        parent = MPI.Comm.Get_parent()
        parent.gather((utils.WHO, helper.square(parent.rank + 2)), root=0)
        parent.Disconnect()
    """))
    master = _program(tmp_path, f"""\
        import sys
        from mpi4py import MPI
        import utils
        comm = MPI.COMM_SELF.Spawn(sys.executable, args=[{str(tmp_path / "workers" / "worker.py")!r}], maxprocs=2)
        print(MPI.COMM_WORLD.rank, utils.WHO, comm.gather(None, root=MPI.ROOT))
        comm.Disconnect()
    """)
    mpich = subprocess.run(["timeout", "-k", "5", "60", MPIEXEC, "-n", "2", sys.executable, master],
                           capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert mpich.returncode == 0, mpich.stderr
    code, out, err = _mpirun(capsys, 2, master)
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == sorted(mpich.stdout.splitlines()) == [
        f"{r} the master's utils [(\"the worker's utils\", 4), (\"the worker's utils\", 9)]" for r in (0, 1)]


def test_spawn_is_collective_and_the_roots_arguments_count(tmp_path, capsys):
    """Two parents spawn three children, the command only at the root: each child has its own world, its own
    sys.argv (the parents keep theirs) and the intercommunicator to the parents as Get_parent(); messages go
    both ways, a Merge puts the parents first, and after Disconnect Get_parent() is MPI.COMM_NULL."""
    prog = _program(tmp_path, """
        import sys
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        if sys.argv[1:2] == ["child"]:
            parent = MPI.Comm.Get_parent()
            print("child", world.rank, world.size, sys.argv[1:], parent.Get_remote_size(), parent.Get_size())
            parent.send(world.rank * 10, dest=world.rank % 2)
            merged = parent.Merge(high=True)
            print("child merged", merged.rank, merged.size)
            parent.Disconnect()
            print("child after", parent == MPI.COMM_NULL, MPI.Comm.Get_parent() == MPI.COMM_NULL)
        else:
            print("parent", world.rank, "parent of its own", MPI.Comm.Get_parent() == MPI.COMM_NULL)
            root = world.rank == 1
            errcodes = []
            inter = world.Spawn(sys.executable if root else None, [__file__, "child", "x y"] if root else None,
                                3 if root else -1, root=1, errcodes=errcodes)
            got = sorted(inter.recv(source=MPI.ANY_SOURCE) for _ in range(2 - world.rank))
            print("parent", world.rank, inter.Get_remote_size(), inter.Get_size(), got, errcodes, sys.argv[1:])
            merged = inter.Merge(high=False)
            print("parent merged", merged.rank, merged.size)
            inter.Disconnect()
        """)
    code, out, err = _mpirun(capsys, 2, prog, "p")
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == sorted(
        [f"parent {r} parent of its own True" for r in range(2)]
        + [f"child {r} 3 ['child', 'x y'] 2 3" for r in range(3)]
        + ["parent 0 3 2 [0, 20] [0, 0, 0] ['p']", "parent 1 3 2 [10] [0, 0, 0] ['p']"]
        + [f"parent merged {r} 5" for r in range(2)] + [f"child merged {r + 2} 5" for r in range(3)]
        + ["child after True True"] * 3)


def test_spawn_multiple_makes_one_world_of_every_commands_ranks(tmp_path, capsys):
    """Spawn_multiple of a script and `python -c`: one world of 1 + 2 children in order; each runs its own
    program with its own arguments and reads its command's index as MPI.APPNUM (MPICH's 0, 1, 1), and errcodes
    has one list per command."""
    (tmp_path / "one.py").write_text("import sys\nfrom mpi4py import MPI\np = MPI.Comm.Get_parent()\n"
                                     "w = MPI.COMM_WORLD\n"
                                     "p.send(('one', w.rank, sys.argv[1:], w.Get_attr(MPI.APPNUM)), dest=0)\n"
                                     "p.Disconnect()\n")
    code_c = ("import sys; from mpi4py import MPI; p = MPI.Comm.Get_parent(); w = MPI.COMM_WORLD; "
              "p.send(('two', w.rank, sys.argv[1:], w.Get_attr(MPI.APPNUM)), dest=0); p.Disconnect()")
    prog = _program(tmp_path, f"""
        import sys
        from mpi4py import MPI
        errcodes = []
        inter = MPI.COMM_SELF.Spawn_multiple([{str(tmp_path / "one.py")!r}, sys.executable],
                                             [["a"], ["-c", {code_c!r}, "b"]], [1, 2], errcodes=errcodes)
        print(inter.Get_remote_size(), errcodes)
        print(sorted(inter.recv(source=r) for r in range(3)))
        inter.Disconnect()
        """)
    code, out, err = _mpirun(capsys, 1, prog)
    assert (code, err) == (0, "")
    assert out.splitlines() == ["3 [[0], [0, 0]]",
                                "[('one', 0, ['a'], 0), ('two', 1, ['b'], 1), ('two', 2, ['b'], 1)]"]


def test_the_run_ends_once_the_children_end_after_their_parents(tmp_path, capsys):
    """The parent spawns and ends at once; its child computes on, then prints: the run waits for it, as mpiexec
    waits for the spawned processes."""
    prog = _program(tmp_path, """
        import sys, time
        from mpi4py import MPI
        if sys.argv[1:] == ["child"]:
            time.sleep(0.3)
            print("child", MPI.COMM_WORLD.rank, "ends after its parent")
        else:
            MPI.COMM_SELF.Spawn(sys.executable, [__file__, "child"], maxprocs=2)
            print("parent ends")
        """)
    code, out, err = _mpirun(capsys, 1, prog)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "parent ends" and sorted(out.splitlines()[1:]) == [
        "child 0 ends after its parent", "child 1 ends after its parent"], out


def test_a_spawned_rank_that_raises_is_reported_as_any_rank(tmp_path, capsys):
    prog = _program(tmp_path, """
        import sys
        from mpi4py import MPI
        if sys.argv[1:] == ["child"]:
            parent = MPI.Comm.Get_parent()
            if MPI.COMM_WORLD.rank == 1:
                raise ValueError("child says no")
            parent.Barrier()
        else:
            MPI.COMM_WORLD.Spawn(sys.executable, [__file__, "child"], maxprocs=2).Barrier()
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert code == 1 and out == ""
    assert err.startswith("spmdsim mpirun: error on simulated rank 3: ValueError: child says no\n"), err
    assert "raised on simulated rank 3 of 4 (2 started, 2 spawned: ranks 2,3)" in err, err


def test_spawned_ranks_waiting_for_parents_that_ended_are_a_deadlock(tmp_path, capsys):
    """The parents end; the children wait for a message no parent sends: every live rank waits, and the report
    names the spawned ranks and their line."""
    prog = _program(tmp_path, """
        import sys
        from mpi4py import MPI
        if sys.argv[1:] == ["child"]:
            MPI.Comm.Get_parent().recv(source=0)
        else:
            MPI.COMM_WORLD.Spawn(sys.executable, [__file__, "child"], maxprocs=2)
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert code == 1 and out == ""
    assert err.startswith("spmdsim mpirun: error: simulated ranks deadlock"), err
    assert "rank 2 waits in it" in err and "rank 3 waits in it" in err and "prog.py:5" in err, err


@pytest.fixture
def watchdog_one_second(monkeypatch):
    """SPMDSIM_WATCHDOG=1, read again by this test's run (debug keeps the process's settings once read)."""
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "1")
    debug._reset()
    yield
    monkeypatch.delenv("SPMDSIM_WATCHDOG")
    debug._reset()


def test_the_watchdog_names_a_spawned_rank_that_computes_on(tmp_path, capsys, watchdog_one_second):
    """The child computes (sleeps) for 20 s while its parents wait in a Barrier with it: the watchdog ends the run
    after 1 s naming it (without the watchdog the Barrier would complete, and the test fail, 20 s later)."""
    prog = _program(tmp_path, """
        import sys, time
        from mpi4py import MPI
        if sys.argv[1:] == ["child"]:
            for _ in range(400):
                time.sleep(0.05)
            MPI.Comm.Get_parent().Barrier()
        else:
            MPI.COMM_WORLD.Spawn(sys.executable, [__file__, "child"], maxprocs=1).Barrier()
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert code == 1 and out == ""
    assert "did not complete within 1.0 s" in err and "rank 2 is computing (at prog.py:6)" in err, err


def test_a_command_mpi_could_not_start_is_mpis_spawn_error(tmp_path, capsys):
    """A command that is no program (a data file), or a script that does not exist: every parent raises
    MPI.Exception (ERR_SPAWN) naming it; maxprocs below 1 is ERR_ARG."""
    (tmp_path / "data").write_text("1 2 3\n")
    prog = _program(tmp_path, f"""
        import sys
        from mpi4py import MPI
        for command, n in (({str(tmp_path / "data")!r}, 1), (sys.executable, 0), ("python", 1)):
            try:
                MPI.COMM_WORLD.Spawn(command, ["nowhere.py"] if n == 0 or command == "python" else None, n)
            except MPI.Exception as exc:
                print(MPI.COMM_WORLD.rank, MPI.Get_error_string(exc.Get_error_class()), str(exc).split(": ", 2)[2])
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert (code, err) == (0, "")
    data = str(tmp_path / "data")
    assert sorted(out.splitlines()) == sorted(
        [f"{r} Error in spawn call command {data!r} is not found or not executable" for r in range(2)]
        + [f"{r} Invalid argument maxprocs 0 must be 1 or more" for r in range(2)]
        + [f"{r} Error in spawn call python nowhere.py: script 'nowhere.py' does not exist" for r in range(2)]), out


@pytest.mark.parametrize("command, refused", [
    ("'/bin/true'", "Spawn of '/bin/true', no Python program"),
    ("sys.executable, ['-O', 'x.py']", "Spawn of python with option '-O'")])
def test_a_program_mpi_could_start_and_a_rank_cannot_is_refused_in_one_line(tmp_path, capsys, command, refused):
    """A compiled program, or python with options of its own: not simulated, and the run ends (also where the
    Spawn came from a thread the rank started, as mpi4py.futures' pool spawns from its manager thread)."""
    prog = _program(tmp_path, f"""
        import sys, threading
        from mpi4py import MPI
        threading.Thread(target=lambda: MPI.COMM_SELF.Spawn({command})).start()
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert code == 1 and out == ""
    assert err.startswith(f"spmdsim mpirun: error on simulated ranks 0,1: NotImplementedError: {refused}"), err


def test_mpi4py_futures_pool_spawns_its_workers(tmp_path, capsys):
    """MPIPoolExecutor without mpi4py's runner spawns its workers (python -R -m mpi4py.futures.server): each
    rank's pool gets its own, as under mpiexec."""
    prog = _program(tmp_path, """
        from mpi4py.futures import MPIPoolExecutor
        if __name__ == "__main__":
            with MPIPoolExecutor() as ex:
                print(list(ex.map(abs, [-1, -2])), ex.num_workers)
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert (code, err) == (0, "")
    assert out.splitlines() == ["[1, 2] 1", "[1, 2] 1"]


def test_accept_and_connect_join_two_groups_at_a_published_port(tmp_path, capsys):
    """Ranks 0,1 accept on a port rank 0 opened and published; ranks 2,3 look it up and connect: each group gets
    the intercommunicator whose remote group is the other, and a Merge puts the lower root's group first."""
    prog = _program(tmp_path, """
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        server = world.rank < 2
        half = world.Split(0 if server else 1, world.rank)
        port = None
        if world.rank == 0:
            port = MPI.Open_port()
            MPI.Publish_name("squares", port)
        world.Barrier()
        if server:
            inter = half.Accept(port, root=0)
            inter.bcast([r * r for r in range(4)] if half.rank == 0 else None,
                        root=MPI.ROOT if half.rank == 0 else MPI.PROC_NULL)
        else:
            inter = half.Connect(MPI.Lookup_name("squares") if half.rank == 0 else None, root=0)
            print("client", world.rank, inter.bcast(None, root=0), inter.Get_remote_size(), inter.Get_size())
        merged = inter.Merge()
        print("merged", world.rank, merged.rank, merged.size)
        inter.Disconnect()
        world.Barrier()
        if world.rank == 0:
            MPI.Unpublish_name("squares", port)
            MPI.Close_port(port)
        """)
    code, out, err = _mpirun(capsys, 4, prog)
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == ["client 2 [0, 1, 4, 9] 2 2", "client 3 [0, 1, 4, 9] 2 2"] + [
        f"merged {r} {r} 4" for r in range(4)]


def test_an_accept_no_connect_meets_is_a_deadlock_naming_its_port(tmp_path, capsys):
    prog = _program(tmp_path, """
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            MPI.COMM_SELF.Accept(MPI.Open_port())
        else:
            MPI.COMM_WORLD.recv(source=0)
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert code == 1 and out == ""
    assert err.startswith("spmdsim mpirun: error: simulated ranks deadlock"), err
    assert "Accept on port 'spmdsim-port-1' (no Connect has come): rank 0 waits in it" in unfold(err), err


def test_a_port_not_open_and_a_name_not_published_are_mpis_errors(tmp_path, capsys):
    prog = _program(tmp_path, """
        from mpi4py import MPI
        for call in (lambda: MPI.COMM_WORLD.Connect("nowhere"), lambda: MPI.Lookup_name("nobody"),
                     lambda: MPI.Close_port("nowhere")):
            try:
                call()
            except MPI.Exception as exc:
                print(MPI.COMM_WORLD.rank, MPI.Get_error_string(exc.Get_error_class()), str(exc).split(": ", 1)[1])
        """)
    code, out, err = _mpirun(capsys, 2, prog)
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == sorted(
        [f"{r} Invalid port Connect: port 'nowhere' is not open (MPI.Open_port gives one)" for r in range(2)]
        + [f"{r} Invalid port Close_port: port 'nowhere' is not open" for r in range(2)]
        + [f"{r} Invalid service name (see MPI_Publish_name) Lookup_name: no service 'nobody' is published"
           for r in range(2)]), out
