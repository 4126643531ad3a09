"""A Layout bound to an MPI communicator, with cached per-axis sub-communicators."""
from __future__ import annotations

import math
import os
from functools import partial
from typing import Any, Iterable

import numpy as np

from ..base import buffers
from ..base.foreign import CallableInt, ForeignAttribute, ForeignName
from ..errors import LayoutError, MeshSizeError, RuntimeMismatchError
from ..layouts.layout import Layout
from ..base.context import current
from .axes import normalize_axes
from .engines import engine_of, launcher, ways_out, world
from .engines.wait import resolve_wait_mode
from .compiled import PROGRAMS  # Mesh.close drops its meshes of other layouts
from .shared_groups import GROUPS  # under MPI, the meshes over a communicator share their groups
from ..programs.algorithms import check_choices
from ..base.validate import as_int, describe
from . import debug, debug_calls

__all__ = ["Mesh", "SCRATCH_MAX_BYTES", "AXIS_ROLES"]

# Temporaries above this are allocated per call: glibc maps that size afresh
# anyway (spmdsim.base.malloc), and keeping one would pin that much per mesh.
SCRATCH_MAX_BYTES = 32 << 20
SCRATCH_ROLES = ("send", "recv")

#: The parts a mesh axis can play: the batch split (data), Megatron's tensor parallelism (tensor), the
#: pipeline's stages (pipeline), an MoE layer's experts (expert), the sequence split of attention
#: (context) and the parameters' shards (shard). Whoever makes a mesh names which axis plays which
#: (``Mesh(layout, roles={"tensor": "tp"})``); code that runs on it asks ``mesh.axis("tensor")``.
AXIS_ROLES = ("data", "tensor", "pipeline", "expert", "context", "shard")


#: Comm.Compare's answers for the same ranks in the same order (MPICH's, Open MPI's and the emulator's numbers)
_IDENT, _CONGRUENT = 0, 1
_SHARED_LAYOUTS: dict = {}  # Layout -> the first equal Layout a simulated rank's mesh was made with

_TORCH, _JAX = "PyTorch DeviceMesh's", "JAX Mesh's"
#: PyTorch's DeviceMesh and JAX's Mesh names for what a Mesh has (docs/tutorials/porting.md): name -> (whose,
#: spmdsim's); each is a ForeignAttribute of Mesh's, one line naming spmdsim's.
_FOREIGN = {
    "get_local_rank()": (_TORCH, "mesh.coord('tp'), this rank's index along a named axis"),
    "get_coordinate()": (_TORCH, "mesh.coords, this rank's index along every axis"),
    "get_rank()": (_TORCH, "mesh.rank"),
    "get_group()": (_TORCH, "mesh.group('tp'), the communicator over the named axes"),
    "device_type": (_TORCH, "none: every rank is a CPU process (an MPI rank or a simulated one), its arrays numpy's"),
    "mesh_dim_names": (_TORCH, "mesh.layout.alias_name"),
    "ndim": (_TORCH, "len(mesh.layout.device_matrix)"),
    "mesh": (_TORCH, "mesh.layout.device_matrix, its ranks numbered row-major from 0 (mesh.group_ranks('tp') "
                     "lists a group's)"),
    "shape": (f"{_TORCH} and {_JAX}", "mesh.layout.device_matrix, the sizes (the names: mesh.layout.alias_name)"),
    "axis_names": (_JAX, "mesh.layout.alias_name"),
    "axis_sizes": (_JAX, "mesh.layout.device_matrix"),
    "devices": (_JAX, "mesh.layout.device_matrix, its ranks numbered row-major from 0"),
}


