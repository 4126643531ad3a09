"""Emulated collective algorithms against MPI's own collectives, on groups of 2 to 8 ranks and mesh axes.

The bodies live in tests/algokit.py; tests/test_algorithms_sim.py runs them on simulated ranks.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from algokit import allreduce_max_mismatches, alltoallv_mismatches, matmul_on_a_ring, mesh_mismatches, mismatches
from spmdsim import Layout, SpmdsimError
from spmdsim.runtime.algorithms import collect_rounds, run_collective

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
# The world cut into groups of these sizes: 8 ranks cover 2, 3, 5, 6 and 8; 4 ranks cover 3 and 4.
SPLITS = {8: [(8,), (2, 6), (3, 5)], 4: [(4,), (3, 1)], 2: [(2,)]}


def test_every_algorithm_equals_mpi_on_each_group_size():
    for sizes in SPLITS.get(WORLD.size, [(WORLD.size,)]):
        starts = np.cumsum((0,) + sizes)
        color = int(np.searchsorted(starts, WORLD.rank, side="right") - 1)
        comm = WORLD.Split(color, WORLD.rank)
        try:
            bad = mismatches(comm) if comm.Get_size() > 1 else []
        finally:
            comm.Free()
        everyone = WORLD.allgather((sizes[color], bad))
        assert not any(b for _, b in everyone), everyone


def test_rounds_are_recorded_with_their_times():
    with collect_rounds() as log:
        x = np.arange(WORLD.size * 4, dtype=np.float64)
        run_collective(WORLD, "ring-allreduce", x)
        run_collective(WORLD, "bruck-alltoall", x)
    assert [r.schedule.name for r in log.records] == ["ring-allreduce", "bruck-alltoall"]
    for rec in log.records:
        assert len(rec.round_seconds) == len(rec.schedule.rounds) and rec.seconds > 0
    ring = log.records[0]
    assert ring.bytes_sent == 2 * (WORLD.size - 1) * x.nbytes // WORLD.size
    assert "reduce-scatter" in log.format()


def test_mesh_algorithms_on_every_axis_group():
    dims = {8: (2, 4), 4: (2, 2)}.get(WORLD.size, (WORLD.size, 1))
    assert mesh_mismatches(WORLD, dims) == []


def test_the_pairwise_alltoallv_equals_mpi_bit_for_bit():
    assert WORLD.allgather(alltoallv_mismatches(WORLD)) == [[]] * WORLD.size


def test_a_matmul_reduces_with_the_ring_round_by_round():
    counts, names, rounds = matmul_on_a_ring(WORLD)
    assert counts == {"allreduce[ring]": 1} and names == ["ring-allreduce"]
    assert rounds == 2 * (WORLD.size - 1)


def test_unknown_algorithm_fails_on_every_rank_before_any_collective():
    from spmdsim.runtime import Mesh

    with pytest.raises(SpmdsimError, match="'bruck' is not an algorithm for allreduce"):
        Mesh(Layout((WORLD.size,), ("x",)), algorithms={"allreduce": "bruck"})
    WORLD.Barrier()  # every rank got here: none is left in a collective


def test_collective_command_json_and_show(capsys):
    import json

    from spmdsim.tools.cli.main import main

    p = WORLD.size
    assert main(["collective", "ring-allreduce", "--size", "64K", "--json", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    record = WORLD.bcast(json.loads(out) if WORLD.rank == 0 else None)
    assert record["matches_mpi"] is True and len(record["rounds"]) == 2 * (p - 1)
    assert record["bytes_sent_per_rank"] == 2 * (p - 1) * 65536 // p == record["formula_bytes"]
    assert main(["collective", "bruck-alltoall", "--size", "64K", "--dtype", "int32", "--show",
                 "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    if WORLD.rank == 0:
        assert "result: matches MPI's Alltoall" in text and "bruck +1" in text
        assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.mpi(min_size=4)
def test_allreduce_max_plain_and_emulated():
    if WORLD.size % 2:
        pytest.skip("a (2, p/2) mesh needs an even world")
    everyone = WORLD.allgather(allreduce_max_mismatches(WORLD))
    assert not any(everyone), everyone
