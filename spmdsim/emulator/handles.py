"""Error handlers and attributes of simulated communicators (mpi4py's Get/Set/Create/Call_errhandler and
Create_keyval, Set_attr, Get_attr, Delete_attr, Free_keyval), a mixin of SimComm.

Error handlers, as mpi4py gives them: MPI.COMM_WORLD and MPI.COMM_SELF start with the handler
``mpi4py.rc.errors`` names when the rank first uses them ("exception", mpi4py's default:
MPI.ERRORS_RETURN, so MPI's errors are raised as MPI.Exception; "default" and "fatal":
MPI.ERRORS_ARE_FATAL; "abort": MPI.ERRORS_ABORT), and so does a new communicator (Dup, Split,
Create, ...), as mpi4py sets it, but under "default", where it has its parent's, as MPI gives it.
``Set_errhandler`` takes MPI's predefined handlers or one made by ``Create_errhandler(fn)``;
``Call_errhandler(code)`` runs the handler: ERRORS_RETURN does nothing, ERRORS_ARE_FATAL and
ERRORS_ABORT end every simulated rank as MPI_Abort does, a user's handler is called as
``fn(comm, code)``. What an error the emulator itself meets in a communicator's call (a bad rank, a
truncated message) does under each handler: spmdsim.emulator.comm_errors. As in one mpi4py process, a rank has
at most 32 user-made handlers at a time.

Attributes: a keyval made by ``Create_keyval(copy_fn, delete_fn)`` keys one value per communicator.
``Dup`` copies a value as MPI's copy callback says (mpi4py's rules: None or False, not copied; True,
the same object; a function, what it returns, NotImplemented meaning not copied); ``Delete_attr``, a
new ``Set_attr`` over a value and ``Free`` call ``delete_fn(comm, keyval, value)``; an exception in a
callback is printed and raised as MPI.Exception (ERR_OTHER), as mpi4py does. The predefined keyvals
(MPI.TAG_UB, ...) read this process's MPI.
"""
from __future__ import annotations

import functools
import itertools
import sys
import threading
from typing import Any, Callable

from ..base import context as _local
from ..runtime.sim._mpi import mpi_error, mpi_module
from .real import real
from ..runtime.sim.engine import SimulationError
from .comm_errors import SimErrhandler, handled_from_now, new_errhandler, run_user_handler
from .job_end import end_every_rank

__all__ = ["CommHandles", "SharedHandle", "SwappedKind", "initial_errhandler"]

_LOCK = threading.Lock()
_IDS = itertools.count(0x5E000001)  # handles no real MPI object has
_KEYVALS: dict = {}  # keyval -> (copy_fn, delete_fn), for every simulated rank (each makes its own)


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


@functools.cache
def _scratch() -> Any:
    """A private duplicate of this process's real COMM_SELF (made once, under _LOCK): `_new_reference`'s."""
    return real("COMM_SELF").Dup()


def _new_reference(errhandler: Any) -> Any:
    """A new reference of this process's MPI to `errhandler` (one of MPI's own), as MPI_Comm_get_errhandler gives
    one: the caller's ``Free`` releases it. A second Python object over the same handle would let that ``Free``
    release MPI's own reference: Open MPI counts references on its predefined handlers too, and a later
    ``MPI.Session.Init`` crashed in it (mpi4py's demo init-fini/test_0.py on simulated ranks). Set on a private
    duplicate of the real COMM_SELF and got back, under _LOCK (simulated ranks are threads)."""
    with _LOCK:
        comm = _scratch()
        comm.Set_errhandler(errhandler)
        return comm.Get_errhandler()


def _callback_failed(what: str) -> BaseException:
    """MPI.Exception (ERR_OTHER) for a callback that raised, which is printed first (as mpi4py does)."""
    import traceback  # here: only a callback that raised loads it

    traceback.print_exc(file=sys.stderr)
    return mpi_error(_mpi(), _mpi().ERR_OTHER, f"the {what} callback raised")


