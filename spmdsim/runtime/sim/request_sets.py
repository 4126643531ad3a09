"""What MPI.Request's class methods do with several simulated requests (a mixin of
spmdsim.runtime.sim.requests.Request).

Waitall/Testall/Waitany/Testany/Waitsome/Testsome and MPI 4.1's Get_status_all/any/some,
with mpi4py's return values, and the statuses they fill (source, tag, byte count; a
list shorter than the requests grows with new MPI.Status objects, as mpi4py grows it).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ._mpi import mpi_error, mpi_module, special
from .groups import AllOf
from .waiting import _Waiting

__all__ = ["ManyRequests", "Polled", "fill_status"]


def fill_status(status: Any, source: int, tag: int, nbytes: int, cancelled: bool = False) -> None:
    """Write source, tag and byte count into an MPI.Status (Get_count(datatype) then divides)."""
    if status is None or not hasattr(status, "Set_source"):
        return
    status.Set_source(source)
    status.Set_tag(tag)
    status.Set_error(0)
    mpi = mpi_module()
    if mpi is not None and hasattr(status, "Set_elements"):
        status.Set_elements(mpi.BYTE, nbytes)
        status.Set_cancelled(cancelled)


def _empty(status: Any) -> None:
    """MPI's empty status (a null request's): any source, any tag, no data."""
    fill_status(status, special("ANY_SOURCE"), special("ANY_TAG"), 0)


class ManyRequests:
    """The class methods of Request over lists of requests (see the module docstring)."""

    __slots__ = ()

    @classmethod
    def Waitall(cls, requests: Sequence[Any], statuses: Any = None) -> bool:
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests: Sequence[Any], statuses: Any = None) -> list:
        statuses = _statuses(statuses, len(requests))
        _block_all(requests)
        for r in requests:
            if _failed(r):
                break
        else:  # none failed
            return [r._finish(statuses[i] if statuses else None) for i, r in enumerate(requests)]
        # MPI_ERR_IN_STATUS, as MPICH's Waitall: with statuses, the requests complete in order up to the first
        # that failed (its status has its error), the rest stay active (MPI.ERR_PENDING); without, all complete
        failures = []
        for i, r in enumerate(requests):
            status = statuses[i] if statuses else None
            if failures and statuses is not None:
                _pending(status)
                continue
            try:
                r._finish(status)
            except Exception as exc:  # noqa: BLE001 - MPI's error, in the status and ERR_IN_STATUS's text
                _set_error(status, exc)
                failures.append((i, exc))
        raise _in_status("Waitall", failures)

    @classmethod
    def Testall(cls, requests: Sequence[Any], statuses: Any = None) -> bool:
        return cls._testall(requests, statuses, "Testall")[0]

    @classmethod
    def testall(cls, requests: Sequence[Any], statuses: Any = None) -> tuple[bool, Optional[list]]:
        return cls._testall(requests, statuses, "testall")

    @classmethod
    def _testall(cls, requests: Sequence[Any], statuses: Any, call: str) -> tuple[bool, Optional[list]]:
        """testall; `call`: the program's call, which a report of a loop polling in vain names."""
        pending = next((r for r in requests if not r.null and not r._ready()), None)
        if pending is not None:
            pending._pause(token=Polled([pending], call))
            return False, None
        statuses = _statuses(statuses, len(requests))
        failed = [(i, r) for i, r in enumerate(requests) if _failed(r)]
        if not failed:
            return True, [r._finish(statuses[i] if statuses else None) for i, r in enumerate(requests)]
        # MPI_ERR_IN_STATUS, as MPICH's Testall: no request completes (a later Wait of a failed one raises its
        # error); a failed one's status has its fields and error, every other's MPI.ERR_PENDING
        for i, r in enumerate(requests):
            status = statuses[i] if statuses else None
            if _failed(r):
                r._peek(status)
                _set_error(status, _failed(r))
            else:
                _pending(status)
        raise _in_status(call, [(i, _failed(r)) for i, r in failed])

    @classmethod
    def Waitany(cls, requests: Sequence[Any], status: Any = None) -> int:
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests: Sequence[Any], status: Any = None) -> tuple[int, Any]:
        while True:
            index, flag, obj = cls._testany(requests, status, None)
            if flag:
                return index, obj
            _block_any(requests)

    @classmethod
    def Testany(cls, requests: Sequence[Any], status: Any = None) -> tuple[int, bool]:
        index, flag, _ = cls._testany(requests, status, "Testany")
        return index, flag

    @classmethod
    def testany(cls, requests: Sequence[Any], status: Any = None) -> tuple[int, bool, Any]:
        return cls._testany(requests, status, "testany")

    @classmethod
    def _testany(cls, requests: Sequence[Any], status: Any, call: Optional[str]) -> tuple[int, bool, Any]:
        """testany; `call`: the program's call, which a report of a loop polling in vain names (None: no poll,
        waitany's)."""
        active = [i for i, r in enumerate(requests) if r.active]
        if not active:
            _empty(status)
            return special("UNDEFINED"), True, None
        for i in active:
            if requests[i]._ready():
                return i, True, requests[i]._finish(status)
        if call is not None:
            requests[active[0]]._pause(token=Polled([requests[i] for i in active], call))
        return special("UNDEFINED"), False, None

    @classmethod
    def Waitsome(cls, requests: Sequence[Any], statuses: Any = None) -> Optional[list]:
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests: Sequence[Any], statuses: Any = None) -> tuple:
        while True:
            indices, objs = cls._testsome(requests, statuses, None)
            if indices is None or indices:
                return indices, objs
            _block_any(requests)

    @classmethod
    def Testsome(cls, requests: Sequence[Any], statuses: Any = None) -> Optional[list]:
        return cls._testsome(requests, statuses, "Testsome")[0]

    @classmethod
    def testsome(cls, requests: Sequence[Any], statuses: Any = None) -> tuple:
        return cls._testsome(requests, statuses, "testsome")

    @classmethod
    def _testsome(cls, requests: Sequence[Any], statuses: Any, call: Optional[str]) -> tuple:
        """testsome; `call` as _testany's."""
        active = [i for i, r in enumerate(requests) if r.active]
        if not active:
            return None, None
        ready = [i for i in active if requests[i]._ready()]
        if not ready:
            if call is not None:
                requests[active[0]]._pause(token=Polled([requests[i] for i in active], call))
            return [], []
        statuses = _statuses(statuses, len(ready))
        if not any(_failed(requests[i]) for i in ready):
            objs = [requests[i]._finish(statuses[k] if statuses else None) for k, i in enumerate(ready)]
            return ready, objs
        # MPI_ERR_IN_STATUS: every done request completes, each status with its error (MPI.SUCCESS or MPI's)
        failures = []
        for k, i in enumerate(ready):
            status = statuses[k] if statuses else None
            try:
                requests[i]._finish(status)
            except Exception as exc:  # noqa: BLE001 - MPI's error, in the status and ERR_IN_STATUS's text
                _set_error(status, exc)
                failures.append((i, exc))
        raise _in_status(call or "Waitsome", failures)

    # -- statuses without completing (MPI 4.1's MPI_Request_get_status_all/any/some) -------------
    @classmethod
    def Get_status_all(cls, requests: Sequence[Any], statuses: Any = None) -> bool:
        """Whether every request is done (statuses filled then); none is completed."""
        return cls._get_status_all(requests, statuses, "Get_status_all")

    @classmethod
    def get_status_all(cls, requests: Sequence[Any], statuses: Any = None) -> bool:
        return cls._get_status_all(requests, statuses, "get_status_all")

    @classmethod
    def _get_status_all(cls, requests: Sequence[Any], statuses: Any, call: str) -> bool:
        pending = next((r for r in requests if not r.null and not r._ready()), None)
        if pending is not None:
            pending._pause(token=Polled([pending], call))
            return False
        statuses = _statuses(statuses, len(requests))
        for i, r in enumerate(requests):
            status = statuses[i] if statuses else None
            if r.null:
                _empty(status)
            else:
                r._peek(status)
        return True

    @classmethod
    def Get_status_any(cls, requests: Sequence[Any], status: Any = None) -> tuple[int, bool]:
        """(index, True) of a done request (not completed), (MPI.UNDEFINED, True) if all are null, else
        (MPI.UNDEFINED, False)."""
        return cls._get_status_any(requests, status, "Get_status_any")

    @classmethod
    def get_status_any(cls, requests: Sequence[Any], status: Any = None) -> tuple[int, bool]:
        return cls._get_status_any(requests, status, "get_status_any")

    @classmethod
    def _get_status_any(cls, requests: Sequence[Any], status: Any, call: str) -> tuple[int, bool]:
        active = [i for i, r in enumerate(requests) if r.active]
        if not active:
            _empty(status)
            return special("UNDEFINED"), True
        for i in active:
            if requests[i]._ready():
                requests[i]._peek(status)
                return i, True
        requests[active[0]]._pause(token=Polled([requests[i] for i in active], call))
        return special("UNDEFINED"), False

    @classmethod
    def Get_status_some(cls, requests: Sequence[Any], statuses: Any = None) -> Optional[list]:
        """The indices of the done requests (not completed), [] if none, None if all are null."""
        return cls._get_status_some(requests, statuses, "Get_status_some")

    @classmethod
    def get_status_some(cls, requests: Sequence[Any], statuses: Any = None) -> Optional[list]:
        return cls._get_status_some(requests, statuses, "get_status_some")

    @classmethod
    def _get_status_some(cls, requests: Sequence[Any], statuses: Any, call: str) -> Optional[list]:
        active = [i for i, r in enumerate(requests) if r.active]
        if not active:
            return None
        ready = [i for i in active if requests[i]._ready()]
        if not ready:
            requests[active[0]]._pause(token=Polled([requests[i] for i in active], call))
            return []
        statuses = _statuses(statuses, len(ready))
        for k, i in enumerate(ready):
            requests[i]._peek(statuses[k] if statuses else None)
        return ready


