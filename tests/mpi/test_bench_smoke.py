"""Smoke tests of the performance tools under MPI: tiny sizes, one repeat."""
from __future__ import annotations

import json
import mmap
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from spmdsim.programs.cost import CostModel
from testkit import load_script

pytestmark = pytest.mark.mpi(min_size=2)

_BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
_BENCH_COLLECTIVES = _BENCH.with_name("bench_collectives.py")
_BENCH_PLACEMENT = _BENCH.with_name("bench_placement.py")
_BENCH_HUGEPAGES = _BENCH.with_name("bench_hugepages.py")


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


def _bench_module(path: Path = _BENCH, name: str = "spmdsim_bench_script"):
    return load_script(path, name)


def _run_bench(bench, out: Path, *args: str) -> list[dict]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rc = bench.main(["--quick", "--repeats", "1", "--warmup", "0", "--json", str(out), *args])
    assert rc == 0
    return comm.bcast(json.loads(out.read_text()) if comm.rank == 0 else None, root=0)


def test_bench_quick_collectives_json(shared_dir):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bench = _bench_module()
    records = _run_bench(bench, shared_dir / "bench.json", "--suite", "collectives", "--filter", "all")
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
            # The per-call split: Python before the first collective and after the last, each a rank's own
            # part of the call (the spans lie inside the call), shorter than the whole call's slowest rank's.
            for part in ("before", "after"):
                seconds = r[f"{who}_{part}_s"]
                assert seconds is not None and 0 <= seconds < r[f"{who}_s"], (r["name"], who, part, seconds)
    if comm.rank == 0:
        split = bench.split_table(records).splitlines()
        assert split[0].split() == ["case", "before", "raw", "comm", "raw", "after", "raw"]
        assert [line[:44].rstrip() for line in split[2:2 + len(records)]] == names


def test_bench_aa_control_times_a_second_raw_copy(shared_dir):
    """--aa: the same cases, the spmdsim slot timing a separately built raw copy (no trace, no model)."""
    bench = _bench_module()
    plain = _run_bench(bench, shared_dir / "plain.json", "--suite", "redistribute")
    aa = _run_bench(bench, shared_dir / "aa.json", "--suite", "redistribute", "--aa")
    assert [r["name"] for r in aa] == [r["name"] for r in plain]
    for r in aa:
        assert r["aa"] is True and r["predicted_comm_s"] is None and r["collectives"] is None
        assert r["spmdsim_s"] > 0 and r["raw_s"] > 0
        # The copy communicates exactly when the original does (B->S(0) is a local slice).
        assert (r["spmdsim_comm_s"] > 0) == (r["raw_comm_s"] > 0)
    assert any(r["raw_comm_s"] > 0 for r in aa)
    assert all("aa" not in r for r in plain)


