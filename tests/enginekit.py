"""Every kind of an engine's transfer, run on a communicator and checked against what MPI's call gives.

One body for every engine: tests/test_engines.py runs it on simulated ranks (the thread engine),
tests/mpi/test_engine_transfers.py under mpiexec (MPI's engine).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from spmdsim.runtime.engines import engine_of

__all__ = ["run_transfers", "check_transfers"]


def run_transfers(comm: Any) -> dict:
    """Every transfer of `comm`'s engine on `comm`, each result kept by name (collective)."""
    out: dict = {}
    engine = engine_of(comm)
    me, g = comm.Get_rank(), comm.Get_size()
    x = np.arange(6, dtype=np.float64) + 10 * me  # rank r: 10r, 10r+1, ...
    out["all_reduce"] = np.empty(6)
    engine.all_reduce(comm, x, out["all_reduce"], "sum", None)
    inplace = x.copy()
    engine.all_reduce(comm, inplace, inplace, "max", None)
    out["all_reduce max in place"] = inplace
    out["all_gather"] = np.empty(6 * g)
    engine.all_gather(comm, x, out["all_gather"], None)
    blocks = np.arange(2 * g, dtype=np.float64) + 100 * me
    out["reduce_scatter"] = np.empty(2)
    engine.reduce_scatter(comm, blocks, out["reduce_scatter"], "sum", None)
    out["all_to_all"] = np.empty(2 * g)
    engine.all_to_all(comm, blocks, out["all_to_all"], None)
    counts = list(range(1, g + 1))  # rank r sends j+1 items to rank j, receives r+1 from each
    send = np.concatenate([np.full(j + 1, 10.0 * me + j) for j in range(g)])
    displs = [sum(counts[:j]) for j in range(g)]
    recv = np.empty((me + 1) * g)
    engine.all_to_allv(comm, send, counts, displs, recv, [me + 1] * g, [(me + 1) * j for j in range(g)], None)
    out["all_to_allv"] = recv
    buf = np.full(3, float(me))
    engine.broadcast(comm, buf, g - 1, None)
    out["broadcast"] = buf
    stack = np.empty(6 * g) if me == 0 else None
    engine.gather_to(comm, x, stack, 0, None)
    out["gather_to"] = stack
    engine.barrier(comm, None)
    waits: list = []

    def wait(request: Any) -> None:  # a wait as the polite one is handed requests: it completes them
        waits.append(request)
        request.Wait()
    peer = (me + 1) % g
    got = np.empty(2)
    requests = [engine.irecv(comm, got, (me - 1) % g, 5), engine.isend(comm, np.array([me, 7.0]), peer, 5)]
    engine.wait_all(requests, wait)
    out["point to point"] = got, len(waits)
    # A group of messages in one call, from and to both neighbours (tags apart where they are one rank);
    # with ml_dtypes one of them bfloat16, which MPI's engine moves as its 16-bit words.
    dtype = _bfloat16_or_float64()
    left, right = (me - 1) % g, (me + 1) % g
    from_left, from_right = np.empty(3), np.empty(2, dtype)
    requests = engine.post(comm, [(from_left, left, 6), (from_right, right, 7)],
                           [(np.full(3, me + 0.5), right, 6), (np.array([me, -me], dtype), left, 7)])
    engine.wait_all(requests, None)
    out["post"] = from_left, from_right.astype(np.float64), len(requests)
    out["objects"] = (engine.all_gather_object(comm, ("r", me)), engine.gather_object(comm, me * me, 1),
                      engine.broadcast_object(comm, {"from": me}, 2), engine.all_reduce_object(comm, me + 1, "sum"))
    half = engine.split(comm, me % 2, -me)  # even and odd ranks, in reverse order
    out["split"] = (half.Get_size(), half.Get_rank())
    engine.free(half)
    return out


def _bfloat16_or_float64() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        return np.dtype(np.float64)
    return np.dtype(ml_dtypes.bfloat16)


