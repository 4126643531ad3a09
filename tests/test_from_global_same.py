"""DTensor.from_global cuts each rank's block from the rank's own copy of the global array: copies that differ
(an array drawn without a seed) are refused on every rank in one line, not cut into a tensor no rank passed."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from docs_commands import run_here
from spmdsim import DTensor, Layout, Mesh, RuntimeMismatchError, simulate

SAID = ("DTensor.from_global: ranks {} and {} passed different arrays; each rank cuts its block from its own copy, "
        "so every rank must pass the same array: draw it from a fixed seed (np.random.default_rng(0)), or build "
        "only each rank's block with DTensor.from_seeded")


def _cut(make, verify: bool = True, block: bool = False):
    """simulate(4): each rank's from_global of `make(rank)` on a 2 x 2 mesh, split over dp; every rank's gather
    (`block`: its own block)."""
    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_global(mesh, make(mesh.rank), mesh.layout("dp", None), verify=verify)
        return x.local.copy() if block else x.gather()

    return simulate(4, main)


@pytest.mark.parametrize("odd, other", [(3, 3), (0, 1), (2, 2)])
def test_rank_0_and_the_first_rank_whose_array_differs_are_named_on_every_rank(odd: int, other: int) -> None:
    with pytest.raises(RuntimeMismatchError) as caught:
        _cut(lambda rank: np.ones((4, 3)) * (2 if rank in (odd, 3) else 1))
    assert str(caught.value) == SAID.format(0, other)


@pytest.mark.parametrize("other", [np.ones((4, 3), np.float32), np.ones((3, 4)), np.ones((4, 3))[:, ::-1] * 2])
def test_another_dtype_shape_or_value_differs_but_another_memory_order_does_not(other) -> None:
    with pytest.raises(RuntimeMismatchError, match="ranks 0 and 1 passed different arrays"):
        _cut(lambda rank: other if rank == 1 else np.ones((4, 3)))
    same = np.arange(12.0).reshape(3, 4).T  # a transposed view: the same values, not C-contiguous
    assert all(np.array_equal(g, same) for g in _cut(lambda rank: same if rank else np.ascontiguousarray(same)))


def test_unseeded_draws_are_refused_and_seeded_ones_cut() -> None:
    with pytest.raises(RuntimeMismatchError, match="passed different arrays"):
        _cut(lambda rank: np.random.default_rng().standard_normal((4, 3)))
    whole = np.random.default_rng(0).standard_normal((4, 3))
    assert all(np.array_equal(g, whole) for g in _cut(lambda rank: np.random.default_rng(0).standard_normal((4, 3))))


def test_verify_false_cuts_each_ranks_own_copy_without_asking() -> None:
    """The program's own arrays, built alike on every rank (the GPT's ids each step), skip the exchange: each rank's
    block is then its own copy's, as before."""
    got = _cut(lambda rank: np.full((4, 3), float(rank)) + np.arange(4.0)[:, None] * 10, verify=False, block=True)
    assert [g[:, 0].tolist() for g in got] == [[0.0, 10.0], [1.0, 11.0], [22.0, 32.0], [23.0, 33.0]]


def test_a_script_run_on_simulated_ranks_ends_in_one_line_and_exit_2(tmp_path) -> None:
    program = tmp_path / "unseeded.py"
    program.write_text(
        "import numpy as np\nfrom spmdsim import DTensor, Layout, Mesh, script\n\n\n"
        "def main():\n    L = Layout((2, 4), ('dp', 'mp'))\n    mesh = Mesh(L)\n"
        "    X = np.random.default_rng().standard_normal((8, 8))\n"
        "    print(DTensor.from_global(mesh, X, L('dp', None)).gather().sum())\n\n\n"
        "if __name__ == '__main__':\n    script(__file__)\n    main()\n")
    out = subprocess.CompletedProcess(program, *run_here(str(program), ["--ranks", "8"]))  # as python runs it
    assert out.returncode == 2, out
    assert out.stdout == "spmdsim: running on 8 simulated ranks in one process (--ranks 8), no mpiexec\n", out
    errors = [line for line in out.stderr.splitlines() if not line.startswith(("  ", "spmdsim: running"))]
    assert errors == ["spmdsim: error: DTensor.from_global: ranks 0 and 1 passed different arrays; each rank cuts "
                      "its block"], out.stderr