def test_bench_errors_every_rank_raises_are_one_line_and_exit_2(shared_dir, capsys):
    """A bad cost file, a --filter that matches no case: exit code 2 on every rank, one line on rank 0."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bench = _bench_module()
    bad = shared_dir / "cost.json"
    if comm.rank == 0:
        bad.write_text('{"version": 1}')
    comm.Barrier()
    for argv, needle in ((["--suite", "overhead", "--cost-file", str(bad)], "cost model"),
                         (["--suite", "collectives", "--filter", "nosuchcase"], "'nosuchcase'")):
        rc = bench.main(["--quick", "--repeats", "1", "--warmup", "0", *argv])
        err = capsys.readouterr().err.replace("\n  ", " ")  # a folded error joined back
        assert comm.allgather(rc) == [2] * comm.size
        errors = [line for line in err.splitlines() if "error" in line]
        assert "Traceback" not in err
        if comm.rank == 0:
            assert len(errors) == 1 and errors[0].startswith("spmdsim: error: ") and needle in errors[0], err
        else:
            assert errors == [], err


@pytest.mark.parametrize("wait", ["busy", "polite"])
def test_bench_collectives_records_both_sides(wait):
    """bench_collectives: every op timed for spmdsim and raw, rank 0 reports (polite: both sides polite)."""
    import argparse

    from mpi4py import MPI

    bc = _bench_module(_BENCH_COLLECTIVES, "spmdsim_bench_collectives_script")
    args = argparse.Namespace(sizes=[4096], ops=list(bc.OPS), repeats=2, alloc=False, wait=wait,
                              prepared=False, aa=False)
    records = bc.bench(args)
    if MPI.COMM_WORLD.rank != 0:
        assert records == []
        return
    assert [r["op"] for r in records] == list(bc.OPS)
    for r in records:
        assert r["spmdsim_s"] > 0 and r["raw_s"] > 0 and r["group_size"] == MPI.COMM_WORLD.size
        assert r["ratio"] == pytest.approx(r["spmdsim_s"] / r["raw_s"])


@pytest.mark.parametrize("op", ["sendrecv", "alltoall"])
def test_bench_placement_times_every_delta(op):
    """bench_placement: one record per size and delta, ratios against delta 0, rank 0 reports."""
    from mpi4py import MPI

    bp = _bench_module(_BENCH_PLACEMENT, "spmdsim_bench_placement_script")
    records = bp.bench([65536, 100000], [16, 0, -16], 2, op)
    if MPI.COMM_WORLD.rank != 0:
        assert records == []
        return
    whole = 8 * MPI.COMM_WORLD.size  # sizes are cut to whole Alltoall blocks
    assert [(r["bytes_per_rank"], r["delta"]) for r in records] == [
        (n - n % whole, d) for n in (65536, 100000) for d in (16, 0, -16)]
    for r in records:
        assert r["op"] == op and r["seconds"] > 0
    base = {r["bytes_per_rank"]: r["seconds"] for r in records if r["delta"] == 0}
    assert all(r["ratio"] == pytest.approx(r["seconds"] / base[r["bytes_per_rank"]]) for r in records)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages on this OS")
@pytest.mark.parametrize("op", ["alltoall", "sendrecv"])
def test_bench_hugepages_times_every_page_kind(op):
    """bench_hugepages: four cases per size, ratios against 4 KiB on both sides, rank 0 reports."""
    from mpi4py import MPI

    bh = _bench_module(_BENCH_HUGEPAGES, "spmdsim_bench_hugepages_script")
    records = bh.bench([65536, 3 << 20], 2, op)
    if MPI.COMM_WORLD.rank != 0:
        assert records == []
        return
    whole = 8 * MPI.COMM_WORLD.size
    assert [(r["bytes_per_rank"], r["send_pages"], r["recv_pages"]) for r in records] == [
        (n - n % whole, s, r) for n in (65536, 3 << 20) for s, r in bh.CASES]
    for r in records:
        assert r["op"] == op and r["seconds"] > 0
        assert r["huge_share"] is None or 0 <= r["huge_share"] <= 1
    base = {r["bytes_per_rank"]: r["seconds"] for r in records if r["send_pages"] == r["recv_pages"] == "4K"}
    assert all(r["ratio"] == pytest.approx(r["seconds"] / base[r["bytes_per_rank"]]) for r in records)


def test_calibrate_fits_and_saves(shared_dir, capsys):
    from mpi4py import MPI

    from spmdsim.tools.cli.main import main

    comm = MPI.COMM_WORLD
    out = shared_dir / "cost.json"
    # Sizes 1024x apart, 3 repeats: calibrate refuses to save a fit whose beta is 0 (times that do not grow with
    # the size), which 4K-256K timed once gave on 8 ranks of a loaded 2-core machine; 4K-2M on 4 ranks beside 3
    # busy loops, 1 launch in 12.
    rc = main(["calibrate", "--sizes", "4K,256K,4M", "--group-sizes", str(comm.size),
               "--ops", "allgather,allreduce", "--repeats", "3", "--warmup", "0",
               "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    if comm.rank == 0:  # the table and the model (103 columns on one line before), within 100 columns
        # the fit picks ring or tree by what was measured: either may win on a loaded machine
        assert re.search(r"CostModel\((ring|tree): alpha=", printed), printed
        assert max(map(len, printed.splitlines())) <= 100
    comm.Barrier()
    model = CostModel.load(out)
    assert model.predict("allreduce", comm.size, 1 << 20) > 0
    assert model.source.startswith("spmdsim calibrate")
    assert model.copy_s_per_byte > 0  # the packing copy was timed too