def _mesh_size(layout: Layout, mesh_dim: Any = None) -> int:
    """PyTorch's ``mesh.size()`` (the number of ranks) and ``mesh.size(mesh_dim)`` (one mesh dim's size: its
    index, or its name, ``mesh.size("tp")``); ``mesh.size`` itself is the number, an int, as JAX's."""
    if mesh_dim is None:
        return layout.num_devices
    names, sizes = layout.alias_name, layout.device_matrix
    if isinstance(mesh_dim, str) and mesh_dim in names:
        return sizes[names.index(mesh_dim)]
    dim = None if isinstance(mesh_dim, str) else as_int(mesh_dim)
    if dim is None or not -len(sizes) <= dim < len(sizes):
        raise LayoutError(f"mesh.size({mesh_dim!r}): expected a mesh dim, an index from {-len(sizes)} to "
                          f"{len(sizes) - 1} or a name in {tuple(names)!r}")
    return sizes[dim]


def _sub_mesh(mesh: Any, axes: Any) -> Any:
    """``mesh["tp"]``, PyTorch's sub-mesh: one line naming how spmdsim names axes instead."""
    raise ForeignName(f"mesh[{axes!r}] is {_TORCH} sub-mesh; spmdsim has none: name the axes where a layout, "
                      "a layer or a collective takes them (mesh.layout(None, 'tp'), axes='tp'), and "
                      "mesh.group('tp') is their communicator (docs/tutorials/porting.md)")


#: Mesh's base class: PyTorch's and JAX's names for what a Mesh has (`_FOREIGN`, and ``mesh["tp"]``), each one line.
_ForeignNames = type("_ForeignNames", (), {
    "__module__": __name__, "__getitem__": _sub_mesh,
    **{spelled.rstrip("()"): ForeignAttribute("mesh", spelled, *said) for spelled, said in _FOREIGN.items()}})


