"""The process's compiled redistributions, per mesh: `PROGRAMS` (meshes of other layouts made for a
mesh), dropped with their mesh (Mesh.close, or its weak reference's callback), and `keep_move`, which keeps
runtime.executor's compiled moves in the mesh's own table (`Mesh._moves`), so that they go with it. Below both
the executor and the mesh: a mesh forgets its programs here."""
from __future__ import annotations

from typing import Any

from ..base.tables import found_table, owned_table, put

__all__ = ["ProgramCache", "PROGRAMS", "keep_move"]


class ProgramCache:
    """Meshes of other layouts, per mesh, dropped with the mesh.

    A repeated redistribution finds its program in one lookup, with no set-up before the MPI
    calls (at 8 ranks on 2 cores that set-up showed as 10-20% of a 2 MiB step).
    """

    def __init__(self) -> None:
        # id(mesh) -> (a weak reference to it, its table): one lookup by an int for every rank's mesh (the
        # simulated ranks' threads share this cache, so a "last mesh" shortcut missed on every call and a
        # WeakKeyDictionary made a weak reference per lookup). The entry goes with its mesh.
        self._by_id: dict[int, tuple[Any, dict]] = {}

    def of(self, mesh: Any) -> dict:
        """The programs of `mesh` (a new empty table the first time)."""
        return owned_table(self._by_id, mesh)

    def forget(self, mesh: Any) -> None:
        """Drop `mesh`'s programs (Mesh.close: its communicators are freed)."""
        if found_table(self._by_id, mesh) is not None:
            self._by_id.pop(id(mesh), None)


#: The process's compiled redistributions.
PROGRAMS = ProgramCache()

#: The most compiled moves a mesh keeps (`keep_move`): a long run over many layouts starts its table over.
MOVES_KEPT = 4096


def keep_move(mesh: Any, key: tuple, entry: tuple) -> tuple:
    """Keep `entry` in `mesh`'s compiled redistributions (`Mesh._moves`) under `key` and return it.

    The table: (id(source layout), id(target layout), shape, dtype) -> (source, target, program, its node's name
    and read layouts (`move_name`), then `_direct`'s six fields), one flat tuple that runtime.executor's
    `redistribute` unpacks once; a plan the caller gives under ("given", id(plan), id(source), id(target), shape,
    the tensor's class) -> (plan, source, target, program). Keyed by ids (tuples of ints hash and compare in C,
    where TensorLayout keys call its Python __hash__ and __eq__): the entry holds the layouts, so their ids are
    never another object's while it lives. On the mesh, not in a table of the process: a program holds its
    mesh, so a process-wide table kept every mesh a program was compiled for, with its communicators and
    scratch buffers (a notebook's every `simulate` run: about 100 KB and 300 objects a run of 4 ranks that
    move one tensor), where now the mesh and its moves go together (or with Mesh.close)."""
    put(mesh._moves, key, entry, MOVES_KEPT)
    return entry
