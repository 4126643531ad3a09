"""What a rank's messages carried, for an exercise that says which values a rank must send.

An exercise's ``sends(case, n, rank)`` names the values whose computing is `rank`'s own work in its
algorithm, as ``{what: value}`` ({"its x plus 1": x + 1}; a tuple of values where any of them will do: a sum
with its common factor, or without); a check whose values are right then fails where a
rank's messages (its sends, the send side of its collectives, its one-sided writes) carried none of them:
another rank did that rank's work, and the messages were only there for show (rank 0 adding the 1 that rank 1
should add, summing every interval, multiplying all of A). A value is carried where a message's data (a buffer
message's count of entries, not all its buffer) holds it, whole, at a multiple of its size, or where a run of
the rank's consecutive messages joined in order does (a value sent in pieces, after a header or not);
a rank with a message whose data the grader cannot read as numbers (an object the pickle carries, a persistent
request's Start) is not judged.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ...emulator.derived import may_be_derived
from ...emulator.typemap import message
from ...runtime.sim._mpi import in_place
from .compare import tolerance
from .exercise import LabError
from .sent_bytes import blocking

__all__ = ["payload", "uncarried"]

#: A call's argument holding the data it sends, in the emulator's names, the first one a call has.
_SENT = ("sendbuf", "buf", "sendobj", "obj", "origin")
#: The collectives whose send buffer is a v-message ([buf, counts, datatype]: counts a list or a tuple, one a
#: rank), and those whose receive buffer is, which holds the data sent in place (MPI.IN_PLACE).
_V_SEND = frozenset(("Scatterv", "Alltoallv", "Alltoallw", "Neighbor_alltoallv", "Neighbor_alltoallw"))
_V_RECEIVE = frozenset(("Gatherv", "Allgatherv", "Alltoallv", "Alltoallw", "Neighbor_allgatherv",
                        "Neighbor_alltoallv", "Neighbor_alltoallw"))


def payload(frame: Any) -> Optional[np.ndarray]:
    """A copy of the data a sending call (the callee's `frame`) carries, flat float64 (complex as it is), or
    None where it is not numbers the grader can read."""
    local = frame.f_locals
    data = next((local[name] for name in _SENT if name in local), None)
    call = blocking(getattr(getattr(frame, "f_code", None), "co_name", ""))
    vector = call in _V_SEND
    if in_place(data):  # MPI.IN_PLACE: the data lies in the receive buffer
        data, vector = local.get("recvbuf"), call in _V_RECEIVE
    if isinstance(data, (list, tuple)) and data and not isinstance(data[0], numbers.Number):
        data = _sent_entries(data, vector)  # a buffer message: [array, datatype] or [array, count, datatype]
    try:
        values = np.array(data, copy=True)
    except (TypeError, ValueError):  # ragged lists and objects numpy cannot take
        return None
    return _flat(values) if values.dtype.kind in "biufc" else None


def _flat(values: np.ndarray) -> np.ndarray:
    """Numbers as the check compares them: flat, float64 (complex128 where complex)."""
    return values.ravel().astype(np.complex128 if values.dtype.kind == "c" else np.float64)


def _sent_entries(spec: Any, vector: bool = False) -> Any:
    """The entries a buffer message `spec` sends: its count of its datatype from its displacement on
    ([work, 5, MPI.DOUBLE]: work's first 5, however long work is); its whole buffer for a derived datatype's,
    a v-collective's (`vector`: its counts a tuple too, not read as a count and a displacement; or counts in a
    list) or a message the emulator cannot read."""
    if may_be_derived(spec) or (len(spec) > 2 and (vector or isinstance(spec[1], (list, np.ndarray)))):
        return spec[0]
    try:
        flat, count, _ = message(spec, "")
    except Exception:  # noqa: BLE001 - a bad message: the call itself says what is wrong
        return spec[0]
    return flat[:count]


def _holds(data: np.ndarray, value: np.ndarray, rtol: float, atol: float) -> bool:
    """Whether `data` holds `value` whole at an offset that is a multiple of its size."""
    if value.size == 0 or data.size < value.size or data.size % value.size:
        return False
    blocks = data.reshape(-1, value.size)
    return bool(np.any(np.all(np.isclose(blocks, value, rtol=rtol, atol=atol), axis=1)))


def _expected(sends: Callable[..., Any], case: dict, n: int, rank: int, rtol: Optional[float],
              atol: Optional[float]) -> dict:
    """The exercise's ``sends(case, n, rank)``, checked: {what: [(flat values, rtol, atol)]}, each tolerance the
    exercise leaves out (None) taken by the value's dtype, as a result's (spmdsim.tools.lab.compare); a
    list of them, the alternatives a tuple names."""
    named = sends(case, n, rank)
    if not isinstance(named, dict) or not all(isinstance(what, str) for what in named):
        raise LabError(f"the exercise's sends(case, {n}, {rank}) returned {named!r}: expected a dict of "
                       "{what: value}")
    out = {}
    for what, value in named.items():
        out[what] = [_value(v, what, n, rank, rtol, atol) for v in (value if isinstance(value, tuple) else (value,))]
    return out


def _value(value: Any, what: str, n: int, rank: int, rtol: Optional[float], atol: Optional[float]) -> tuple:
    """One of `sends`' values: (flat values, rtol, atol), each tolerance left out (None) taken by its dtype."""
    values = np.asarray(value)
    if values.dtype.kind not in "biufc":
        raise LabError(f"the exercise's sends(case, {n}, {rank}) names {what!r} as {value!r}: expected numbers, "
                       "an array of them, or a tuple of such values")
    return (_flat(values), *tolerance(values, rtol, atol))


def uncarried(carried: list, sends: Callable[..., Any], case: dict, rtol: Optional[float] = None,
              atol: Optional[float] = None) -> Optional[tuple]:
    """(rank, what) of the first value the exercise's `sends` names that none of its rank's messages carried,
    `carried` holding each rank's payloads (None for one the grader cannot read), or None; `rtol`, `atol`: the
    exercise's RTOL and ATOL."""
    n = len(carried)
    for rank, payloads in enumerate(carried):
        if any(data is None for data in payloads):
            continue
        for what, values in _expected(sends, case, n, rank, rtol, atol).items():
            if not any(_holds(data, *value) for data in _runs(payloads) for value in values):
                return rank, what
    return None


#: The most consecutive messages joined into one run (`_runs`): a rank of the shipped exercises sends a few.
_LONGEST_RUN = 8


def _runs(payloads: list) -> Iterator[np.ndarray]:
    """Each message in `payloads`, each run of up to _LONGEST_RUN consecutive ones joined in order, and all
    of them joined (a value sent in pieces: a header, then two Sends of its halves): at most
    _LONGEST_RUN runs a message, so a rank that sent very many messages costs its count times that, not its
    square."""
    yield from payloads
    for first in range(len(payloads)):
        for last in range(first + 2, min(first + _LONGEST_RUN, len(payloads)) + 1):
            if last - first < len(payloads):
                yield np.concatenate(payloads[first:last])
    if len(payloads) > 1:
        yield np.concatenate(payloads)
