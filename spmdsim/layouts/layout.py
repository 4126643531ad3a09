"""Device matrices and tensor layouts: who holds which slice of a global tensor.

Pure Python; never imports mpi4py. Semantics (docs/explanation/semantics.md):

* ranks are numbered row-major over the device matrix (last axis fastest);
* a tensor map entry names the mesh axes a tensor dim is split over; with
  several axes the first listed is major (shard = i_a * |b| + i_b for (a, b));
* mesh axes named nowhere are replicated; partial axes hold pending sums.

A Layout's rank arithmetic is in spmdsim.layouts.rank_groups, a TensorLayout's shapes and holdings in
spmdsim.layouts.shards, the reading and printing of tensor-map entries in spmdsim.layouts.notation.
"""
from __future__ import annotations

import math
from dataclasses import InitVar, dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Optional, Sequence

from ..errors import LayoutError
from .notation import (DIALECT_FUNCTIONS, MapEntry, dialect_hint, format_tensor_map, normalize_entry,
                       numbered_map_by_name)
from .rank_groups import RankGroups
from .shards import TensorShards
from .slicing import CUTS
from ..base.validate import as_int, counted

__all__ = ["Layout", "TensorLayout", "default_axis_names"]


#: MindSpore's virtual axis name for micro-interleaving, refused by Layout (docs/reference/dialects.md,
#: "Not supported").
INTERLEAVED = "interleaved_parallel"


def default_axis_names(count: int) -> tuple[str, ...]:
    """The mesh axis names every entry point uses when none are given: ``axis_0, axis_1, ...``."""
    return tuple(f"axis_{i}" for i in range(count))


def _kept_hash(fields: Callable[[Any], tuple]) -> Callable[[Any], int]:
    """A frozen class's __hash__ that hashes `fields(self)` once and keeps it in the instance (``_hash``): hashing
    the nested tuples cost ~0.4 us a lookup, and layouts key every plan, program and mesh table. The kept hash is
    left out of pickles (each class's __getstate__): str hashes differ between processes."""

    def __hash__(self: Any) -> int:
        try:
            return self.__dict__["_hash"]
        except KeyError:
            value = hash(fields(self))
            object.__setattr__(self, "_hash", value)
            return value

    return __hash__


def _check_rank_list(rank_list: object, matrix: tuple[int, ...]) -> None:
    """Accept MindSpore's ``rank_list`` where it says what spmdsim does: the ranks 0..n-1 in order (its default,
    the device matrix numbered row-major); refuse any other list in one line saying why."""
    devices = math.prod(matrix)
    try:
        items = None if isinstance(rank_list, (str, bytes, dict, set)) else list(rank_list)  # type: ignore
    except TypeError:
        items = None
    ranks = None if items is None else [as_int(r) for r in items]
    if ranks is None or any(r is None for r in ranks):
        raise LayoutError(f"rank_list {rank_list!r} must be a list of integer ranks, one per device of "
                          f"device_matrix {matrix!r}, such as list(range({devices}))")
    shown = repr(items) if len(ranks) <= 16 else f"[{', '.join(map(str, ranks[:8]))}, ...]"
    if len(ranks) != devices:
        raise LayoutError(f"rank_list {shown} gives {counted(len(ranks), 'rank')} but device_matrix {matrix!r} has "
                          f"{counted(devices, 'device')}; expected one rank per device")
    if ranks != list(range(devices)):
        raise LayoutError(f"rank_list {shown} puts the devices on other ranks than 0..{devices - 1} in order, "
                          "which spmdsim does not model: it numbers a device matrix's ranks row-major from 0 (the "
                          f"last axis fastest); expected list(range({devices})) or no rank_list")


