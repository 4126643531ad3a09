"""The `spmdsim` MPI commands the docs quote (docs_commands.MPI_DOCS), run at their own rank count.

Each runs in-process under the suite's mpiexec (a launch per command would cost
seconds on 2 cores); rank 0 checks the output the doc quotes under it. Commands
for another rank count run in the other pass of scripts/test.sh; the examples
run in test_examples.py; the benchmarks and calibration are not run here.
"""
from __future__ import annotations

import pathlib
import sys

import pytest
from mpi4py import MPI

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from docs_commands import MPI_DOCS, mismatch, shown  # noqa: E402

from spmdsim.tools.cli.main import main  # noqa: E402
from testkit import allgather_after_all  # noqa: E402

pytestmark = pytest.mark.mpi(min_size=2)

_NOT_HERE = ("calibrate",)  # measures for minutes


def _here() -> list:
    size = MPI.COMM_WORLD.size
    return [q for doc in MPI_DOCS for q in shown(doc)
            if q.mpi and q.mpi[0] == size and q.mpi[1][0] == "spmdsim" and q.mpi[1][1] not in _NOT_HERE]


def test_the_docs_quote_spmdsim_commands_at_4_and_8_ranks():
    counts = [q.mpi[0] for doc in MPI_DOCS for q in shown(doc) if q.mpi and q.mpi[1][0] == "spmdsim"]
    assert counts.count(8) >= 8 and counts.count(4) >= 2


@pytest.mark.parametrize("quote", _here(), ids=lambda q: f"{q.doc}:{q.line}")
def test_each_quoted_mpi_command_runs_and_prints_what_the_doc_quotes(quote, capsys, tmp_path,
                                                                     monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.chdir(comm.bcast(str(tmp_path)))  # files a command writes (--trace-out) land on rank 0's
    monkeypatch.setenv("SPMDSIM_COST_FILE", str(tmp_path / "no-calibration.json"))
    code = main(quote.mpi[1][1:])
    out = capsys.readouterr().out
    # Rank 0 prints (and draws --png pictures) alone: the others sleep until it is done.
    assert allgather_after_all(comm, code) == [0] * comm.size, quote.where()
    if comm.rank == 0:
        assert max((len(line) for line in out.splitlines()), default=0) <= 100, (quote.where(), out)
        if quote.output:
            why = mismatch(quote.output, out)
            assert why is None, f"{quote.where()}: {why}\n{out}"
