"""MPI I/O on simulated ranks (spmdsim.emulator.file): what a program's file holds, its pointers, and MPI's errors.

mpi4py's own test_file and test_io run too (tests/test_sim_mpi4py_suite.py), and examples/mpi4py/parallel_io.py
prints what MPICH prints (tests/test_sim_mpirun.py); these check the bytes against numpy and the refusals."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from spmdsim.runtime.sim.engine import DeadlockError, RuntimeMismatchError
from testkit import on_simulated_ranks

MPI = pytest.importorskip("mpi4py.MPI")


def _blocks(path: str) -> tuple:
    """4 ranks write an 8 x 8 array's 2 x 2 blocks through subarray views (Write_all), then read rows of it back
    at explicit offsets (Read_at_all) and columns through a vector view (Read_all)."""
    comm = MPI.COMM_WORLD
    r = comm.rank
    whole = np.arange(64.0).reshape(8, 8)
    i, j = divmod(r, 2)
    view = MPI.DOUBLE.Create_subarray([8, 8], [4, 4], [4 * i, 4 * j]).Commit()
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
    fh.Set_view(0, MPI.DOUBLE, view)
    fh.Write_all(np.ascontiguousarray(whole[4 * i:4 * i + 4, 4 * j:4 * j + 4]))
    fh.Set_view(0, MPI.DOUBLE)  # the file as doubles again
    rows = np.full((2, 8), -1.0)
    status = MPI.Status()
    fh.Read_at_all(16 * r, rows, status)
    column = MPI.DOUBLE.Create_vector(8, 2, 8).Commit()  # columns 2r, 2r + 1: every row's pair
    resized = column.Create_resized(0, 64 * 8).Commit()
    fh.Set_view(16 * r, MPI.DOUBLE, resized)
    pairs = np.full((8, 2), -1.0)
    fh.Read_all(pairs)
    position = fh.Get_position()
    fh.Close()
    for t in (view, column, resized):
        t.Free()
    return rows.tolist(), status.Get_count(MPI.DOUBLE), pairs.tolist(), position


def test_blocks_written_through_subarray_views_make_numpys_file_and_read_back_any_way(tmp_path):
    path = str(tmp_path / "array.bin")
    got = on_simulated_ranks(4, functools.partial(_blocks, path))
    whole = np.arange(64.0).reshape(8, 8)
    assert np.array_equal(np.fromfile(path).reshape(8, 8), whole)
    for r, (rows, count, pairs, position) in enumerate(got):
        assert rows == whole[2 * r:2 * r + 2].tolist() and count == 16
        assert pairs == whole[:, 2 * r:2 * r + 2].tolist() and position == 16


def _pointers(path: str) -> tuple:
    """Rank r writes r + 1 bytes of its number in rank order (Write_ordered), then 2 bytes at the shared
    pointer; each reads the file from 1 past its end at its own pointer."""
    comm = MPI.COMM_WORLD
    r = comm.rank
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE)
    fh.Write_ordered(np.full(r + 1, r, np.int8))
    ordered = fh.Get_position_shared()
    comm.Barrier()
    fh.Write_shared(np.full(2, 10 + r, np.int8))
    comm.Barrier()
    fh.Seek(-4, MPI.SEEK_END)
    tail = np.full(6, -1, np.int8)
    status = MPI.Status()
    fh.Read(tail, status)
    size = fh.Get_size()
    whole = np.full(size, -1, np.int8)
    fh.Read_at(0, whole)
    fh.Sync()
    fh.Close()
    return ordered, tail.tolist(), status.Get_count(MPI.BYTE), whole.tolist()


def test_ordered_shared_and_own_pointers_and_a_read_past_the_end(tmp_path):
    path = str(tmp_path / "log.bin")
    got = on_simulated_ranks(3, functools.partial(_pointers, path))
    ordered, tail, count, whole = got[0]
    assert [g[0] for g in got] == [6, 6, 6] and all(g[1:] == (tail, count, whole) for g in got)
    shared = [whole[k:k + 2] for k in (6, 8, 10)]  # the three ranks' pairs, in the order they came
    assert whole[:6] == [0, 1, 1, 2, 2, 2] and sorted(shared) == [[10, 10], [11, 11], [12, 12]]
    assert count == 4 and tail == whole[8:] + [-1, -1]  # 4 bytes to the end; the rest of the buffer untouched
    assert not os.path.exists(path)  # MODE_DELETE_ON_CLOSE


def _refusals(folder: str) -> list:
    """MPI's error class of each wrong call, and whether the text names what was wrong."""
    comm = MPI.COMM_WORLD
    said = []

    def refused(call, *args):
        try:
            call(*args)
        except MPI.Exception as exc:
            said.append((exc.Get_error_class(), str(exc)))
        else:
            said.append(None)

    missing = os.path.join(folder, "missing.bin")
    refused(MPI.File.Open, comm, missing, MPI.MODE_RDONLY)
    refused(MPI.File.Open, comm, missing, MPI.MODE_RDONLY | MPI.MODE_RDWR)
    refused(MPI.File.Open, comm, os.path.join(folder, f"mine{comm.rank}.bin"), MPI.MODE_CREATE | MPI.MODE_WRONLY)
    made = os.path.join(folder, "made.bin")
    MPI.File.Open(comm, made, MPI.MODE_CREATE | MPI.MODE_WRONLY).Close()
    refused(MPI.File.Open, comm, made, MPI.MODE_CREATE | MPI.MODE_EXCL | MPI.MODE_WRONLY)
    fh = MPI.File.Open(comm, made, MPI.MODE_RDONLY)
    refused(fh.Write_at, 0, np.zeros(2))
    refused(fh.Read_at, -1, np.zeros(2))
    fh.Close()
    refused(fh.Get_size)
    refused(MPI.File.Delete, missing)
    return said