@dataclass(frozen=True)
class Layout(RankGroups):
    """A named device matrix, e.g. ``Layout((2, 4), ("dp", "mp"))``.

    Calling it with a tensor map gives a TensorLayout:
    ``Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))``.
    `cut` is the rule that cuts every tensor dim split over this device matrix
    (spmdsim.layouts.slicing): "even" (the default; sizes must divide), "chunk" (DTensor's,
    torch.chunk's) or "balanced" (sizes differ by at most one).
    `rank_list` is MindSpore's: accepted as its default, the ranks ``0..n-1`` in order (also as MindSpore's
    third positional argument, ``Layout((2, 4), ("dp", "mp"), list(range(8)))``); other lists are refused.
    """

    device_matrix: tuple[int, ...]
    alias_name: tuple[str, ...]
    cut: str = "even"
    rank_list: InitVar[Optional[Sequence[int]]] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "Layout":
        if "name" in kwargs:  # MindSpore's tutorial prose writes Layout((2, 2, 2), name=("dp", "sp", "mp"))
            matrix = args[0] if args else kwargs.get("device_matrix", (2, 4))
            raise LayoutError(f"Layout(name={kwargs['name']!r}): MindSpore's Layout, as spmdsim's, takes the axes' "
                              "names as alias_name (no name keyword); expected Layout(device_matrix, alias_name), "
                              f"e.g. Layout({matrix!r}, {kwargs['name']!r})")
        return super().__new__(cls)

    def __post_init__(self, rank_list: Optional[Sequence[int]] = None) -> None:
        # A bare string is not a sequence of names here: "ab" would become axes 'a' and 'b'.
        for what, value in (("device_matrix", self.device_matrix), ("alias_name", self.alias_name)):
            if isinstance(value, (str, bytes)):
                raise LayoutError(f"{what} {value!r} must be a sequence, not one string; e.g. "
                                  "Layout((2, 4), ('dp', 'mp'))")
        try:
            matrix = tuple(self.device_matrix)
            names = tuple(self.alias_name)
        except TypeError:
            raise LayoutError(f"device_matrix {self.device_matrix!r} and alias_name {self.alias_name!r} "
                              "must be sequences") from None
        if not matrix:
            raise LayoutError("device_matrix must have at least one axis, got ()")
        sizes = tuple(as_int(size) for size in matrix)  # numpy integers too, as the dialects take
        for size, n in zip(matrix, sizes):
            if n is None or n <= 0:
                raise LayoutError(f"device_matrix {matrix!r} must hold positive integers, got {size!r}")
        matrix = sizes
        if len(names) != len(matrix):
            raise LayoutError(f"alias_name {names!r} has {counted(len(names), 'name')} but device_matrix "
                              f"{matrix!r} has {counted(len(matrix), 'axis')}; expected one name per axis")
        for name in names:
            if not isinstance(name, str) or not name or name == "None":
                raise LayoutError(f"alias name {name!r} must be a non-empty string other than 'None'")
        if len(set(names)) != len(names):
            repeated = next(name for i, name in enumerate(names) if name in names[:i])
            raise LayoutError(f"alias_name {names!r} names two axes {repeated!r}; expected a different name for "
                              "each axis of the device matrix")
        if INTERLEAVED in names:  # MindSpore's: a virtual axis, no devices; here it would be one of real ranks
            raise LayoutError(f"alias name {INTERLEAVED!r} in {names!r} is MindSpore's micro-interleaving (a tensor "
                              "cut into slices that one device computes in turn), which spmdsim does not model; "
                              "expected the device matrix of the real axes: leave that axis and its size out")
        cut = self.cut
        if not isinstance(cut, str) and hasattr(cut, "__iter__") and rank_list is None:  # MindSpore's 3rd argument
            cut, rank_list = "even", cut
        if rank_list is not None:
            _check_rank_list(rank_list, matrix)
        if cut not in CUTS:
            raise LayoutError(f"cut {cut!r} must be one of {CUTS!r}")
        object.__setattr__(self, "cut", cut)
        object.__setattr__(self, "device_matrix", matrix)
        object.__setattr__(self, "alias_name", names)

    def __eq__(self, other: object) -> bool:
        # `is` first, as TensorLayout's: meshes and plans share their Layout objects.
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.device_matrix == other.device_matrix  # type: ignore[attr-defined]
                and self.alias_name == other.alias_name and self.cut == other.cut)  # type: ignore[attr-defined]

    # A Layout keys the meshes', scalars' and plans' tables.
    __hash__ = _kept_hash(lambda self: (self.device_matrix, self.alias_name, self.cut))

    def __repr__(self) -> str:
        # The default rule is left out, so the repr of an even Layout reads as it always has.
        cut = "" if self.cut == "even" else f", cut={self.cut!r}"
        return f"Layout(device_matrix={self.device_matrix!r}, alias_name={self.alias_name!r}{cut})"

    def __call__(self, *tensor_map: MapEntry, partial: str | Iterable[str] = ()) -> "TensorLayout":
        return TensorLayout(self, tensor_map, partial)

    def __str__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.alias_name, self.device_matrix))
        return f"Layout({axes}{'' if self.cut == 'even' else ', cut=' + self.cut})"

    def with_cut(self, cut: str) -> "Layout":
        """The same device matrix cutting tensor dims by rule `cut`."""
        return self if cut == self.cut else Layout(self.device_matrix, self.alias_name, cut)

    # -- sizes ---------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        """Number of ranks the device matrix needs."""
        return math.prod(self.device_matrix)

    @property
    def ndim(self) -> int:
        return len(self.device_matrix)

    def axis_index(self, alias: str) -> int:
        """Position of a mesh axis in the device matrix."""
        try:
            return self.alias_name.index(alias)
        except ValueError:
            raise LayoutError(f"unknown alias {alias!r}; expected one of {self.alias_name!r}") from None

    def axis_size(self, alias: str) -> int:
        return self.device_matrix[self.axis_index(alias)]

    def group_size(self, axes: Iterable[str]) -> int:
        """Number of ranks in one group over `axes` (product of their sizes)."""
        if type(axes) is not tuple:
            return math.prod(self.axis_size(a) for a in axes)
        try:
            known = self._sizes.get(axes)  # a tensor map's entries: shapes, shards and plans ask for them again
        except TypeError:  # an unhashable name: refused by axis_size, as before
            known = None
        if known is None:
            known = math.prod(self.axis_size(a) for a in axes)
            if len(self._sizes) < 256:
                self._sizes[axes] = known
        return known

    @cached_property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides: the last axis varies fastest."""
        return tuple(math.prod(self.device_matrix[i + 1:]) for i in range(self.ndim))

    @cached_property
    def _coords(self) -> dict:
        """rank -> coords(rank), for the ranks asked about (up to 4096)."""
        return {}

    @cached_property
    def _sizes(self) -> dict:
        """axes (a tuple) -> group_size(axes), for the groups asked about (up to 256)."""
        return {}

    # The answers kept above and the hash are left out of pickles (str hashes differ between processes).
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_coords", "_sizes", "_hash")}


@dataclass(frozen=True)
class TensorLayout(TensorShards):
    """A Layout plus a tensor map (and optional partial axes): one tensor's sharding.

    Attributes:
        layout: the device matrix and its axis names.
        tensor_map: per tensor dim, the mesh axes it is split over (() = not split).
        partial: mesh axes over which local values are pending sums.
    """

    layout: Layout
    tensor_map: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.layout, Layout):
            raise LayoutError(f"layout {self.layout!r} must be a Layout")
        if isinstance(self.tensor_map, (str, type(None))):
            raise LayoutError(f"tensor_map {self.tensor_map!r} must be a sequence of entries, one per tensor dim")
        try:
            entries = tuple(normalize_entry(e) for e in self.tensor_map)
        except LayoutError as error:  # MindSpore's integer tensor_map: written by name where it can be
            by_name = numbered_map_by_name(self.tensor_map, self.layout.alias_name)
            raise (LayoutError(f"{error}{by_name}") if by_name else error) from None
        # A bare string is one axis name, never a sequence of one-letter axes.
        partial = (self.partial,) if isinstance(self.partial, str) else self.partial
        partial = tuple(partial) if hasattr(partial, "__iter__") and not isinstance(partial, bytes) else (None,)
        if not all(isinstance(alias, str) for alias in partial):  # partial=1, None, (0,): a TypeError deeper down
            raise LayoutError(f"partial {self.partial!r} must be a mesh axis name or a tuple of them (() for none), "
                              f"from {self.layout.alias_name!r}")
        seen: set[str] = set()
        for axes in entries + (partial,):
            for alias in axes:
                if alias not in self.layout.alias_name:
                    raise LayoutError(f"unknown alias {alias!r} in tensor map {self._shown(entries, partial)}; "
                                      f"expected one of {self.layout.alias_name!r}{self._alias_hint(alias)}")
                if alias in seen:
                    raise LayoutError(f"axis {alias!r} is used more than once in tensor map "
                                      f"{self._shown(entries, partial)}; each mesh axis may appear at most once")
                seen.add(alias)
        object.__setattr__(self, "tensor_map", entries)
        object.__setattr__(self, "partial", partial)

    def _alias_hint(self, alias: str) -> str:
        """Why a name is not an axis, where it is another notation's: an axis number (MindSpore's integer map),
        a placement (S(0), Shard(0)) or a PartitionSpec; the functions that read the latter two."""
        if alias.lstrip("-").isdigit():
            by_name = numbered_map_by_name(self.tensor_map, self.layout.alias_name)
            return f" (an axis number? MindSpore's integer tensor_map is not read: write the axis's name{by_name})"
        entries = [e for e in self.tensor_map if isinstance(e, str)]
        hint = dialect_hint(alias, entries, DIALECT_FUNCTIONS, "build the layout with")
        return f"; {hint}, from spmdsim.layouts.dialects" if hint else ""

    # Equal layouts are mostly the same object (the planners' and autograd's caches hand them
    # out): `is` first spares the generated __eq__'s two field tuples (~0.3 us, 25 times a step).
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.layout == other.layout and self.tensor_map == other.tensor_map  # type: ignore[attr-defined]
                and self.partial == other.partial)  # type: ignore[attr-defined]

    # TensorLayouts key the plan and program caches of every redistribution.
    __hash__ = _kept_hash(lambda self: (self.layout, self.tensor_map, self.partial))

    # The tensor layout (an object) whose gradient, laid out by this object, the backward walk keeps as it is
    # (spmdsim.nn.autograd.engine.grad_layout moves it nowhere): noted on this object by the walk, so a parameter's
    # pending gradient is routed by one attribute read. Not a field: no part of the value.
    _grad_of = None  # (no annotation: a class attribute, not a dataclass field)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_derived", "_shapes", "_grad_of")}

    @staticmethod
    def _shown(entries: tuple, partial: tuple) -> str:
        text = format_tensor_map(entries)
        return text + (f" partial {partial!r}" if partial else "")

    def __str__(self) -> str:
        return self._shown(self.tensor_map, self.partial)

    # -- derived views -----------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.tensor_map)

    @cached_property
    def split_axes(self) -> tuple[str, ...]:
        """Mesh axes that split some tensor dim, in tensor-map order."""
        return tuple(a for axes in self.tensor_map for a in axes)

    @cached_property
    def replicated_axes(self) -> tuple[str, ...]:
        """Mesh axes that neither split a dim nor hold partial sums (device-matrix order)."""
        used = set(self.split_axes) | set(self.partial)
        return tuple(a for a in self.layout.alias_name if a not in used)

    @cached_property
    def copy_axes(self) -> tuple[str, ...]:
        """Replicated axes that make copies: those of size above one (a size-1 axis makes none)."""
        return tuple(a for a in self.replicated_axes if self.layout.axis_size(a) > 1)

    @cached_property
    def addend_axes(self) -> tuple[str, ...]:
        """Partial axes that make several addends: those of size above one."""
        return tuple(a for a in self.partial if self.layout.axis_size(a) > 1)

    def num_shards(self, tensor_dim: int) -> int:
        """Number of pieces tensor dim `tensor_dim` is cut into."""
        return self.layout.group_size(self.tensor_map[tensor_dim])

    @cached_property
    def shards_per_dim(self) -> tuple[int, ...]:
        return tuple(self.num_shards(d) for d in range(self.ndim))

    @cached_property
    def counts_per_dim(self) -> tuple[tuple[int, ...], ...]:
        """Per tensor dim, the sizes of the mesh axes it is split over (first major): what the cut rule
        cuts by (spmdsim.layouts.slicing; under "chunk" a dim on several axes is cut axis by axis, as DTensor's)."""
        return tuple(tuple(self.layout.axis_size(a) for a in axes) for axes in self.tensor_map)

    def with_partial(self, partial: str | Iterable[str]) -> "TensorLayout":
        """This layout pending over `partial` instead (kept per layout: the strategy search and the
        backward walk ask each layout for the same few, ~1.5 million times at 16 devices)."""
        if type(partial) is not tuple:
            partial = (partial,) if isinstance(partial, str) else tuple(partial)
        if partial == self.partial:  # itself (an equal value): the gradients' layouts are then the tensors'
            return self  # own objects, and the comparisons of the backward walk stop at `is`
        derived = self.__dict__.get("_derived")
        if derived is None:
            derived = {}
            object.__setattr__(self, "_derived", derived)
        out = derived.get(partial)
        if out is None:
            out = TensorLayout(self.layout, self.tensor_map, partial)
            if len(derived) < 64:
                derived[partial] = out
                # And back: `out` over this layout's own axes is this very object (a pending gradient,
                # once summed, is then in its tensor's layout object, and comparisons stop at `is`).
                object.__setattr__(out, "_derived", {self.partial: self})
        return out

    def with_map(self, *tensor_map: MapEntry) -> "TensorLayout":
        return TensorLayout(self.layout, tensor_map, self.partial)
