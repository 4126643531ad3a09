"""`spmdsim mpirun`'s deadlock report on many ranks says where the others are as it says the ranks that wait:
runs of ranks together (`ranks 2-7 finished`), not a clause a rank."""
from __future__ import annotations

from spmdsim.runtime.sim import engine
from spmdsim.runtime.sim.report import unfold
from spmdsim.tools.cli.main import main

DEADLOCK = "spmdsim mpirun: error: simulated ranks deadlock (every live rank waits, none can go on): "


def _report(tmp_path, capsys, source: str) -> str:
    """The one-line deadlock report of `source` run on 8 simulated ranks (exit code 1)."""
    (tmp_path / "prog.py").write_text("import numpy as np\nfrom mpi4py import MPI\n" + source)
    assert main(["mpirun", "-n", "8", "python", str(tmp_path / "prog.py")]) == 1
    err = unfold(capsys.readouterr().err)
    assert err.startswith(DEADLOCK), err
    return err[len(DEADLOCK):].rstrip("\n")


def test_the_ranks_a_collective_waits_for_are_said_as_runs(tmp_path, capsys):
    """Six clauses, "rank 2 finished; rank 3 finished; ... rank 7 finished", were one."""
    said = _report(tmp_path, capsys, "comm = MPI.COMM_WORLD\nif comm.rank < 2:\n    comm.Barrier()\n")
    assert said == "barrier on the world (call 1): ranks 0,1 wait in it; ranks 2-7 finished; at prog.py:5", said
    said = _report(tmp_path, capsys, "comm = MPI.COMM_WORLD\nif comm.rank < 2:\n    comm.Ibarrier().Wait()\n"
                                     "elif comm.rank == 2:\n    comm.Recv(bytearray(1), source=0)\n")
    assert said.startswith("Ibarrier on the world (call 1): ranks 0,1 wait in it; rank 2 is elsewhere, in recv from "
                           "group rank 0 (any tag) on the world; ranks 3-7 finished; at prog.py:5 | "), said


def test_the_origins_a_win_test_waits_for_are_said_as_runs(tmp_path, capsys, monkeypatch):
    """On a communicator other than the world each origin was 'group rank 1 (world rank 6), group rank 2 (world
    rank 5), ...', each then 'rank 6 finished; rank 5 finished; ...'."""
    monkeypatch.setattr(engine, "POLL_STALL_S", 0.3)
    said = _report(tmp_path, capsys, "comm = MPI.COMM_WORLD.Split(0, 7 - MPI.COMM_WORLD.rank)\n"
                                     "win = MPI.Win.Create(np.zeros(4), comm=comm)\nif comm.rank == 0:\n"
                                     "    win.Post(comm.group.Incl(list(range(1, 7))))\n"
                                     "    while not win.Test():\n        pass\n")
    assert said == ("a window's exposure epoch (the Complete of group ranks 1-6 (world ranks 1-6)) on the group of "
                    "ranks 0-7: rank 7 polls it (Win.Test), and no rank left can complete it; ranks 1-6 finished; "
                    "at prog.py:7"), said