class Polled:
    """Requests polled by one call of the program's (`call`: Testany, testsome, Testall, Iprobe, ..., which a
    report of a loop polling in vain names): no rank left completes the poll if it completes none of them
    (Testall and Get_status_all poll the first pending one); the report names the first."""

    def __init__(self, requests: Sequence[Any], call: str) -> None:
        # a request of parts (persistent, a copy, a Sendrecv) is named by its pending part, on that part's group
        self.first, self.call = requests[0]._shown(), call
        self.requests = requests
        self.group, self.kind = self.first.group, self.first.kind

    def _what(self) -> str:
        return self.first._what()

    def why_stuck(self, world: Any) -> tuple[str, str]:
        return self.first.why_stuck(world)

    def never_completes(self, world: Any) -> bool:
        return all(r.never_completes(world) for r in self.requests)


def _failed(request: Any) -> Any:
    """The MPI error (MPI.Exception) a done, active `request` completes with, else None: what Waitall, Testall,
    Waitsome and Testsome report as MPI.ERR_IN_STATUS (another error is raised as it is, as before)."""
    if request.null:
        return None
    error = request._received().error
    if error is None:  # asked of every request Waitall completes
        return None
    mpi = mpi_module()
    return error if mpi is not None and isinstance(error, mpi.Exception) else None


