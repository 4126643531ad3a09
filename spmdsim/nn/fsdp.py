"""Fully sharded data parallelism (ZeRO-3; PyTorch FSDP2's ``fully_shard``) over spmdsim's DTensor.

Each parameter becomes a leaf whose layout splits its dim 0 over the mesh's data axis as well (FSDP2's
``Shard(0)``; after the axes that already split dim 0, so that gathering over the data axis gives back the
parameter's own layout): a rank holds 1/dp of it (on a mesh that cuts by `CUT`, torch.chunk's rule, rows the
shards do not divide are cut as FSDP2 cuts them, the last shards short), and the optimizer steps those shards. A
unit (a layer, or the model's root: the embedding and the head) is gathered just before its forward reads it,
flat, as FSDP2 gathers (spmdsim.nn.fsdp_flat): its shards packed into one buffer and gathered by one Allgather (a
`BlockAllgather` step record the executor runs), each parameter's block copied out of the gathered buffer; its
backward waits for the unit's gradients, each a pending sum over the data axis, packs them and sums them onto the
shards by one Reduce_scatter (a `BlockReduceScatter`, the gather's conjugate). One gather and one reduce-scatter
per unit (per group of its parameters sharded over the same axes, of one dtype: two in an expert layer). A step of
the 4-layer GPT on dp 8 makes 9 gathers (the root's once, each layer's twice) and 5 Reduce_scatters where a call
per parameter made 124 and 64; its `collectives` column counts them with the loss's Allreduce::

    python examples/train_gpt.py --ranks 8 --dp 8 --zero 3 --steps 1 --sample 0 --no-check   # 15 collectives

The gathered buffer and the blocks copied out of it coexist for that moment: `held` and `most` count both. No
gradient of the whole parameter outlives its unit's backward.

With ``reshard_after_forward`` (FSDP2's default) a unit's gathered blocks are freed when its forward ends and
gathered again when its backward starts: an identity node on the unit's output whose backward runs the
gathers again (no graph recorded) and puts the blocks back into the very tensors the unit's nodes hold, before
any of them runs. Without it they stay until the unit's backward is done. Either way an identity node on the
unit's input frees them once every node of the unit has run its backward (FSDP2's post-backward reshard).
A unit whose forward runs under ``no_grad`` (evaluation, or a recomputed region's first forward) frees its
blocks as soon as the forward ends. The root's parameters are gathered once and kept to the end of the
backward, as FSDP2 keeps its root's.

On a mesh with an "expert" role beside the "data" one (expert parallelism) each parameter is sharded over the
data-parallel axes it is replicated over: a dense one over (data, expert), all the ranks that hold a copy of
it, an expert's (split over the expert axis) over the data axis alone, the ranks that hold the same experts
(Megatron-Core's and DeepSpeed's expert-data-parallel group); its gradient, a pending sum over those axes, is
reduce-scattered over them. A "context" axis (each rank sees part of every sequence) is one more, as in FSDP2.

With ``prefetch`` the next unit's gathers run before a unit's forward and the previous unit's before its
backward (two units gathered at once). On a mesh with a "shard" role beside the "data" one the parameters are
sharded over the shard axis and replicated over the data axis (HSDP): the Reduce_scatter runs within a
shard group and its result, the unit's shard gradients end to end, is summed across the groups by one Allreduce
over the data axis.

    >>> # fs = fully_shard(params, mesh)                       # params: name -> DTensor
    >>> # y = fs.unit(["w1"], lambda h, used: h @ used["w1"], x)  # one unit's forward; fs.params to the optimizer
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from ..base import buffers
from ..base.foreign import take_foreign
from ..base.validate import describe
from ..errors import LayoutError, SpmdsimError
from ..layouts.layout import TensorLayout
from ..runtime.dtensor import DTensor
from ..runtime.executor import redistribute
from ..runtime.mesh import Mesh
from .autograd.graph import is_grad_enabled, kept_as, no_grad, record
from .autograd.kept import nothing, shell
from .fsdp_flat import flat_groups, gather_blocks, gathered
from ..base.tables import put

__all__ = ["fully_shard", "FullyShard", "sharded_layout", "shard_axes", "shard_group", "shard_problem", "on_mesh",
           "GATHERED", "CUT"]

#: The kind of kept bytes (spmdsim.nn.autograd.kept_bytes) of a unit's gathered parameters held for its backward.
GATHERED = "gathered parameters"
#: The cut (spmdsim.layouts.slicing) of a mesh whose parameters fully_shard shards unevenly: FSDP2's, torch.chunk's
#: (pieces of ceil(rows / shards), the last ones short or empty). On an even mesh a dim 0 the shards do not divide
#: is refused.
CUT = "chunk"


def on_mesh(layouts: dict, layout: Any) -> dict:
    """`layouts` (name -> TensorLayout) over the Layout `layout` where each is over its device matrix and axes
    under another cut (a model's layouts, written before its mesh took ZeRO-3's `CUT`); the others as given."""
    same = layout.with_cut("even")
    return {name: TensorLayout(layout, t.tensor_map, t.partial)
            if isinstance(t, TensorLayout) and t.layout != layout and t.layout.with_cut("even") == same else t
            for name, t in layouts.items()}


def sharded_layout(layout: TensorLayout, axis: Any) -> TensorLayout:
    """`layout` with dim 0 split over `axis` (a name, or a tuple of them) too, after the axes that already split
    it (the minor ones).

    The shard FSDP keeps; gathering it over `axis` gives `layout` back. Pure: made once per (layout, axis names)."""
    named = type(axis) is str or type(axis) is tuple and all(type(a) is str for a in axis)
    key = (layout, axis) if named and type(layout) is TensorLayout else None
    made = None if key is None else _SHARDED.get(key)
    if made is None:
        entries = tuple(layout.tensor_map)
        axes = (axis,) if isinstance(axis, str) else tuple(axis)
        made = TensorLayout(layout.layout, (entries[0] + axes,) + entries[1:], layout.partial)
        if key is not None:
            put(_SHARDED, key, made, 1024)
    return made


_SHARDED: dict = {}  # (TensorLayout, axis: a name or a tuple of them) -> `sharded_layout`'s answer


def shard_group(mesh_layout: Any, roles: dict) -> tuple:
    """The axes fully_shard shards over on a mesh of `roles` (role -> axis): its "shard" axis (HSDP) and its
    "context" axis where it has one, else its "data" axis and, where it has them, its "expert" and "context" axes
    (each parameter over those it is replicated over: `shard_axes`); () where it has none. Pure. (The
    context-parallel ranks hold the same parameters: FSDP2 shards over PyTorch's dp_shard x cp.)"""
    kinds = ("shard", "context") if roles.get("shard") else ("data", "expert", "context")
    return tuple(roles[r] for r in kinds if roles.get(r) in mesh_layout.alias_name)


def shard_axes(layout: TensorLayout, group: tuple) -> tuple:
    """The axes of `group` a parameter of `layout` is sharded over: those it is replicated over (an expert's,
    split over the expert axis, over the data axis alone; a dense one over all of them). Pure."""
    used = {a for entry in layout.tensor_map for a in entry}
    return tuple(a for a in group if a not in used)


#: What `shard_problem` adds to rows an even mesh's shards do not divide: how to shard them.
_EVEN_MESH = (f" on a mesh that cuts evenly; a mesh of Layout(..., cut={CUT!r}) shards it as FSDP2 does, the last "
             "shards short")


def shard_problem(name: str, layout: TensorLayout, shape: tuple, axis: Any, even: str = _EVEN_MESH) -> Optional[str]:
    """Why parameter `name` (its `layout` and global `shape`) cannot be sharded over `axis` (a name, or the
    group of axes `shard_axes` picks from), or None. `even`: the end of the line for rows the shards of a mesh
    that cuts evenly do not divide (a caller whose user makes no mesh says why instead).

    One line, alike on every rank (pure: no collective)."""
    if not shape:
        return f"parameter {name!r} is a scalar; fully sharded data parallelism splits dim 0 of each parameter"
    if layout.partial:
        return f"parameter {name!r} is a pending sum over {layout.partial!r}; expected a resolved parameter"
    group = (axis,) if isinstance(axis, str) else tuple(axis)
    axes = shard_axes(layout, group)
    if not axes:
        what = f"the data axis {group[0]!r}" if len(group) == 1 else f"every data-parallel axis {group!r}"
        return f"parameter {name!r} is already split over {what} ({layout}); expected a layout replicated over it"
    shards = 1
    for a in layout.tensor_map[0] + axes:
        shards *= layout.layout.axis_size(a)
    if shape[0] % shards and layout.layout.cut == "even":
        return (f"parameter {name!r} dim 0 of size {shape[0]} is not divisible by {shards} shards (axes "
                f"{layout.tensor_map[0] + axes!r}){even}")
    return None


class FullyShard:
    """A model's parameters sharded over the data axis, made by `fully_shard`.

    `params`: name -> leaf DTensor, 1/dp each (the optimizer's); `layouts`: name -> the layout the forward
    reads it in; `axes`: name -> the axes it is sharded over (`shard_axes` of `group`); `unit` and `unshard`
    gather them; `held` and `most`: the gathered bytes held now and the most held at once since `start`."""

    def __init__(self, params: dict, mesh: Any, reshard_after_forward: bool, group: Any,
                 prefetch: bool = False) -> None:
        group = (group,) if isinstance(group, str) else tuple(group)
        self.mesh, self.reshard_after_forward, self.group = mesh, bool(reshard_after_forward), group
        self.axis = group[0]  # the data axis (HSDP: the shard axis)
        self.prefetch = bool(prefetch)
        # prefetched: the next unit's gathered tensors (forward), the previous unit's blocks (backward), by names
        self._ahead: dict = {}
        self._behind: dict = {}
        self.layouts = {name: t.layout for name, t in params.items()}
        self.axes = {name: shard_axes(t.layout, group) for name, t in params.items()}
        # bytes of gathered blocks held now, and the most held at once since `start` (the memory report's)
        self.held = self.most = 0
        self._live: dict = {}  # id -> a gathered tensor whose block is held (not released)
        self._plans: dict = {}  # a unit's names -> its flat groups (`_groups`)
        self.params: dict = {}
        for name, t in params.items():
            target = sharded_layout(t.layout, self.axes[name])
            with no_grad():  # B -> S(0) over the data axis: a local slice, no communication
                moved = redistribute(t, target).local
            # its own buffer, so that the whole block can go (a dry run's: the engine's zeros, never touched)
            block = mesh.engine.blank(moved.shape, moved.dtype) if mesh.engine.dry else moved.copy()
            leaf = DTensor.from_local(mesh, block, target, t.global_shape)
            self.params[name] = leaf.requires_grad_() if t._ag is not None else leaf
            if t._ag is not None:  # an optimizer given `t` would never see a gradient: refused (optim_checks)
                t._ag.sharded_away = name

    def unshard(self, names: Iterable[str], held: bool = True) -> dict:
        """name -> the parameter whole again on the data axis (its own layout): one Allgather for each group of
        them that shares its axes and dtype (`spmdsim.nn.fsdp_flat`), recorded (its backward reduce-scatters
        the group's gradients onto the shards at once) where gradients are recorded. `held` False: not counted
        nor kept for `release` (the blocks go with the graph that holds them)."""
        out: dict = _Gathered()
        for group in self._groups(names):
            leaves = [self.params[m.name] for m in group.members]
            if group.size == 1:  # nothing to gather (a data axis of size 1): each its own move, which moves nothing
                tensors = [redistribute(t, m.layout) for t, m in zip(leaves, group.members)]
                flat = 0
            else:
                blocks, flat = gather_blocks(self.mesh, group, [_block(t) for t in leaves])
                tensors = gathered(self.mesh, group, leaves, blocks)
            out.update((m.name, t) for m, t in zip(group.members, tensors))
            if held:  # the gathered buffer beside the copied-out blocks, then freed
                self._count(flat)
                self._held(tensors)
                self._count(-flat)
        return out

    def _groups(self, names: Iterable[str]) -> tuple:
        """The flat groups (spmdsim.nn.fsdp_flat.flat_groups) of the unit `names`, worked out once."""
        key = tuple(names)
        groups = self._plans.get(key)
        if groups is None:
            unknown = [n for n in key if n not in self.params]
            if isinstance(names, str) or unknown:
                what = f"{names!r} is one name; expected a list of names, [{names!r}]" if isinstance(names, str) \
                    else f"{unknown[0]!r} is not a parameter fully_shard sharded"
                raise SpmdsimError(f"fully_shard unit: {what}; its parameters are {', '.join(map(repr, self.params))}")
            groups = self._plans[key] = flat_groups(self, list(key))
        return groups

    def _held(self, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self._live[id(t)] = t
            self._count(t.local.nbytes)

    def _count(self, nbytes: int) -> None:
        self.held += nbytes
        self.most = max(self.most, self.held)

    def start(self) -> None:
        """Count the most gathered bytes held at once from now on (a step's forward starts)."""
        self.most = self.held

    def release(self, gathered: dict) -> None:
        """Free `gathered`'s blocks (a dict `unshard` gave) that are still held: a unit after its use, the root
        when the next forward gathers it again."""
        for t in gathered.values():
            if self._live.pop(id(t), None) is not None:
                self._count(-t._local.nbytes)
                t._local = nothing(t._local.dtype, t._local.shape)

    def unit(self, names: Iterable[str], fn: Callable[..., Any], x: Any, *args: Any,
             reshard: Optional[bool] = None, after: Optional[list] = None, before: Optional[list] = None) -> Any:
        """``fn(x', gathered, *args)``: one unit's forward, its parameters `names` gathered first (`unshard`)
        and `x'` an identity of the activation `x` whose backward frees them again once the unit's backward
        is done; with ``reshard_after_forward`` freed when `fn` returns and gathered again before the
        unit's backward (an identity on the output, see the module docstring). `fn` returns one DTensor.
        `reshard`: this unit's choice in place of ``reshard_after_forward`` (False in a recomputed region,
        whose backward follows its forward at once). With ``prefetch``, `after` (the next unit's names) are
        gathered before `fn` runs, and `before` (the previous unit's) before this unit's backward runs
        (FSDP's forward and backward prefetch: two units' gathered parameters held at once)."""
        if isinstance(names, str):
            self._groups(names)  # (refused: one name, not a list of them)
        names = list(names)
        reshard = self.reshard_after_forward if reshard is None else reshard
        gathered = self._ahead.pop(tuple(names), None) or self.unshard(names)
        if self.prefetch and after:
            self._ahead[tuple(after)] = self.unshard(after)
        before = before if self.prefetch else None
        recording = is_grad_enabled() and (x._ag is not None or any(t._ag is not None for t in gathered.values()))
        if recording and x._ag is not None:  # (an input without a graph, the data: freed when the graph goes)
            x = _identity(x, "fsdp.post_backward", lambda: self.release(gathered))
        out = fn(x, gathered, *args)
        if not isinstance(out, DTensor):
            self.release(gathered)
            raise SpmdsimError(f"fully_shard unit {names!r}: fn returned a {type(out).__name__}; expected one DTensor "
                               "(a unit's output is one tensor: run a second unit for a second output)")
        if not recording:
            self.release(gathered)
            return out
        if reshard:
            self.release(gathered)
            out = _identity(out, "fsdp.pre_backward", lambda: self._regather(names, gathered, before))
        return out

    def _regather(self, names: list, gathered: dict, before: Optional[list] = None) -> None:
        """The unit's gathers again (or their blocks prefetched), no graph recorded, put into the tensors its
        nodes hold; with `before`, the previous unit's gathered ahead of its backward."""
        again = self._behind.pop(tuple(names), None) or self._fetch(names)
        for name in names:
            t = gathered[name]
            t._local = again[name]
            self._live[id(t)] = t
        if before:
            self._behind[tuple(before)] = self._fetch(before)

    def _fetch(self, names: list) -> dict:
        """name -> the block of the parameter gathered (no graph recorded), counted as held (and each group's
        gathered buffer while its blocks are copied out of it)."""
        blocks: dict = {}
        with no_grad():
            for group in self._groups(names):
                leaves = [self.params[m.name] for m in group.members]
                if group.size == 1:
                    got, flat = [redistribute(t, m.layout).local for t, m in zip(leaves, group.members)], 0
                else:
                    got, flat = gather_blocks(self.mesh, group, [_block(t) for t in leaves])
                blocks.update((m.name, b) for m, b in zip(group.members, got))
                self._count(flat + sum(b.nbytes for b in got))
                self._count(-flat)
        return blocks


class _Gathered(dict):
    """A unit's gathered parameters, name -> DTensor: a name the unit did not gather is refused in one line."""

    def __missing__(self, name: Any) -> Any:
        raise SpmdsimError(f"fully_shard unit: fn read parameter {name!r}, which this unit did not gather (it "
                           f"gathered {', '.join(map(repr, self)) or 'nothing'}); list every parameter the "
                           "unit's fn reads in its names")


def _block(t: Any) -> Any:
    """`t`'s block (a captured step's traced view of it while capturing)."""
    return t._local if not buffers.CAPTURE.on else t.local


def _identity(x: Any, name: str, then: Callable[[], None]) -> Any:
    """`x` on the same block, one node whose backward calls `then` and passes the gradient on. The node keeps
    no block of `x` (its `shell`); what `then` reaches (the unit's gathered parameters) it keeps as `GATHERED`."""
    out = DTensor._trusted(x.mesh, x.local, x.layout, tuple(x.global_shape))

    def backward(dy: Any) -> tuple:
        then()
        return (dy,)

    with kept_as(GATHERED):
        return record(out, name, (shell(x),), backward, reads=(x, out))


def _group(mesh: Mesh, axis: Any) -> tuple:
    """The axes `fully_shard` shards over: `axis` (a name or a tuple of names, each an axis of `mesh`), or where
    it is None those of the mesh's roles (`shard_group`); one line where they are none or no axes of the mesh."""
    names = mesh.layout.alias_name
    if axis is None:
        group = shard_group(mesh.layout, mesh.roles)
        if not group:
            raise SpmdsimError(f"fully_shard: the mesh {names!r} names no data axis (roles {mesh.roles!r}); "
                               "give the mesh a data role or axis=")
        return group
    group = (axis,) if isinstance(axis, str) else tuple(axis) if isinstance(axis, (tuple, list)) else ()
    bad = [a for a in group if a not in names]
    if not group or bad:
        what = repr(bad[0]) if bad else describe(axis)
        raise LayoutError(f"fully_shard: axis {what} is not an axis of the mesh; expected one of {names!r} "
                          "or a tuple of them")
    return group


#: FSDP2's fully_shard keywords (spmdsim.base.foreign): the values that ask for what this one does, and what it does.
_FSDP2_KEYWORDS = {
    "mp_policy": ((None,), "the units gather each parameter in its own dtype, which the model's precision "
                           "policy chose (the GPT's train(precision='bf16-mixed'): bf16 parameters)"),
    "offload_policy": ((None,), "the shards and the optimizer's states stay in this rank's memory (no CPU "
                                "offload)"),
    "shard_placement_fn": ((None,), "each parameter's dim 0 is split over the data axis (FSDP2's default "
                                    "Shard(0))"),
    "ignored_params": ((None,), "every parameter given is sharded; leave one out of params to keep it whole"),
}


def fully_shard(params: Any, mesh: Any, reshard_after_forward: bool = True,
                axis: Optional[str] = None, prefetch: bool = False, **foreign: Any) -> FullyShard:
    """Shard `params` over the data-parallel axis of `mesh` (PyTorch FSDP2's ``fully_shard``).

    Args:
        params: name -> DTensor (a model's parameters, in the layouts its forward reads them in), or an
            object with such a ``params`` dict (spmdsim.models.gpt.parallel.GPT).
        mesh: the mesh they live on; its axis of the "shard" role shards them, replicated over the data axis
            (HSDP, FSDP2's 2-D mesh), or where it has none its axis of the "data" role (``mesh.axis("data")``)
            and, with expert parallelism, its "expert" axis: each parameter over those it is replicated over
            (`shard_axes`: experts over the data axis, dense parameters over both).
        reshard_after_forward: free each unit's gathered parameters after its forward and gather them
            again for its backward (FSDP2's default), or keep them until its backward.
        axis: the axis to shard over (or a tuple of them, each parameter over those it is replicated over),
            where the mesh names no data role.
        prefetch: gather the next unit's parameters before a unit's forward runs, and the previous unit's
            before a unit's backward runs (FSDP's forward and backward prefetch; `FullyShard.unit`).

    Returns a `FullyShard`: ``.params`` the sharded leaves (the optimizer's), ``.unit(...)`` a unit's forward.
    Every rank raises the same one-line error, before any collective, for a parameter it cannot shard.
    FSDP2's `mp_policy`, `offload_policy`, `shard_placement_fn` and `ignored_params` are taken as None only.
    """
    if foreign:  # FSDP2's keywords, by habit: spmdsim's values pass
        take_foreign("fully_shard", foreign, _FSDP2_KEYWORDS)
    if hasattr(params, "params") and isinstance(params.params, dict):
        params = params.params
    if not isinstance(params, dict):
        raise SpmdsimError(f"fully_shard: params must be a dict name -> DTensor or a model with .params, got "
                           f"{type(params).__name__}")
    if not isinstance(mesh, Mesh):
        raise LayoutError(f"fully_shard: mesh must be a spmdsim Mesh, got {describe(mesh)}; pass the Mesh the "
                          "parameters live on (Mesh(layout) makes one of a Layout)")
    for name, t in params.items():
        if not isinstance(t, DTensor):
            raise SpmdsimError(f"fully_shard: parameter {name!r} must be a DTensor, got {describe(t)}")
    group = _group(mesh, axis)
    for flag, value in (("reshard_after_forward", reshard_after_forward), ("prefetch", prefetch)):
        if type(value) is not bool:
            raise SpmdsimError(f"fully_shard: {flag} {value!r} must be True or False")
    for name, t in params.items():
        problem = shard_problem(name, t.layout, tuple(t.global_shape), group)
        if problem:
            raise SpmdsimError(f"fully_shard: {problem}")
    return FullyShard(params, mesh, reshard_after_forward, group, prefetch)