def check_transfers(out: dict, r: int, g: int) -> None:
    """Rank `r`'s results of `run_transfers` on a group of `g`, against what MPI's calls give (worked out here)."""
    x = [np.arange(6.0) + 10 * q for q in range(g)]
    assert np.array_equal(out["all_reduce"], sum(x))
    assert np.array_equal(out["all_reduce max in place"], x[-1])
    assert np.array_equal(out["all_gather"], np.concatenate(x))
    blocks = [np.arange(2.0 * g) + 100 * q for q in range(g)]
    assert np.array_equal(out["reduce_scatter"], sum(b[2 * r:2 * r + 2] for b in blocks))
    assert np.array_equal(out["all_to_all"], np.concatenate([b[2 * r:2 * r + 2] for b in blocks]))
    assert np.array_equal(out["all_to_allv"], np.concatenate([np.full(r + 1, 10.0 * q + r) for q in range(g)]))
    assert np.array_equal(out["broadcast"], np.full(3, g - 1.0))
    assert (out["gather_to"] is None) == (r != 0)
    if r == 0:
        assert np.array_equal(out["gather_to"], np.concatenate(x))
    got, waited = out["point to point"]
    assert np.array_equal(got, [(r - 1) % g, 7.0]) and waited == 2
    from_left, from_right, posted = out["post"]
    assert np.array_equal(from_left, np.full(3, (r - 1) % g + 0.5)) and posted == 4
    assert np.array_equal(from_right, [(r + 1) % g, -((r + 1) % g)])
    gathered, squares, bcast, total = out["objects"]
    assert gathered == [("r", q) for q in range(g)] and bcast == {"from": 2} and total == g * (g + 1) // 2
    assert squares == ([q * q for q in range(g)] if r == 1 else None)
    evens_or_odds = [q for q in range(g) if q % 2 == r % 2]
    assert out["split"] == (len(evens_or_odds), sorted(evens_or_odds, reverse=True).index(r))


# -- dtypes: text moves on every engine alike; what MPI cannot take, every engine refuses in one line ------
TEXT_DTYPES = ("S4", "<U4")
#: (dtype, op) -> the DTypeError's line on every engine; the (dtype, op) pairs of `DTYPE_OPS` not named here
#: are taken. "max" is allreduce's op="max".
_SUM = "cannot sum dtype '{}'; expected an integer, float or complex dtype (bool and text can be moved, not summed)"
_ORDER = ("cannot take the max of dtype '{}'; expected an integer or real float dtype (bool, complex and text "
          "can be moved, not ordered)")
_SEND = ("MPI cannot send dtype '{}' ({}); expected a numeric dtype: bool, int8..int64, uint8..uint64, "
         "float16..float64, complex64, complex128")
DTYPE_OPS = ("allreduce", "max", "reduce_scatter", "allgather", "alltoall", "bcast")
REFUSED = {
    **{(t, op): f"{op}: " + _SUM.format(n) for t, n in (("|b1", "bool"), ("|S4", "bytes32"), ("<U4", "str128"))
       for op in ("allreduce", "reduce_scatter")},
    **{(t, "max"): "allreduce: " + _ORDER.format(n) for t, n in (
        ("|b1", "bool"), ("|S4", "bytes32"), ("<U4", "str128"), ("<c16", "complex128"), ("<c8", "complex64"))},
    **{(t, op): f"{'allreduce' if op == 'max' else op}: " + _SEND.format(t, n)
       + ("" if op in ("allreduce", "max", "reduce_scatter") else "; or text (numpy's S or U dtypes)")
       for t, n in (("<M8[s]", "datetime64[s]"), ("|O", "object"), ("|V12", "void96")) for op in DTYPE_OPS},
}
USER_DTYPES = ("|b1", "|S4", "<U4", "<c16", "<c8", "<f2", "<M8[s]", "|O", "|V12")


def _text(dtype: str, me: int, g: int) -> np.ndarray:
    """Rank `me`'s (g, 2) text block: item [j, k] is "me.jk" (ranks and g under 10)."""
    return np.array([[f"{me}.{j}{k}" for k in range(2)] for j in range(g)], dtype=dtype)


