"""The data calls of MPI I/O on simulated ranks (spmdsim.emulator.file's SimFile): views, file pointers, reads and
writes at explicit offsets, at the rank's own pointer, at the shared pointer and in rank order, each in its
blocking, collective (``_all``), split (``_begin``/``_end``) and nonblocking (``I...``) forms as mpi4py has them.

Offsets and pointers count etypes of the rank's view; a read past the end of the file stops there (its status
counts the bytes read, as MPI's). A collective data call moves the rank's bytes, then waits for every member's
(a collective of the file's communicator), so the members' writes are all in the file when it returns.
"""
from __future__ import annotations

import os
from typing import Any, NoReturn

from ..runtime.sim._mpi import mpi_error, special
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.requests import completed, fill_status
from .file_view import View, read_bytes, write_bytes
from .comm_errors import SimErrhandler, run_user_handler
from .job_end import end_every_rank
from .derived import committed
from .window_bytes import _Side
from .window_state import _mpi

__all__ = ["FileAccess", "raise_as_handled"]


def raise_as_handled(file: Any, code: int, text: str) -> NoReturn:
    """MPI's error `code` under `file`'s error handler (an open file's, or MPI.FILE_NULL's for Open and Delete):
    MPI.Exception under ERRORS_RETURN; a handler of the program's runs first (it may end the run); a fatal one
    (ERRORS_ARE_FATAL, ERRORS_ABORT) ends every rank, as MPI ends the job."""
    mpi, eh = _mpi(), file._handler()
    if isinstance(eh, SimErrhandler):
        run_user_handler(file, eh, code)
    elif eh is not None and eh != mpi.ERRORS_RETURN:
        error = SimulationError(f"{text} ({mpi.Get_error_string(code)}), under a fatal error handler: every rank "
                                "was stopped")
        error.abort_code = int(code) or 1  # type: ignore[attr-defined]
        end_every_rank(error)
    raise mpi_error(mpi, code, text)


def _status(status: Any, nbytes: int) -> None:
    fill_status(status, special("ANY_SOURCE"), special("ANY_TAG"), nbytes)


