"""Reference work the ranks of a mesh share instead of each repeating it whole.

Checking a program's gradients against central differences of its numpy twin
(`spmdsim.references.backward.numeric_grads`) costs 2 evaluations of the twin per
element, and every rank needs the whole answer. Under MPI each rank is a
process: p ranks computing it all do p times the work (8 times on 8 ranks,
which on 2 cores made these references most of an example's run).
`shared_numeric_grads(mesh, fn, *arrays)` deals numeric_grads' runs of
elements out in p consecutive shares, each rank computes its own share, and
one Allgather through the door (runtime.door.transfer: checked with
SPMDSIM_CHECK, watched with SPMDSIM_WATCHDOG, waited politely on a polite
mesh) gives every rank every share, placed by position: the same bits as
numeric_grads in one process, whatever the number of ranks. Before it, an
Allgather of a 32-byte digest of the arrays, `h` and `batch` makes sure every
rank asks the same question: ranks that differ all raise the same error. A
dry run computes the whole answer on its one rank (spmdsim.runtime.sim.once).

`shared_once(mesh, key, fn, *args)` is `spmdsim.runtime.sim.once` for work that does
not split (a reference training step): on simulated ranks it is `once`; under
MPI, when every rank passes equal arguments (an Allgather of their digests),
rank 0 computes ``fn(*args)`` and Bcasts through the door give every rank
its result, pickled, the arrays' bytes out of band (rank 0 copies them once
into one buffer; the arrays a rank receives view its copy of it), the others
waiting politely on a polite mesh (at 8 ranks on 2 cores, 1 rank's work where
each of 8 repeated it). Ranks whose arguments
differ compute their own, as `once` does.
"""
from __future__ import annotations

import argparse
import hashlib
import pickle
import types
from typing import Any, Callable

import numpy as np

from ..references import backward as rg
from ..base.once import once
from ..errors import SpmdsimError
from . import door
from .engines import engine_of
from .engines.wait import resolve_wait_mode

__all__ = ["across_processes", "digest", "shared_numeric_grads", "shared_once", "shared_once_on"]

_DIGEST = 32  # bytes of blake2b
_ALIGN = 64  # bytes: where each array received by shared_once starts in its buffer


