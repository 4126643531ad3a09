"""The process's compiled redistributions, per mesh: `PROGRAMS` (meshes of other layouts made for a
mesh) and `_MOVES` (runtime.executor's compiled moves), dropped with their mesh (Mesh.close, or its
weak reference's callback). Below both the executor and the mesh: a mesh forgets its programs here."""
from __future__ import annotations

import weakref
from typing import Any
from ..base.tables import put

__all__ = ["ProgramCache", "PROGRAMS", "keep_move"]


class ProgramCache:
    """Meshes of other layouts, per mesh, and the registry that drops a mesh's compiled redistributions
    (`_MOVES`) with the mesh.

    A repeated redistribution finds its program in one lookup, with no set-up before the MPI
    calls (at 8 ranks on 2 cores that set-up showed as 10-20% of a 2 MiB step).
    """

    def __init__(self) -> None:
        # id(mesh) -> (a weak reference to it, its table): one lookup by an int for every rank's mesh (the
        # simulated ranks' threads share this cache, so a "last mesh" shortcut missed on every call and a
        # WeakKeyDictionary made a weak reference per lookup). The entry goes with its mesh, and the
        # mesh's redistributions in `_MOVES` with it.
        self._by_id: dict[int, tuple[Any, dict]] = {}

    def of(self, mesh: Any) -> dict:
        """The programs of `mesh` (a new empty table the first time)."""
        key = id(mesh)
        seen = self._by_id.get(key)
        if seen is not None and seen[0]() is mesh:
            return seen[1]
        table: dict = {}
        by_id = self._by_id
        forget_moves = _forget_moves  # (held: see _forget_moves)

        def dropped(ref: Any) -> None:  # the mesh is gone: its entry too (unless a new mesh took its id)
            entry = by_id.get(key)
            if entry is not None and entry[0] is ref:
                by_id.pop(key, None)
            forget_moves(key)  # before a new mesh can take its id

        by_id[key] = (weakref.ref(mesh, dropped), table)
        return table

    def forget(self, mesh: Any) -> None:
        """Drop `mesh`'s programs (Mesh.close: its communicators are freed)."""
        seen = self._by_id.get(id(mesh))
        if seen is not None and seen[0]() is mesh:
            self._by_id.pop(id(mesh), None)
        _forget_moves(id(mesh))


#: The process's compiled redistributions.
PROGRAMS = ProgramCache()

# Every mesh's compiled redistributions in one table, for one lookup a move: (id(mesh), id(source layout),
# id(target layout), shape, dtype) -> (source, target, program, its node's name and read layouts (`move_name`),
# then `_direct`'s six fields), one flat tuple that `redistribute` unpacks once. Keyed by ids (tuples of ints
# hash and compare in C, where TensorLayout keys call its Python __hash__ and __eq__): the entry holds both
# layouts, so their ids are never another object's while it lives, and a mesh's entries go when the mesh does
# (ProgramCache: its weak reference's callback, or Mesh.close's `forget`), before another mesh can take its id.
# A plan the caller gives is kept here too, under (id(mesh), "given", id(plan), id(source), id(target), shape,
# the tensor's class) -> (plan, source, target, program).
_MOVES: dict = {}


def _forget_moves(mesh_id: int, moves: dict = _MOVES) -> None:
    """Drop the compiled redistributions of the mesh whose id is `mesh_id` (`moves` bound here: a mesh that
    goes at the interpreter's exit may find this module's globals cleared)."""
    for key in list(moves):  # (a copy: the simulated ranks' threads add moves meanwhile)
        if key[0] == mesh_id:
            moves.pop(key, None)


def keep_move(mesh: Any, key: tuple, entry: tuple) -> tuple:
    """Keep `entry` in `_MOVES` under `key` (whose first field is id(mesh)) and return it: `mesh` registered in
    `PROGRAMS`, so that its moves go with it; a full table (a long run over many layouts) starts over."""
    PROGRAMS.of(mesh)
    put(_MOVES, key, entry, 4096)
    return entry
