"""The recorded graph: leaves that require grad, nodes that operators attach to their outputs.

Each DTensor has one slot, ``_ag``: None (no gradient wanted: the forward
pays one attribute check per operand), a `Leaf` (a tensor the user marked
with ``requires_grad_()``, holding ``.grad``) or a `Node` (the output of an
operator one of whose inputs required grad). A node keeps its inputs and a
backward function that maps the output's gradient to one gradient per input.
Pure Python: importing it starts no MPI.
"""
from __future__ import annotations

from collections import deque
import itertools
from itertools import repeat
import threading
from functools import partial, wraps
from operator import attrgetter, is_not
from typing import Any, Callable, Optional, Sequence

from ...errors import OperatorError
from ...base.precision import is_float, is_low
from ...layouts.layout import TensorLayout
from ...layouts.notation import move_name
from ...base.tables import put

__all__ = ["Leaf", "Node", "record", "attach", "no_grad", "is_grad_enabled", "requires_grad_", "used_axes",
           "with_partial", "kept_as", "enable_grad", "updated", "stale_reads"]


class _ModeState(threading.local):
    """Whether operators record (False inside ``no_grad()``), per thread: simulated ranks are threads,
    and one rank's ``no_grad()`` must not switch recording off for the others."""

    enabled = True  # False inside no_grad()
    # The `Node.seq` of this thread's last optimizer step (`updated`): a graph with a node recorded before it (a
    # lower seq) may read a parameter the step changed in place, which the backward looks for (`stale_reads`);
    # a graph recorded after it cannot (every node of a normal step's).
    step_seq = -1
    # (kind, era): what the nodes recorded now keep for backward (`kept_as`), and the era of this thread's
    # last optimizer step (`updated`). One tuple, which `attach` stores in each node as it is: a node learns
    # both for the one slot write it made for its kind alone.
    tag: tuple = (None, 0)


_Mode = _ModeState()


def is_grad_enabled() -> bool:
    """True unless inside ``no_grad()``."""
    return _Mode.enabled is not False


class _Switch:
    """`no_grad` and `enable_grad`: a context manager, and a decorator with or without its parentheses
    (``@no_grad()``, ``@no_grad``), as PyTorch's."""

    __slots__ = ("before",)
    _on = False

    def __new__(cls, func: Any = None) -> Any:
        if func is None:
            return object.__new__(cls)
        if not callable(func):
            raise OperatorError(f"{cls.__name__}({func!r}): expected no argument (with {cls.__name__}(): ...) or "
                                f"a function to decorate (@{cls.__name__})")
        return object.__new__(cls)(func)

    def __call__(self, func: Callable) -> Callable:
        switch = type(self)

        @wraps(func)
        def switched(*args: Any, **kwargs: Any) -> Any:
            with switch():
                return func(*args, **kwargs)

        return switched

    def __enter__(self) -> None:
        self.before = _Mode.enabled
        _Mode.enabled = self._on

    def __exit__(self, *exc: Any) -> None:
        _Mode.enabled = self.before


class no_grad(_Switch):  # noqa: N801 - PyTorch's name
    """Operators run inside this block record no graph (optimizer updates, checks)."""

    __slots__ = ()
    _on = False


class enable_grad(_Switch):  # noqa: N801 - PyTorch's name
    """Operators inside record again, even within ``no_grad()`` (a recomputed region's backward)."""

    __slots__ = ()
    _on = True


class kept_as:  # noqa: N801 - used as a function: ``with kept_as("mlp"):``
    """Nodes recorded inside keep their saved tensors under `kind` ("attention core", "mlp", ...), which
    `spmdsim.nn.autograd.kept_bytes` groups by.

    Per thread, as `no_grad`. Nested: the innermost kind.
    (A class, not a generator: a model's forward enters one around each part, 27 a GPT step.)"""

    __slots__ = ("kind", "before", "mine")

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        before = self.before = _Mode.tag
        _Mode.tag = self.mine = (self.kind, before[1])

    def __exit__(self, *exc: Any) -> None:
        # The kind before, at the era now (an optimizer step inside the block started a new one). The tag this
        # block set, still there (every nested block restored it, no step ran): the one before, as it is.
        tag = _Mode.tag
        if tag is self.mine:
            _Mode.tag = self.before
        else:
            before = self.before
            _Mode.tag = before if tag[1] == before[1] else (before[0], tag[1])


