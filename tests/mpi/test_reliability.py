"""The divergence guard and the watchdog inside one MPI job (pytest-mpi, any world size).

Cases where a rank differs are built so that every rank raises the same error
(the group is the whole world), so no rank is left waiting.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from spmdsim.errors import RuntimeMismatchError
from spmdsim.runtime import _roster, debug, debug_calls

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def comm():
    world = _world()
    dup = world.Dup()
    yield dup
    dup.Free()


def test_identical_calls_pass_the_fingerprint_check(comm) -> None:
    for seq in range(1, 4):
        debug_calls.verify(comm, "allreduce", ("mp",), np.float32, (4, 8), (), seq, polite=True)


@pytest.mark.parametrize("what", ["shape", "op", "seq", "dtype"])
def test_one_differing_rank_is_named_on_every_rank(comm, what: str) -> None:
    last = comm.size - 1
    odd = comm.rank == last
    call = dict(op="allreduce", axes=("mp",), dtype=np.float32, shape=(4, 8), extra=(), seq=7)
    if odd:
        call.update({"shape": dict(shape=(4, 9)), "op": dict(op="allgather", extra=(0,)),
                     "seq": dict(seq=8), "dtype": dict(dtype=np.float64)}[what])
    with pytest.raises(RuntimeMismatchError) as info:
        debug_calls.verify(comm, polite=False, **call)
    text = str(info.value)
    # With two ranks it is a tie: the lower rank's call is taken as intended.
    assert text.startswith(f"collectives diverge: rank {last} calls "), text
    assert "but rank 0 calls allreduce on ('mp',) float32 (4, 8) (seq 7)" in text
    assert all(comm.allgather(text == str(info.value)))


def _after_the_others_reported(comm, reported) -> None:
    """Rank 0 returns once every other rank of `comm` has sent `_REPORTED` (sleeping between polls, in no
    collective: what the others' watchdog must find); the others send it, then return."""
    if comm.rank != 0:
        reported.append(comm.isend(None, dest=0, tag=_REPORTED))
        return
    waiting = [comm.irecv(source=r, tag=_REPORTED) for r in range(1, comm.size)]
    while not all(request.test()[0] for request in waiting):  # done requests answer (True, None) again
        time.sleep(0.01)


_REPORTED = 31  # a point-to-point tag on the test's own communicator


def test_watchdog_names_the_collective_and_the_rank_that_is_missing(comm) -> None:
    debug.configure(watchdog=1.0)
    reported: list = []
    try:
        seen: list[str] = []
        if comm.rank == 0:
            # Late until the others' watchdog has fired (1 s) and asked where rank 0 is (0.5 s without an
            # answer), however long that takes on a loaded machine (a fixed sleep of 2 s raced it).
            _after_the_others_reported(comm, reported)
        request = comm.Ibarrier()
        debug_calls.wait(request, "barrier", ("x",), 3, polite=True, on_timeout=seen.append, comm=comm)
        if comm.rank != 0:
            _after_the_others_reported(comm, reported)
        request.Wait()
        for sent in reported:
            sent.wait()
    finally:
        debug.configure(watchdog=None)
    _drain(comm)
    if comm.rank != 0:
        waiting = _roster.ranks_text(list(range(1, comm.size)))
        assert seen == [f"[rank {_world().rank}] spmdsim: collective barrier on ('x',) (seq 3) "
                        f"did not complete within 1.0 s: {waiting} wait{'s' * (comm.size == 2)} in "
                        "it; rank 0 is in no collective: skipped this one (inside an `if` on the "
                        "rank?), or still computing, stuck or finished"]


def test_watchdog_names_where_a_rank_waits_instead(comm) -> None:
    from spmdsim.runtime import guard

    world = _world()
    guard._private(world)  # the side channel spanning the world (collective; kept, as in a guarded run)
    other = comm.Dup()
    last = comm.size - 1
    seen: list[str] = []
    debug.configure(watchdog=1.0)
    try:
        # The last rank waits on another communicator: each side times out and names the other.
        if comm.rank == last:
            first, then, call = other.Ibarrier(), comm.Ibarrier, ("allgather", ("y",), 4, other)
        else:
            first, then, call = comm.Ibarrier(), other.Ibarrier, ("barrier", ("x",), 3, comm)
        debug_calls.wait(first, *call[:3], polite=True, on_timeout=seen.append, comm=call[3])
        second = then()
        first.Wait()
        second.Wait()
    finally:
        debug.configure(watchdog=None)
    _drain(comm)
    other.Free()
    head = f"[rank {world.rank}] spmdsim: collective "
    if comm.rank == last:
        assert seen == [head + f"allgather on ('y',) (seq 4) did not complete within 1.0 s: rank "
                        f"{last} waits in it; {_roster.ranks_text(list(range(last)))} "
                        f"wait{'s' * (last == 1)} in barrier on ('x',) (seq 3) (held up elsewhere, "
                        "or collectives called in different orders)"]
    else:
        assert seen == [head + "barrier on ('x',) (seq 3) did not complete within 1.0 s: "
                        f"{_roster.ranks_text(list(range(last)))} wait{'s' * (last == 1)} in it; "
                        f"rank {last} waits in allgather on ('y',) (seq 4) (held up elsewhere, or "
                        "collectives called in different orders)"]


def _drain(comm) -> None:
    # Questions to a rank that never answered, late answers: dropped so no later test sees them.
    comm.Barrier()
    for side in {id(c): c for c in (_roster.channel(comm)[0], comm)}.values():
        _roster.drain(side)
    comm.Barrier()


def test_sequence_numbers_agree_after_collectives() -> None:
    from spmdsim import Layout
    from spmdsim.runtime import Mesh, allgather, allreduce

    world = _world()
    with Mesh(Layout((world.size,), ("x",)), world) as mesh:
        before = debug.current_seq()
        x = allreduce(mesh, np.ones(4), "x")
        allgather(mesh, x, "x", 0)
        counted = debug.current_seq() - before
        # Counts from here: a pipeline run earlier in the session left its stages at different totals.
        seqs = world.allgather(counted)
    assert counted in (0, 2)  # 0 until the collectives are hooked (see docs/explanation/reliability.md)
    assert len(set(seqs)) == 1


def test_operators_and_redistributions_pass_with_the_guard_and_watchdog_on() -> None:
    from spmdsim import Layout
    from spmdsim.tools.demo import jobs
    from spmdsim.tools.demo.registry import run_job
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor, Mesh

    world = _world()
    size = world.size
    debug.configure(check=True, watchdog=60)
    try:
        before = debug.current_seq()
        for job in (jobs.strategy_matmul_job(world, ((1, size), (size, 1)), (4, 2 * size, 6)),
                    jobs.mlp_job(world, (3, 5, 2 * size)),
                    jobs.embedding_job(world, "vocab", (2, 3, 2 * size, 4))):
            assert run_job(job, world).verdict.passed
        matrix = (2, size // 2) if size % 2 == 0 else (size, 1)
        with Mesh(Layout(matrix, ("a", "b")), world) as mesh:
            full = np.arange(4 * size * 6, dtype=np.float64).reshape(4 * size, 6)
            x = DTensor.from_global(mesh, full, mesh.layout(("a", "b"), None))
            y = redistribute(x, mesh.layout(("b", "a"), None))  # a general exchange (Alltoallv)
            assert np.array_equal(y.local, full[y.slices])
        assert debug.current_seq() - before >= 4
    finally:
        debug.configure(check=False, watchdog=None)


def test_alltoallv_counts_that_disagree_are_named_on_every_rank(comm) -> None:
    g = comm.size
    sends = np.full(g, 3, np.int64)
    receives = np.full(g, 3, np.int64)
    sends[comm.rank] = receives[comm.rank] = 0
    debug_calls.verify_counts(comm, sends, receives, 1, polite=True)  # consistent: passes
    if comm.rank == g - 1:
        receives[0] = 4
    with pytest.raises(RuntimeMismatchError) as info:
        debug_calls.verify_counts(comm, sends, receives, 2, polite=True)
    assert str(info.value) == (f"alltoallv counts disagree (seq 2): rank 0 sends 3 elements to "
                               f"rank {g - 1}, which expects 4")


def test_guard_catches_operands_whose_global_shape_differs_on_one_rank() -> None:
    # K = 16 on every rank but the last, 32 there: each collective's buffer is (4, 8)
    # everywhere, so only the operands show the bug (before: a silently wrong result).
    from spmdsim import Layout, SeededTensor
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor, Mesh

    world = _world()
    size = world.size
    last = world.rank == size - 1
    k = 32 if last else 16
    with Mesh(Layout((size,), ("mp",)), world) as mesh:
        x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, k * size), seed=1))
        w = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((k * size, 8), seed=2))
        debug.configure(check=True)
        try:
            with pytest.raises(RuntimeMismatchError) as info:
                matmul(x, w)
            text = str(info.value)
            # The odd rank out is named (with two ranks the tie goes to rank 0's call).
            assert text.startswith(f"collectives diverge: rank {size - 1} calls matmul operands"), text
            assert f"x (4, {32 * size})" in text and "but rank 0 calls matmul operands" in text, text
            assert f"x (4, {16 * size})" in text, text
            # The same operands agree: the guard passes them, and the product is right.
            y = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16 * size), seed=1))
            v = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((16 * size, 8), seed=2))
            out = matmul(y, v)
            assert np.allclose(out.local, SeededTensor((4, 16 * size), seed=1).full()
                               @ SeededTensor((16 * size, 8), seed=2).full(), rtol=1e-5, atol=1e-5)
            # A redistribution whose target differs on one rank is caught the same way.
            target = mesh.layout(None, None) if last else mesh.layout("mp", None)
            with pytest.raises(RuntimeMismatchError, match="redistribute operands"):
                redistribute(y, target)
        finally:
            debug.configure(check=False)