def initial_errhandler(parent: Any = None) -> Any:
    """The handler a communicator starts with (None: ERRORS_RETURN): the one mpi4py sets for
    ``mpi4py.rc.errors``, or under "default" MPI's (the `parent` handle's, ERRORS_ARE_FATAL for a
    predefined communicator)."""
    import mpi4py

    errors = getattr(getattr(mpi4py, "rc", None), "errors", "exception")
    if errors not in ("default", "fatal", "abort"):  # mpi4py's "exception": no handler, and no MPI library needed
        return None
    mpi = _mpi()
    if errors == "default":
        return handled_from_now(mpi.ERRORS_ARE_FATAL if parent is None else parent.errhandler)
    if errors == "fatal":
        return handled_from_now(mpi.ERRORS_ARE_FATAL)
    if errors == "abort":
        return handled_from_now(mpi.ERRORS_ABORT if mpi.ERRORS_ABORT != mpi.ERRHANDLER_NULL
                                  else mpi.ERRORS_ARE_FATAL)
    return None


class SwappedKind(type):
    """The metaclass of a simulated class a rank's mpi4py.MPI swaps in for its own `_MPI_CLASS` (SimWin for "Win",
    SimFile for "File"): mpi4py's own objects of that class (MPI.WIN_NULL, MPI.FILE_NULL) are instances too."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        mpi = mpi_module()
        return mpi is not None and isinstance(obj, mpi.__dict__[cls._MPI_CLASS])


class SharedHandle:
    """Identity of a simulated MPI object whose copies share one handle (`self._h`), as mpi4py's copies share one
    MPI handle: equal when the handle is, and a null one equal to mpi4py's null object of its kind (a mixin of
    SimComm, SimWin and SimFile)."""

    #: mpi4py's class and null object this kind compares with (a SimWin's: "Win", "WIN_NULL")
    _MPI_CLASS, _MPI_NULL = "Comm", "COMM_NULL"

    def __eq__(self, other: Any) -> bool:
        if type.__instancecheck__(SharedHandle, other) and other._MPI_CLASS == self._MPI_CLASS:
            return (self._h is other._h) or (not self and not other)
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.__dict__[self._MPI_CLASS]):  # the class itself, also swapped
            return not self and other == getattr(mpi, self._MPI_NULL)
        return NotImplemented

    def __ne__(self, other: Any) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return id(self._h)


class CommHandles(SharedHandle):
    """Error handlers, attributes and identity of a SimComm or a SimWin (a mixin; `self._h`: the handle copies
    share)."""

    # -- error handlers ----------------------------------------------------------------------------

    @classmethod
    def Create_errhandler(cls, errhandler_fn: Callable) -> SimErrhandler:
        """A handler calling ``errhandler_fn(comm, errorcode)`` (RuntimeError past 32 on one rank, as mpi4py)."""
        return new_errhandler(errhandler_fn)

    def _live_handle(self) -> Any:
        h = self._h
        if h is None or h.freed:
            raise mpi_error(_mpi(), _mpi().ERR_COMM, "the communicator is MPI.COMM_NULL (freed or never made)")
        return h

    def Get_errhandler(self) -> Any:
        """The communicator's handler (a new handle each time, as MPI's: Free it when done)."""
        eh = self._live_handle().errhandler
        if eh is None:
            return _new_reference(_mpi().ERRORS_RETURN)
        return SimErrhandler(eh.fn, eh.handle) if isinstance(eh, SimErrhandler) else _new_reference(eh)

    def Set_errhandler(self, errhandler: Any) -> None:
        h = self._live_handle()
        mpi = _mpi()
        if isinstance(errhandler, SimErrhandler):
            if not errhandler:
                raise mpi_error(mpi, mpi.ERR_ERRHANDLER, "the error handler is MPI.ERRHANDLER_NULL")
            h.errhandler = handled_from_now(SimErrhandler(errhandler.fn, errhandler.handle))
            return
        if not isinstance(errhandler, mpi.Errhandler):
            raise TypeError(f"expected an Errhandler, got {type(errhandler).__name__}")
        if errhandler == mpi.ERRHANDLER_NULL:
            raise mpi_error(mpi, mpi.ERR_ERRHANDLER, "the error handler is MPI.ERRHANDLER_NULL")
        h.errhandler = handled_from_now(mpi.Errhandler(errhandler))

    def Call_errhandler(self, errorcode: int) -> None:
        """Run the communicator's handler on `errorcode` (see the module docstring)."""
        eh = self._live_handle().errhandler
        mpi = _mpi()
        if isinstance(eh, SimErrhandler):
            run_user_handler(self, eh, errorcode)
        elif eh is not None and eh != mpi.ERRORS_RETURN:  # ERRORS_ARE_FATAL, ERRORS_ABORT: as MPI_Abort
            error = SimulationError(f"simulated rank {self.world_rank}: {mpi.Get_error_string(errorcode)} "
                                    f"(error code {errorcode}) on {self._group.label()}, whose error handler is "
                                    f"fatal: every rank was stopped")
            error.abort_code = int(errorcode) or 1
            end_every_rank(error)

    errhandler = property(Get_errhandler, Set_errhandler)

    # -- attributes --------------------------------------------------------------------------------

    @classmethod
    def Create_keyval(cls, copy_fn: Any = None, delete_fn: Any = None, nopython: bool = False) -> int:
        with _LOCK:
            keyval = next(_IDS)
            _KEYVALS[keyval] = (copy_fn, delete_fn)
        return keyval

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        """Forget `keyval` (values already set stay until deleted); returns MPI.KEYVAL_INVALID."""
        with _LOCK:
            _KEYVALS.pop(keyval, None)
        return _mpi().KEYVAL_INVALID

    def Set_attr(self, keyval: int, attrval: Any) -> None:
        h = self._live_handle()
        if keyval not in _KEYVALS:
            raise mpi_error(_mpi(), _mpi().ERR_KEYVAL, f"keyval {keyval!r} was not made by Create_keyval")
        if keyval in h.attrs:
            self._delete(h, keyval)
        h.attrs[keyval] = attrval

    def Get_attr(self, keyval: int) -> Any:
        """The value of `keyval` (None if unset); the predefined ones (MPI.TAG_UB, ...) as this process's MPI,
        but MPI.UNIVERSE_SIZE and MPI.APPNUM as MPICH's `mpiexec -n N` ranks read them (None and 0; a spawned
        rank's APPNUM is its command's index, as MPICH's)."""
        h = self._live_handle()
        if keyval in _KEYVALS or keyval in h.attrs:
            return h.attrs.get(keyval)
        mpi = _mpi()
        if keyval == mpi.UNIVERSE_SIZE:  # what mpiexec's ranks read; this process (an MPICH singleton) asking
            return None  # would fork an mpiexec for it, and without one on PATH wait for it forever
        if keyval == mpi.APPNUM:  # (a rank of a Spawn_multiple: its command's index, spmdsim.emulator.spawn)
            state = _local.simulated()
            return 0 if state is None else state.appnum
        # The predefined attributes are the world's (Open MPI sets MPI.LASTUSEDCODE there alone; MPICH on both).
        found = real("COMM_WORLD").Get_attr(keyval)
        return real("COMM_SELF").Get_attr(keyval) if found is None else found

    def Delete_attr(self, keyval: int) -> None:
        h = self._live_handle()
        if keyval not in h.attrs:
            if keyval not in _KEYVALS:
                raise mpi_error(_mpi(), _mpi().ERR_KEYVAL, f"keyval {keyval!r} was not made by Create_keyval")
            return
        self._delete(h, keyval)

    def _delete(self, h: Any, keyval: int) -> None:
        value = h.attrs.pop(keyval)
        delete_fn = _KEYVALS.get(keyval, (None, None))[1]
        if callable(delete_fn):
            try:
                delete_fn(self, keyval, value)
            except Exception:  # noqa: BLE001 - printed, then MPI's error, as mpi4py does
                raise _callback_failed("attribute delete") from None

    def _copy_attrs(self, new: Any) -> None:
        """Dup: give `new` the attributes MPI's copy callbacks copy."""
        for keyval, value in list(self._h.attrs.items()):
            copy_fn = _KEYVALS.get(keyval, (None, None))[0]
            if copy_fn is None or copy_fn is False:
                continue
            if copy_fn is True:
                new._h.attrs[keyval] = value
                continue
            try:
                copied = copy_fn(self, keyval, value)
            except Exception:  # noqa: BLE001 - printed, then MPI's error
                raise _callback_failed("attribute copy") from None
            if copied is not NotImplemented:
                new._h.attrs[keyval] = copied

    def _delete_attrs(self) -> None:
        """Free: every attribute's delete callback."""
        h = self._h
        for keyval in list(h.attrs):
            self._delete(h, keyval)
