"""The sub-communicators the meshes over one MPI communicator share (`GROUPS`).

A mesh builds a group over some of its axes with MPI_Comm_create_group (collective over the group's members,
spmdsim.runtime.engines.mpi) the first time a collective needs it. Under MPI a group of the same ranks of the
same communicator, in the same order, is built once and serves every mesh that asks for it; the last mesh
using it frees it when it closes. MPICH gives a process 2,048 communicators, so a program that made a Mesh in
a loop and never closed it (a mesh per call of a helper, a notebook's cell run again and again) ended after
about 2,000 meshes in MPICH's "Too many communicators" error; such meshes now share their groups, and a
program that keeps that many different groups open is told in one line to close the meshes it is done with.

Every rank of an SPMD program makes the same meshes and closes them alike, so a group is found, built or
freed on all of its members alike. Simulated ranks and dry runs build a mesh's groups for it alone (they have
no such limit). Below the mesh: a mesh asks `GROUPS` for its groups and gives them back.
"""
from __future__ import annotations

from typing import Any, Callable

from ..base.tables import found_table, owned_table
from ..errors import SpmdsimError

__all__ = ["SharedGroups", "GROUPS"]


class SharedGroups:
    """MPI sub-communicators by parent communicator and members: (group, size, rank) and how many meshes use it."""

    def __init__(self) -> None:
        # id(parent comm) -> (a weak reference to it, {members: [(comm, size, rank), meshes using it]}): the table
        # goes with its parent (a new communicator that takes its id finds its own)
        self._by_parent: dict[int, tuple[Any, dict]] = {}

    def take(self, mesh: Any, axes: tuple, build: Callable[[], tuple]) -> tuple:
        """`mesh`'s group over `axes`: one another mesh over the same communicator built of the same ranks in
        the same order, else `build()`'s (collective over its members)."""
        if mesh.engine.name != "mpi":
            return build()
        table = owned_table(self._by_parent, mesh.comm)
        members = mesh.group_ranks(axes)
        entry = table.get(members)
        if entry is None:
            entry = table[members] = [_built(build, mesh), 0]
        entry[1] += 1
        return entry[0]

    def give_back(self, mesh: Any, axes: tuple, info: tuple) -> None:
        """`mesh` no longer uses its group `info` over `axes`: freed where no other mesh does (collective over the
        group, as its build was)."""
        table = (found_table(self._by_parent, mesh.comm) if mesh.engine.name == "mpi" else None) or {}
        members = mesh.group_ranks(axes)
        entry = table.get(members)
        if entry is None or entry[0] is not info:  # (a group built for this mesh alone)
            mesh.engine.free(info[0])
            return
        entry[1] -= 1
        if entry[1] == 0:
            del table[members]
            mesh.engine.free(info[0])


def _built(build: Callable[[], tuple], mesh: Any) -> tuple:
    """`build()`, MPI's running out of communicators said in one line (every rank of an SPMD program builds
    the same groups, so each runs out at the same build)."""
    try:
        return build()
    except Exception as exc:
        if "Too many communicators" not in str(exc):
            raise
        raise SpmdsimError(f"MPI has no communicator left for a group of mesh {mesh.layout.device_matrix!r} "
                           "(MPICH gives a process 2,048): close each Mesh you are done with (mesh.close(), or "
                           "`with Mesh(...) as mesh:`)") from None


#: The process's shared groups.
GROUPS = SharedGroups()
