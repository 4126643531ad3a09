"""Allreduce of two plain numpy arrays (spmdsim.emulator.collective_checks.plain_reduction, most programs' call)
answers as the general path's checks do: the same sums, the same refusals with the same messages."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

import spmdsim.emulator.collectives as emulated
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate


def _cases() -> dict:
    """name -> (send, receive, op): plain arrays the checks take, and each kind of refusal they make."""
    f, out = np.ones(8), np.empty(8)
    readonly = np.zeros(8)
    readonly.flags.writeable = False
    return {
        "sum": (f, out, MPI.SUM), "2-d": (np.ones((2, 4)), np.empty((2, 4)), MPI.SUM),
        "int prod": (np.arange(1, 9), np.empty(8, int), MPI.PROD), "user op": (f, np.empty(8), MPI.Op.Create(
            lambda a, b, t: None, True)),
        "same buffer": (f, f, MPI.SUM), "overlap": (f[:6], f[2:], MPI.SUM),
        "dtypes differ": (np.ones(8, np.float32), out, MPI.SUM), "counts differ": (np.ones(4), out, MPI.SUM),
        "max of complex": (np.ones(8, complex), np.empty(8, complex), MPI.MAX),
        "sum of booleans": (np.ones(8, bool), np.empty(8, bool), MPI.SUM), "band of floats": (f, out, MPI.BAND),
        "maxloc of floats": (f, out, MPI.MAXLOC), "read-only": (f, readonly, MPI.SUM),
        "strided send": (np.ones(16)[::2], out, MPI.SUM), "strided receive": (f, np.empty(16)[::2], MPI.SUM),
        "text": (np.array(["ab"] * 8), np.empty(8, "U2"), MPI.SUM),
        "objects": (np.array([1] * 8, object), np.empty(8, object), MPI.SUM),
        "big-endian": (np.ones(8, ">f8"), np.empty(8, ">f8"), MPI.SUM),
    }


def _answers() -> dict:
    comm = MPI.COMM_WORLD  # (swapped: this simulated rank's)
    answers = {}
    for name, (send, recv, op) in _cases().items():
        try:
            comm.Allreduce(send, recv, op)
            answers[name] = None if name == "user op" else recv.tolist()
        except Exception as exc:  # noqa: BLE001 - the class and message are the answer
            answers[name] = f"{type(exc).__name__}: {exc}"
    return answers


def test_plain_arrays_get_the_general_paths_answers(monkeypatch):
    taken = []
    plain = emulated.plain_reduction

    def counted(*args):
        pair = plain(*args)
        taken.append(pair is not None)
        return pair

    monkeypatch.setattr(emulated, "plain_reduction", counted)
    with swapped():
        fast = simulate(2, _answers)
    monkeypatch.setattr(emulated, "plain_reduction", lambda *args: None)  # every call the general path's
    with swapped():
        general = simulate(2, _answers)
    assert fast == general
    answers = fast[0]
    assert answers["sum"] == [2.0] * 8 and answers["int prod"] == [i * i for i in range(1, 9)]
    refused = [name for name, answer in answers.items() if isinstance(answer, str)]
    assert len(refused) == len(answers) - 4, answers  # all but sum, 2-d, int prod and user op
    assert "aliased" in answers["same buffer"] and "Invalid MPI_Op" in answers["max of complex"]
    # the plain path answered the four that pass and those refused after its own checks (aliasing, counts, dtypes)
    assert sum(taken) >= 2 * 4
