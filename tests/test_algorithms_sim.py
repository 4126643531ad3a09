"""The collective-algorithm tests of tests/mpi/test_algorithms.py on simulated ranks (spmdsim.simulate).

The same bodies (tests/algokit.py), compared with the simulated ranks' own
collectives: every algorithm at 2, 3, 4, 6 and 8 ranks, the Mesh option on
every axis group, a MatMul's ring Allreduce, and `spmdsim collective --ranks`.
"""
from __future__ import annotations

import json

import pytest

from algokit import matmul_on_a_ring, mesh_mismatches, mismatches
from spmdsim.cli.main import main
from spmdsim.sim import simulate, world


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_every_algorithm_equals_the_builtin_collective(p):
    assert simulate(p, lambda: mismatches(world())) == [[]] * p


@pytest.mark.parametrize("dims", [(2, 4), (2, 2)])
def test_mesh_algorithms_on_every_axis_group(dims):
    n = dims[0] * dims[1]
    assert simulate(n, lambda: mesh_mismatches(world(), dims)) == [[]] * n


def test_a_matmul_reduces_with_the_ring_round_by_round():
    results = simulate(4, lambda: matmul_on_a_ring(world()))
    assert results == [({"allreduce[ring]": 1}, ["ring-allreduce"], 6)] * 4


def test_collective_command_on_simulated_ranks(capsys):
    assert main(["collective", "rabenseifner-allreduce", "--size", "96K", "--ranks", "6", "--json",
                 "--repeat", "1"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["simulated"] is True and record["matches_mpi"] is True and record["ranks"] == 6
    # p = 6 folds 2 ranks: 4 survivors, 2 log2(4) + 2 rounds; busiest sends 2 * 3/4 n + n.
    n = 96 << 10
    assert len(record["rounds"]) == 6 and record["bytes_sent_per_rank"] == 2 * 3 * n // 4 + n
    assert main(["collective", "ring-allreduce", "--size", "64K", "--ranks", "4", "--repeat", "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "spmdsim: running on 4 simulated ranks in one process (--ranks 4), no mpiexec"
    assert any(line.startswith("result: matches the simulated ranks' Allreduce") for line in text)
