"""The recorded graph: leaves that require grad, nodes that operators attach to their outputs.

Each DTensor has one slot, ``_ag``: None (no gradient wanted: the forward
pays one attribute check per operand), a `Leaf` (a tensor the user marked
with ``requires_grad_()``, holding ``.grad``) or a `Node` (the output of an
operator one of whose inputs required grad). A node keeps its inputs and a
backward function that maps the output's gradient to one gradient per input.
Pure Python: importing it starts no MPI.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Optional, Sequence

from ..errors import OperatorError
from ..precision import is_low
from ..layout import TensorLayout

__all__ = ["Leaf", "Node", "record", "attach", "no_grad", "is_grad_enabled", "requires_grad_", "used_axes",
           "with_partial", "kept_as", "enable_grad"]


class _ModeState(threading.local):
    """Whether operators record (False inside ``no_grad()``), per thread: simulated ranks are threads,
    and one rank's ``no_grad()`` must not switch recording off for the others."""

    enabled = True
    kind: Optional[str] = None  # what the nodes recorded now keep for backward (`kept_as`)


_Mode = _ModeState()


def is_grad_enabled() -> bool:
    """True unless inside ``no_grad()``."""
    return _Mode.enabled


@contextmanager
def no_grad() -> Iterator[None]:
    """Operators run inside this block record no graph (optimizer updates, checks)."""
    before = _Mode.enabled
    _Mode.enabled = False
    try:
        yield
    finally:
        _Mode.enabled = before


@contextmanager
def enable_grad() -> Iterator[None]:
    """Operators inside record again, even within ``no_grad()`` (a recomputed region's backward)."""
    before = _Mode.enabled
    _Mode.enabled = True
    try:
        yield
    finally:
        _Mode.enabled = before


class kept_as:  # noqa: N801 - used as a function: ``with kept_as("mlp"):``
    """Nodes recorded inside keep their saved tensors under `kind` ("attention core", "mlp", ...), which
    `spmdsim.autograd.kept_bytes` groups by; per thread, as `no_grad`. Nested: the innermost kind.
    (A class, not a generator: a model's forward enters one around each part, 27 a GPT step.)"""

    __slots__ = ("kind", "before")

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        self.before = _Mode.kind
        _Mode.kind = self.kind

    def __exit__(self, *exc: Any) -> None:
        _Mode.kind = self.before


class _Recorded:
    """What a tensor in the graph can extend it with, without its caller importing autograd."""

    __slots__ = ()

    def moved(self, out: Any, x: Any) -> Any:
        """`out` is `x` redistributed (the executor's move): its backward is the reverse move,
        which the backward walk makes as it brings each gradient to its input's layout. Its name holds the
        two layouts, not the tensors: a closure over `out` made a cycle (out -> its node -> the name -> out)
        that kept both blocks, about 6 MiB a GPT step's rank, until the garbage collector ran."""
        return record(out, partial(_move_name, x._layout, out._layout), (x,), _passed)


def _move_name(source: Any, target: Any) -> str:
    return f"redistribute {source} -> {target}"


def _passed(dy: Any) -> tuple:
    return (dy,)


