"""Smoke tests of the performance tools under MPI: tiny sizes, one repeat."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from spmdsim.cost import CostModel

pytestmark = pytest.mark.mpi(min_size=2)

_BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


@pytest.fixture
def shared_dir():
    """One temp dir for all ranks (rank 0 makes it; conftest's per-rank tmp_path differs)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="spmdsim-bench-") if comm.rank == 0 else None))
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_bench_quick_collectives_json(shared_dir):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    spec = importlib.util.spec_from_file_location("spmdsim_bench_script", _BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    out = shared_dir / "bench.json"
    rc = bench.main(["--quick", "--suite", "collectives", "--repeats", "1", "--warmup", "0",
                     "--json", str(out), "--filter", "all"])
    assert rc == 0
    records = comm.bcast(json.loads(out.read_text()) if comm.rank == 0 else None, root=0)
    names = [r["name"] for r in records]
    assert any(n.startswith(f"allgather g{comm.size} ") for n in names)
    assert any(n.startswith(f"allreduce g{comm.size} ") for n in names)
    for r in records:
        assert set(bench.KEYS) <= set(r)
        assert r["spmdsim_s"] > 0 and r["raw_s"] > 0 and r["numpy_s"] >= 0
        assert r["peak_rss_bytes"] > 1 << 20 and r["bytes_per_rank"] > 0
        assert r["predicted_comm_s"] > 0
        # After the last rank arrived is part of the time inside the collectives.
        for who in ("spmdsim", "raw"):
            after = r[f"{who}_comm_after_arrival_s"]
            assert after is not None and 0 <= after <= r[f"{who}_comm_s"] + 1e-6


def test_calibrate_fits_and_saves(shared_dir):
    from mpi4py import MPI

    from spmdsim.cli.main import main

    comm = MPI.COMM_WORLD
    out = shared_dir / "cost.json"
    rc = main(["calibrate", "--sizes", "4K,64K,256K", "--group-sizes", str(comm.size),
               "--ops", "allgather,allreduce", "--repeats", "1", "--warmup", "0",
               "--output", str(out)])
    assert rc == 0
    comm.Barrier()
    model = CostModel.load(out)
    assert model.predict("allreduce", comm.size, 1 << 20) > 0
    assert model.source.startswith("spmdsim calibrate")
    assert model.copy_s_per_byte > 0  # the packing copy was timed too