def shared_numeric_grads(mesh: Any, fn: Callable[..., np.ndarray], *arrays: np.ndarray, h: float = 1e-6,
                         batch: int = 0) -> list[np.ndarray]:
    """``spmdsim.references.backward.numeric_grads(fn, *arrays, h=h, batch=batch)``, 1/p of it on each rank.

    A collective: every rank of `mesh` calls it with the same `fn`, `arrays`, `h` and `batch` (the same
    error on every rank when the arrays, `h` or `batch` differ). Returns the float64 gradients, the same
    bits as numeric_grads on one process. `fn` failing within one rank's share is one rank's error (under
    MPI the guard ends the job: spmdsim.install_excepthook).
    """
    comm, size = mesh.comm, mesh.size
    if size == 1:
        return rg.numeric_grads(fn, *arrays, h=h, batch=batch)
    if mesh.engine.dry:  # one rank runs for all; its work is no rank's bytes held
        return once("spmdsim.runtime.shared_numeric_grads", lambda: rg.numeric_grads(fn, *arrays, h=h, batch=batch))
    shapes = [np.shape(a) for a in arrays]
    polite = mesh.polite
    mine = digest((h, batch, arrays))
    digests = np.empty((size, _DIGEST), np.uint8)
    door.transfer(comm, "numeric_grads", (), mine, (), polite, engine_of(comm).all_gather, mine, digests)
    differ = [r for r in range(size) if not np.array_equal(digests[r], digests[0])]
    if differ:
        raise SpmdsimError(f"shared_numeric_grads: rank {differ[0]}'s arrays, h or batch differ from rank 0's; "
                           "pass the same on every rank")
    parts = rg.numeric_grad_parts(shapes, batch)
    cuts = [len(parts) * r // size for r in range(size + 1)]
    counts = [sum(stop - start for _, start, stop in parts[cuts[r]:cuts[r + 1]]) for r in range(size)]
    send = np.zeros(max(counts), np.float64)  # shares of unequal lengths travel padded to the longest
    rank = mesh.rank
    send[:counts[rank]] = rg.numeric_grad_values(fn, arrays, parts[cuts[rank]:cuts[rank + 1]], h, batch)
    table = np.empty((size, len(send)), np.float64)
    door.transfer(comm, "numeric_grads", (), send, (), polite, engine_of(comm).all_gather, send, table)
    flat = np.concatenate([table[r, :counts[r]] for r in range(size)])
    return rg.split_flat(flat, shapes)


def shared_once(mesh: Any, key: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (local work, no collectives), computed by one rank of `mesh` for all when their `args` are equal.

    A collective under MPI: every rank of `mesh` calls it, in the same order. Simulated ranks: ``once(key, fn,
    *args)`` (spmdsim.runtime.sim.once). Under MPI: rank 0 computes and the others receive a copy of its result
    (pickled) when every rank's `args` are equal (arrays value by value); otherwise each rank computes its own.
    If rank 0's `fn` raises, or its result does not pickle, each rank computes its own (and raises its own error).
    """
    if mesh.size == 1 or mesh.engine.simulated:
        return once(key, fn, *args)
    return _rank_0_for_all(mesh.comm, mesh.rank, mesh.size, mesh.polite, fn, args)


def shared_once_on(comm: Any, key: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """`shared_once` over the ranks of a communicator that no mesh holds (a command's world), waiting as a mesh
    over it would (SPMDSIM_WAIT)."""
    if not across_processes(comm):
        return once(key, fn, *args)
    return _rank_0_for_all(comm, comm.Get_rank(), comm.Get_size(), resolve_wait_mode(None, comm) == "polite", fn,
                           args)


def across_processes(comm: Any) -> bool:
    """Whether `comm`'s ranks are two or more MPI processes (where rank 0 computes for the others), not one
    rank or simulated ranks (where `once` shares the work)."""
    return comm.Get_size() > 1 and not engine_of(comm).simulated


def _rank_0_for_all(comm: Any, rank: int, size: int, polite: bool, fn: Callable[..., Any], args: tuple) -> Any:
    """`shared_once` under MPI: rank 0's ``fn(*args)`` for every rank whose `args` equal its own."""
    mine = digest(args)
    digests = np.empty((size, _DIGEST), np.uint8)
    door.transfer(comm, "once", (), mine, (), polite, engine_of(comm).all_gather, mine, digests)
    if not (digests == digests[0]).all():
        return fn(*args)  # the ranks ask different questions: each its own answer
    payload, buffers, result, failed = None, [], None, None
    if rank == 0:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - raised below; the others compute their own
            failed = exc
        else:
            try:  # the arrays' bytes out of band: they travel in one buffer the receiver's arrays then view
                payload = np.frombuffer(pickle.dumps(result, protocol=5, buffer_callback=buffers.append), np.uint8)
                buffers = [np.frombuffer(b.raw(), np.uint8) for b in buffers]
            except Exception:  # noqa: BLE001 - a result pickle cannot carry: each rank computes its own
                payload = None
    # How many out-of-band buffers (-1: no result to send), then the pickle's length and each buffer's.
    count = np.array([-1 if payload is None else len(buffers)], np.int64)
    door.transfer(comm, "once", (), count, (), polite, engine_of(comm).broadcast, count, 0)
    if count[0] < 0:  # rank 0's fn raised, or its result does not pickle
        if failed is not None:
            raise failed
        return result if rank == 0 else fn(*args)
    sizes = np.array([len(payload)] + [b.size for b in buffers] if rank == 0 else [0] * (1 + int(count[0])),
                     np.int64)
    door.transfer(comm, "once", (), sizes, (), polite, engine_of(comm).broadcast, sizes, 0)
    starts = np.concatenate([[0], np.cumsum((sizes[1:] + _ALIGN - 1) // _ALIGN * _ALIGN)])  # each array aligned
    data = np.empty(int(starts[-1]), np.uint8)
    if rank == 0:
        for start, b in zip(starts, buffers):
            data[start:start + b.size] = b
    else:
        payload = np.empty(int(sizes[0]), np.uint8)
    for part in (payload, data):
        if part.size:
            door.transfer(comm, "once", (), part, (), polite, engine_of(comm).broadcast, part, 0)
    if rank == 0:
        return result
    return pickle.loads(payload, buffers=[data[start:start + n] for start, n in zip(starts, sizes[1:])])


def digest(value: Any) -> np.ndarray:
    """32 bytes (blake2b) that differ, but for a hash collision, where `value`s differ (see `_fold`)."""
    digest = hashlib.blake2b(digest_size=_DIGEST)
    _fold(digest, value)
    return np.frombuffer(digest.digest(), np.uint8).copy()


def _fold(digest: Any, value: Any) -> None:
    """Feed `value` into `digest`: arrays by dtype, shape and bytes; lists, tuples, dicts and argparse
    namespaces item by item; functions by module and name; anything else by its type and repr (an object whose
    repr differs by rank makes the digests differ)."""
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
        digest.update(repr(("array", value.dtype.str, value.shape)).encode())
        try:  # its bytes read in place, not copied (a reference step's arrays: ~20 MB a step on every rank)
            data = value.reshape(-1).view(np.uint8)
        except (TypeError, ValueError):  # no plain bytes to view (object arrays): their copy, as tobytes gives
            data = value.tobytes()
        digest.update(data)
    elif isinstance(value, (list, tuple)):
        digest.update(repr((type(value).__name__, len(value))).encode())
        for item in value:
            _fold(digest, item)
    elif isinstance(value, dict):
        digest.update(repr(("dict", len(value))).encode())
        for name, item in value.items():
            digest.update(repr(name).encode())
            _fold(digest, item)
    elif isinstance(value, argparse.Namespace):  # a command line: its fields (a handler among them)
        digest.update(b"namespace")
        _fold(digest, vars(value))
    elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):  # by name: its address is the process's
        digest.update(repr(("function", value.__module__, value.__qualname__)).encode())
    else:
        digest.update(repr((type(value).__qualname__, value)).encode())