class FileAccess:
    """SimFile's views, pointers and data calls (a mixin; `self._live()` the shared open file, `self._h` the
    handle's own state, `self._comm` the file's communicator)."""

    # -- the view --------------------------------------------------------------------------------

    def Set_view(self, disp: int = 0, etype: Any = None, filetype: Any = None, datarep: str = "native",
                 info: Any = None) -> None:
        """The rank's view (collective); both file pointers back to 0."""
        shared, mpi = self._live(), _mpi()
        etype = mpi.BYTE if etype is None else etype
        filetype = etype if filetype is None else filetype
        if datarep not in ("native", "internal"):
            self._fail(mpi.ERR_UNSUPPORTED_DATAREP, f"Set_view: data representation {datarep!r} is not simulated; "
                                                    "'native' and 'internal' are")
        for t in (etype, filetype):
            committed(t, "a file view's datatype")
        view = View(int(disp), etype, filetype, datarep)

        def complete(slot: Any) -> None:
            shared.shared_pos = 0

        self._comm._enter("File.Set_view", ("File.Set_view", view.esize, datarep), None, complete)
        self._h.view, self._h.pos = view, 0

    def Get_view(self) -> tuple:
        """(displacement, etype, filetype, data representation); a derived type is a new handle (Free it)."""
        self._live()
        v = self._h.view
        return (v.disp, v.etype if v.etype.is_predefined else v.etype.Dup(),
                v.filetype if v.filetype.is_predefined else v.filetype.Dup(), v.datarep)

    def Get_byte_offset(self, offset: int) -> int:
        """The file's byte of etype `offset` of the view."""
        self._live()
        return self._h.view.byte_offset(self._offset("Get_byte_offset", offset))

    # -- file pointers ---------------------------------------------------------------------------

    def _sought(self, call: str, now: int, offset: int, whence: int) -> int:
        mpi = _mpi()
        if whence == mpi.SEEK_SET:
            to = offset
        elif whence == mpi.SEEK_CUR:
            to = now + offset
        elif whence == mpi.SEEK_END:
            to = self._h.view.stream_end(os.fstat(self._open.fd).st_size) // self._h.view.esize + offset
        else:
            self._fail(mpi.ERR_ARG, f"{call}: whence {whence!r} is not MPI.SEEK_SET, SEEK_CUR or SEEK_END")
        return self._offset(call, to)

    def Seek(self, offset: int, whence: Any = None) -> None:
        self._live()
        whence = _mpi().SEEK_SET if whence is None else whence
        self._h.pos = self._sought("Seek", self._h.pos, int(offset), whence)

    def Get_position(self) -> int:
        self._live()
        return self._h.pos

    def Seek_shared(self, offset: int, whence: Any = None) -> None:
        """Move the shared file pointer (collective: the same offset and whence on every member)."""
        shared = self._live()
        whence = _mpi().SEEK_SET if whence is None else whence
        to = self._sought("Seek_shared", shared.shared_pos, int(offset), whence)

        def complete(slot: Any) -> None:
            shared.shared_pos = to

        self._comm._enter("File.Seek_shared", ("File.Seek_shared", int(offset), whence), None, complete)

    def Get_position_shared(self) -> int:
        return self._live().shared_pos

    # -- the bytes -------------------------------------------------------------------------------

    def _fail(self, code: int, text: str) -> NoReturn:
        raise_as_handled(self, code, f"File.{text}")

    def _offset(self, call: str, offset: Any) -> int:
        offset = int(offset)
        if offset < 0:
            self._fail(_mpi().ERR_ARG, f"{call}: offset {offset} is negative")
        return offset

    def _side(self, call: str, write: bool, spec: Any, shared_pointer: bool) -> _Side:
        """The buffer `spec` of a read or write, after the file's mode allows it (MODE_SEQUENTIAL: only at the
        `shared_pointer`)."""
        amode, mpi = self._live().amode, _mpi()
        if write and amode & mpi.MODE_RDONLY:
            self._fail(mpi.ERR_READ_ONLY, f"{call}: the file is open with MPI.MODE_RDONLY")
        if not write and amode & mpi.MODE_WRONLY:
            self._fail(mpi.ERR_ACCESS, f"{call}: the file is open with MPI.MODE_WRONLY")
        if amode & mpi.MODE_SEQUENTIAL and not shared_pointer:
            self._fail(mpi.ERR_UNSUPPORTED_OPERATION, f"{call}: a file opened with MPI.MODE_SEQUENTIAL is read and "
                                                      "written at the shared file pointer only")
        return _Side.of(spec, f"File.{call}", readonly=write)

    def _io(self, side: _Side, write: bool, start: int) -> int:
        """Move `side`'s bytes to or from the view's stream from etype `start`; the bytes moved (the file's
        mutex held by the caller)."""
        view, fd = self._h.view, self._open.fd
        first, n = start * view.esize, side.nbytes
        if write:
            write_bytes(fd, view.offsets(first, n), side.read(), not self._open.amode & _mpi().MODE_WRONLY)
            return n
        n = max(0, min(n, view.stream_end(os.fstat(fd).st_size) - first))
        data = read_bytes(fd, view.offsets(first, n), n)
        if type(side.positions) is int:
            side.memory[side.start:side.start + n] = data
        else:
            side.memory[side.start + side.positions[:n]] = data
        return n

    def _at(self, call: str, write: bool, offset: Any, buf: Any, status: Any, together: bool = False) -> int:
        side = self._side(call, write, buf, shared_pointer=False)
        start = self._offset(call, offset)
        with self._open.mutex:
            n = self._io(side, write, start)
        if together:
            self._comm._enter(f"File.{call}", (f"File.{call}",))
        _status(status, n)
        return n

    def _here(self, call: str, write: bool, buf: Any, status: Any, together: bool = False) -> int:
        """At the rank's own pointer, which moves past the bytes moved, or, for a nonblocking call, past those
        asked for (set as the call starts, as MPI does and MPICH's reads past the end show)."""
        side = self._side(call, write, buf, shared_pointer=False)
        with self._open.mutex:
            n = self._io(side, write, self._h.pos)
        self._h.pos += (side.nbytes if call.startswith("I") else n) // self._h.view.esize
        if together:
            self._comm._enter(f"File.{call}", (f"File.{call}",))
        _status(status, n)
        return n

    def _shared(self, call: str, write: bool, buf: Any, status: Any) -> int:
        side, shared = self._side(call, write, buf, shared_pointer=True), self._open
        with shared.mutex:
            start = shared.shared_pos
            shared.shared_pos += side.nbytes // self._h.view.esize
            n = self._io(side, write, start)
        _status(status, n)
        return n

    def _ordered(self, call: str, write: bool, buf: Any, status: Any) -> int:
        """Collective: the members' data one after the other in rank order from the shared file pointer."""
        side, shared = self._side(call, write, buf, shared_pointer=True), self._open

        def complete(slot: Any) -> None:
            starts = [shared.shared_pos]
            for c in slot.calls:
                starts.append(starts[-1] + c.data)
            shared.shared_pos, slot.shared = starts[-1], starts

        slot = self._comm._enter(f"File.{call}", (f"File.{call}",), side.nbytes // self._h.view.esize, complete)
        with shared.mutex:
            n = self._io(side, write, slot.shared[self._comm.Get_rank()])
        self._comm._enter(f"File.{call}", (f"File.{call}", "(its end)"))
        _status(status, n)
        return n

    def _request(self, n: int) -> Any:
        req = completed(self._comm.Get_rank(), "recv")
        req.nbytes, req.source, req.got_tag = n, special("ANY_SOURCE"), special("ANY_TAG")
        return req

    def _begin(self, call: str, run: Any) -> None:
        """A split collective's _begin: `run()` (the collective) now, its bytes kept for the _end's status."""
        self._live()
        if self._h.split is not None:
            self._fail(_mpi().ERR_IO, f"{call}_begin: {self._h.split[0]}_begin is still active on this file "
                                      "(one split collective at a time)")
        self._h.split = (call, run())

    def _end(self, call: str, status: Any) -> None:
        self._live()
        if self._h.split is None or self._h.split[0] != call:
            self._fail(_mpi().ERR_IO, f"{call}_end: no {call}_begin before it")
        _status(status, self._h.split[1])
        self._h.split = None
