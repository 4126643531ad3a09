"""runtime.shared_groups: under MPI the meshes over one communicator share a group of the same ranks (built once,
freed by the last mesh that closes); MPI running out of communicators is one line. The MPI side:
tests/mpi/test_runtime_mesh.py."""
from __future__ import annotations

import types

import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.runtime.shared_groups import SharedGroups


class _Parent:
    """A communicator stand-in (weakly referable)."""


def _mesh(parent, members, freed):
    engine = types.SimpleNamespace(name="mpi", free=freed.append)
    return types.SimpleNamespace(engine=engine, comm=parent, group_ranks=lambda axes: members,
                                 layout=types.SimpleNamespace(device_matrix=(4,)))


def test_a_group_is_built_once_per_members_and_freed_by_its_last_user():
    groups, parent, freed, built = SharedGroups(), _Parent(), [], []

    def build():
        built.append(1)
        return (f"comm{len(built)}", 4, 0)

    a, b = _mesh(parent, (0, 1, 2, 3), freed), _mesh(parent, (0, 1, 2, 3), freed)
    other = _mesh(parent, (0, 2), freed)
    first = groups.take(a, ("x",), build)
    assert groups.take(b, ("y",), build) is first and len(built) == 1
    assert groups.take(other, ("x",), build) == ("comm2", 4, 0)  # other members: its own
    groups.give_back(a, ("x",), first)
    assert freed == []
    groups.give_back(b, ("y",), first)
    assert freed == ["comm1"]
    assert groups.take(a, ("x",), build) == ("comm3", 4, 0)  # built again once freed
    assert groups.take(_mesh(_Parent(), (0, 1, 2, 3), freed), ("x",), build) == ("comm4", 4, 0)  # another parent


def test_simulated_ranks_build_their_groups_each_time():
    groups, freed = SharedGroups(), []
    mesh = _mesh(_Parent(), (0, 1), freed)
    mesh.engine.name = "threads"
    one, two = (groups.take(mesh, ("x",), lambda: (object(), 2, 0)) for _ in range(2))
    assert one is not two
    groups.give_back(mesh, ("x",), one)
    assert freed == [one[0]]


def test_running_out_of_communicators_is_one_line():
    def build():
        raise RuntimeError("Other MPI error, error stack: ... Too many communicators (0/2048 free on this process)")

    with pytest.raises(SpmdsimError) as caught:
        SharedGroups().take(_mesh(_Parent(), (0, 1), []), ("x",), build)
    assert str(caught.value) == ("MPI has no communicator left for a group of mesh (4,) (MPICH gives a process 2,048): "
                                 "close each Mesh you are done with (mesh.close(), or `with Mesh(...) as mesh:`)")

    def fails():
        raise RuntimeError("another")

    with pytest.raises(RuntimeError, match="another"):  # another error as it was
        SharedGroups().take(_mesh(_Parent(), (0, 1), []), ("x",), fails)