class Leaf(_Recorded):
    """A tensor the user asked gradients for; ``grad`` is a DTensor in its layout (or None)."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: Any = None


class Detached(Leaf):
    """An activation made a leaf where a checkpointed region is recomputed (spmdsim.autograd.checkpoint): a
    leaf for the walk, but no parameter: the nodes reading it round their gradients as any activation's
    readers do (spmdsim.autograd.engine's `_of_parameters`)."""

    __slots__ = ()


class Node(_Recorded):
    """An operator's output in the graph.

    Attributes:
        name: the operator ("matmul", "relu", ...), or a function making a longer
            text (the forward step, for explanations); `describe()` gives the text.
        inputs: the DTensor operands (None where an operand is not a DTensor).
        backward: ``backward(dy) -> tuple of gradients, one per input`` (None
            where an input needs none); None once the graph was freed.
        want: the layout (without partial axes) the gradient of the output must
            have when `backward` receives it, or None to take it as it comes.
        reads: layouts of the tensors `backward` reads besides the gradient; a
            pending sum of the gradient over an axis none of them uses passes
            through (the backward is linear and their blocks repeat there).
        kind: what the node keeps for backward, for the memory tracker (`kept_as`); None: untagged.
        low: the output's dtype when it is bfloat16 (spmdsim.precision), else None.
    """

    __slots__ = ("name", "inputs", "backward", "want", "reads", "kind", "low")

    def __init__(self, name: str, inputs: tuple, backward: Callable, want: Any, reads: tuple,
                 kind: Optional[str] = None, low: Any = None) -> None:
        self.name, self.inputs, self.backward, self.want, self.reads = name, inputs, backward, want, reads
        self.kind = kind
        self.low = low  # the output's dtype when bfloat16: its gradient is rounded to it before `backward`

    def describe(self) -> str:
        """The forward step this node records, as text."""
        return self.name if isinstance(self.name, str) else self.name()


def requires_grad_(tensor: Any, flag: bool = True) -> Any:
    """Mark `tensor` (a leaf) as needing ``.grad``; integer and bool tensors are refused."""
    if not flag:
        if isinstance(tensor._ag, Node):
            raise OperatorError("requires_grad_(False) on the output of an operator: only a leaf "
                                "(a tensor you built) can stop requiring grad; use no_grad() instead")
        tensor._ag = None
        return tensor
    if tensor.dtype.kind != "f" and not is_low(tensor.dtype):
        raise OperatorError(
            f"requires_grad_() on a DTensor of dtype {tensor.dtype.name!r}: only floating tensors "
            "have gradients (integer ids and labels never need one)")
    if tensor._ag is None:
        tensor._ag = Leaf()
    return tensor


def record(out: Any, name: str | Callable[[], str], inputs: Sequence[Any], backward: Callable,
           want: Any = None, reads: Optional[Sequence[Any]] = None) -> Any:
    """Attach a Node to `out` unless inside ``no_grad()``; returns `out`.

    Operators call it only when an input has ``_ag`` set. `reads`: the
    tensors (or layouts) the backward reads; default the inputs and `out`.
    """
    if not _Mode.enabled:
        return out
    if reads is None:
        reads = tuple(inputs) + (out,)
    # A loop, not a comprehension (a frame of its own); a TensorLayout is its own layout (its `.layout` is
    # the device matrix).
    layouts = []
    for t in reads:
        if t is not None:
            layouts.append(t if type(t) is TensorLayout else t.layout)
    return attach(out, name, tuple(inputs), backward, want, tuple(layouts))


def attach(out: Any, name: str | Callable[[], str], inputs: tuple, backward: Callable, want: Any,
           reads: tuple) -> Any:
    """`record` for a caller that knows its node's read layouts (`reads`, a tuple of TensorLayouts, not
    tensors) and gives `inputs` as a tuple: an operator's prepared call (spmdsim.ops.pointwise), which
    works them out once per call signature, not on every call. Attaches nothing inside ``no_grad()``."""
    if not _Mode.enabled:
        return out
    dtype = out._local.dtype
    # Node's fields set here, as Node() sets them, without its __init__'s frame (a node per operator).
    node = _new_node(Node)
    node.name, node.inputs, node.backward, node.want, node.reads = name, inputs, backward, want, reads
    node.kind = _Mode.kind
    node.low = dtype if dtype.kind == "V" and is_low(dtype) else None
    out._ag = node
    return out


_new_node = object.__new__


def used_axes(layouts: Sequence[Any]) -> frozenset:
    """Mesh axes that split or hold pending sums in any of `layouts` (a tuple: remembered)."""
    try:
        return _USED[layouts]
    except (KeyError, TypeError):  # new, or not hashable (a list)
        pass
    used: set = set()
    for layout in layouts:
        used.update(layout.split_axes)
        used.update(layout.partial)
    out = frozenset(used)
    if type(layouts) is tuple:
        if len(_USED) >= _CACHE_MAX:
            _USED.clear()
        _USED[layouts] = out
    return out


_USED: dict = {}  # a node's read layouts -> used_axes of them (a step asks for the same few)


_CACHE_MAX = 4096


def with_partial(layout: Any, partial: tuple[str, ...]) -> Any:
    """``layout.with_partial(partial)`` for a tuple of axis names, the same object on every call."""
    # By the layout object itself, never by value: a tuple of an int and strs hashes and compares in C,
    # where a TensorLayout key calls its Python __hash__ and __eq__; and each layout gets its own derived
    # layouts (TensorLayout.with_partial keeps them, ~5 us to build one), so a pending gradient, summed,
    # is its tensor's own layout object, not that of the first equal layout seen (the optimizer's check
    # of ~60 gradients a step then stops at `is`). The entry holds the layout: its id is not reused.
    seen = _BY_OBJECT.get((id(layout), partial))
    if seen is not None and seen[0] is layout:
        return seen[1]
    out = layout.with_partial(partial)
    if len(_BY_OBJECT) >= _CACHE_MAX:
        _BY_OBJECT.clear()
    _BY_OBJECT[(id(layout), partial)] = (layout, out)
    return out


_BY_OBJECT: dict = {}  # (id(layout), partial) -> (layout, with_partial's answer)
