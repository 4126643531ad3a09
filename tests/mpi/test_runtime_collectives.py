"""Each collective against the numpy computation of what it must produce, on every axis group."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim import Layout, ShapeError
from spmdsim.runtime import Mesh, collect_trace
from spmdsim.runtime import collectives as C

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
LAYOUTS = {
    8: [((2, 4), ("dp", "mp")), ((2, 2, 2), ("dp", "sp", "mp")), ((4, 1, 2), ("a", "b", "c"))],
    4: [((2, 2), ("dp", "mp")), ((2, 1, 2), ("a", "b", "c"))],
}


def _layouts():
    return [Layout(*spec) for spec in LAYOUTS.get(WORLD.size, [((WORLD.size,), ("x",))])]


def _axis_groups(names):
    """Each single axis, all axes in order and reversed (membership tests cover the rest)."""
    out = [(n,) for n in names] + [tuple(names), tuple(reversed(names))]
    return list(dict.fromkeys(out))


def _data(rank, shape, dtype=np.float64):
    return (np.arange(np.prod(shape)).reshape(shape) + 1000 * rank).astype(dtype)


def _members(layout, rank, axes):
    return next(g for g in layout.axis_groups(axes) if rank in g)


_MESHES: dict = {}


def _meshes(wait):
    """Meshes built once per wait mode and kept for the module (group splits are costly at 8 ranks)."""
    if wait not in _MESHES:
        _MESHES[wait] = [Mesh(layout, wait=wait) for layout in _layouts()]
    return _MESHES[wait]


@pytest.fixture(params=["busy", "polite"])
def wait(request):
    return request.param


def test_allgather_allreduce_reduce_scatter_bcast_match_numpy(wait):
    for mesh in _meshes(wait):
        layout = mesh.layout
        r = mesh.rank
        for axes in _axis_groups(layout.alias_name):
            members = _members(layout, r, axes)
            g = len(members)
            me = members.index(r)
            shape = (2, 3 * g, 2 * g)
            x = _data(r, shape)
            for d in range(3):
                got = C.allgather(mesh, x, axes, d)
                np.testing.assert_array_equal(got, np.concatenate([_data(m, shape) for m in members], axis=d))
            total = sum(_data(m, shape) for m in members)
            np.testing.assert_array_equal(C.allreduce(mesh, x, axes), total)
            for d in (1, 2):
                block = [slice(None)] * 3
                n = shape[d] // g
                block[d] = slice(me * n, (me + 1) * n)
                np.testing.assert_array_equal(C.reduce_scatter(mesh, x, axes, d), total[tuple(block)])
            root = g - 1
            for _ in range(2):  # the second call repeats what the first kept (door.repeat)
                buf = x.copy() if me == root else np.zeros_like(x)
                out = C.bcast(mesh, buf, axes, root=root)
                np.testing.assert_array_equal(out, _data(members[root], shape))
                assert out is buf


def test_alltoall_matches_numpy(wait):
    for mesh in _meshes(wait):
        layout = mesh.layout
        r = mesh.rank
        for axes in _axis_groups(layout.alias_name):
            members = _members(layout, r, axes)
            g, me = len(members), members.index(r)
            shape = (2 * g, g, 2 * g)
            for split_dim, concat_dim in [(0, 0), (0, 2), (2, 1), (1, 1), (-1, 0)]:
                got = C.alltoall(mesh, _data(r, shape, np.float32), axes, split_dim, concat_dim)
                pieces = [np.split(_data(m, shape, np.float32), g, axis=split_dim)[me] for m in members]
                np.testing.assert_array_equal(got, np.concatenate(pieces, axis=concat_dim))


def test_alltoallv_general_exchange(wait):
    mesh = _meshes(wait)[0]
    r, n = mesh.rank, mesh.size
    # Rank r sends (r + s) % 3 + 1 rows to every rank s, including itself; none to r+1.
    rows = lambda src, dst: (src + dst) % 3 + 1  # noqa: E731
    skip = lambda src, dst: dst == (src + 1) % n  # noqa: E731
    sends = {s: np.full((rows(r, s), 2), 10 * r + s, np.int64) for s in range(n) if not skip(r, s)}
    shapes = {s: (rows(s, r), 2) for s in range(n) if not skip(s, r)}
    with collect_trace() as tr:
        got = C.alltoallv(mesh, sends, shapes, np.int64, label="exchange")
    assert sorted(got) == sorted(shapes)
    for s, arr in got.items():
        np.testing.assert_array_equal(arr, np.full((rows(s, r), 2), 10 * s + r, np.int64))
    (entry,) = tr.entries
    sent = sum(a.nbytes for s, a in sends.items() if s != r)
    assert (entry.op, entry.bytes_sent, entry.label) == ("alltoallv", sent, "exchange")
    assert entry.bytes_copied == sent  # every block sent is packed into one buffer
    # Sends to all but r+1, receives from all but r-1: every other rank is a peer (none at 2 ranks).
    assert entry.peers == (n - 1 if n > 2 else 0)


def test_exchange_by_spec_matches_alltoallv():
    from spmdsim.runtime.exchange_spec import ExchangeSpec

    mesh = _meshes("polite")[0]
    n, r = mesh.size, mesh.rank
    local = np.arange(n * 3, dtype=np.float64).reshape(n, 3) + 100 * r
    # Row s of this rank goes to rank s (all but its own); the same through both APIs.
    sends = [(s, (slice(s, s + 1), slice(0, 3)), (1, 3)) for s in range(n) if s != r]
    spec = ExchangeSpec.build(n, r, local.shape, sends, [(s, 3) for s in range(n) if s != r])
    with collect_trace() as tr:
        flat = C.exchange(mesh, local, spec, label="spec")
    general = C.alltoallv(mesh, {s: local[s:s + 1] for s in range(n) if s != r},
                          {s: (1, 3) for s in range(n) if s != r}, np.float64)
    for src, lo, hi in spec.recv_slots:
        np.testing.assert_array_equal(flat[lo:hi], general[src].reshape(-1))
        np.testing.assert_array_equal(flat[lo:hi], np.arange(r * 3, r * 3 + 3) + 100 * src)
    (entry,) = tr.entries
    assert (entry.op, entry.label, entry.bytes_sent, entry.bytes_copied) == ("alltoallv", "spec", 24 * (n - 1),
                                                                             24 * (n - 1))
    assert entry.peers == spec.peers == n - 1
    with pytest.raises(ShapeError, match="is not an array of shape"):
        C.exchange(mesh, local[1:], spec)
    other = ExchangeSpec.build(n, (r + 1) % n, local.shape, [], [])
    with pytest.raises(ShapeError, match="used on rank"):
        C.exchange(mesh, local, other)
    # Into a caller's buffer (the executor's kept one): the same values, in that buffer.
    into = np.full(spec.recv_total, -1.0)
    assert C.exchange(mesh, local, spec, out=into) is into
    np.testing.assert_array_equal(into, flat)
    with pytest.raises(ShapeError, match="exchange: out"):
        C.exchange(mesh, local, spec, out=np.empty(spec.recv_total + 1))


def test_kept_temporaries_are_reused_and_never_part_of_a_result(monkeypatch):
    """Packed sends and received blocks go through the mesh's kept buffers; later calls must not
    change earlier results."""
    from spmdsim.runtime import mesh as mesh_module
    from spmdsim.runtime.exchange_spec import ExchangeSpec

    mesh = _meshes("busy")[0]
    n, r, g = mesh.size, mesh.rank, mesh.size
    axes = mesh.layout.alias_name
    shape = (3, 2 * g)  # split on dim 1: blocks must be packed
    want = {}
    got = {}
    for k in (1, 2):
        x = _data(r, shape) * k
        got["alltoall", k] = C.alltoall(mesh, x, axes, 1, 0)
        want["alltoall", k] = np.concatenate(
            [np.split(_data(m, shape) * k, g, axis=1)[r] for m in range(n)], axis=0)
        got["alltoall to dim 1", k] = C.alltoall(mesh, x.T.copy(), axes, 0, 1)  # received, then placed
        want["alltoall to dim 1", k] = np.concatenate(
            [np.split(_data(m, shape).T * k, g, axis=0)[r] for m in range(n)], axis=1)
        got["allgather dim 1", k] = C.allgather(mesh, x, axes, 1)
        want["allgather dim 1", k] = np.concatenate([_data(m, shape) * k for m in range(n)], axis=1)
        got["reduce_scatter", k] = C.reduce_scatter(mesh, x, axes, 1)
        want["reduce_scatter", k] = np.split(sum(_data(m, shape) * k for m in range(n)), g, axis=1)[r]
        sends = [(s, (slice(s, s + 1), slice(0, 3)), (1, 3)) for s in range(n) if s != r]
        spec = ExchangeSpec.build(n, r, (n, 3), sends, [(s, 3) for s in range(n) if s != r])
        got["exchange", k] = C.exchange(mesh, np.full((n, 3), 10.0 * r + k), spec)
        want["exchange", k] = np.concatenate([np.full(3, 10.0 * s + k) for s in range(n) if s != r])
        general = C.alltoallv(mesh, {s: np.full(2, 100.0 * r + k) for s in range(n)},
                              {s: (2,) for s in range(n)}, np.float64)
        got["alltoallv", k] = np.concatenate([general[s] for s in range(n)])
        want["alltoallv", k] = np.concatenate([np.full(2, 100.0 * s + k) for s in range(n)])
        if k == 1:
            kept = dict(mesh._scratch)
            assert sorted(kept) == ["recv", "send"]
    assert all(mesh._scratch[role] is kept[role] for role in kept)  # the same memory on every call
    for key, value in got.items():
        np.testing.assert_array_equal(value, want[key], err_msg=str(key))
        assert not any(np.shares_memory(value, buf) for buf in kept.values()), key
    # Above the limit a temporary is made per call and not kept.
    monkeypatch.setattr(mesh_module, "SCRATCH_MAX_BYTES", 64)
    big = mesh.scratch("send", (16,), np.float64)
    assert big.shape == (16,) and not np.shares_memory(big, kept["send"])
    small = mesh.scratch("recv", (2, 3), np.int32)
    assert small.shape == (2, 3) and small.dtype == np.int32 and np.shares_memory(small, kept["recv"])
    with pytest.raises(ValueError, match="scratch role 'out'"):
        mesh.scratch("out", (1,), np.float64)
    # A repeated request is served from the view cache; growing a role drops its cached views.
    monkeypatch.setattr(mesh_module, "SCRATCH_MAX_BYTES", 32 << 20)
    first = mesh.scratch("recv", (2, 3), np.int32)
    assert mesh.scratch("recv", (2, 3), np.int32) is first
    assert mesh.scratch("recv", (2, 3), np.dtype(np.int32)).dtype == np.int32
    grown = mesh.scratch("recv", (kept["recv"].nbytes + 8,), np.uint8)
    again = mesh.scratch("recv", (2, 3), np.int32)
    assert again is not first and np.shares_memory(again, grown) and not np.shares_memory(again, first)


def test_results_and_kept_buffers_start_at_the_page_offset():
    """What spmdsim allocates for MPI to write (results, kept temporaries) is placed (spmdsim.base.buffers)."""
    from spmdsim.base import buffers
    from spmdsim.runtime.exchange_spec import ExchangeSpec

    mesh = _meshes("busy")[0]
    n, r, axes = mesh.size, mesh.rank, mesh.layout.alias_name
    x = _data(r, (n * 128, 64))  # n * 64 KiB: every result below is at least buffers.MIN_BYTES
    results = {
        "allgather": C.allgather(mesh, x, axes, 0),
        "alltoall": C.alltoall(mesh, x, axes, 0, 0),
        "allreduce": C.allreduce(mesh, x, axes),
        "reduce_scatter": C.reduce_scatter(mesh, x, axes, 0),
    }
    rows = x.shape[0] // n
    sends = [(s, (slice(s * rows, (s + 1) * rows), slice(None)), (rows, 64)) for s in range(n)]
    spec = ExchangeSpec.build(n, r, x.shape, [t for t in sends if t[0] != r],
                              [(s, rows * 64) for s in range(n) if s != r])
    results["exchange"] = C.exchange(mesh, x, spec)
    general = C.alltoallv(mesh, {s: x[:rows] for s in range(n)}, {s: (rows, 64) for s in range(n)}, x.dtype)
    results.update({f"alltoallv from {s}": general[s] for s in range(n) if s != r})
    # Blocks along a later dim arrive in the kept receive buffer (placed, below); the result
    # they are unpacked into is filled by numpy, not MPI, and is numpy's own array.
    for unpacked in (C.allgather(mesh, x, axes, 1), C.alltoall(mesh, x, axes, 0, 1)):
        assert unpacked.flags.owndata and unpacked.base is None
    results.update({f"kept {role}": buf for role, buf in mesh._scratch.items()})
    for name, value in results.items():
        assert value.nbytes >= buffers.MIN_BYTES, name
        assert buffers.page_offset(value) == buffers.PAGE_OFFSET, name


def test_trace_records_ops_bytes_and_nesting():
    mesh = _meshes("polite")[0]
    layout = mesh.layout
    axes = (layout.alias_name[-1],)
    g = layout.group_size(axes)
    x = np.ones((4 * g, 4), np.float32)
    with collect_trace() as outer:
        C.allgather(mesh, x, axes, 0, label="ag")
        with collect_trace() as inner:
            C.allreduce(mesh, x, axes)
            C.reduce_scatter(mesh, x, axes, 0)
            C.alltoall(mesh, x, axes, 0, 1)
    assert outer.counts() == {"allgather": 1, "allreduce": 1, "reduce_scatter": 1, "alltoall": 1}
    assert inner.counts() == {"allreduce": 1, "reduce_scatter": 1, "alltoall": 1}
    ag, ar, rs, aa = outer.entries
    n = x.nbytes
    assert (ag.label, ag.axes, ag.group_size) == ("ag", axes, g)
    assert (ag.bytes_sent, ag.bytes_received) == ((g - 1) * n, (g - 1) * n)
    assert ar.bytes_sent == ar.bytes_received == 2 * (g - 1) * n // g
    assert rs.bytes_received == (g - 1) * n // g
    assert aa.bytes_sent == (g - 1) * n // g
    assert all(e.seconds >= 0 for e in outer.entries)
    # Packing: alltoall 0 -> 1 sends leading blocks as they are and unpacks along dim 1;
    # the others send and receive along dim 0 with no local copy.
    assert (ag.bytes_copied, ar.bytes_copied, rs.bytes_copied) == (0, 0, 0)
    assert aa.bytes_copied == n
    with collect_trace() as packed:
        C.allgather(mesh, x, axes, 1)
        C.reduce_scatter(mesh, x, axes, 1)
        C.alltoall(mesh, x, axes, 1, 0)
    assert [e.bytes_copied for e in packed.entries] == [g * n, n, n]
    totals = outer.reduce(mesh.comm)
    assert totals["counts"]["allgather"] == 1
    assert totals["bytes_sent_total"] == mesh.size * sum(e.bytes_sent for e in outer.entries)
    assert "allreduce" in outer.summary() and '"op": "allgather"' in outer.to_json()


def test_shape_errors_are_raised_before_communication():
    mesh = _meshes("polite")[0]
    layout = mesh.layout
    axes = layout.alias_name
    g = mesh.size
    with pytest.raises(ShapeError, match="not divisible by group size"):
        C.reduce_scatter(mesh, np.ones((g + 1, 2)), axes, 0)
    with pytest.raises(ShapeError, match="out of range"):
        C.allgather(mesh, np.ones(3), axes, 1)
    # A missing dim is named, not taken for dim 0.
    x = np.ones((2 * g, 2))
    for call in (lambda: C.allgather(mesh, x, axes, None), lambda: C.reduce_scatter(mesh, x, axes, None),
                 lambda: C.alltoall(mesh, x, axes, None, 0), lambda: C.alltoall(mesh, x, axes, 0, "1")):
        with pytest.raises(ShapeError, match="must be an integer tensor dim"):
            call()


def test_out_buffers_receive_the_result():
    mesh = _meshes("busy")[0]
    layout = mesh.layout
    axes = tuple(layout.alias_name)
    members = _members(layout, mesh.rank, axes)
    g, me = len(members), members.index(mesh.rank)
    shape = (g, 2 * g)
    x = _data(mesh.rank, shape)
    for d in (0, 1):
        out = np.empty(tuple(s * g if i == d else s for i, s in enumerate(shape)))
        assert C.allgather(mesh, x, axes, d, out=out) is out
        np.testing.assert_array_equal(out, np.concatenate([_data(m, shape) for m in members], axis=d))
    total = sum(_data(m, shape) for m in members)
    out = np.empty(shape)
    assert C.allreduce(mesh, x, axes, out=out) is out
    np.testing.assert_array_equal(out, total)
    out = np.empty((1, 2 * g))
    assert C.reduce_scatter(mesh, x, axes, 0, out=out) is out
    np.testing.assert_array_equal(out, total[me:me + 1])
    out = np.empty((g * g, 2))
    assert C.alltoall(mesh, x, axes, 1, 0, out=out) is out
    np.testing.assert_array_equal(out, np.concatenate([np.split(_data(m, shape), g, axis=1)[me] for m in members]))
    with pytest.raises(ShapeError, match=r"allreduce: out \(\(3,\), 'float64'\) must be"):
        C.allreduce(mesh, x, axes, out=np.empty(3))
    # alltoallv: the blocks from the other ranks are views of `out`, sources in rank order.
    n, r = mesh.size, mesh.rank
    sends = {s: np.full((2, s + 1), 10.0 * r + s) for s in range(n)}
    shapes = {s: (2, r + 1) for s in range(n)}
    flat = np.empty(2 * (r + 1) * (n - 1))
    got = C.alltoallv(mesh, sends, shapes, np.float64, out=flat)
    for s in range(n):
        np.testing.assert_array_equal(got[s], np.full((2, r + 1), 10.0 * s + r))
        assert np.shares_memory(got[s], flat) == (s != r)
    np.testing.assert_array_equal(flat, np.concatenate([np.full(2 * (r + 1), 10.0 * s + r)
                                                        for s in range(n) if s != r]))
    with pytest.raises(ShapeError, match=r"alltoallv: out \(\(1,\), 'float64'\) must be"):
        C.alltoallv(mesh, sends, shapes, np.float64, out=np.empty(1))


@pytest.mark.parametrize("wait", ["busy", "polite"])
def test_allreduce_in_place_sums_into_the_input(wait):
    world = MPI.COMM_WORLD
    mesh = Mesh(Layout((world.size,), ("x",)), wait=wait)
    local = np.arange(12, dtype=np.float64) * (world.rank + 1)
    result = C.allreduce(mesh, local, ("x",), out=local)
    total = sum(range(1, world.size + 1))
    assert result is local
    np.testing.assert_array_equal(local, np.arange(12, dtype=np.float64) * total)
    mesh.close()


@pytest.mark.parametrize("wait", ["busy", "polite"])
def test_plain_and_layered_ways_agree(wait):
    """Calls run plain (MPI alone); with the divergence guard on, layered (fingerprint, watchdog)."""
    from spmdsim.runtime import debug

    mesh = _meshes(wait)[0]
    axes = tuple(mesh.layout.alias_name)
    members = _members(mesh.layout, mesh.rank, axes)
    g, me = len(members), members.index(mesh.rank)
    shape = (2 * g, 3)
    x = _data(mesh.rank, shape, np.float32)
    total = sum(_data(m, shape, np.float32) for m in members)
    expected = {
        "allgather": np.concatenate([_data(m, shape, np.float32) for m in members]),
        "alltoall": np.concatenate([np.split(_data(m, shape, np.float32), g)[me] for m in members]),
        "allreduce": total,
        "reduce_scatter": np.split(total, g)[me],
    }
    calls = {
        "allgather": lambda out: C.allgather(mesh, x, axes, 0, out=out),
        "alltoall": lambda out: C.alltoall(mesh, x, axes, 0, 0, out=out),
        "allreduce": lambda out: C.allreduce(mesh, x, axes, out=out),
        "reduce_scatter": lambda out: C.reduce_scatter(mesh, x, axes, 0, out=out),
    }
    entries = {}
    try:
        for check in (False, True):
            debug.configure(check=check)
            with collect_trace() as tr:
                for op, call in calls.items():
                    before = debug.current_seq()
                    np.testing.assert_array_equal(call(None), expected[op])
                    out = np.empty_like(expected[op])
                    assert call(out) is out
                    np.testing.assert_array_equal(out, expected[op])
                    # Each call takes one sequence number either way.
                    assert debug.current_seq() - before == 2
                    with pytest.raises(ShapeError, match=f"{op}: out"):
                        call(np.empty(expected[op].shape, np.float64))
                    with pytest.raises(ShapeError, match=f"{op}: out"):
                        call(np.empty(expected[op].size + 1, np.float32))
            entries[check] = [(e.op, e.axes, e.group_size, e.bytes_sent, e.bytes_received)
                              for e in tr.entries]
    finally:
        debug.configure(check=False)
    assert entries[False] == entries[True] and len(entries[False]) == 8
    buf = x.copy() if me == 0 else np.zeros_like(x)
    assert C.bcast(mesh, buf, axes, 0) is buf
    np.testing.assert_array_equal(buf, _data(members[0], shape, np.float32))
