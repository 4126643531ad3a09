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
