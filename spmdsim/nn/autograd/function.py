"""``spmdsim.nn.autograd.Function``: a user's own local op on shards, with its own backward.

Like ``torch.autograd.Function``, but each rank's `forward` and `backward`
see numpy blocks (this rank's shards), not global tensors::

    class Square(spmdsim.nn.autograd.Function):
        @staticmethod
        def forward(ctx, x):          # x: this rank's block of a DTensor
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, dy):        # dy: this rank's block of the output's gradient
            (x,) = ctx.saved_tensors
            return 2 * x * dy

    y = Square.apply(x)               # a DTensor in x's layout

The output has the first DTensor argument's layout and global shape unless
``apply(..., layout=, shape=)`` says otherwise; its block must have that
layout's shard shape. Inputs must not be pending sums (the op is the user's:
spmdsim cannot know it is linear); the gradient reaches `backward` whole in
the output's layout, and each returned block is the gradient of that input's
block (None for none): one per DTensor argument, or one per argument as
PyTorch's backward returns them (None for the others).
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Sequence

import numpy as np

from ...base.buffers import as_array, contiguous
from ...base.validate import counted, describe, dtype_name, shape_arg
from ...errors import OperatorError
from ...layouts.layout import Layout, TensorLayout
from ...base.context import current
from ...runtime.engines.trace import Trace
from .graph import is_grad_enabled, record, with_partial

__all__ = ["Function", "FunctionCtx"]


class FunctionCtx:
    """What `forward` passes to `backward`: ``save_for_backward(*arrays)``, ``saved_tensors``, and any attribute.

    ``ctx.rank``, ``ctx.slices`` (per DTensor argument, this rank's region of it) and ``ctx.layouts`` say where
    the blocks sit in the global tensors; ``ctx.mesh``, the arguments' mesh, is what a collective of
    spmdsim.runtime takes (``allreduce(ctx.mesh, block, "tp")``); ``ctx.needs_input_grad`` (PyTorch's), per
    argument, whether it is a DTensor that wants a gradient.
    """

    def __init__(self, rank: int, slices: tuple, layouts: tuple, needs_input_grad: tuple = (),
                 mesh: Any = None) -> None:
        self.rank, self.slices, self.layouts, self.mesh = rank, slices, layouts, mesh
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved_tensors = arrays


class Function:
    """Subclass with static ``forward(ctx, *blocks_and_args)`` and ``backward(ctx, dy_block)``; call ``apply``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:  # pragma: no cover - the subclass's
        raise NotImplementedError("a Function subclass defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx: FunctionCtx, dy: Any) -> Any:  # pragma: no cover - the subclass's
        raise NotImplementedError("a Function subclass defines backward(ctx, dy)")

    @classmethod
    def apply(cls, *args: Any, layout: Any = None, shape: Sequence[int] | None = None) -> Any:
        """Run `forward` on this rank's blocks of the DTensor arguments (others pass as they are)."""
        tensors = [a for a in args if hasattr(a, "_ag") and hasattr(a, "layout")]
        positions = {id(t): k for k, t in enumerate(tensors)}
        name = cls.__name__
        if not tensors:
            raise OperatorError(f"{name}.apply: no argument is a DTensor")
        for method in ("forward", "backward"):  # a plain def: forward's ctx would be the first block
            if inspect.isfunction(inspect.getattr_static(cls, method)):
                raise OperatorError(f"{name}.{method} is not a static method; write @staticmethod above "
                                    f"def {method}(ctx, ...), as PyTorch's Function does")
        first = tensors[0]
        tensor = type(first)  # the runtime's DTensor, taken from the argument (no import of the runtime's dtensor)

        def make_dtensor(mesh: Any, local: Any, layout: Any, shape: Sequence[int]) -> Any:
            block = contiguous(local)  # (a 0-d block made 1-d: a scalar's, a loss's, made 0-d again)
            return tensor(mesh, block if np.ndim(local) else block.reshape(()), layout, tuple(shape))

        layout, shape = _output(name, tensors, layout, shape)
        recording = is_grad_enabled()
        needs = tuple(recording and id(a) in positions and a._ag is not None for a in args)
        ctx = FunctionCtx(first.mesh.rank, tuple(t.slices for t in tensors), tuple(t.layout for t in tensors), needs,
                          first.mesh)
        block = cls.forward(ctx, *[a.local if any(a is t for t in tensors) else a for a in args])
        if isinstance(block, tuple) or not _numeric(block):
            raise OperatorError(f"{name}.forward returned {_what(block)}; expected one numpy array of real numbers "
                                "(bool, integer or float), this rank's block of the output (one output per Function)")
        block = np.asanyarray(block)
        expected = layout.local_shape(shape, first.mesh.rank)
        if block.shape != expected:
            raise OperatorError(f"{name}.forward returned a block of shape {block.shape!r}; the output's layout "
                                f"{layout} of global shape {shape!r} needs {expected!r}")
        out = make_dtensor(first.mesh, block, layout, shape)
        if all(t._ag is None for t in tensors):
            return out

        def backward(dy: Any) -> tuple:
            if cls.backward is Function.backward:  # (the base's NotImplementedError named no class)
                raise OperatorError(f"{name} defines no backward, and an argument of it requires grad; write "
                                    "@staticmethod def backward(ctx, dy) returning one gradient per DTensor argument "
                                    "(or call it under spmdsim.nn.autograd.no_grad())")
            unsummed = _copies_to_sum(tensors, layout)
            if not unsummed:
                grads = cls.backward(ctx, dy.local)
            else:  # the collectives it makes, watched: a copy's gradient needs one over the axes that split the rest
                grads, seen = _watched(cls.backward, ctx, dy.local)
            grads = grads if isinstance(grads, tuple) else (grads,)
            if len(grads) == len(args) != len(tensors):  # PyTorch's habit: one per argument, None for the others
                extra = [k for k, a in enumerate(args) if positions.get(id(a)) is None and grads[k] is not None]
                if extra:
                    raise OperatorError(f"{name}.backward returned a gradient for argument {extra[0]} "
                                        f"({args[extra[0]]!r}), which is not a DTensor; return None there")
                grads = tuple(grads[k] for k, a in enumerate(args) if positions.get(id(a)) is not None)
            if len(grads) != len(tensors):
                raise OperatorError(_miscounted(name, len(grads), len(tensors), len(args)))
            result = []
            for t, g in zip(tensors, grads):
                if g is None or t._ag is None:
                    result.append(None)
                    continue
                if not _numeric(g):
                    raise OperatorError(f"{name}.backward returned {_what(g)} as a gradient; expected a numpy array of "
                                        "real numbers (bool, integer or float), the gradient of this rank's block of "
                                        "that argument")
                g = as_array(g, t.dtype)
                if g.shape != t.local.shape:
                    raise OperatorError(f"{name}.backward returned a gradient block of shape {g.shape!r} "
                                        f"for an argument block of shape {t.local.shape!r}")
                result.append(make_dtensor(t.mesh, g, t.layout, t.global_shape))
            if unsummed:
                _warn_unsummed(name, unsummed, result, seen, first.mesh.rank)
            return tuple(result)

        return record(out, name, tuple(tensors), backward, with_partial(layout, ()))


def _output(name: str, tensors: list, layout: Any, shape: Any) -> tuple[TensorLayout, tuple[int, ...]]:
    """The output's layout and global shape (`layout=`, `shape=`, else the first DTensor's), the arguments checked
    first: one mesh, no pending sum; `layout=` a TensorLayout of that mesh. Alike on every rank: layouts only."""
    mesh = tensors[0].mesh
    for t in tensors:
        if t.mesh is not mesh and (why := mesh.apart_from(t.mesh)):
            raise OperatorError(f"{name}.apply: its DTensor arguments live on different meshes: {why}"
                                + ("; redistribute one onto the other's mesh first" if t.mesh.layout != mesh.layout
                                   else ""))
        if t.layout.partial:
            raise OperatorError(f"{name}.apply: argument of layout {t.layout} is a pending sum; resolve it "
                                "first with spmdsim.nn.ops.resolved(x) (one Allreduce, on every rank): spmdsim "
                                f"cannot know whether {name} is linear")
    given_layout = layout is not None
    if layout is None:
        layout = tensors[0].layout
    elif not isinstance(layout, TensorLayout):
        given = f"{layout}, a device matrix" if isinstance(layout, Layout) else describe(layout)
        raise OperatorError(f"{name}.apply: layout={given}; expected a TensorLayout on the arguments' "
                            f"mesh, as x.mesh.layout(...) gives, or an argument's own (x.layout: {tensors[0].layout})")
    elif layout.layout != mesh.layout:
        raise OperatorError(f"{name}.apply: layout={layout} is over {layout.layout}, but the arguments live on "
                            f"{mesh.layout}; build it on their mesh: x.mesh.layout(...)")
    shape = tuple(tensors[0].global_shape) if shape is None else shape_arg(shape, f"{name}.apply: shape=",
                                                                          OperatorError)
    if len(layout.tensor_map) != len(shape):  # shape= alone, the first argument's layout kept: say layout=
        whose = "layout=" if given_layout else "the first argument's layout (no layout= given)"
        dims = ", ".join(["None"] * len(shape))
        raise OperatorError(f"{name}.apply: shape={shape!r} has {len(shape)} dims but {whose} {layout} has "
                            f"{len(layout.tensor_map)} entries; give layout= for the output on the arguments' mesh: "
                            f"x.mesh.layout({dims}) replicated, or x.mesh.layout({dims}{', ' if dims else ''}"
                            f"partial={mesh.layout.alias_name!r}) where each rank's block is an addend")
    return layout, shape


def _copies_to_sum(tensors: list, out: TensorLayout) -> dict:
    """Argument index -> the axes (of more than one rank) its DTensor is a copy over but the output or another
    argument is split over: the gradient a rank's backward finds there is its part's alone, to be added up over
    them (docs/howto/add-operator.md). Alike on every rank: layouts only."""
    found = {}
    for k, t in enumerate(tensors):
        split = set(out.split_axes).union(*(u.layout.split_axes for u in tensors if u is not t))
        axes = tuple(a for a in t.layout.copy_axes if a in split)
        if axes:
            found[k] = axes
    return found


def _watched(backward: Any, *args: Any) -> tuple:
    """(`backward(*args)`, the Trace of the collectives it made): collect_trace's, without importing the runtime
    above its engines (this module decides; spmdsim.runtime.trace is the running rank's)."""
    seen, traces = Trace(), current().traces
    traces.append(seen)
    try:
        return backward(*args), seen
    finally:
        traces.remove(seen)


def _warn_unsummed(name: str, unsummed: dict, grads: list, seen: Any, rank: int) -> None:
    """A RuntimeWarning (from the mesh's rank 0) for each gradient of a copy that `backward` returned without a
    collective of spmdsim.runtime over its axes (`seen`: what it called): each rank holds its own part alone."""
    if rank != 0:
        return
    covered = {a for e in seen.entries for a in e.axes}
    for k, axes in unsummed.items():
        missing = tuple(a for a in axes if a not in covered)
        if grads[k] is not None and missing:
            warnings.warn(f"{name}: DTensor argument {k} is replicated over {missing!r}, which splits the output or "
                          f"another argument, and {name}.backward returned its gradient without a collective over "
                          "them: each rank holds the gradient through its own part only; add the parts up in "
                          f"backward: allreduce(ctx.mesh, grad, {missing!r}) (docs/howto/add-operator.md)",
                          RuntimeWarning, stacklevel=2)


def _numeric(value: Any) -> bool:
    """Whether `value` is a block of numbers (an array, a number or nested lists of them), not a DTensor."""
    if hasattr(value, "_ag") and hasattr(value, "layout"):
        return False
    try:
        return np.asanyarray(value).dtype.kind in "biufV"
    except (TypeError, ValueError):  # ragged lists
        return False


def _what(value: Any) -> str:
    """`value` named by its kind, for a refusal (alike on every rank: no rank's values)."""
    if hasattr(value, "_ag") and hasattr(value, "layout"):
        return f"a DTensor of global shape {tuple(value.global_shape)!r} (blocks are numpy arrays: x.local)"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "") not in "biufV":  # a complex, string or object array
        return f"an array of dtype {dtype_name(dtype)!r}"
    return f"a {type(value).__name__}"


def _miscounted(name: str, grads: int, tensors: int, args: int) -> str:
    """A backward that returned `grads` gradients for a forward of `tensors` DTensors among `args` arguments."""
    among = f" among {counted(args, 'argument')}" if args != tensors else ""
    pytorch = f", or {args}, one per argument as PyTorch's" if args != tensors else ""
    return (f"{name}.backward returned {counted(grads, 'gradient')} for a forward of "
            f"{counted(tensors, 'DTensor argument')}{among}; expected {tensors}, one per DTensor argument{pytorch} "
            "(None where there is none)")