class Mesh(_ForeignNames):
    """``Mesh(layout, comm=None)``: the device matrix of `layout` over `comm` (default `spmdsim.world()`).

    Every rank checks ``prod(device_matrix) == comm.size`` before any collective
    (the same MeshSizeError, a RuntimeMismatchError, otherwise). Attributes: ``layout``, ``comm``,
    ``rank``, ``size`` (an int; ``size("tp")``: one axis's), ``coords`` (``coord("tp")``: one axis's),
    ``wait_mode`` ("busy" or "polite"; ``polite``),
    ``algorithms`` (``{"allreduce": "ring", ...}``: run step by step over
    point-to-point messages, docs/explanation/algorithms.md; None: MPI's own collectives),
    ``roles`` (role -> axis name, given as ``roles=``; ``axis(role)`` reads it: AXIS_ROLES).
    Use as a context manager, or call ``close()``, to free the sub-communicators.
    """

    def __init__(self, layout: Layout, comm: Any = None, *, wait: str | None = None,
                 algorithms: dict[str, str] | None = None, roles: dict[str, str] | None = None) -> None:
        # Checked first: the same error on every rank, before any collective.
        self.algorithms = check_choices(algorithms)
        if not isinstance(layout, Layout):
            raise LayoutError(f"layout must be a spmdsim Layout (device matrix and axis names), got "
                              f"{describe(layout)}; e.g. Mesh(Layout((2, 4), ('dp', 'tp')))")
        #: role -> the axis that plays it (AXIS_ROLES); empty where the mesh's maker named none.
        self.roles = _checked_roles(roles, layout)
        if comm is None:
            comm = world()
        #: What this mesh runs on (spmdsim.runtime.engines): MPI, simulated ranks' threads, or a dry run.
        self.engine = engine = engine_of(comm)
        simulated = engine.simulated
        if not simulated:
            _check_mpi_comm(comm)
        size = comm.Get_size()
        if layout.num_devices != size:
            error = MeshSizeError(f"device matrix {layout.device_matrix!r} needs {layout.num_devices} ranks but the "
                                  f"communicator has {size}", layout.num_devices, size)
            # The whole world too few or too many (one plain process's too): how to get as many, as this world was
            # started; a sub-communicator's size is the program's own, one rank's of a bigger world too
            if size == world().Get_size():
                raise error.with_ways(ways_out(layout.num_devices, size, launcher(size)))
            raise error
        if simulated:
            # Simulated ranks are threads of one process and share the planners' caches: their meshes
            # share one Layout per device matrix, so that the layouts of a plan one rank made hold the
            # very Layout every rank's mesh holds, and placement checks stop at `is`.
            layout = _SHARED_LAYOUTS.setdefault(layout, layout)
        self.layout, self.comm, self.rank = layout, comm, comm.Get_rank()
        self.size = CallableInt(layout.num_devices, partial(_mesh_size, layout))  # JAX's int, PyTorch's call
        #: The rank's context the mesh was made in (spmdsim.base.context: its open traces, its debug settings),
        #: read by runtime.door.point_to_point without asking which thread runs.
        self.context = current()
        self.coords = layout.coords(self.rank)
        # Simulated ranks are threads of one process: no MPI progress to be polite to.
        self.wait_mode = resolve_wait_mode(wait, comm) if not simulated else _simulated_wait(wait)
        self.polite = self.wait_mode == "polite"
        # axes -> (comm, size, rank); building a group is collective, so ranks must ask for
        # groups in the same order (they do: every rank runs the same program).
        self._groups: dict[tuple[str, ...], tuple[Any, int, int]] = {}
        # The same groups under the spellings callers used ("mp" for ("mp",)): one lookup per collective.
        self._spelled: dict[Any, tuple[Any, int, int]] = {}
        # (collective, axes as spelled, shape, dtype, dims) -> what its first call over a group of this
        # mesh checked and worked out (spmdsim.runtime.collectives, door.repeat); freed with the groups. Also
        # ("moe plan", id(config), tokens, sequences, layer) -> an MoE layer's plan (spmdsim.models.moe.exchange._plan).
        # At most 256: a step's collectives repeat a few dozen signatures.
        self._plans: dict[tuple, tuple] = {}
        # This mesh's compiled redistributions (spmdsim.runtime.compiled.keep_move): they hold the mesh, so they
        # live on it and go with it.
        self._moves: dict[tuple, tuple] = {}
        self._scratch: dict[str, np.ndarray] = {}  # see scratch()
        # (role, shape, dtype) -> the view scratch() returned last time: one lookup instead of
        # three numpy views, which cost ~7 us per call with cold caches at 4 ranks per core.
        self._scratch_views: dict[tuple, np.ndarray] = {}

    def scratch(self, role: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A C-contiguous temporary of `shape` and `dtype`, the same memory on every call with this `role`.

        Roles: "send" (packed before sending) and "recv" (received before being
        copied into place); filled and drained within one call, never returned.
        Fresh above SCRATCH_MAX_BYTES. At 8 ranks on 2 cores a fresh buffer per
        call measured 1.1-1.4x a kept one (docs/explanation/performance.md, "Kept temporaries").
        """
        key = (role, shape, dtype)
        try:
            return self._scratch_views[key]
        except (KeyError, TypeError):  # a new request, or an unhashable shape or dtype
            pass
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > SCRATCH_MAX_BYTES:
            return buffers.kept_empty(shape, dtype)
        buf = self._scratch.get(role)
        if buf is None or buf.nbytes < nbytes:
            if role not in SCRATCH_ROLES:
                raise ValueError(f"scratch role {role!r} is not one of {SCRATCH_ROLES!r}")
            buf = self._scratch[role] = buffers.kept_empty(max(nbytes, 1), np.uint8)
            # Views of the old buffer would still work, but two calls that get
            # different buffers for one role would keep two buffers alive.
            self._scratch_views = {k: v for k, v in self._scratch_views.items() if k[0] != role}
        view = buf[:nbytes].view(dtype).reshape(shape)
        if len(self._scratch_views) < 64:  # bounded: the shapes a job's loops repeat
            try:
                self._scratch_views[key] = view
            except TypeError:  # unhashable: served, not cached
                pass
        return view

    def __repr__(self) -> str:
        # No rank, as a DTensor's: a refusal quoting a mesh passed where a number goes reads alike on every rank
        # (one line, not one rank's text and "ranks differ: ..."); mesh.rank says which rank this is.
        return f"Mesh({self.layout!r}, size={self.size}, wait={self.wait_mode!r})"

    def coord(self, axis: str) -> int:
        """This rank's index along mesh axis `axis` (JAX's ``lax.axis_index``, DTensor's ``get_local_rank``)."""
        names = self.layout.alias_name
        if axis not in names:
            raise LayoutError(f"axis {axis!r} is not one of the mesh's {tuple(names)!r}")
        return self.coords[names.index(axis)]

    def axis(self, role: str) -> str | None:
        """The name of the axis that plays `role` ("data", "tensor", ...: AXIS_ROLES), or None where none does."""
        if role not in AXIS_ROLES:
            raise LayoutError(f"axis role {role!r} is not one of {AXIS_ROLES!r}")
        return self.roles.get(role)

    def group(self, axes: str | Iterable[str]) -> Any:
        """The sub-communicator over `axes` that holds this rank (mixed-radix order, first major)."""
        return self.group_info(axes)[0]

    def group_info(self, axes: str | Iterable[str]) -> tuple[Any, int, int]:
        """(comm, size, rank in group) for `axes`, built once (collective) and cached."""
        try:
            return self._spelled[axes]
        except (KeyError, TypeError):  # a new spelling, or an unhashable one (a list)
            pass
        key = normalize_axes(axes)
        info = self._groups.get(key)
        if info is None:
            info = self._groups[key] = self._split(key)
        if isinstance(axes, (str, tuple)):
            self._spelled[axes] = info
        return info

    def _split(self, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        # Validates the names on every rank before the collective build (engine.group); under MPI a group
        # another mesh over the same communicator built of the same ranks is shared (runtime.shared_groups).
        # The guard's check of the request (or the watchdog's wait) runs for a shared one too: ranks asking a
        # new mesh for different groups are told so, as where each mesh built its own.
        self.layout.split_color_key(self.rank, axes)
        _before_split(self, axes)
        return GROUPS.take(self, axes, partial(self.engine.group, self, axes))

    def group_ranks(self, axes: str | Iterable[str]) -> tuple[int, ...]:
        """Mesh ranks of this rank's group over `axes`, in group order (pure, no MPI)."""
        return self.layout.group_members(self.rank, normalize_axes(axes))

    def apart_from(self, other: "Mesh") -> str | None:
        """Why DTensors on mesh `other` cannot meet DTensors on this one in one operation, or None (`foreign`;
        a method, so that code above the runtime that holds a mesh asks it without importing the runtime)."""
        return foreign(self, other)

    def close(self) -> None:
        """Free the cached sub-communicators (collective over the mesh; under MPI those no other mesh uses)."""
        for axes, info in self._groups.items():
            GROUPS.give_back(self, axes, info)
        self._groups.clear()
        self._spelled.clear()
        self._plans.clear()
        self._moves.clear()
        PROGRAMS.forget(self)
        self._scratch.clear()
        self._scratch_views.clear()

    def __enter__(self) -> "Mesh":
        return self

    def __exit__(self, *exc: object) -> None:
        # After an exception ranks may disagree on what they built; freeing is
        # local in MPICH but collective in the standard, so only free on success.
        if exc[0] is None:
            self.close()


def foreign(mesh: Mesh, other: Mesh) -> str | None:
    """Why DTensors on `other` cannot meet DTensors on `mesh` in one operation, or None (local: no collective).

    Called where the two are two Mesh objects: another device matrix or axis names; a mesh another simulated
    rank made (its DTensor holds that rank's block, passed through a global or a closure); the same layout
    over a communicator of other ranks or in another order (each block cut for another rank's coordinates).
    """
    if other.layout != mesh.layout:
        return f"{mesh.layout} and {other.layout}"
    if other.context is not mesh.context:
        return (f"{mesh.layout} of simulated rank {mesh.rank} and of rank {other.rank}: a DTensor made on one "
                "rank holds that rank's block; let each rank build its own (not pass one through a global "
                "or a closure)")
    if other.comm is mesh.comm:
        return None
    compare = getattr(mesh.comm, "Compare", None)  # a dry run's communicator has none: one rank of a group
    same = other.rank == mesh.rank if compare is None else compare(other.comm) in (_IDENT, _CONGRUENT)
    return None if same else (f"{mesh.layout} over two communicators of other ranks or in another order (this "
                              f"rank is {mesh.rank} of one and {other.rank} of the other): their blocks are "
                              "cut for other ranks' coordinates; build both on one communicator")


def _checked_roles(roles: dict[str, str] | None, layout: Layout) -> dict[str, str]:
    """`roles` as a fresh dict, each a known role (AXIS_ROLES) played by one distinct axis of `layout`."""
    if roles is None:
        return {}
    if not isinstance(roles, dict):
        raise LayoutError(f"roles must be a dict of role -> axis name, got {roles!r}; e.g. {{'tensor': 'tp'}}")
    names = tuple(layout.alias_name)
    for role, axis in roles.items():
        if role not in AXIS_ROLES:
            raise LayoutError(f"axis role {role!r} is not one of {AXIS_ROLES!r}")
        if axis not in names:
            raise LayoutError(f"the {role} axis {axis!r} is not one of the mesh's {names!r}")
    twice = sorted({a for a in roles.values() if list(roles.values()).count(a) > 1})
    if twice:
        raise LayoutError(f"axis {twice[0]!r} plays more than one role in {roles!r}; give each axis one role")
    return dict(roles)


def _check_mpi_comm(comm: Any) -> None:
    """An MPI communicator must be a valid intracommunicator of the world mpiexec launched."""
    from mpi4py import MPI

    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise RuntimeMismatchError(f"communicator {comm!r} must be a valid MPI intracommunicator "
                                   "(or a simulated one from spmdsim.simulate)")
    expected = _expected_world()
    world = MPI.COMM_WORLD.Get_size()
    if expected is not None and expected != world:
        raise RuntimeMismatchError(f"the MPI world has {world} ranks but {expected} were launched: is "
                                   "mpiexec from the same MPI as mpi4py? (python -m mpi4py --mpi-library)")


def _expected_world() -> int | None:
    """SPMDSIM_EXPECT_WORLD as a rank count (None when unset); anything else is refused."""
    raw = os.environ.get("SPMDSIM_EXPECT_WORLD", "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # str.isdigit alone takes '²', which int() refuses
        raise RuntimeMismatchError(f"SPMDSIM_EXPECT_WORLD={raw!r} is not a number of ranks; expected the "
                                   "count mpiexec launches, e.g. 8 (spmdsim launch sets it), or unset")
    return int(raw)


def _simulated_wait(wait: str | None) -> str:
    """Simulated ranks always wait busily (threads: no MPI progress to be polite to), but a
    setting that MPI would refuse is refused here too, so a typo does not wait for the cluster."""
    resolve_wait_mode(wait, None, check_only=True)
    _expected_world()  # only its spelling: a simulation is not the world mpiexec launched
    return "busy"


def _before_split(mesh: Mesh, axes: tuple[str, ...]) -> None:
    """Before the collective group build: ranks that build different groups (or one that skips) must not meet there.

    The build (MPI_Comm_create_group under MPI, engines/mpi.py) has no nonblocking form: in debug mode the
    guard compares the request first, the watchdog waits on an Ibarrier instead; numbered by how many groups
    this mesh has built. A polite mesh waits on that Ibarrier too (politely): MPICH's ranks spin inside the
    build, so the first to arrive took the cores the last ones still computed on (5.5 of 102 CPU-s of the GPT
    tests with Comm.Split, 8 ranks on 2 cores).
    """
    if mesh.size == 1:
        return
    number = len(mesh._groups) + 1
    polite = mesh.polite
    if debug.check_enabled():
        debug_calls.verify(mesh.comm, "split", axes, "int64", None, (), number, polite)
    elif polite or debug.watchdog_seconds() is not None:
        # a job call, as process.py's (no data: not through the door, which sits above the mesh)
        engine_of(mesh.comm).barrier(mesh.comm, debug_calls.waiter("split", axes, number, polite, mesh.comm))
