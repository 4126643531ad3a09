"""Device matrices and tensor layouts: who holds which slice of a global tensor.

Pure Python; never imports mpi4py. Semantics (docs/explanation/semantics.md):

* ranks are numbered row-major over the device matrix (last axis fastest);
* a tensor map entry names the mesh axes a tensor dim is split over; with
  several axes the first listed is major (shard = i_a * |b| + i_b for (a, b));
* mesh axes named nowhere are replicated; partial axes hold pending sums.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Callable, Iterable, Sequence, Union

import numpy as np

from ..errors import LayoutError, ShapeError
from .slicing import CUTS, check_cut, shard_bounds
from ..base.validate import as_int, counted, shape_arg

__all__ = ["Layout", "TensorLayout", "MapEntry", "normalize_entry", "format_entry", "format_tensor_map",
           "default_axis_names"]

#: One tensor-map entry as a user writes it: alias, None/"None", or tuple of aliases.
MapEntry = Union[str, None, Sequence[str]]


#: MindSpore's virtual axis name for micro-interleaving, refused by Layout (docs/reference/dialects.md, "Not supported").
INTERLEAVED = "interleaved_parallel"


def default_axis_names(count: int) -> tuple[str, ...]:
    """The mesh axis names every entry point uses when none are given: ``axis_0, axis_1, ...``."""
    return tuple(f"axis_{i}" for i in range(count))


def _is_none(entry: object) -> bool:
    return entry is None or entry == "None"


def normalize_entry(entry: MapEntry) -> tuple[str, ...]:
    """Turn one user tensor-map entry into a tuple of axis names (() = not split)."""
    if _is_none(entry):
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        names = tuple(entry)
        for name in names:
            if not isinstance(name, str) or name == "None":
                number = " (an axis number, MindSpore's integer tensor_map: write the axis's name)" \
                    if as_int(name) is not None else ""
                raise LayoutError(f"tensor map tuple {entry!r} must hold axis names only, got {name!r}{number}")
        # A one-element tuple is the same as the bare alias; () stays 'not split'.
        return names
    if as_int(entry) is not None:  # MindSpore's tensor_map numbers the device matrix's axes from the right
        raise LayoutError(f"tensor map entry {entry!r} is an axis number (MindSpore's integer tensor_map, counted "
                          "from the right, -1 for none), which spmdsim does not read; expected an axis name, "
                          "None/'None' or a tuple of axis names: write the name of the axis it numbers")
    raise LayoutError(f"tensor map entry {entry!r} must be an axis name, None/'None' or a tuple of axis names")


def format_entry(axes: tuple[str, ...]) -> str:
    """Short form of one entry: None, "mp" or ("sp", "dp")."""
    if not axes:
        return "None"
    if len(axes) == 1:
        return f'"{axes[0]}"'
    return "(" + ", ".join(f'"{a}"' for a in axes) + ")"


def format_tensor_map(entries: tuple) -> str:
    """Short form of a tensor map: ("mp", ("sp", "dp")), or ("x",) for one dim."""
    # One entry keeps Python's tuple comma: ("x") would read as a string.
    return "(" + ", ".join(format_entry(e) for e in entries) + ("," if len(entries) == 1 else "") + ")"


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


@dataclass(frozen=True)
class Layout:
    """A named device matrix, e.g. ``Layout((2, 4), ("dp", "mp"))``.

    Calling it with a tensor map gives a TensorLayout:
    ``Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))``.
    `cut` is the rule that cuts every tensor dim split over this device matrix
    (spmdsim.layouts.slicing): "even" (the default; sizes must divide), "chunk" (DTensor's,
    torch.chunk's) or "balanced" (sizes differ by at most one).
    """

    device_matrix: tuple[int, ...]
    alias_name: tuple[str, ...]
    cut: str = "even"

    def __post_init__(self) -> None:
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
            raise LayoutError(f"alias_name {names!r} has {len(names)} names but device_matrix "
                              f"{matrix!r} has {len(matrix)} axes")
        for name in names:
            if not isinstance(name, str) or not name or name == "None":
                raise LayoutError(f"alias name {name!r} must be a non-empty string other than 'None'")
        if len(set(names)) != len(names):
            raise LayoutError(f"alias_name {names!r} repeats a name")
        if INTERLEAVED in names:  # MindSpore's: a virtual axis, no devices; here it would be one of real ranks
            raise LayoutError(f"alias name {INTERLEAVED!r} in {names!r} is MindSpore's micro-interleaving (a tensor "
                              "cut into slices that one device computes in turn), which spmdsim does not model; "
                              "expected the device matrix of the real axes: leave that axis and its size out")
        if self.cut not in CUTS:
            raise LayoutError(f"cut {self.cut!r} must be one of {CUTS!r}")
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

    # -- rank <-> coordinates --------------------------------------------------
    def _check_rank(self, rank: int) -> int:
        """`rank` as an int rank of this device matrix (a float rank would give float coords)."""
        if type(rank) is not int:
            n = as_int(rank)
            if n is None:
                raise LayoutError(f"rank {rank!r} must be an integer (expected 0 <= rank < {self.num_devices})")
            rank = n
        if not 0 <= rank < self.num_devices:
            raise LayoutError(f"rank {rank!r} is outside device matrix {self.device_matrix!r} "
                              f"(expected 0 <= rank < {self.num_devices})")
        return rank

    def coords(self, rank: int) -> tuple[int, ...]:
        """Device coordinates of `rank`, one per mesh axis."""
        # Kept per rank (bounded): every shard's bounds, group and member query asks for them again.
        known = self._coords.get(rank) if type(rank) is int else None
        if known is not None:
            return known
        rank = self._check_rank(rank)
        out = tuple((rank // s) % n for s, n in zip(self.strides, self.device_matrix))
        if len(self._coords) < 4096:
            self._coords[rank] = out
        return out

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

    def rank_of(self, coords: Sequence[int]) -> int:
        """Rank at the given device coordinates."""
        coords = tuple(coords)
        if len(coords) != self.ndim or any(
            as_int(c) is None or not 0 <= c < n for c, n in zip(coords, self.device_matrix)
        ):
            raise LayoutError(f"coordinates {coords!r} do not fit device matrix {self.device_matrix!r}")
        return sum(int(c) * s for c, s in zip(coords, self.strides))

    def group_index(self, rank: int, axes: Sequence[str]) -> int:
        """Mixed-radix index of `rank` along `axes` (first listed major)."""
        coords = self.coords(rank)
        index = 0
        for alias in axes:
            i = self.axis_index(alias)
            index = index * self.device_matrix[i] + coords[i]
        return index

    def group_indices(self, axes: Sequence[str]) -> np.ndarray:
        """`group_index(rank, axes)` of every rank at once, as an int64 array in rank order.

        For whole-mesh work (the planner at thousands of devices), where a call
        per rank would dominate.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        ranks = np.arange(self.num_devices, dtype=np.int64)
        index = np.zeros(self.num_devices, dtype=np.int64)
        for alias in axes:
            i = self.axis_index(alias)
            index = index * self.device_matrix[i] + (ranks // self.strides[i]) % self.device_matrix[i]
        return index

    def split_color_key(self, rank: int, axes: Sequence[str]) -> tuple[int, int]:
        """(color, key) for Comm.Split building the group over `axes` that holds `rank`.

        Ranks share a color when they agree on every axis outside `axes`; the key
        orders each group in mixed-radix order of `axes`, so Allgather output is in
        shard order.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        coords = list(self.coords(rank))
        for alias in axes:
            coords[self.axis_index(alias)] = 0
        return self.rank_of(coords), self.group_index(rank, axes)

    def group_members(self, rank: int, axes: Sequence[str]) -> tuple[int, ...]:
        """The ranks of the group over `axes` that holds `rank`, in mixed-radix order of `axes` (first listed
        major): the group `split_color_key(rank, axes)` names, its `axis_groups` entry, worked out from
        `rank`'s coordinates without visiting the other ranks."""
        axes = tuple(axes)
        self._check_axes(axes)
        coords, strides = self.coords(rank), self.strides
        first, offsets = rank, [0]
        for alias in axes:
            i = self.axis_index(alias)
            first -= coords[i] * strides[i]
            offsets = [o + c * strides[i] for o in offsets for c in range(self.device_matrix[i])]
        return tuple(first + o for o in offsets)

    def axis_groups(self, axes: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """All groups of ranks over `axes`, each in mixed-radix order of `axes`.

        Groups are listed by their smallest rank. An empty `axes` gives one
        group per rank.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        groups: dict[int, list[tuple[int, int]]] = {}
        for rank in range(self.num_devices):
            color, key = self.split_color_key(rank, axes)
            groups.setdefault(color, []).append((key, rank))
        return tuple(tuple(r for _, r in sorted(members)) for _, members in sorted(groups.items()))

    def _check_axes(self, axes: tuple[str, ...]) -> None:
        for alias in axes:
            self.axis_index(alias)
        if len(set(axes)) != len(axes):
            raise LayoutError(f"axis group {axes!r} repeats an axis")


@dataclass(frozen=True)
class TensorLayout:
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
        entries = tuple(normalize_entry(e) for e in self.tensor_map)
        # A bare string is one axis name, never a sequence of one-letter axes.
        partial = (self.partial,) if isinstance(self.partial, str) else tuple(self.partial)
        seen: set[str] = set()
        for axes in entries + (partial,):
            for alias in axes:
                if alias not in self.layout.alias_name:
                    number = (" (an axis number? MindSpore's integer tensor_map is not read: write the axis's name)"
                              if alias.lstrip("-").isdigit() else "")
                    raise LayoutError(f"unknown alias {alias!r} in tensor map {self._shown(entries, partial)}; "
                                      f"expected one of {self.layout.alias_name!r}{number}")
                if alias in seen:
                    raise LayoutError(f"axis {alias!r} is used more than once in tensor map "
                                      f"{self._shown(entries, partial)}; each mesh axis may appear at most once")
                seen.add(alias)
        object.__setattr__(self, "tensor_map", entries)
        object.__setattr__(self, "partial", partial)

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
    # pending gradient is routed by one attribute read (issue 58). Not a field: no part of the value.
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

    # -- shapes ----------------------------------------------------------------
    def check_shape(self, shape: Sequence[int], what: str | None = None) -> tuple[int, ...]:
        """Validate a global shape against this layout and return it as a tuple of ints.

        `what` names the tensor in a divisibility error ("ColumnParallelLinear weight W").
        """
        if type(shape) is tuple and self._known(("checked", shape)) is not None:  # passed before: ~4 us a call
            return shape
        shape = shape_arg(shape, "shape" if what is None else f"{what} shape")
        if len(shape) != self.ndim:
            raise ShapeError(f"{'' if what is None else what + ': '}tensor map {self} has "
                             f"{counted(self.ndim, 'entry')} but shape {shape!r} has {counted(len(shape), 'dim')}")
        cut = self.layout.cut
        for tensor_dim, (size, axes) in enumerate(zip(shape, self.tensor_map)):
            check_cut(cut, size, self.layout.group_size(axes), tensor_dim, axes,
                      None if what is None else (what, shape))
        return self._keep(("checked", shape), shape)

    def local_shape(self, shape: Sequence[int], rank: int | None = None) -> tuple[int, ...]:
        """Shape of `rank`'s shard; without `rank`, the shape every rank's shard has.

        Under an uneven cut (Layout cut "chunk" or "balanced") of a size that does
        not divide, shards differ: asking without a rank then raises ShapeError.
        """
        if rank is not None:
            return tuple(b - a for a, b in self.bounds(rank, shape))
        known = self._known(("local", shape))
        if known is not None:
            return known
        shape = self.check_shape(shape)
        uneven = self.uneven_dims(shape)
        if uneven:
            d = uneven[0]
            raise ShapeError(f"shards of tensor dim {d} of size {shape[d]!r} differ between ranks "
                             f"({self.shards_per_dim[d]} shards, cut {self.layout.cut!r}); "
                             "expected a rank to ask for its own shard's shape")
        return self._keep(("local", shape), tuple(s // n for s, n in zip(shape, self.shards_per_dim)))

    def uneven_dims(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The tensor dims whose shards differ in size between ranks (none under the even cut)."""
        if self.layout.cut == "even":
            return ()
        return tuple(d for d, (s, n) in enumerate(zip(shape, self.shards_per_dim)) if s % n)

    def max_local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Per dim, the largest shard (the first: every rule puts its longest pieces first)."""
        shape = self.check_shape(shape)
        cut = self.layout.cut
        return tuple(b - a for a, b in (shard_bounds(s, n, 0, cut) for s, n in zip(shape, self.counts_per_dim)))

    # Answers about global shapes that passed check_shape, per layout: operators and the backward walk
    # ask each layout the same few questions every step. Kept only for shapes of Python ints (16.0
    # equals 16 and hashes alike, and must be refused again), out of pickles like the hash.
    def _known(self, key: tuple) -> Any:
        shapes = self.__dict__.get("_shapes")
        if shapes is None or type(key[-1]) is not tuple:
            return None
        for n in key[-1]:
            if type(n) is not int:
                return None
        return shapes.get(key)

    def _keep(self, key: tuple, value: Any) -> Any:
        for n in key[-1]:
            if type(n) is not int:
                return value
        shapes = self.__dict__.get("_shapes")
        if shapes is None:
            shapes = {}
            object.__setattr__(self, "_shapes", shapes)
        if len(shapes) < 256:
            shapes[key] = value
        return value

    # -- who holds what ------------------------------------------------------------
    def shard_index(self, rank: int) -> tuple[int, ...]:
        """Per tensor dim, the index of the shard `rank` holds."""
        return tuple(self.layout.group_index(rank, axes) for axes in self.tensor_map)

    def bounds(self, rank: int, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Per tensor dim, the half-open [start, stop) that `rank` holds."""
        if type(rank) is int:
            known = self._known(("bounds", rank, shape))
            if known is not None:
                return known
        shape = self.check_shape(shape)
        cut = self.layout.cut
        out = tuple(shard_bounds(size, n, i, cut)
                    for size, n, i in zip(shape, self.counts_per_dim, self.shard_index(rank)))
        return self._keep(("bounds", rank, shape), out) if type(rank) is int else out

    def slices(self, rank: int, shape: Sequence[int]) -> tuple[slice, ...]:
        """Per tensor dim, the slice of the global tensor that `rank` holds."""
        if type(rank) is int and type(shape) is tuple:  # kept as `bounds` is: a check asks for them every step
            known = self._known(("slices", rank, shape))
            if known is not None:
                return known
            return self._keep(("slices", rank, shape), tuple(slice(a, b) for a, b in self.bounds(rank, shape)))
        return tuple(slice(a, b) for a, b in self.bounds(rank, shape))

    def rank_slices(self, shape: Sequence[int]) -> dict[int, tuple[tuple[int, int], ...]]:
        """Bounds for every rank (the `spmdsim slices` table)."""
        return {r: self.bounds(r, shape) for r in range(self.layout.num_devices)}

    def ranks_holding(self, shard_index: Sequence[int]) -> tuple[int, ...]:
        """All ranks whose shard has the given per-dim index (replicas and partials)."""
        shard_index = tuple(shard_index)
        if len(shard_index) != self.ndim or any(
            as_int(i) is None or not 0 <= i < n for i, n in zip(shard_index, self.shards_per_dim)
        ):
            raise LayoutError(f"shard index {shard_index!r} does not fit shards per dim {self.shards_per_dim!r}")
        return tuple(r for r in range(self.layout.num_devices) if self.shard_index(r) == shard_index)

    def replica_groups(self) -> tuple[tuple[int, ...], ...]:
        """Groups of ranks that hold identical local values (differ only on replicated axes)."""
        return self.layout.axis_groups(self.replicated_axes)

    def num_replicas(self) -> int:
        return self.layout.group_size(self.replicated_axes)


def move_name(source: Any, target: Any) -> Callable[[], str]:
    """A redistribution's node's name in autograd's graph: a function making its text (`Node.describe`), of the
    two layouts alone (here, below the runtime and autograd: the executor keeps one per move it has planned)."""
    return partial(_move_name, source, target)


def _move_name(source: Any, target: Any) -> str:
    return f"redistribute {source} -> {target}"