_ERAS = itertools.count(1)  # eras of optimizer steps, over every thread: each step's is new


def updated(leaves: Any) -> None:
    """Note that the blocks of these leaves (parameters) were just changed in place (an optimizer's step): a
    graph recorded before reads their new values, not those its forward read, and `stale_reads` finds it.
    Costs one tuple a step and one attribute per leaf (set in C), nothing per recorded node."""
    era = next(_ERAS)
    deque(map(setattr, leaves, repeat("updated"), repeat(era)), 0)  # leaf.updated = era for each, in C
    mode = _Mode
    mode.tag = (mode.tag[0], era)
    mode.step_seq = _next_seq()  # nodes recorded from now on on this thread have higher seqs


def stale_reads(order: Any) -> Any:
    """The first (node, leaf tensor) of the graph `order` (its nodes) whose node read the leaf before an
    optimizer step changed the leaf's block in place, or None. The backward asks only when the graph holds a
    node recorded before this thread's last step (`_ModeState.step_seq`): never in a normal step."""
    for node in order:
        era = node.tag[1]
        for t in node.inputs:
            leaf = getattr(t, "_ag", None)
            if isinstance(leaf, Leaf) and leaf.updated > era:
                return node, t
    return None


class _Recorded:
    """What a tensor in the graph can extend it with, without its caller importing autograd."""

    __slots__ = ()

    def moved(self, out: Any, x: Any, name: Any = None, reads: Optional[tuple] = None) -> Any:
        """`out` is `x` redistributed (the executor's move): its backward is the reverse move,
        which the backward walk makes as it brings each gradient to its input's layout. Its name holds the
        two layouts, not the tensors: a closure over `out` made a cycle (out -> its node -> the name -> out)
        that kept both blocks, about 6 MiB a GPT step's rank, until the garbage collector ran. `name` and
        `reads`: `move_name`'s and the two layouts, where the caller keeps them per move (the executor)."""
        # `record`'s node, its read layouts (x's and out's) given: no gathering them (a move a call);
        # `attach` written out (a move's node, 18 a GPT step), as it sets the fields
        if _Mode.enabled is not True:  # inside no_grad()
            return out
        if name is None:
            source, target = x._layout, out._layout
            name, reads = move_name(source, target), (source, target)
        node = _new_node(Node)
        node.name, node.inputs, node.backward, node.want, node.reads = name, (x,), _passed, None, reads
        node.tag = _Mode.tag
        node.low = _LOW[out._local.dtype]
        node.seq = _next_seq()
        out._ag = node
        return out


def _passed(dy: Any) -> tuple:
    return (dy,)


class Leaf(_Recorded):
    """A tensor the user asked gradients for; ``grad`` is a DTensor in its layout (or None); ``updated``: the
    era of the last optimizer step that changed its block in place (0: none; `updated`); ``main``: where its
    gradient accumulates, or None: a view of an optimizer's flat gradient buffer, shaped as the leaf's block
    (Megatron's main_grad: spmdsim.nn.distrib_optim under ZeRO-1), into which each backward's gradient is copied
    (the first since the step) or added, ``.grad`` then a DTensor of that view (spmdsim.nn.autograd.engine);
    ``sharded_away``: the parameter's name where spmdsim.nn.fsdp.fully_shard replaced it by its shards (an
    optimizer given it is refused: the units never read it, so it would never get a gradient), else None."""

    __slots__ = ("grad", "updated", "main", "sharded_away")

    def __init__(self) -> None:
        self.grad: Any = None
        self.updated = 0
        self.main: Any = None
        self.sharded_away: Optional[str] = None