def _set_error(status: Any, error: BaseException) -> None:
    """Write `error`'s class into `status`'s error field (MPICH's code there has that class)."""
    if status is not None and hasattr(status, "Set_error"):
        mpi = mpi_module()
        status.Set_error(error.Get_error_class() if mpi is not None and isinstance(error, mpi.Exception)
                         else mpi.ERR_OTHER)


def _pending(status: Any) -> None:
    """The status of a request Waitall or Testall leaves active after another failed: MPI.ERR_PENDING."""
    if status is not None and hasattr(status, "Set_error"):
        _empty(status)
        status.Set_error(mpi_module().ERR_PENDING)


def _in_status(call: str, failures: list) -> BaseException:
    """MPI.Exception MPI.ERR_IN_STATUS for `call`, naming the failed requests (index, error); a non-MPI error
    (an unpickling one) among them is raised as it is."""
    mpi = mpi_module()
    first = failures[0][1]
    if mpi is None or not isinstance(first, mpi.Exception):
        return first
    said = "; ".join(f"request {i}: {exc}" for i, exc in failures[:3])
    more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
    return mpi_error(mpi, mpi.ERR_IN_STATUS, f"{call}: {said}{more} (each status's Get_error() has its request's "
                                             f"error class; MPI.SUCCESS for one that completed, MPI.ERR_PENDING "
                                             f"for one still active)")


def _statuses(statuses: Any, n: int) -> Any:
    """mpi4py's rule: a list of statuses shorter than needed grows with new MPI.Status objects; a
    shorter sequence of another kind (a tuple) gets what it holds, the rest go to statuses dropped."""
    if statuses is None:
        return None
    if len(statuses) < n:
        more = [mpi_module().Status() for _ in range(n - len(statuses))]
        if isinstance(statuses, list):
            statuses += more
        else:
            return [*statuses, *more]
    return statuses


def _block_any(requests: Sequence[Any]) -> None:
    """Wait until one of `requests` (not null, not done) completes."""
    _block_on(requests, every=False)


def _block_all(requests: Sequence[Any]) -> None:
    """Wait until every one of `requests` is done: one wait, released when the last completes (`AllOf`)."""
    _block_on(requests, every=True)


def _block_on(requests: Sequence[Any], every: bool) -> None:
    pending = tuple(p for r in requests if every or not r.null for p in (*r.parts, r)
                    if not p.done and p.group is not None)
    if not pending:
        return
    group = pending[0].group
    world = group.world
    rank = group.members[pending[0].me]
    with world.lock:
        world.check(rank)
        if every:
            for p in pending:  # waited for: a deferring receive's message lands as it arrives (one held
                p.defer = False  # already lands as the request completes)
            token = AllOf(pending)
            if not token.all_done():
                world.wait(rank, _Waiting(None, token.group, None, token=token))
        elif all(not p.done for p in pending):
            world.wait(rank, _Waiting(None, group, None, token=pending))
