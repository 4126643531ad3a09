"""MPI I/O on simulated ranks: mpi4py's ``MPI.File`` (docs/reference/emulator-windows-files.md).

    fh = MPI.File.Open(comm, "out.bin", MPI.MODE_WRONLY | MPI.MODE_CREATE)   # collective
    fh.Set_view(rank * nbytes, MPI.DOUBLE)                                   # or a derived filetype
    fh.Write_all(block); fh.Close()

The ranks are threads of one process, so an open file is one descriptor of this process that every member
reads and writes at its own offsets (os.pread, os.pwrite), one operation at a time (so each is atomic, which
MPI allows in either atomicity mode). What MPI makes collective synchronizes the members as a collective of the
file's own communicator (a duplicate of the one it was opened on): Open, Close, Set_view, Set_size, Preallocate,
Sync, Set_atomicity, Seek_shared and the blocking ``_all`` and ``_ordered`` data calls (and their split
``_begin``/``_end`` forms), so a rank that skips one is reported as a deadlock, and members that call different
ones as a mismatch; the nonblocking forms (``Iwrite_at``, ``Iread_all``, ...) are done when their call returns.

Views (``Set_view``): a displacement, an elementary type and any filetype MPI can pack, its data's offsets
increasing (spmdsim.emulator.file_view), in the "native" representation ("internal" is the same here). Errors are
MPI.Exception with MPI's error classes (a file's handler is ERRORS_RETURN unless MPI.FILE_NULL's or the file's
own was set to ERRORS_ARE_FATAL, which ends the run). The data calls are spmdsim.emulator.file_access's.
"""
from __future__ import annotations

import os
import threading
import types
from typing import Any, Callable

from ..base import context as _local
from ..runtime.sim._mpi import mpi_error, mpi_module
from .comm import _resolve, self_comm
from .comm_errors import SimErrhandler, new_errhandler, run_user_handler
from .file_access import raise_as_handled
from .file_calls import FileCalls
from .file_view import View
from .handles import SharedHandle, SwappedKind, _new_reference, initial_errhandler
from .window_state import _mpi

__all__ = ["SimFile", "file_null"]


class _Open:
    """What the members of one Open share: the descriptor, its path and mode, the shared file pointer."""

    __slots__ = ("fd", "path", "amode", "mutex", "shared_pos", "atomic")

    def __init__(self, fd: int, path: str, amode: int) -> None:
        self.fd, self.path, self.amode = fd, path, amode
        self.mutex = threading.Lock()  # one operation at a time on the file
        self.shared_pos = 0  # the shared file pointer, in etypes of the view
        self.atomic = False


class _Handle:
    """What copies of one member's file handle share (``MPI.File(fh)``): its view and file pointer, error
    handler, info, and a split collective begun."""

    __slots__ = ("view", "pos", "errhandler", "info", "split", "closed")

    def __init__(self, errhandler: Any) -> None:
        self.view = View.default()
        self.pos = 0  # the individual file pointer, in etypes of the view
        self.errhandler = errhandler  # None: MPI.ERRORS_RETURN
        self.info: Any = None
        self.split: Any = None  # a split collective's (call, bytes moved) between its _begin and _end
        self.closed = False


def _os_error(call: str, path: str, exc: OSError) -> tuple:
    """(MPI's error class, the text) of an OSError opening or deleting `path`."""
    mpi = _mpi()
    code = {FileNotFoundError: mpi.ERR_NO_SUCH_FILE, FileExistsError: mpi.ERR_FILE_EXISTS,
            PermissionError: mpi.ERR_ACCESS, IsADirectoryError: mpi.ERR_BAD_FILE,
            NotADirectoryError: mpi.ERR_BAD_FILE}.get(type(exc), mpi.ERR_IO)
    return code, f"{call}: {path}: {exc.strerror or exc}"


def _amode_problem(amode: int) -> str:
    """Why `amode` is not an access mode MPI opens a file in, or ""."""
    mpi = _mpi()
    ways = [m for m in (mpi.MODE_RDONLY, mpi.MODE_RDWR, mpi.MODE_WRONLY) if amode & m]
    if len(ways) != 1:
        return "exactly one of MPI.MODE_RDONLY, MODE_RDWR and MODE_WRONLY must be given"
    if amode & mpi.MODE_RDONLY and amode & (mpi.MODE_CREATE | mpi.MODE_EXCL):
        return "MPI.MODE_RDONLY with MODE_CREATE or MODE_EXCL"
    if amode & mpi.MODE_RDWR and amode & mpi.MODE_SEQUENTIAL:
        return "MPI.MODE_RDWR with MODE_SEQUENTIAL"
    return ""


def _os_flags(amode: int) -> int:
    mpi = _mpi()
    flags = os.O_RDONLY if amode & mpi.MODE_RDONLY else os.O_WRONLY if amode & mpi.MODE_WRONLY else os.O_RDWR
    if amode & mpi.MODE_CREATE:
        flags |= os.O_CREAT
    if amode & mpi.MODE_EXCL:
        flags |= os.O_EXCL
    return flags | getattr(os, "O_CLOEXEC", 0)


