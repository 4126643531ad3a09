"""SimGroup: an MPI group of simulated ranks (mpi4py's Group API on world ranks, no MPI)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..sim._buffers import mpi_module, special

__all__ = ["SimGroup", "speak_mpi4py"]


def speak_mpi4py(cls: type, name: str) -> None:
    """Python's errors about `cls`'s objects name mpi4py's class `name`, as mpi4py's do: "'Intracomm'
    object has no attribute 'Sendd'", "Intracomm.Send() missing 2 required positional arguments"
    (not SimComm, PointToPoint.Send). Its own qualified name stays (pickle, docs); once, at import."""
    cls.__name__ = name
    for owner in cls.__mro__[:-1]:  # its own methods and its mixins', up to a base already named
        if owner is not cls and owner.__name__ != owner.__qualname__:
            break
        for attr, value in vars(owner).items():
            func = getattr(value, "__func__", value)
            if not attr.startswith("_") and callable(func) and hasattr(func, "__code__"):
                func.__qualname__ = f"{name}.{func.__name__}"  # an alias (Rsend = Send): its def


class SimGroup:
    """An ordered set of world ranks as seen from world rank `me` (made by SimComm.Get_group)."""

    def __init__(self, members: Any = (), me: Optional[int] = None) -> None:
        if isinstance(members, SimGroup):  # MPI.Group(group): a copy
            members, me = members._members, members._me
        self._members: Optional[tuple] = tuple(int(m) for m in members)
        self._me = me

    def _new(self, members: Sequence[int]) -> "SimGroup":
        return SimGroup(members, self._me)

    def Get_size(self) -> int:
        return len(self._members) if self._members is not None else special("UNDEFINED")

    def Get_rank(self) -> int:
        members = self._members or ()
        return members.index(self._me) if self._me in members else special("UNDEFINED")

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks: Optional[Sequence[int]] = None, group: Optional["SimGroup"] = None) -> list:
        """Where ranks of this group are in `group` (MPI.UNDEFINED if absent; None: all ranks)."""
        ranks = range(len(self._members)) if ranks is None else ranks
        out = []
        for r in ranks:
            if r == special("PROC_NULL"):
                out.append(r)
                continue
            world_rank = self._members[r]
            if group is None:
                out.append(world_rank)
            else:
                out.append(group._members.index(world_rank) if world_rank in group._members
                           else special("UNDEFINED"))
        return out

    def Compare(self, group: "SimGroup") -> int:
        """MPI.IDENT (same ranks, same order), MPI.SIMILAR (same ranks) or MPI.UNEQUAL."""
        if self._members == group._members:
            return special("IDENT")
        if set(self._members) == set(group._members):
            return special("SIMILAR")
        return special("UNEQUAL")

    def Incl(self, ranks: Sequence[int]) -> "SimGroup":
        return self._new([self._members[r] for r in ranks])

    def Excl(self, ranks: Sequence[int]) -> "SimGroup":
        drop = set(ranks)
        return self._new([m for i, m in enumerate(self._members) if i not in drop])

    def Range_incl(self, ranges: Sequence[tuple]) -> "SimGroup":
        return self.Incl([r for first, last, stride in ranges for r in range(first, last + (1 if stride > 0 else -1),
                                                                               stride)])

    def Range_excl(self, ranges: Sequence[tuple]) -> "SimGroup":
        return self.Excl([r for first, last, stride in ranges for r in range(first, last + (1 if stride > 0 else -1),
                                                                               stride)])

    def Union(self, group: "SimGroup") -> "SimGroup":
        return self._new(list(self._members) + [m for m in group._members if m not in self._members])

    def Intersection(self, group: "SimGroup") -> "SimGroup":
        return self._new([m for m in self._members if m in group._members])

    def Difference(self, group: "SimGroup") -> "SimGroup":
        return self._new([m for m in self._members if m not in group._members])

    def Dup(self) -> "SimGroup":
        return self._new(self._members)

    def Free(self) -> None:
        self._members = None

    def __bool__(self) -> bool:
        return self._members is not None

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SimGroup):
            return self._members == other._members
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.__dict__["Group"]):  # the class itself, also swapped
            if other == mpi.GROUP_NULL:
                return self._members is None
            if other == mpi.GROUP_EMPTY:
                return self._members == ()
            return False
        return NotImplemented

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<simulated Group {self._members!r}>"


speak_mpi4py(SimGroup, "Group")
