"""The bytes one rank's communication call sends: a send's message, and a collective's share of the data.

A collective is counted as a teacher reasons about it, free of any algorithm: a rank sends the data of its
own that the other ranks receive, each byte once, however an MPI library would route it (a tree Bcast
forwards the root's buffer through other ranks; what is counted is the root's buffer, at the root):

- Bcast, bcast: the root's buffer; the other ranks send nothing.
- Scatter(v), scatter: the root's blocks for the other ranks (its own block stays).
- Gather(v), gather: a non-root's send buffer; the root sends nothing.
- Allgather(v), allgather: its send buffer (with MPI.IN_PLACE: its block of the receive buffer).
- Alltoall(v, w), alltoall: its blocks for the other ranks.
- Reduce, reduce: a non-root's send buffer.
- Allreduce, allreduce: its send buffer (every other rank's result depends on all of it).
- Reduce_scatter(_block): its blocks of the send buffer for the other ranks (its own block's share stays).
- Scan, Exscan, scan, exscan: its send buffer, but at the last rank (whose value no rank after it uses).
- Neighbor_allgather(v): its send buffer; Neighbor_alltoall(v, w): its whole send buffer.
- Barrier: nothing; on a communicator of one rank every collective sends nothing.

The nonblocking (Ibcast) and persistent (Bcast_init, at each Start) forms send what the blocking one does;
an object form's object counts as `object_bytes` says; MPI.IN_PLACE reads the receive buffer where the
data lies.
"""
from __future__ import annotations

import inspect
import pickle
from typing import Any, Callable, Optional

from ...emulator.derived import may_be_derived, packed, wmessage
from ...emulator.typemap import message, vector
from ...runtime.sim._mpi import in_place

__all__ = ["buffer_bytes", "message_bytes", "object_bytes", "collective_sent", "persistent_collective_sent",
           "blocking"]


def buffer_bytes(spec: Any) -> int:
    """The bytes of an mpi4py buffer argument: an array, or [array, datatype] / [array, count, datatype]."""
    count = None
    if isinstance(spec, (list, tuple)) and spec:
        if len(spec) >= 3 and isinstance(spec[1], int):
            count = spec[1]
        spec = spec[0]
    try:
        view = memoryview(spec)
    except TypeError:
        return 0
    return view.nbytes if count is None else count * view.itemsize


def message_bytes(spec: Any) -> int:
    """The bytes a send's (or a one-sided operation's) buffer message carries: what its count of its datatype
    packs, a derived datatype's too ([x, 1, a contiguous type of 1000 doubles]: 8,000 B, not one double's 8),
    or `buffer_bytes` where the message cannot be read."""
    try:
        return _block(spec)
    except Exception:  # noqa: BLE001 - a bad message: the call itself says what is wrong
        return buffer_bytes(spec)


#: Python's numbers, which a lowercase call's pickle wraps in more bytes than their values (a list of 3 floats: 43 B).
_NUMBERS = (int, float)