def file_null(state: Any) -> "SimFile":
    """The simulated rank's MPI.FILE_NULL (its error handler is the one files it opens start with)."""
    if state.file_null is None:
        state.file_null = SimFile()
    return state.file_null


def _null_file() -> "SimFile":
    """The running rank's MPI.FILE_NULL (its error handler: Open's and Delete's)."""
    state = _local.simulated()
    return SimFile() if state is None else file_null(state)


def _new_file_handler() -> Any:
    """The error handler a file opened now starts with, as mpi4py sets it by ``mpi4py.rc.errors`` (a new
    communicator's: spmdsim.emulator.handles.initial_errhandler), "default" keeping MPI.FILE_NULL's."""
    return initial_errhandler(types.SimpleNamespace(errhandler=_null_file()._null_handler))


class SimFile(FileCalls, SharedHandle, metaclass=SwappedKind):
    """One simulated rank's handle of an open file (mpi4py's File). ``SimFile()`` is null (== MPI.FILE_NULL)."""

    _MPI_CLASS, _MPI_NULL = "File", "FILE_NULL"

    def __init__(self, file: Any = None) -> None:
        if type.__instancecheck__(SimFile, file):  # MPI.File(fh): a copy sharing the handle
            self._h, self._comm, self._open = file._h, file._comm, file._open
            self._null_handler = file._null_handler
            return
        mpi = mpi_module()
        if file is not None and not (mpi is not None and isinstance(file, mpi.__dict__["File"])
                                     and file == mpi.FILE_NULL):
            raise TypeError(f"expected a file, got {type(file).__name__}")
        self._h, self._comm, self._open, self._null_handler = None, None, None, None

    # -- opening, closing, deleting ------------------------------------------------------------

    @classmethod
    def Open(cls, comm: Any, filename: Any, amode: Any = None, info: Any = None) -> "SimFile":
        """Open `filename` on every member of `comm` (collective: the same name and mode on each)."""
        mpi = _mpi()
        comm = _resolve(comm)
        comm._live_handle()
        amode = mpi.MODE_RDONLY if amode is None else int(amode)
        path = os.fsdecode(os.fspath(filename))
        problem = _amode_problem(amode)
        if problem:
            raise mpi_error(mpi, mpi.ERR_AMODE, f"File.Open: amode {amode}: {problem}")
        private = comm.Dup()  # the file's own communicator: its collectives are no calls of `comm`'s
        private._group.made = f"the file {os.path.basename(path)!r} opened on {comm._group.label()}"  # (reports')

        def complete(slot: Any) -> None:
            if len({c.data for c in slot.calls}) > 1:
                slot.shared = (mpi.ERR_NOT_SAME, "File.Open: the members gave different file names or modes "
                                                 f"({sorted({c.data for c in slot.calls})!r})")
                return
            try:
                slot.shared = _Open(os.open(path, _os_flags(amode), 0o666), path, amode)
            except OSError as exc:
                slot.shared = _os_error("File.Open", path, exc)

        slot = private._enter("File.Open", ("File.Open",), (path, amode), complete)
        if isinstance(slot.shared, tuple):
            private.Free()
            raise_as_handled(_null_file(), *slot.shared)
        f = cls()
        f._h, f._comm, f._open = _Handle(_new_file_handler()), private, slot.shared
        if info is not None and info != mpi.INFO_NULL:
            f._h.info = info.Dup()
        if amode & mpi.MODE_APPEND:  # both file pointers start at the end
            f._h.pos = f._open.shared_pos = os.fstat(f._open.fd).st_size
        return f

    def Close(self) -> None:
        """Close the file (collective); with MODE_DELETE_ON_CLOSE the last member deletes it."""
        shared = self._live()

        def complete(slot: Any) -> None:
            os.close(shared.fd)
            if shared.amode & _mpi().MODE_DELETE_ON_CLOSE:
                try:
                    os.remove(shared.path)
                except OSError:
                    pass

        self._comm._enter("File.Close", ("File.Close",), None, complete)
        self._comm.Free()
        self._h.closed = True
        self._h, self._comm, self._open = None, None, None

    def free(self) -> None:
        """Close the file unless it is null (mpi4py's free)."""
        if self._h is not None and not self._h.closed:
            self.Close()

    @classmethod
    def Delete(cls, filename: Any, info: Any = None) -> None:
        """Delete `filename` (not collective)."""
        path = os.fsdecode(os.fspath(filename))
        try:
            os.remove(path)
        except OSError as exc:
            raise_as_handled(_null_file(), *_os_error("File.Delete", path, exc))

    # -- identity ---------------------------------------------------------------------------------

    def _live(self) -> _Open:
        if self._h is None or self._h.closed:
            mpi = _mpi()
            raise mpi_error(mpi, mpi.ERR_FILE, "the file is MPI.FILE_NULL (closed or never opened)")
        return self._open

    def __bool__(self) -> bool:
        return self._h is not None and not self._h.closed

    def __reduce__(self) -> Any:
        raise ValueError(f"cannot serialize {self!r}")

    def __repr__(self) -> str:
        return "<simulated File null>" if not self else f"<simulated File {self._open.path!r}>"

    def toint(self) -> int:
        """-1: a simulated file has no MPI handle (as a simulated communicator)."""
        return -1

    py2f = toint

    # -- error handlers ------------------------------------------------------------------------------

    @classmethod
    def Create_errhandler(cls, errhandler_fn: Callable) -> SimErrhandler:
        """A handler calling ``errhandler_fn(file, errorcode)`` (RuntimeError past 32 on one rank, as mpi4py)."""
        return new_errhandler(errhandler_fn)

    def _handler(self) -> Any:
        """The file's error handler (None: ERRORS_RETURN); MPI.FILE_NULL's is what files opened later start with."""
        return self._h.errhandler if self else self._null_handler

    def Get_errhandler(self) -> Any:
        """The file's handler (a new reference each time, as MPI's: Free it when done)."""
        eh = self._handler()
        if isinstance(eh, SimErrhandler):
            return SimErrhandler(eh.fn, eh.handle)
        return _new_reference(_mpi().ERRORS_RETURN if eh is None else eh)

    def Set_errhandler(self, errhandler: Any) -> None:
        mpi = _mpi()
        if isinstance(errhandler, SimErrhandler) and errhandler:
            handler: Any = SimErrhandler(errhandler.fn, errhandler.handle)
        elif isinstance(errhandler, mpi.Errhandler) and errhandler != mpi.ERRHANDLER_NULL:
            handler = None if errhandler == mpi.ERRORS_RETURN else mpi.Errhandler(errhandler)
        else:
            raise mpi_error(mpi, mpi.ERR_ARG, f"File.Set_errhandler: expected an error handler, got {errhandler!r}")
        if not self:
            self._null_handler = handler
        else:
            self._h.errhandler = handler

    def Call_errhandler(self, errorcode: int) -> None:
        """Run the file's handler on `errorcode`: nothing under ERRORS_RETURN, the program's function, or a
        fatal handler's end of the run."""
        eh = self._handler()
        if isinstance(eh, SimErrhandler):
            run_user_handler(self, eh, errorcode)
        elif eh is not None and errorcode != _mpi().SUCCESS:
            raise_as_handled(self, errorcode, f"File.Call_errhandler({errorcode})")

    @property
    def world_rank(self) -> int:  # (a handler's report names the rank and the group)
        state = _local.simulated()
        return self._comm.world_rank if self else 0 if state is None else state.rank

    @property
    def _group(self) -> Any:
        return self._comm._group if self else self_comm(_local.simulated())._group

    errhandler = property(Get_errhandler, Set_errhandler)

    # -- what it is ------------------------------------------------------------------------------------

    def Get_amode(self) -> int:
        return self._live().amode

    def Get_group(self) -> Any:
        self._live()
        return self._comm.Get_group()

    def Get_size(self) -> int:
        return os.fstat(self._live().fd).st_size

    def Get_info(self) -> Any:
        self._live()
        return self._h.info.Dup() if self._h.info is not None else _mpi().Info.Create()

    def Set_info(self, info: Any) -> None:
        self._live()
        self._h.info = None if info is None or info == _mpi().INFO_NULL else info.Dup()

    def Get_atomicity(self) -> bool:
        return self._live().atomic

    def Set_atomicity(self, flag: bool) -> None:
        shared = self._live()
        self._comm._enter("File.Set_atomicity", ("File.Set_atomicity",))
        shared.atomic = bool(flag)

    def Get_type_extent(self, datatype: Any) -> int:
        self._live()
        return datatype.Get_extent()[1]

    amode = property(Get_amode)
    size = property(Get_size)
    info = property(Get_info, Set_info)
    atomicity = property(Get_atomicity, Set_atomicity)

    @property
    def group(self) -> Any:
        return self.Get_group()

    @property
    def group_size(self) -> int:
        self._live()
        return self._comm.Get_size()

    @property
    def group_rank(self) -> int:
        self._live()
        return self._comm.Get_rank()

    # -- its length ------------------------------------------------------------------------------------

    def Set_size(self, size: int) -> None:
        """Truncate or extend the file to `size` bytes (collective: the same size on every member)."""
        self._resize("Set_size", size, shrink=True)

    def Preallocate(self, size: int) -> None:
        """Make the file at least `size` bytes long (collective)."""
        self._resize("Preallocate", size, shrink=False)

    def _resize(self, call: str, size: int, shrink: bool) -> None:
        shared, mpi = self._live(), _mpi()
        size = int(size)
        if size < 0:
            self._fail(mpi.ERR_ARG, f"{call}: size {size} is negative")
        if shared.amode & mpi.MODE_RDONLY:
            self._fail(mpi.ERR_READ_ONLY, f"{call}: the file is open read-only")

        def complete(slot: Any) -> None:
            if shrink or os.fstat(shared.fd).st_size < size:
                os.ftruncate(shared.fd, size)

        self._comm._enter(f"File.{call}", (f"File.{call}", size), None, complete)

    def Sync(self) -> None:
        """Make every member's writes visible to every member (collective; one process's file: a barrier)."""
        self._live()
        self._comm._enter("File.Sync", ("File.Sync",))
