"""An integer power with a negative exponent is refused on every rank alike, as numpy refuses it.

numpy's integer np.power raises ValueError on a negative exponent entry; run on each rank's block, it was raised
on the ranks holding one alone, while the others went on (into the next collective: a hang or a confusing
partial failure under MPI). Pure: 4 simulated ranks, each returning what it raised.
"""
from __future__ import annotations

import numpy as np

import spmdsim
from spmdsim import DTensor, Layout, Mesh, OperatorError
from spmdsim.nn import ops
from spmdsim.nn.ops.pointwise import pointwise

G = np.array([1, 2, 3, -1, 4, 5, 6, 7], np.int64)  # the one negative entry on rank 1 of 4


def _outcomes(call, dry_run=False):
    """Per rank: ("ok", global result) or (the error's type name, its message)."""
    def body():
        mesh = Mesh(Layout((4,), ("x",)))
        x = DTensor.from_global(mesh, G, mesh.layout("x"))
        try:
            return "ok", call(mesh, x).gather()
        except Exception as e:  # noqa: BLE001 - what each rank raised, compared below
            return type(e).__name__, str(e)
    return spmdsim.simulate(4, body, dry_run=dry_run)


def test_a_negative_integer_exponent_is_refused_on_every_rank_alike():
    """``2 ** x``, ``x ** x``, ``np.power(mask, x)`` of int64 x with -1 on rank 1: numpy's ValueError on rank 1
    alone; now the same one-line OperatorError on all four (the least exponent agreed over the mesh)."""
    calls = {"2 ** x": lambda m, x: 2 ** x, "x ** x": lambda m, x: ops.pow(x, x),
             "np.power(mask, x)": lambda m, x: np.power(x > 2, x)}
    for name, call in calls.items():
        got = _outcomes(call)
        assert len(set(got)) == 1, f"{name}: {got}"
        kind, message = got[0]
        assert kind == OperatorError.__name__, f"{name}: {got[0]}"
        assert "whose entries include -1: numpy refuses integers to negative integer powers" in message
        assert "\n" not in message
    # A dry run (one rank runs for all, on its own small block: rank 0's, -1 there) refuses it alike (was ValueError).
    assert _outcomes(lambda m, x: 2 ** (x - 2), dry_run=True)[0][0] == OperatorError.__name__
    # A number exponent (pointwise's own path, a 0-d array through np.power) is every rank's: refused alike too.
    got = _outcomes(lambda m, x: pointwise("pow", x, np.array(-2)))
    assert got == [("OperatorError", "pow: a DTensor of int64 to the negative integer power -2: numpy refuses "
                    "integers to negative integer powers; use a float exponent (-2.0) or convert x first, e.g. "
                    "x.astype('float64')")] * 4


def test_integer_powers_numpy_computes_are_computed():
    """No negative entry, an unsigned or float exponent or base: numpy's values and dtype, no refusal."""
    cases = {"2 ** |x|": (lambda m, x: 2 ** abs(x), 2 ** np.abs(G)),
             "x ** uint8": (lambda m, x: x ** abs(x).astype(np.uint8), G ** np.abs(G).astype(np.uint8)),
             "2.0 ** x": (lambda m, x: 2.0 ** x, 2.0 ** G)}
    for name, (call, want) in cases.items():
        got = _outcomes(call)
        for kind, value in got:
            assert kind == "ok", f"{name}: {value}"
            assert value.dtype == want.dtype and np.array_equal(value, want), f"{name}: {value} != {want}"


def test_a_replayed_integer_power_checks_each_replays_exponents_on_every_rank_alike():
    """A captured step's check of a DTensor's integer exponents was the capture's int() of each rank's least entry,
    a guard: a replay whose exponents changed stopped with ReplayError on the ranks whose least entry changed
    (positive ones too), while the others went on into the step's Allreduce (a deadlock). Now the check is
    recorded (a kernel: the least entry agreed over the mesh again): any exponents numpy takes replay, a negative
    entry on one rank is refused on all four in one line, and the graph replays again afterwards."""
    from spmdsim.runtime.replay import capture

    def body():
        mesh = Mesh(Layout((4,), ("x",)))
        x, e = (DTensor.from_global(mesh, a, mesh.layout("x")) for a in (np.abs(G), np.abs(G)))
        graph = capture(lambda x, e: ops.resolved(ops.sum(ops.pow(x, e))), x, e)
        out = []
        for new in (np.abs(G) + 1, G, np.abs(G) // 2):
            try:
                out.append(("ok", int(graph(x, DTensor.from_global(mesh, new, mesh.layout("x"))).local)))
            except Exception as ex:  # noqa: BLE001 - what each rank raised, compared below
                out.append((type(ex).__name__, str(ex)))
        return out

    got = spmdsim.simulate(4, body)
    assert len(set(map(tuple, got))) == 1, got
    base = np.abs(G)
    assert got[0] == [("ok", int(np.sum(base ** (base + 1)))),
                      ("OperatorError", "pow: a DTensor of int64 to the powers of a DTensor of int64 whose entries "
                       "include -1: numpy refuses integers to negative integer powers; convert first, e.g. "
                       "exponent.astype('float64')"),
                      ("ok", int(np.sum(base ** (base // 2))))]


def test_an_empty_integer_tensor_to_a_negative_power_is_the_empty_result():
    """An empty tensor has no entry to refuse: numpy gives the empty result (np.power(empty int32, -1), bool's
    int64), where ops.pow refused it by the exponent alone."""
    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        out = []
        for dtype in (np.int32, np.bool_):
            x = DTensor.from_global(mesh, np.zeros((0, 4), dtype), mesh.layout(None, "x"))
            for call in (lambda: ops.pow(x, -1), lambda: x ** -2, lambda: np.power(x, np.int64(-1))):
                got = call().gather()
                out.append((got.shape, got.dtype.name))
        return out

    empty = np.zeros((0, 4), np.int32)
    want = [(w.shape, w.dtype.name) for a in (empty, empty.astype(bool))
            for w in (np.power(a, -1), a ** -2, np.power(a, np.int64(-1)))]
    assert spmdsim.simulate(2, body) == [want] * 2
