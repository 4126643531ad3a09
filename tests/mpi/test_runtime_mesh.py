"""Mesh: size check and axis sub-communicators (membership and mixed-radix order)."""
from __future__ import annotations

import itertools

import pytest
from mpi4py import MPI

from spmdsim import Layout, RuntimeMismatchError
from spmdsim.runtime import Mesh

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
MESHES = {
    8: [((2, 4), ("dp", "mp")), ((2, 2, 2), ("dp", "sp", "mp")), ((8,), ("x",)), ((4, 1, 2), ("a", "b", "c"))],
    4: [((2, 2), ("dp", "mp")), ((4,), ("x",)), ((4, 1), ("a", "b")), ((2, 1, 2), ("a", "b", "c"))],
}


def _meshes():
    return MESHES.get(WORLD.size, [((WORLD.size,), ("x",))])


def _axis_groups(names):
    for k in range(1, len(names) + 1):
        yield from itertools.permutations(names, k)


@pytest.mark.parametrize("index", range(4))
def test_every_axis_group_has_the_layout_members_in_order(index):
    meshes = _meshes()
    if index >= len(meshes):
        pytest.skip("fewer meshes at this world size")
    layout = Layout(*meshes[index])
    wait = ("busy", "polite")[index % 2]
    with Mesh(layout, wait=wait) as mesh:
        assert (mesh.rank, mesh.size, mesh.coords) == (WORLD.rank, WORLD.size, layout.coords(WORLD.rank))
        assert mesh.wait_mode == wait
        for axes in _axis_groups(layout.alias_name):
            group = mesh.group(axes)
            assert mesh.group(axes) is group  # cached
            members = group.allgather(mesh.rank)
            expected = [g for g in layout.axis_groups(axes) if mesh.rank in g]
            assert tuple(members) == expected[0] == mesh.group_ranks(axes), axes
            assert group.Get_rank() == layout.group_index(mesh.rank, axes)


def test_mesh_on_sub_communicator_and_size_mismatch():
    half = WORLD.Split(WORLD.rank % 2, WORLD.rank)
    try:
        with Mesh(Layout((half.size,), ("x",)), half) as mesh:
            assert mesh.group("x").allgather(WORLD.rank) == [r for r in range(WORLD.size) if r % 2 == WORLD.rank % 2]
    finally:
        half.Free()
    with pytest.raises(RuntimeMismatchError,
                       match=rf"needs {2 * WORLD.size} ranks but the communicator has {WORLD.size}"):
        Mesh(Layout((2, WORLD.size), ("a", "b")))


def test_mesh_over_comm_self_short_circuits():
    from spmdsim.runtime import collectives as C
    import numpy as np

    mesh = Mesh(Layout((1,), ("x",)), MPI.COMM_SELF)
    x = np.arange(6.0).reshape(2, 3)
    assert C.allgather(mesh, x, "x", 1) is x
    assert C.allreduce(mesh, x, "x") is x
    assert mesh.wait_mode == "busy"


def test_meshes_over_one_communicator_share_their_groups_and_the_last_close_frees_them():
    """Two meshes of the same ranks build a group once (runtime.shared_groups); the first close leaves it to the
    other, which still runs collectives on it; the last close frees it. (Over a communicator of their own: a mesh
    an earlier test left unclosed over the world would share the group too.)"""
    comm = WORLD.Dup()
    first, second = (Mesh(Layout((WORLD.size,), ("x",)), comm) for _ in range(2))
    other = Mesh(Layout((WORLD.size, 1), ("a", "b")), comm)  # another layout, the same ranks in the same order
    group = first.group("x")
    assert second.group("x") is group and other.group("a") is group and group != MPI.COMM_NULL
    first.close()
    assert second.group("x").allreduce(1) == WORLD.size  # still the other meshes'
    second.close()
    other.close()
    assert group == MPI.COMM_NULL  # freed by the last
    comm.Free()


def test_a_mesh_made_in_a_loop_and_never_closed_does_not_run_out_of_communicators():
    """MPICH gives a process 2,048 communicators: a mesh made per iteration and left unclosed (each building its
    group) ended after about 2,000 in MPICH's "Too many communicators"; they share one group now."""
    for _ in range(2100):
        mesh = Mesh(Layout((WORLD.size,), ("x",)))
        assert mesh.group("x").Get_size() == WORLD.size
    mesh.close()
