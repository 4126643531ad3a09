"""What an MPI error in a simulated communicator's (or window's) call does, by the error handler it has
(spmdsim.emulator.handles sets them), and the handlers a program makes with ``Create_errhandler(fn)``.

Under MPI.ERRORS_RETURN (mpi4py's default) the call raises MPI.Exception. Under MPI.ERRORS_ARE_FATAL and
MPI.ERRORS_ABORT it ends every simulated rank, as MPICH aborts the job (one line, the error class as exit code).
Under a user's handler it calls ``fn(comm, errorcode)`` once, and the call returns what mpi4py makes of MPICH's
null handles (`_nothing`): MPI.REQUEST_NULL from a call that starts a request (Isend, Ibcast, Send_init, ...),
MPI.COMM_NULL from one that makes a communicator, False from Iprobe, True from Probe, MPI.MESSAGE_NULL from
Mprobe, else None; but an error in Set_errhandler is raised, as MPICH reports it on the world (whose handler is
mpi4py's ERRORS_RETURN). A handler that raises ends every rank (exit code 1), as mpi4py makes that a fatal
error. A communicator's methods pay for this only once
some rank set a handler other than ERRORS_RETURN: until then the error is raised where it is met.
"""
from __future__ import annotations

import functools
import itertools
import sys
import threading
import weakref
from typing import Any, Callable, Optional

from ..base import context as _local
from ..runtime.sim._mpi import mpi_error, mpi_module
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.report import _program_line
from ..runtime.sim.requests import REQUEST_NULL
from .job_end import end_every_rank
from .message import MESSAGE_NULL
from .real import comm_null, real_module

__all__ = ["SimErrhandler", "new_errhandler", "run_user_handler", "end_on_fatal_errors", "handled_from_now",
           "GUARD_CODE"]

MAX_USER_ERRHANDLERS = 32  # mpi4py's table of Python callbacks, per process

_LOCK = threading.Lock()
_IDS = itertools.count(0x5F000001)  # handles no real MPI object has
_ERRHANDLERS: dict = {}  # handle -> SimErrhandler
_USER_COUNT: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # RankContext -> made, not freed

#: The calls starting with I or i that start no request (those that do give MPI.REQUEST_NULL on a handled error).
_NO_REQUEST = frozenset(("Iprobe", "iprobe", "Improbe", "improbe", "Is_inter", "Is_intra", "Idup"))
#: The calls a user's handler does not handle (see the module docstring).
_RAISED = frozenset(("Set_errhandler",))


class SimErrhandler:
    """A communicator error handler made by ``Create_errhandler(fn)`` on a simulated rank (mpi4py's Errhandler)."""

    def __init__(self, fn: Optional[Callable] = None, handle: int = 0) -> None:
        self.fn, self.handle = fn, handle

    def __bool__(self) -> bool:
        return self.fn is not None

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SimErrhandler):
            return self.handle == other.handle
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.Errhandler):
            return not self and other == mpi.ERRHANDLER_NULL
        return NotImplemented

    def __ne__(self, other: Any) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = object.__hash__

    def toint(self) -> int:
        return self.handle

    py2f = toint

    @classmethod
    def fromint(cls, handle: int) -> "SimErrhandler":
        found = _ERRHANDLERS.get(handle)
        return SimErrhandler(found.fn, handle) if found is not None else SimErrhandler()

    f2py = fromint

    def Free(self) -> None:
        if self.fn is None:
            mpi = real_module()
            raise mpi_error(mpi, mpi.ERR_ERRHANDLER, "the error handler is MPI.ERRHANDLER_NULL")
        with _LOCK:
            if _ERRHANDLERS.pop(self.handle, None) is not None:
                state = _local.simulated()
                if state is not None and _USER_COUNT.get(state):
                    _USER_COUNT[state] -= 1
        self.fn, self.handle = None, 0

    def __reduce__(self) -> Any:
        raise ValueError("cannot serialize 'mpi4py.MPI.Errhandler' instance")

    def __repr__(self) -> str:
        return f"<simulated Errhandler {self.fn!r}>"


def new_errhandler(fn: Callable) -> SimErrhandler:
    """``Create_errhandler(fn)``: a handler calling ``fn(comm, errorcode)`` (RuntimeError past 32 on one rank, as
    mpi4py)."""
    state = _local.simulated()
    with _LOCK:
        made = _USER_COUNT.get(state, 0) if state is not None else 0
        if made >= MAX_USER_ERRHANDLERS:
            raise RuntimeError("cannot create too many user-defined error handlers")
        if state is not None:
            _USER_COUNT[state] = made + 1
        eh = SimErrhandler(fn, next(_IDS))
        _ERRHANDLERS[eh.handle] = eh
    return eh


