"""Reductions of plain numpy arrays (spmdsim.emulator.collective_checks.plain_reduction, most programs' calls:
Allreduce, Reduce, Scan, Exscan, Reduce_scatter_block) answer as the general path's checks do: the same values,
the same refusals with the same messages."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

import spmdsim.emulator.collectives as emulated
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate


def _cases() -> dict:
    """name -> (send, receive, op): plain arrays the checks take, and each kind of refusal they make."""
    f, out = np.ones(8), np.zeros(8)
    readonly = np.zeros(8)
    readonly.flags.writeable = False
    return {
        "sum": (f, out, MPI.SUM), "2-d": (np.ones((2, 4)), np.zeros((2, 4)), MPI.SUM),
        "int prod": (np.arange(1, 9), np.zeros(8, int), MPI.PROD), "user op": (f, np.zeros(8), MPI.Op.Create(
            lambda a, b, t: None, True)),
        "same buffer": (f, f, MPI.SUM), "overlap": (f[:6], f[2:], MPI.SUM),
        "dtypes differ": (np.ones(8, np.float32), out, MPI.SUM), "counts differ": (np.ones(4), out, MPI.SUM),
        "max of complex": (np.ones(8, complex), np.zeros(8, complex), MPI.MAX),
        "sum of booleans": (np.ones(8, bool), np.zeros(8, bool), MPI.SUM), "band of floats": (f, out, MPI.BAND),
        "maxloc of floats": (f, out, MPI.MAXLOC), "read-only": (f, readonly, MPI.SUM),
        "strided send": (np.ones(16)[::2], out, MPI.SUM), "strided receive": (f, np.zeros(16)[::2], MPI.SUM),
        "text": (np.array(["ab"] * 8), np.zeros(8, "U2"), MPI.SUM),
        "objects": (np.array([1] * 8, object), np.zeros(8, object), MPI.SUM),
        "big-endian": (np.ones(8, ">f8"), np.zeros(8, ">f8"), MPI.SUM), "no receive buffer": (f, None, MPI.SUM),
    }


def _scattered_cases() -> dict:
    """Reduce_scatter_block's (2 ranks: a send buffer of 2 blocks of the receive buffer's count)."""
    f = np.ones(16)
    return {"sum": (f, np.zeros(8), MPI.SUM), "user op": (f, np.zeros(8), MPI.Op.Create(lambda a, b, t: None, True)),
            "counts differ": (np.ones(8), np.zeros(8), MPI.SUM), "no even split": (np.ones(7), np.zeros(3), MPI.SUM),
            "dtypes differ": (np.ones(16, np.float32), np.zeros(8), MPI.SUM), "aliased": (f, f[8:], MPI.SUM),
            "max of complex": (np.ones(16, complex), np.zeros(8, complex), MPI.MAX),
            "strided receive": (f, np.zeros(16)[::2], MPI.SUM)}


#: The cases a Reduce's ranks refuse alike: refused by the send data (a receive buffer's refusal, the root's
#: alone, would leave the other rank in the call).
BY_SENDER = ("sum", "2-d", "int prod", "user op", "max of complex", "sum of booleans", "band of floats",
             "maxloc of floats", "strided send", "text", "objects", "big-endian")


def _answers() -> dict:
    comm = MPI.COMM_WORLD  # (swapped: this simulated rank's)
    answers = {}
    calls = {"Allreduce": comm.Allreduce, "Scan": comm.Scan, "Exscan": comm.Exscan, "Reduce": comm.Reduce,
             "Reduce_scatter_block": comm.Reduce_scatter_block}
    for call, run in calls.items():
        for name, (send, recv, op) in (_scattered_cases() if call == "Reduce_scatter_block" else _cases()).items():
            if call == "Reduce" and name not in BY_SENDER:
                continue
            try:
                run(send, recv, op)
                answers[call, name] = None if name == "user op" else recv.tolist()
            except Exception as exc:  # noqa: BLE001 - the class and message are the answer
                answers[call, name] = f"{type(exc).__name__}: {exc}"
    return answers


def test_plain_arrays_get_the_general_paths_answers(monkeypatch):
    taken = []
    plain = emulated.plain_reduction

    def counted(*args, **kwargs):
        pair = plain(*args, **kwargs)
        taken.append(pair is not None)
        return pair

    monkeypatch.setattr(emulated, "plain_reduction", counted)
    with swapped():
        fast = simulate(2, _answers)
    monkeypatch.setattr(emulated, "plain_reduction", lambda *args, **kwargs: None)  # every call the general path's
    with swapped():
        general = simulate(2, _answers)
    assert fast == general
    first, second = fast
    assert first["Allreduce", "sum"] == [2.0] * 8 and first["Allreduce", "int prod"] == [i * i for i in range(1, 9)]
    assert first["Scan", "sum"] == [1.0] * 8 and second["Scan", "sum"] == [2.0] * 8
    assert first["Exscan", "sum"] == [0.0] * 8 and second["Exscan", "sum"] == [1.0] * 8  # rank 0's: as it was
    assert first["Reduce", "sum"] == [2.0] * 8 and second["Reduce", "sum"] == [0.0] * 8  # the root's alone
    assert first["Reduce_scatter_block", "sum"] == second["Reduce_scatter_block", "sum"] == [2.0] * 8
    for call in ("Allreduce", "Scan", "Exscan", "Reduce", "Reduce_scatter_block"):  # all but those that pass refused
        refused = [name for (c, name), answer in first.items() if c == call and isinstance(answer, str)]
        assert len(refused) == {"Reduce": 8, "Reduce_scatter_block": 6}.get(call, 15), (call, refused)
    assert "aliased" in first["Scan", "same buffer"] and "Invalid MPI_Op" in first["Reduce", "max of complex"]
    assert first["Allreduce", "no receive buffer"].startswith("TypeError")  # mpi4py's: None is no buffer there
    # the plain path answered the four that pass and those refused after its own checks (aliasing, counts, dtypes)
    assert sum(taken) >= 2 * (4 * 4 + 2)
