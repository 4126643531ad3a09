"""The collective-algorithm tests of tests/mpi/test_algorithms.py on simulated ranks (spmdsim.simulate).

The same bodies (tests/algokit.py), compared with the simulated ranks' own
collectives: every algorithm at 2, 3, 4, 6 and 8 ranks, the Mesh option on
every axis group, a MatMul's ring Allreduce, Allreduce's maximum, and `spmdsim collective --ranks`.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from algokit import allreduce_max_mismatches, alltoallv_mismatches, matmul_on_a_ring, mesh_mismatches, mismatches
from spmdsim.tools.cli.main import main
from spmdsim.runtime.sim import simulate, world


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_every_algorithm_equals_the_builtin_collective(p):
    assert simulate(p, lambda: mismatches(world())) == [[]] * p


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_the_pairwise_alltoallv_equals_the_builtin_bit_for_bit(p):
    assert simulate(p, lambda: alltoallv_mismatches(world())) == [[]] * p


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
    assert "sums in another order" in " ".join(text)
    # Integer sums are exact in any order: the report said "sums in another order" of them too.
    assert main(["collective", "ring-allreduce", "--size", "1K", "--ranks", "4", "--repeat", "1", "--dtype",
                 "int64"]) == 0
    text = " ".join(" ".join(capsys.readouterr().out.split()).split())
    assert "(max abs difference 0: integer sums, exact in any order)" in text and "another order" not in text
    # --root is the bcast algorithms' (given or not: 0); refused for the others (tests/test_algorithms_cli.py).
    for root in (["--root", "2"], []):
        assert main(["collective", "binomial-bcast", "--size", "64K", "--ranks", "4", "--repeat", "1",
                     "--json", *root]) == 0
        record = json.loads(capsys.readouterr().out)
        assert record["matches_mpi"] is True and record["bytes_sent_by_rank"][int((root or [0, 0])[1])] > 0


@pytest.mark.parametrize("p", [4, 8])
def test_allreduce_max_plain_and_emulated(p):
    assert simulate(p, lambda: allreduce_max_mismatches(world())) == [[]] * p


def test_allreduce_refuses_an_unknown_op_on_every_rank():
    from spmdsim import Layout
    from spmdsim.errors import OperatorError
    from spmdsim.runtime import Mesh
    from spmdsim.runtime import collectives as C

    def body():
        mesh = Mesh(Layout((2,), ("x",)), world())
        try:
            C.allreduce(mesh, np.ones(3), "x", op="prod")
        except OperatorError as e:
            return str(e)

    assert simulate(2, body) == ["allreduce op 'prod' is not supported; expected 'sum', 'max' or 'min'"] * 2


def test_run_collective_refuses_what_the_mesh_collectives_refuse():
    """run_collective summed text with numpy's string add (a silent wrong answer), ORed bools and failed inside
    numpy on a datetime: now the mesh collectives' DTypeError, on every rank; text and bool still move."""
    from spmdsim.errors import DTypeError
    from spmdsim.runtime.algorithms import run_collective

    def body(name, x):
        try:
            return run_collective(world(), name, x).tolist()
        except DTypeError as e:
            return str(e)

    text = np.array(["ab", "c", "d", "e"])
    assert simulate(2, body, "ring-allreduce", text) == [
        "allreduce: cannot sum dtype 'str64'; expected an integer, float or complex dtype (bool and text can be "
        "moved, not summed)"] * 2
    assert simulate(2, body, "recursive-halving-reduce-scatter", np.ones(4, bool))[0].startswith(
        "reduce_scatter: cannot sum dtype 'bool'")
    assert simulate(2, body, "ring-allgather", np.zeros(2, "datetime64[D]"))[1].startswith(
        "allgather: MPI cannot send dtype '<M8[D]' (datetime64[D]); expected a numeric dtype")
    assert simulate(2, body, "bruck-allgather", text[:2]) == [["ab", "c", "ab", "c"]] * 2


def test_ranks_whose_arrays_differ_get_one_line_before_any_message():
    """A binomial bcast whose receivers' arrays were larger than the root's returned their extra elements
    uninitialised (smaller ones were truncated or deadlocked); every rank now raises the same line."""
    from spmdsim.runtime.algorithms import run_collective

    def rank(sizes, dtypes, name, root=0):
        def run():
            me = world().Get_rank()
            x = np.full(sizes[me], me + 1.0, dtypes[me])
            try:
                return run_collective(world(), name, x, root=root).tolist()
            except Exception as error:  # noqa: BLE001 - the line itself is the result
                return f"{type(error).__name__}: {error}"
        return simulate(len(sizes), run)

    line = ("ShapeError: binomial-bcast: every rank's array must have the root's (rank 1) size and dtype, 4 "
            "elements of float64; rank 0: 6 of float64, rank 2: 6 of float64")
    assert rank((6, 4, 6), ("f8",) * 3, "binomial-bcast", root=1) == [line] * 3
    assert rank((4, 4), ("f8", "f4"), "ring-allreduce") == [
        "ShapeError: ring-allreduce: every rank's array must have rank 0's size and dtype, 4 elements of "
        "float64; rank 1: 4 of float32"] * 2
    assert rank((4, 4, 4), ("f8",) * 3, "binomial-bcast", root=2) == [[3.0] * 4] * 3