def run_user_handler(comm: Any, eh: SimErrhandler, errorcode: int) -> None:
    """Call the user's handler `eh` on `comm`'s error `errorcode`; if it raises, end every rank (exit code 1)."""
    try:
        eh.fn(comm, errorcode)
    except Exception as exc:  # noqa: BLE001 - mpi4py: "Fatal Python error: exception in user-defined error handler"
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        line = _program_line(tb.tb_frame)
        ended = SimulationError(f"simulated rank {comm.world_rank}: the error handler of {comm._group.label()} "
                                f"raised {type(exc).__name__}: {exc}{' (at ' + line + ')' if line else ''}; as "
                                f"mpi4py makes that a fatal error: every rank was stopped")
        ended.abort_code = 1
        end_every_rank(ended)


def _fatal(comm: Any, call: str, error: BaseException) -> BaseException:
    """The end of the job for MPI's `error` in `call` on `comm`, whose handler is fatal (as MPICH aborts)."""
    mpi = real_module()
    name = "MPI.ERRORS_ABORT" if comm._h.errhandler == getattr(mpi, "ERRORS_ABORT", None) else "MPI.ERRORS_ARE_FATAL"
    frame = outer = sys._getframe(1)
    while frame is not None:  # the program's call (Send), not the one it made inside (Isend)
        if frame.f_code is GUARD_CODE:
            call, outer = frame.f_locals["fn"].__name__, frame
        frame = frame.f_back
    line = _program_line(outer)
    ended = SimulationError(f"fatal error on simulated rank {comm.world_rank}: {error} (in {call} on "
                            f"{comm._group.label()}, whose error handler is {name}"
                            f"{'; at ' + line if line else ''}): every rank was stopped")
    ended.abort_code = error.Get_error_class() or 1
    return ended


def _inside_another(frame: Any) -> bool:
    """Whether `frame` runs inside a guarded call (a program's Send calling Isend): that call handles the error."""
    while frame is not None:
        if frame.f_code is GUARD_CODE:
            return True
        frame = frame.f_back
    return False


def _guarded(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            mpi = sys.modules.get("mpi4py.MPI")
            h = getattr(self, "_h", None)  # None for mpi4py's own object (MPI.Comm.Compare(MPI.COMM_NULL, c))
            if mpi is None or h is None or not isinstance(exc, mpi.Exception):
                raise
            eh = h.errhandler
            if eh is None or eh == mpi.ERRORS_RETURN:
                raise
            if not isinstance(eh, SimErrhandler):
                end_every_rank(_fatal(self, fn.__name__, exc))
            if fn.__name__ in _RAISED or _inside_another(sys._getframe(1)):
                raise
            run_user_handler(self, eh, exc.Get_error_code())
            return _nothing(fn.__name__)

    call.ends_on_fatal = True
    return call


def _nothing(call: str) -> Any:
    """What `call` returns after a user's handler ran on its error (see the module docstring)."""
    if call in ("Iprobe", "iprobe", "Probe", "probe"):
        return call[0] in "Pp"
    if call in ("Mprobe", "mprobe"):
        return MESSAGE_NULL
    if call.endswith("_init") or call[0] in "Ii" and call not in _NO_REQUEST:
        return REQUEST_NULL
    if call.startswith(("Create", "Split", "Dup", "Merge")):
        return comm_null()
    return None


#: The code of every guarded method's wrapper (its frame stands between a program's call and the method).
GUARD_CODE = _guarded(lambda self: None).__code__


_GUARDABLE: list = []  # the communicator classes whose methods a handler guards, once one is set
_GUARDED: list = []  # [True] once they are


def end_on_fatal_errors(cls: type) -> None:
    """Make `cls`'s public methods (and its emulator mixins') do what the communicator's handler says on MPI's
    error (see the module docstring), from the first time a rank has a handler other than ERRORS_RETURN: until
    then (mpi4py's default) no call pays for the check."""
    with _LOCK:
        _GUARDABLE.append(cls)
        if _GUARDED:
            _guard(cls)


def _guard(cls: type) -> None:
    for owner in cls.__mro__:
        if not owner.__module__.startswith(__name__.rpartition(".")[0]):
            continue
        for name, value in vars(owner).items():
            if (name.startswith("_") or not callable(value) or not hasattr(value, "__code__")
                    or getattr(value, "ends_on_fatal", False) or getattr(cls, name) is not value):
                continue
            setattr(cls, name, _guarded(value))


def handled_from_now(errhandler: Any) -> Any:
    """`errhandler`, after guarding the communicators' methods if it is not ERRORS_RETURN (None)."""
    if errhandler is not None and not _GUARDED and errhandler != real_module().ERRORS_RETURN:
        with _LOCK:
            if not _GUARDED:
                for cls in _GUARDABLE:
                    _guard(cls)
                _GUARDED.append(True)
    return errhandler