class Detached(Leaf):
    """An activation made a leaf where a checkpointed region is recomputed (spmdsim.nn.autograd.checkpoint): a
    leaf for the walk, but no parameter: the nodes reading it round their gradients as any activation's
    readers do (spmdsim.nn.autograd.engine's `_of_parameters`)."""

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
        tag: (kind, era): what the node keeps for backward, for the memory tracker (`kept_as`; None:
            untagged), and the era of the thread's last optimizer step when it was recorded (`updated`).
        low: the output's dtype when it is bfloat16 (spmdsim.base.precision), else None.
        seq: when the node was recorded, a number that grows with each node recorded in the process: every
            node's inputs were recorded before it, so the backward walks a graph latest first (PyTorch's
            engine orders its ready nodes by such a sequence number too).
    """

    __slots__ = ("name", "inputs", "backward", "want", "reads", "tag", "low", "seq")

    def __init__(self, name: str, inputs: tuple, backward: Callable, want: Any, reads: tuple,
                 kind: Optional[str] = None, low: Any = None) -> None:
        self.name, self.inputs, self.backward, self.want, self.reads = name, inputs, backward, want, reads
        self.tag = (kind, _Mode.tag[1])
        self.low = low  # the output's dtype when bfloat16: its gradient is rounded to it before `backward`
        self.seq = _next_seq()

    @property
    def kind(self) -> Optional[str]:
        """What the node keeps for backward (`kept_as`); None: untagged."""
        return self.tag[0]

    def describe(self) -> str:
        """The forward step this node records, as text."""
        return self.name if isinstance(self.name, str) else self.name()


def requires_grad_(tensor: Any, flag: bool = True, spelled: str = "") -> Any:
    """Mark `tensor` (a leaf) as needing ``.grad``; integer and bool tensors are refused. `spelled`:
    "requires_grad = " when called as ``tensor.requires_grad = flag`` (for the refusals' text)."""
    if flag is not True and flag is not False:
        if type(flag).__name__ != "bool_":  # numpy's bool passes as Python's
            call = f"requires_grad = {flag!r}" if spelled else f"requires_grad_({flag!r})"
            raise OperatorError(f"{call}: expected True or False, got a {type(flag).__name__}")
        flag = bool(flag)
    if not flag:
        if isinstance(tensor._ag, Node):
            raise OperatorError("requires_grad_(False) on the output of an operator: only a leaf "
                                "(a tensor you built) can stop requiring grad; use no_grad() instead")
        tensor._ag = None
        return tensor
    if not is_float(tensor.dtype):
        raise OperatorError(
            f"requires_grad_() on a DTensor of dtype {tensor.dtype.name!r}: only floating tensors "
            "have gradients (integer ids and labels never need one)")
    if tensor._ag is None:
        tensor._ag = Leaf()
    return tensor


def set_grad(tensor: Any, value: Any) -> None:
    """``tensor.grad = value``: None forgets a leaf's gradient (nothing to forget elsewhere); a DTensor of the
    leaf's global shape, mesh and layout (no pending sum) and a floating dtype becomes its gradient."""
    leaf = tensor._ag
    if value is None:
        if isinstance(leaf, Leaf):
            leaf.grad = None
        return
    where = f"a DTensor of global shape {tuple(tensor.global_shape)!r}"
    if not isinstance(leaf, Leaf):
        raise OperatorError(f".grad = ... on {where} that is not a leaf with requires_grad_(): only such a tensor "
                            "holds a gradient (None may be set anywhere)")
    whole = tensor.layout if not tensor.layout.partial else tensor.layout.with_partial(())
    shape = getattr(value, "global_shape", None)
    if shape is None or not hasattr(value, "_ag"):
        raise OperatorError(f".grad = {type(value).__name__}: expected None or {where} laid out {whole}")
    if tuple(shape) != tuple(tensor.global_shape) or value.mesh is not tensor.mesh or value.layout != whole:
        raise OperatorError(f".grad = a DTensor of global shape {tuple(shape)!r} laid out {value.layout}: expected "
                            f"{where} laid out {whole} on the parameter's mesh")
    if not is_float(value.dtype):
        raise OperatorError(f".grad = a DTensor of dtype {value.dtype.name!r}: a gradient is floating")
    leaf.grad = value


def record(out: Any, name: str | Callable[[], str], inputs: Sequence[Any], backward: Callable,
           want: Any = None, reads: Optional[Sequence[Any]] = None) -> Any:
    """Attach a Node to `out` unless inside ``no_grad()``; returns `out`.

    Operators call it only when an input has ``_ag`` set. `reads`: the
    tensors (or layouts) the backward reads; default the inputs and `out`.
    """
    if not _Mode.enabled:
        return out
    if reads is None:
        reads = (*inputs, out)
    if TensorLayout not in map(type, reads):  # tensors (and Nones): their layouts gathered in C
        return attach(out, name, tuple(inputs), backward, want, tuple(map(_LAYOUT, filter(_NOT_NONE, reads))))
    # A loop, not a comprehension (a frame of its own); a TensorLayout is its own layout (its `.layout` is
    # the device matrix).
    layouts = []
    for t in reads:
        if t is not None:
            layouts.append(t if type(t) is TensorLayout else t.layout)
    return attach(out, name, tuple(inputs), backward, want, tuple(layouts))


_LAYOUT, _NOT_NONE = attrgetter("layout"), partial(is_not, None)


def attach(out: Any, name: str | Callable[[], str], inputs: tuple, backward: Callable, want: Any,
           reads: tuple) -> Any:
    """`record` for a caller that knows its node's read layouts (`reads`, a tuple of TensorLayouts, not
    tensors) and gives `inputs` as a tuple: an operator's prepared call (spmdsim.nn.ops.pointwise), which
    works them out once per call signature, not on every call. Attaches nothing inside ``no_grad()``."""
    if _Mode.enabled is not True:  # inside no_grad()
        return out
    # Node's fields set here, as Node() sets them, without its __init__'s frame (a node per operator).
    node = _new_node(Node)
    node.name, node.inputs, node.backward, node.want, node.reads = name, inputs, backward, want, reads
    node.tag = _Mode.tag
    node.low = _LOW[out._local.dtype]  # the dtype when bfloat16, else None: one dict read
    node.seq = _next_seq()
    out._ag = node
    return out


_new_node = object.__new__


class _LowDtypes(dict):
    """A block's dtype -> itself when it is bfloat16 (spmdsim.base.precision.is_low), else None: `Node.low` of an
    output of that dtype. Filled on first ask (a handful of dtypes)."""

    def __missing__(self, dtype: Any) -> Any:
        low = self[dtype] = dtype if getattr(dtype, "kind", None) == "V" and is_low(dtype) else None
        return low


_LOW = _LowDtypes()
_next_seq = itertools.count().__next__  # Node.seq: one C call a node (atomic under the interpreter lock)


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
        put(_USED, layouts, out, 4096)
    return out


_USED: dict = {}  # a node's read layouts -> used_axes of them (a step asks for the same few)


def with_partial(layout: Any, partial: tuple[str, ...]) -> Any:
    """``layout.with_partial(partial)`` for a tuple of axis names, the same object on every call."""
    # By the layout object itself, never by value: a tuple of an int and strs hashes and compares in C,
    # where a TensorLayout key calls its Python __hash__ and __eq__; and each layout gets its own derived
    # layouts (TensorLayout.with_partial keeps them, ~5 us to build one), so a pending gradient, summed,
    # is its tensor's own layout object, not that of the first equal layout seen (the optimizer's check
    # of ~60 gradients a step then stops at `is`). The entry holds the layout: its id is not reused while the
    # entry is there, so a key found is this very object's.
    seen = _BY_OBJECT.get((id(layout), partial))
    if seen is not None:
        return seen[1]
    out = layout.with_partial(partial)
    put(_BY_OBJECT, (id(layout), partial), (layout, out), 4096)
    return out


_BY_OBJECT: dict = {}  # (id(layout), partial) -> (layout, with_partial's answer)
