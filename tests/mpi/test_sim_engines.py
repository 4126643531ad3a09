"""Both engines, one program: every demo scenario gives the same trace under MPI and on simulated ranks.

Rank 0 runs the scenarios again on as many simulated ranks as the MPI world
has, while the other ranks wait politely (testkit.root_for_all: an Ibarrier polled with
sleeps, so they leave the cores to the simulation).
"""
from __future__ import annotations

import pytest
from mpi4py import MPI

from spmdsim.tools.demo.registry import Context, run_job, scenarios
from testkit import root_for_all

pytestmark = pytest.mark.mpi(min_size=2)


def _traces(comm):
    """Per scenario: this rank's (op, axes, group size, bytes sent, bytes received) and its verdict."""
    out = {}
    for sc in scenarios():
        if sc.needs(comm.Get_size()) is not None:
            continue
        run = run_job(sc.build(Context(comm)), comm)
        out[sc.name] = ([(e.op, e.axes, e.group_size, e.bytes_sent, e.bytes_received) for e in run.entries],
                        bool(run.verdict.passed))
    return out


@pytest.mark.filterwarnings("ignore:simulate.*processes mpiexec started:RuntimeWarning")  # on purpose
def test_demo_scenarios_trace_alike_on_both_engines():
    import spmdsim

    comm = MPI.COMM_WORLD
    mpi = comm.gather(_traces(comm), root=0)

    def compare():
        simulated = spmdsim.simulate(comm.size, lambda: _traces(spmdsim.world()))
        problems = [f"rank {r} {name}: mpi {mpi[r][name]} simulated {simulated[r].get(name)}"
                    for r in range(comm.size) for name in mpi[r] if mpi[r][name] != simulated[r].get(name)]
        if sorted(mpi[0]) != sorted(simulated[0]):
            problems.append(f"scenarios differ: {sorted(mpi[0])} vs {sorted(simulated[0])}")
        if not all(passed for name in mpi[0] for passed in (mpi[0][name][1], simulated[0][name][1])):
            problems.append("a scenario failed its check")
        return problems, len(mpi[0])

    problems, count = root_for_all(comm, compare)
    assert not problems, problems[:5]
    assert count >= (14 if comm.size == 8 else 1)


def test_demo_table_alike_on_both_engines(capsys, monkeypatch):
    """`spmdsim demo --ranks N` prints the table `mpiexec -n N spmdsim demo` prints (errors aside)."""
    from spmdsim.base.threads import SIZE_VARIABLES
    from spmdsim.tools.cli.main import main

    comm = MPI.COMM_WORLD
    assert main(["demo", "--only", "matmul_2x4_4x1,linear_column,mlp"]) == 0
    under_mpi = capsys.readouterr().out

    def simulated():
        for name in SIZE_VARIABLES:  # --ranks refuses to run inside a launched job: this one means it
            monkeypatch.delenv(name, raising=False)
        code = main(["demo", "--only", "matmul_2x4_4x1,linear_column,mlp", "--ranks", str(comm.size)])
        return code, capsys.readouterr().out

    code, text = root_for_all(comm, simulated)
    if comm.rank == 0:
        banner, *table = text.splitlines()
        assert code == 0 and banner.startswith(f"spmdsim: running on {comm.size} simulated ranks")
        assert _without_errors(table) == _without_errors(under_mpi.splitlines())


def _without_errors(lines):
    """The table with its max-error column blanked (the sums run in another order on each engine)."""
    import re

    return [re.sub(r"\d\.\d\de-\d\d", "<err>", line) for line in lines]