def run_dtypes(comm: Any) -> dict:
    """What the mesh's collectives make of the dtypes a user might pass, on meshes over `comm`: text (bytes and
    str) through MPI's collectives, the prepared ones, alltoallv and (a mesh made with ``algorithms=``) the
    emulated algorithms; then, for each of `USER_DTYPES` and `DTYPE_OPS`, "taken" or the DTypeError's line."""
    from spmdsim import Layout
    from spmdsim.errors import DTypeError
    from spmdsim.runtime import (Mesh, allgather, allreduce, alltoall, alltoallv, bcast, prepare_allgather,
                                 prepare_alltoall, reduce_scatter)

    out: dict = {}
    me, g = comm.Get_rank(), comm.Get_size()
    for algorithms in (None, {"allgather": "bruck", "alltoall": "pairwise", "bcast": "binomial"}):
        mesh = Mesh(Layout((g,), ("x",)), comm, algorithms=algorithms)
        for dtype in TEXT_DTYPES:
            x = _text(dtype, me, g)
            key = (dtype, algorithms is not None)
            out[key] = {"allgather 0": allgather(mesh, x, "x", 0), "allgather 1": allgather(mesh, x, "x", 1),
                        "alltoall": alltoall(mesh, x, "x", 0, 1), "bcast": bcast(mesh, x.copy(), "x", g - 1)}
            if algorithms is None:  # these run on MPI's own collectives on any mesh (docs/explanation/algorithms.md)
                out[key]["prepared allgather"] = prepare_allgather(mesh, x, "x", 0).run().copy()
                out[key]["prepared alltoall"] = prepare_alltoall(mesh, x, "x", 0).run().copy()
                # Rank me sends (q % 2) + 1 items to rank q: counts of items, not of bytes.
                got = alltoallv(mesh, {q: x[q, :q % 2 + 1] for q in range(g)},
                                {q: (me % 2 + 1,) for q in range(g)}, dtype)
                out[key]["alltoallv"] = [got[q].tolist() for q in range(g)]
        mesh.close()
    mesh = Mesh(Layout((g,), ("x",)), comm)
    calls = {"allreduce": lambda a: allreduce(mesh, a, "x"), "max": lambda a: allreduce(mesh, a, "x", op="max"),
             "reduce_scatter": lambda a: reduce_scatter(mesh, a, "x", 0),
             "allgather": lambda a: allgather(mesh, a, "x", 0), "alltoall": lambda a: alltoall(mesh, a, "x", 0, 0),
             "bcast": lambda a: bcast(mesh, a, "x", 0)}
    for dtype in USER_DTYPES:
        a = np.zeros(2 * g, dtype="i4,f8" if dtype == "|V12" else dtype)
        for op in DTYPE_OPS:
            try:
                calls[op](a)
            except DTypeError as exc:
                out[dtype, op] = str(exc)
            else:
                out[dtype, op] = "taken"
    mesh.close()
    return out


def check_dtypes(out: dict, r: int, g: int, moved: bool = True) -> None:
    """Rank `r`'s results of `run_dtypes` on `g` ranks: the text each call gives under MPI (unless not `moved`:
    a dry run's), and each refusal's line."""
    for dtype in TEXT_DTYPES:
        x = [_text(dtype, q, g) for q in range(g)]
        for emulated in (False, True):
            got = out[dtype, emulated]
            assert got["allgather 0"].dtype == np.dtype(dtype) and got["alltoall"].dtype == np.dtype(dtype)
            if not moved:
                continue
            assert np.array_equal(got["allgather 0"], np.concatenate(x, 0))
            assert np.array_equal(got["allgather 1"], np.concatenate(x, 1))
            assert np.array_equal(got["alltoall"], np.concatenate([b[r:r + 1] for b in x], 1))
            assert np.array_equal(got["bcast"], x[g - 1])
            if not emulated:
                assert np.array_equal(got["prepared allgather"], np.concatenate(x, 0))
                assert np.array_equal(got["prepared alltoall"], np.concatenate([b[r:r + 1] for b in x], 0))
                assert got["alltoallv"] == [x[q][r, :r % 2 + 1].tolist() for q in range(g)]
    for dtype in USER_DTYPES:
        for op in DTYPE_OPS:
            assert out[dtype, op] == REFUSED.get((dtype, op), "taken"), (dtype, op)