def _number_bytes(number: Any) -> int:
    """A Python number's bytes: 8, as an int64 or float64 holds it, or an int's own beyond 64 bits (an array's
    bytes packed into one int are that array's)."""
    return 8 if type(number) is float else max(8, (number.bit_length() + 8) // 8)


def _array_bytes(obj: Any) -> Optional[int]:
    """The bytes of an array's values (a NumPy array or scalar), or None for any other object, an array of
    Python objects included (its buffer holds pointers; its pickle, the objects)."""
    if not hasattr(obj, "__array_interface__") or getattr(getattr(obj, "dtype", None), "hasobject", True):
        return None
    try:
        return memoryview(obj).nbytes
    except (TypeError, ValueError):
        return None


def object_bytes(obj: Any) -> int:
    """The bytes of an object a lowercase call carries: an array's (or a list or tuple of arrays') data, as
    its buffer form would send it, so that `comm.sendrecv(x, ...)` meets the same budget as `Sendrecv`; a
    Python number, or a list or tuple of them (`x[-1].tolist()`), 8 bytes each, as a float64 or int64 array
    of them (an int past 64 bits its own bytes); any other object its pickle's (an array of objects, or an
    object that only names an ``__array_interface__``, carries what its pickle holds)."""
    if isinstance(obj, (list, tuple)) and obj:
        sizes = [_array_bytes(item) for item in obj]
        if None not in sizes:
            return sum(sizes)
    size = _array_bytes(obj)
    if size is not None:
        return size
    if type(obj) in _NUMBERS:
        return _number_bytes(obj)
    if isinstance(obj, (list, tuple)) and obj and all(type(item) in _NUMBERS for item in obj):
        return sum(_number_bytes(item) for item in obj)
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - what cannot be pickled fails in the call itself
        return 0


def _block(spec: Any, blocks: int = 1) -> int:
    """The bytes of one of the `blocks` equal blocks of a buffer message (a derived datatype's packed bytes)."""
    data, count, _ = message(packed(spec) if may_be_derived(spec) else spec, "", blocks)
    return count * data.itemsize


def _blocks(spec: Any, g: int) -> list:
    """The bytes of each of the `g` blocks of a v-collective's buffer message."""
    data, counts, _, _ = vector(spec, "", g)
    return [count * data.itemsize for count in counts]


def _data(a: dict, where: str = "sendbuf") -> Any:
    """The buffer holding this rank's data: the send buffer, or the receive buffer under MPI.IN_PLACE."""
    return a["recvbuf"] if in_place(a.get(where)) else a[where]


def _others(sizes: list, me: int) -> int:
    return sum(sizes) - sizes[me]


def _reduce_scatter(a: dict, g: int, me: int) -> int:
    data = _data(a)
    counts = a.get("recvcounts")
    if counts is None:
        return _block(data) - _block(a["recvbuf"])
    return _others([int(c) for c in counts], me) * message(data, "")[0].itemsize


def _root(a: dict) -> int:
    return int(a.get("root", 0))


#: Each collective's (blocking form's) bytes sent by this rank: f(arguments, size, rank).
_RULES: dict[str, Callable[[dict, int, int], int]] = {
    "Bcast": lambda a, g, me: _block(a["buf"]) if me == _root(a) else 0,
    "bcast": lambda a, g, me: object_bytes(a.get("obj")) if me == _root(a) else 0,
    "Scatter": lambda a, g, me: (g - 1) * _block(a["sendbuf"], g) if me == _root(a) else 0,
    "Scatterv": lambda a, g, me: _others(_blocks(a["sendbuf"], g), me) if me == _root(a) else 0,
    "scatter": lambda a, g, me: _others([object_bytes(o) for o in a["sendobj"]], me) if me == _root(a) else 0,
    "Gather": lambda a, g, me: _block(a["sendbuf"]) if me != _root(a) else 0,
    "Gatherv": lambda a, g, me: _block(a["sendbuf"]) if me != _root(a) else 0,
    "gather": lambda a, g, me: object_bytes(a["sendobj"]) if me != _root(a) else 0,
    "Allgather": lambda a, g, me: _block(a["recvbuf"], g) if in_place(a["sendbuf"]) else _block(a["sendbuf"]),
    "Allgatherv": lambda a, g, me: _blocks(a["recvbuf"], g)[me] if in_place(a["sendbuf"]) else _block(a["sendbuf"]),
    "allgather": lambda a, g, me: object_bytes(a["sendobj"]),
    "Alltoall": lambda a, g, me: (g - 1) * _block(_data(a), g),
    "Alltoallv": lambda a, g, me: _others(_blocks(_data(a), g), me),
    "Alltoallw": lambda a, g, me: _others(list(wmessage(_data(a), "", g, False)[1]), me),
    "alltoall": lambda a, g, me: _others([object_bytes(o) for o in a["sendobj"]], me),
    "Reduce": lambda a, g, me: _block(a["sendbuf"]) if me != _root(a) else 0,
    "reduce": lambda a, g, me: object_bytes(a["sendobj"]) if me != _root(a) else 0,
    "Allreduce": lambda a, g, me: _block(_data(a)),
    "allreduce": lambda a, g, me: object_bytes(a["sendobj"]),
    "Reduce_scatter_block": lambda a, g, me: (g - 1) * _block(_data(a), g),
    "Reduce_scatter": _reduce_scatter,
    "Scan": lambda a, g, me: _block(_data(a)) if me < g - 1 else 0,
    "Exscan": lambda a, g, me: _block(_data(a)) if me < g - 1 else 0,
    "scan": lambda a, g, me: object_bytes(a["sendobj"]) if me < g - 1 else 0,
    "exscan": lambda a, g, me: object_bytes(a["sendobj"]) if me < g - 1 else 0,
    "Neighbor_allgather": lambda a, g, me: _block(a["sendbuf"]),
    "Neighbor_allgatherv": lambda a, g, me: _block(a["sendbuf"]),
    "Neighbor_alltoall": lambda a, g, me: buffer_bytes(a["sendbuf"]),
    "Neighbor_alltoallv": lambda a, g, me: buffer_bytes(a["sendbuf"]),
    "Neighbor_alltoallw": lambda a, g, me: buffer_bytes(a["sendbuf"]),
    "neighbor_allgather": lambda a, g, me: object_bytes(a["sendobj"]),
    "neighbor_alltoall": lambda a, g, me: sum(object_bytes(o) for o in a["sendobj"]),
}


def blocking(name: str) -> str:
    """The blocking collective a nonblocking or persistent one stands for (Ibcast, Bcast_init: Bcast)."""
    name = name[:-len("_init")] if name.endswith("_init") else name
    return name[1].upper() + name[2:] if name[:1] == "I" and name[1:2].islower() else name


def collective_sent(name: str, arguments: dict, comm: Any) -> int:
    """The bytes collective `name` called with `arguments` (its parameters by name) on `comm` sends from this
    rank (the module docstring); 0 for a call that is no collective or that its own checks refuse."""
    rule = _RULES.get(blocking(name))
    if rule is None:
        return 0
    try:
        g, me = comm.Get_size(), comm.Get_rank()
        return rule(arguments, g, me) if g > 1 else 0
    except Exception:  # noqa: BLE001 - a bad argument or a freed communicator: the call itself says so
        return 0


def persistent_collective_sent(name: str, local: dict) -> int:
    """The bytes each Start of a persistent collective sends, from the frame locals of its maker (`name`,
    Allreduce_init, made by spmdsim.emulator.persistent: ``self``, the nonblocking ``call``, ``args``, ``kwargs``)."""
    try:
        comm = local["self"]
        bound = inspect.signature(getattr(comm, local["call"])).bind(*local["args"], **local["kwargs"])
        bound.apply_defaults()
    except Exception:  # noqa: BLE001 - the call itself says what is wrong with its arguments
        return 0
    return collective_sent(name, dict(bound.arguments), comm)
