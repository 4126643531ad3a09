"""Memory before allocation under MPI: one line from rank 0, the same exit on every rank."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.layouts.datagen import SeededTensor
from spmdsim.errors import ShapeError

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _error_lines(err: str) -> list[str]:
    return [line for line in err.replace("\n  ", " ").splitlines() if line.strip()]  # a folded error joined back


def test_run_refuses_a_matmul_too_large_for_memory_before_allocating(capsys):
    size = _world().size
    if size % 2:
        pytest.skip("the strategy needs an even world size")
    strategy = f"((2,{size // 2}),({size // 2},1))"
    rc = main(["run", "matmul", "--strategy", strategy, "--shape", "400000,400000,400000"])
    err = capsys.readouterr().err
    assert _world().allgather(rc) == [2] * size
    if _world().rank == 0:
        (line,) = _error_lines(err)
        assert line.startswith("spmdsim: error: MatMul (") and " needs " in line
        assert "the largest --shape that fits is " in line and "Traceback" not in err
    else:
        assert err == ""


def test_from_seeded_refuses_a_shard_over_spmdsim_memory(monkeypatch):
    from spmdsim.errors import ResourceError
    from spmdsim.runtime import DTensor, Mesh

    monkeypatch.setenv("SPMDSIM_MEMORY", "64K")
    size = _world().size
    mesh = Mesh(Layout((size,), ("x",)), _world())
    small = DTensor.from_seeded(mesh, mesh.layout("x", None), SeededTensor((size, 8), "float64"))
    assert small.local.shape == (1, 8)
    with pytest.raises(ResourceError, match=r"needs .* but a rank has 64 KiB \(SPMDSIM_MEMORY=64K\); "
                                            r"the largest shape that fits is "):
        DTensor.from_seeded(mesh, mesh.layout("x", None), SeededTensor((size * 4096, 8), "float64"))
    with pytest.raises(ShapeError, match="too large to index"):
        DTensor.from_seeded(mesh, mesh.layout("x", None), SeededTensor((size * 2 ** 61, 0), "float64"))
    mesh.close()


def test_a_memory_error_on_every_rank_is_one_line(capsys):
    from spmdsim.runtime.guard import run_guarded

    def body():
        np.empty(1 << 62, np.uint8)  # 4 EiB: numpy raises its MemoryError before touching memory

    rc = run_guarded(body, _world())
    err = capsys.readouterr().err
    assert _world().allgather(rc) == [2] * _world().size
    if _world().rank == 0:
        (line,) = _error_lines(err)
        assert line.startswith("spmdsim: error: out of memory: Unable to allocate 4.00 EiB")