def test_wrong_calls_raise_mpis_error_classes_naming_the_value(tmp_path):
    said = on_simulated_ranks(2, functools.partial(_refusals, str(tmp_path)))
    assert said[0] == said[1] or all(a[0] == b[0] for a, b in zip(*said))
    codes = [entry[0] for entry in said[0]]
    assert codes == [MPI.ERR_NO_SUCH_FILE, MPI.ERR_AMODE, MPI.ERR_NOT_SAME, MPI.ERR_FILE_EXISTS, MPI.ERR_READ_ONLY,
                     MPI.ERR_ARG, MPI.ERR_FILE, MPI.ERR_NO_SUCH_FILE]
    texts = [entry[1] for entry in said[0]]
    assert "missing.bin" in texts[0] and "exactly one of MPI.MODE_RDONLY" in texts[1]
    assert "mine0.bin" in texts[2] and "mine1.bin" in texts[2] and "offset -1 is negative" in texts[5]
    assert not any(name.startswith("mine") for name in os.listdir(tmp_path))  # nothing opened where names differ


def _skips(path: str) -> None:
    comm = MPI.COMM_WORLD
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    if comm.rank == 0:
        fh.Write_at_all(0, np.zeros(2))
    fh.Close()


def test_a_rank_that_skips_a_collective_file_call_is_named_not_a_hang(tmp_path):
    with pytest.raises((DeadlockError, RuntimeMismatchError)) as raised:
        on_simulated_ranks(2, functools.partial(_skips, str(tmp_path / "skip.bin")))
    assert ("on the file 'skip.bin' opened on the world" in str(raised.value) and "rank 0 calls File.Write_at_all but "
            "rank 1 calls File.Close" in str(raised.value)), raised.value


def _spread(path: str, gap: int, mode: str) -> list:
    """2 ranks, each 3 doubles a tile `gap` bytes long, rank r's at byte 8r of each: written (in a file opened
    write-only, or read-write), then read back."""
    comm = MPI.COMM_WORLD
    tile = MPI.DOUBLE.Create_resized(0, gap).Commit()
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | getattr(MPI, mode))
    fh.Set_view(8 * comm.rank, MPI.DOUBLE, tile)
    fh.Write_all(np.arange(3.0) + 10 * comm.rank)
    if mode == "MODE_WRONLY":
        fh.Close()
        fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
        fh.Set_view(8 * comm.rank, MPI.DOUBLE, tile)
    back = np.full(4, -1.0)
    status = MPI.Status()
    fh.Read_at_all(0, back, status)
    fh.Close()
    tile.Free()
    return back.tolist() + [status.Get_count(MPI.DOUBLE)]


@pytest.mark.parametrize("gap, mode", [(32, "MODE_RDWR"), (3 << 20, "MODE_RDWR"), (32, "MODE_WRONLY")],
                         ids=["one-span", "a-call-a-run", "write-only"])
def test_scattered_bytes_land_alike_read_and_written_by_span_or_by_run(tmp_path, gap, mode):
    """A scattered view's bytes go by one access of their span (data sieving) or, where the span is over 4 times
    them and 1 MiB or the file was opened write-only (no reading the span), by one call a run: the file and the
    reads are the same."""
    path = str(tmp_path / "spread.bin")
    got = on_simulated_ranks(2, functools.partial(_spread, path, gap, mode))
    assert got == [[0.0, 1.0, 2.0, -1.0, 3], [10.0, 11.0, 12.0, -1.0, 3]]
    held = np.fromfile(path)
    assert held.size == (2 * gap + 16) // 8
    assert held[[0, 1, gap // 8, gap // 8 + 1, gap // 4, gap // 4 + 1]].tolist() == [0, 10, 1, 11, 2, 12]
    assert np.count_nonzero(held) == 5  # (the holes read as zeros)
