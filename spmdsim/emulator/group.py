"""SimGroup: an MPI group of simulated ranks (mpi4py's Group API on world ranks, no MPI)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..runtime.sim._buffers import int_array
from ..runtime.sim._mpi import c_int, mpi_error, mpi_module, special

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
    """An ordered set of world ranks as seen from world rank `me` (made by SimComm.Get_group).

    As an MPI handle: ``SimGroup()`` is null (falsy, equal to MPI.GROUP_NULL); copies made with
    ``MPI.Group(group)`` share the handle (equal), every new group has its own (two Incl of the same
    ranks differ, as in MPICH), and an empty result is MPI.GROUP_EMPTY's handle (equal to it). The
    real MPI.GROUP_EMPTY and MPI.GROUP_NULL are taken wherever a group is.
    """

    def __init__(self, members: Any = None, me: Optional[int] = None, handle: Any = None) -> None:
        if isinstance(members, SimGroup):  # MPI.Group(group): a copy, one handle
            members, me, handle = members._members, members._me, members._handle
        elif members is not None and not isinstance(members, (tuple, list, range)):
            members, me, handle = _from_real(members)
        self._members: Optional[tuple] = None if members is None else tuple(int(m) for m in members)
        self._me = me
        self._handle = handle if handle is not None else (_EMPTY if self._members == () else object())

    def _new(self, members: Sequence[int]) -> "SimGroup":
        return SimGroup(list(members), self._me)

    def _live(self) -> "SimGroup":
        """This group, refused as MPI refuses a null group (MPI.Exception ERR_GROUP)."""
        if self._members is None:
            mpi = mpi_module()
            if mpi is not None:
                raise mpi_error(mpi, mpi.ERR_GROUP, "the group is MPI.GROUP_NULL (freed or never made)")
            raise ValueError("the group is null (freed or never made)")
        return self

    def Get_size(self) -> int:
        return len(_sim(self)._live()._members)

    def Get_rank(self) -> int:
        members = _sim(self)._live()._members
        return members.index(self._me) if self._me in members else special("UNDEFINED")

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks: Optional[Sequence[int]] = None, group: Optional["SimGroup"] = None) -> list:
        """Where ranks of this group are in `group` (MPI.UNDEFINED if absent; None: all ranks)."""
        members = _sim(self)._live()._members
        ranks = range(len(members)) if ranks is None else _ranks(ranks, len(members), "Translate_ranks", True)
        there = None if group is None else _sim(group)._live()._members
        out = []
        for r in ranks:
            if r == special("PROC_NULL"):
                out.append(r)
                continue
            world_rank = members[r]
            if there is None:
                out.append(world_rank)
            else:
                out.append(there.index(world_rank) if world_rank in there else special("UNDEFINED"))
        return out

    def Compare(self, group: "SimGroup") -> int:
        """MPI.IDENT (same ranks, same order), MPI.SIMILAR (same ranks) or MPI.UNEQUAL."""
        mine, theirs = _sim(self)._live()._members, _sim(group)._live()._members
        if mine == theirs:
            return special("IDENT")
        if set(mine) == set(theirs):
            return special("SIMILAR")
        return special("UNEQUAL")

    def Incl(self, ranks: Sequence[int]) -> "SimGroup":
        group = _sim(self)._live()
        return group._new([group._members[r] for r in _ranks(ranks, len(group._members), "Incl")])

    def Excl(self, ranks: Sequence[int]) -> "SimGroup":
        group = _sim(self)._live()
        drop = set(_ranks(ranks, len(group._members), "Excl"))
        return group._new([m for i, m in enumerate(group._members) if i not in drop])

    def Range_incl(self, ranges: Sequence[tuple]) -> "SimGroup":
        return SimGroup.Incl(self, _ranged(ranges, _sim(self)._live().size, "Range_incl"))

    def Range_excl(self, ranges: Sequence[tuple]) -> "SimGroup":
        return SimGroup.Excl(self, _ranged(ranges, _sim(self)._live().size, "Range_excl"))

    # mpi4py's set operations are class methods: MPI.Group.Union(group1, group2)
    @classmethod
    def Union(cls, group1: "SimGroup", group2: "SimGroup") -> "SimGroup":
        a, b = _pair(group1, group2)
        return a._new(list(a._members) + [m for m in b._members if m not in a._members])

    @classmethod
    def Intersection(cls, group1: "SimGroup", group2: "SimGroup") -> "SimGroup":
        a, b = _pair(group1, group2)
        return a._new([m for m in a._members if m in b._members])

    @classmethod
    def Difference(cls, group1: "SimGroup", group2: "SimGroup") -> "SimGroup":
        a, b = _pair(group1, group2)
        return a._new([m for m in a._members if m not in b._members])

    def Dup(self) -> "SimGroup":
        group = _sim(self)._live()
        return group._new(group._members)

    def Free(self) -> None:
        if isinstance(self, SimGroup) and self._handle is not _EMPTY:  # GROUP_EMPTY's handle stays
            self._members = None

    free = Free

    def __bool__(self) -> bool:
        return self._members is not None

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SimGroup):
            return self._handle is other._handle if self._members is not None else other._members is None
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.__dict__["Group"]):  # the class itself, also swapped
            if other == mpi.GROUP_NULL:
                return self._members is None
            if other == mpi.GROUP_EMPTY:
                return self._members is not None and self._handle is _EMPTY
            return False
        return NotImplemented

    def __ne__(self, other: Any) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = object.__hash__

    def __reduce__(self) -> Any:
        """Only null and empty groups pickle (as mpi4py's: a copy, equal), others raise ValueError."""
        if self._members is None:
            return (SimGroup, ())
        if self._handle is _EMPTY:
            return (SimGroup, ((),))
        raise ValueError("cannot serialize 'mpi4py.MPI.Group' instance")

    def __repr__(self) -> str:
        return f"<simulated Group {self._members!r}>"


_EMPTY = object()  # the handle of every empty group: MPI.GROUP_EMPTY's


def _ranks(ranks: Any, size: int, call: str, proc_null: bool = False) -> list:
    """`ranks` of a group of `size` as mpi4py and MPICH take them: each an integer (operator.index: a float
    is mpi4py's TypeError), each a rank of the group (MPI.PROC_NULL too where `proc_null`), else
    MPI.Exception (MPI.ERR_RANK), as MPICH raises."""
    ranks = int_array(ranks)
    null = special("PROC_NULL") if proc_null else None
    bad = [r for r in ranks if not 0 <= r < size and r != null]
    if bad:
        raise _refused("ERR_RANK", f"{call}: rank {bad[0]!r} is not in a group of {size}")
    return ranks


def _ranged(ranges: Sequence[tuple], size: int, call: str) -> list:
    """The ranks of (first, last, stride) triples, each number a C int as mpi4py takes it (a float truncated:
    mpi4py's Range_incl takes (0.0, 2.0, 1)); a stride of 0 or a range leaving the group's `size` ranks is
    MPI.Exception (MPI.ERR_ARG), as MPICH raises."""
    out = []
    for triple in ranges:
        first, last, stride = (c_int(v, f"{call} range {triple!r}") for v in triple)
        if stride == 0 or not (0 <= first < size and 0 <= last < size):
            raise _refused("ERR_ARG", f"{call}: range {triple!r} of a group of {size}")
        out += range(first, last + (1 if stride > 0 else -1), stride)
    return out


def _refused(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) that goes on with `text`, as MPICH raises it; a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi_error(mpi, getattr(mpi, code), text) if mpi is not None else ValueError(text)


def _from_real(group: Any) -> tuple:
    """(members, me, handle) of mpi4py's own MPI.GROUP_EMPTY or MPI.GROUP_NULL (no other real group
    reaches a simulated rank)."""
    mpi = mpi_module()
    if mpi is not None and isinstance(group, mpi.__dict__["Group"]):
        if group == mpi.GROUP_NULL:
            return None, None, None
        if group == mpi.GROUP_EMPTY:
            return (), None, _EMPTY
    raise TypeError(f"expected a Group, got {type(group).__name__}")


def _sim(group: Any) -> SimGroup:
    """`group` as a SimGroup (mpi4py's MPI.GROUP_EMPTY and MPI.GROUP_NULL included)."""
    return group if isinstance(group, SimGroup) else SimGroup(*_from_real(group))


def _pair(group1: Any, group2: Any) -> tuple:
    a, b = _sim(group1)._live(), _sim(group2)._live()
    if a._me is None:  # the empty group knows no caller: the other one does
        a = SimGroup(a._members, b._me, a._handle)
    return a, b


speak_mpi4py(SimGroup, "Group")
