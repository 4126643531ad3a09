"""A file view of MPI I/O on simulated ranks (spmdsim.emulator.file): which bytes of the file a rank's data
stream reaches.

A view is MPI's triple: a displacement in bytes, an elementary type (offsets count in it) and a filetype
tiled from the displacement on, each tile one filetype extent long, the data at the filetype's own byte
positions (found as one-sided operations find a derived type's: spmdsim.emulator.window_bytes._positions,
MPI's own packing). Byte j of the stream is at ``disp + (j // size) * extent + positions[j % size]`` of the
file; a view of a type without holes is one run of bytes from its displacement.
"""
from __future__ import annotations

import os
from typing import Any

from ..runtime.sim._mpi import mpi_error
from .._lazy import numpy_on_first_use
from .window_bytes import _positions
from .window_state import _mpi

np = numpy_on_first_use(globals())

__all__ = ["View", "write_bytes", "read_bytes"]

#: A scattered access reads (and a write writes back) the whole span its bytes lie in, as ROMIO's data sieving
#: does, where that span is at most SIEVE times its bytes (plus 1 MiB); else it makes one call a run of bytes.
SIEVE = 4


class View:
    """One rank's view of an open file (`MPI.File.Set_view`'s arguments, checked)."""

    __slots__ = ("disp", "etype", "filetype", "datarep", "esize", "size", "extent", "positions")

    def __init__(self, disp: int, etype: Any, filetype: Any, datarep: str) -> None:
        mpi = _mpi()
        self.disp, self.etype, self.filetype, self.datarep = disp, etype, filetype, datarep
        self.esize = etype.Get_size()
        self.size = filetype.Get_size()
        lb, self.extent = filetype.Get_extent()
        if disp < 0:
            raise mpi_error(mpi, mpi.ERR_ARG, f"Set_view: displacement {disp} is negative")
        if self.esize <= 0 or self.size <= 0 or self.size % self.esize:
            raise mpi_error(mpi, mpi.ERR_TYPE, f"Set_view: the filetype's {self.size} bytes are not a whole "
                                               f"number of etypes of {self.esize} bytes")
        if lb < 0 or self.extent < self.size:
            raise mpi_error(mpi, mpi.ERR_TYPE, "Set_view: a filetype whose data lie before its start or overlap "
                                               "their next copy (a negative lower bound or extent below its size)")
        positions, _, _ = _positions(filetype, 1)  # (an int: its bytes in a row from its start)
        if type(positions) is not int and len(positions) > 1 and (np.diff(positions) <= 0).any():
            raise mpi_error(mpi, mpi.ERR_TYPE, "Set_view: the filetype's displacements must increase (MPI "
                                               "requires a file view's typemap monotonic and without overlaps)")
        in_a_row = type(positions) is int or int(positions[-1]) + 1 == self.size  # (increasing: 0 .. size - 1)
        if in_a_row and self.extent == self.size:  # tiles back to back: the file's bytes from disp on
            self.positions: Any = self.size
        else:
            self.positions = np.arange(self.size, dtype=np.int64) if type(positions) is int else positions

    @classmethod
    def default(cls) -> "View":
        """The view a file is opened with: bytes from byte 0."""
        byte = _mpi().BYTE
        return cls(0, byte, byte, "native")

    def contiguous(self) -> bool:
        return type(self.positions) is int

    def offsets(self, start: int, nbytes: int) -> Any:
        """The file's byte offsets of stream bytes `start` to `start + nbytes` (an int64 array), or the first
        of them where they lie in a row (an int)."""
        if self.contiguous():
            return self.disp + start
        j = np.arange(start, start + nbytes, dtype=np.int64)
        tile, within = np.divmod(j, self.size)
        return self.disp + tile * self.extent + self.positions[within]

    def stream_end(self, file_size: int) -> int:
        """The stream bytes the view reaches below byte `file_size` of the file (its end, in stream bytes)."""
        past = file_size - self.disp
        if past <= 0:
            return 0
        if self.contiguous():
            return past
        tiles, rest = divmod(past, self.extent)
        return tiles * self.size + int(np.searchsorted(self.positions, rest))

    def byte_offset(self, offset: int) -> int:
        """The file's byte offset of etype `offset` of the view (MPI.File.Get_byte_offset)."""
        start = offset * self.esize
        if self.contiguous():
            return self.disp + start
        tile, within = divmod(start, self.size)
        return self.disp + tile * self.extent + int(self.positions[within])


def runs(offsets: Any, nbytes: int) -> list:
    """`View.offsets`' answer as [(file offset, stream index, length)]: the runs of bytes in a row."""
    if type(offsets) is int:
        return [(offsets, 0, nbytes)] if nbytes else []
    if not len(offsets):
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(offsets)]))
    return [(int(offsets[s]), int(s), int(e - s)) for s, e in zip(starts, ends)]


def _sieved(offsets: Any, nbytes: int) -> Any:
    """(first, last + 1) of the bytes `offsets` reach, where one access of that span is cheaper, else None."""
    if type(offsets) is int or not nbytes:
        return None
    lo, hi = int(offsets[0]), int(offsets[-1]) + 1
    return (lo, hi) if hi - lo <= SIEVE * nbytes + (1 << 20) else None


def _pread(fd: int, length: int, at: int) -> bytes:
    """Up to `length` bytes of the file from byte `at` (fewer where it ends)."""
    parts, got = [], 0
    while got < length:
        part = os.pread(fd, length - got, at + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _pwrite(fd: int, data: Any, at: int) -> None:
    chunk, done = memoryview(data), 0
    while done < len(chunk):
        done += os.pwrite(fd, chunk[done:], at + done)


def write_bytes(fd: int, offsets: Any, data: Any, readable: bool) -> None:
    """Write `data` (uint8) at the file's byte `offsets` (`View.offsets`' answer); through its span only where the
    file is `readable` (a file opened MPI.MODE_WRONLY goes a run at a time)."""
    span = _sieved(offsets, len(data)) if readable else None
    if span is not None:  # read the span, put the bytes in, write it back (the file's mutex is held)
        lo, hi = span
        block = np.zeros(hi - lo, np.uint8)  # (past the file's end the holes stay zero, as a hole reads)
        old = _pread(fd, hi - lo, lo)
        block[:len(old)] = np.frombuffer(old, np.uint8)
        block[offsets - lo] = data
        _pwrite(fd, block, lo)
        return
    for at, i, length in runs(offsets, len(data)):
        _pwrite(fd, data[i:i + length], at)


def read_bytes(fd: int, offsets: Any, nbytes: int) -> Any:
    """The `nbytes` bytes (uint8) at the file's byte `offsets`, all below its end."""
    span = _sieved(offsets, nbytes)
    if span is not None:
        lo, hi = span
        return np.frombuffer(_pread(fd, hi - lo, lo), np.uint8)[offsets - lo]
    data = np.empty(nbytes, np.uint8)
    for at, i, length in runs(offsets, nbytes):
        data[i:i + length] = np.frombuffer(_pread(fd, length, at), np.uint8)
    return data
