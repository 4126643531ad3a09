"""One fault, one exit code and one line under every launcher: --ranks N (run_on_ranks) and spmdsim mpirun
end a deadlock and a rank's sys.exit as mpiexec would (MPICH's hydra exits with its ranks' largest code)."""
from __future__ import annotations

import sys

import numpy as np

import spmdsim
from spmdsim.emulator.mpirun import run as mpirun
from spmdsim.runtime.sim.launch import run_on_ranks
from testkit import unfold

DEADLOCK = "simulated ranks deadlock (every live rank waits, none can go on):"


def _every_rank_deadlocks() -> None:
    comm = spmdsim.world()
    comm.Recv(np.empty(4), source=comm.Get_rank() ^ 1)  # each waits for its pair, which waits too


def _rank_1_exits_3() -> None:
    comm = spmdsim.world()
    if comm.Get_rank() == 1:
        sys.exit(3)
    comm.barrier()  # the others wait for it


def test_a_deadlock_of_every_rank_is_a_failure_not_bad_input(capsys):
    """--ranks said 2 (bad input, found before any work) where simulate() and mpirun say 1."""
    assert run_on_ranks(4, _every_rank_deadlocks) == 1
    err = unfold(capsys.readouterr().err)
    assert err.startswith(f"spmdsim: error: {DEADLOCK}"), err


def test_a_ranks_sys_exit_is_its_code_and_named_under_ranks_as_under_mpirun(capsys, tmp_path):
    """Rank 1's sys.exit(3), the others left waiting: --ranks exited 1 saying 'rank 1 finished', mpirun 3
    saying 'rank 1 exited (sys.exit(3))'."""
    assert run_on_ranks(4, _rank_1_exits_3) == 3
    ranks = unfold(capsys.readouterr().err)
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1:\n    sys.exit(3)\n"
                    "MPI.COMM_WORLD.Barrier()\n")
    assert mpirun(4, ["python", str(prog)]) == 3
    under_mpirun = unfold(capsys.readouterr().err)
    for err, prefix in ((ranks, "spmdsim: error: "), (under_mpirun, "spmdsim mpirun: error: ")):
        assert err.startswith(prefix + DEADLOCK), err
        assert "rank 1 exited (sys.exit(3))" in err and "finished" not in err, err
