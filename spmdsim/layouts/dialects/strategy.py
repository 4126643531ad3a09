"""MindSpore `.shard` strategies as TensorLayouts (docs/explanation/semantics.md, "Strategies").

A strategy gives, per input tensor, the slice count of each tensor dim:
``ops.MatMul().shard(((2, 1), (1, 4)))``. One tensor's device matrix is its
strategy (axes ``"axis_0", ...``); a MatMul's is ``(batch.., a, b, c)`` named
``("batch0", .., "m", "k", "n")``. A strategy using fewer devices than the world
gets a repeated-calculation axis ``"rep"`` on the right (MindSpore's default).
The tables are in docs/reference/dialects.md.
"""
from __future__ import annotations

import ast
import math
import re
import threading
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ...errors import DialectError, StrategySizeError
from ..layout import Layout, TensorLayout
from ...base.validate import counted
from ._common import (as_flag, as_int, as_items, axis_names, mesh_of, positive_int, refuse_keywords,
                      refuse_mesh_as_count, require_layout)
from ...base.deprecated import deprecated

__all__ = [
    "REP_AXIS", "StrategyLike", "MatMulLayouts", "parse_strategy", "format_strategy",
    "strategy_to_layout", "strategy_layout", "matmul_layouts", "layout_to_strategy", "strategy_of",
]

#: Name of the repeated-calculation axis appended when a strategy uses fewer devices.
REP_AXIS = "rep"

_EXAMPLE = "e.g. '((2, 1), (1, 4))' or '(2, 1)'"

#: Held while a strategy's text is made an AST: CPython 3.11 counts the AST constructor's depth per
#: interpreter, not per thread, so two threads (simulated ranks) parsing at once, one of them switched out
#: inside a garbage collection, raised "SystemError: AST constructor recursion depth mismatch"
#: (python/cpython gh-106905). Reentrant: a finalizer the collection runs may parse a strategy too.
_AST_LOCK = threading.RLock()

#: What `parse_strategy` accepts: text, one tensor's slice counts, or one per input.
StrategyLike = Union[str, Sequence[int], Sequence[Sequence[int]]]


def parse_strategy(value: StrategyLike) -> tuple[tuple[int, ...], ...]:
    """Normalize a strategy to one tuple of slice counts per input tensor.

    Accepts text (``"((2,1),(1,4))"``, ``"((2,1,2,2,1),)"``, ``"(2,1)"``) or
    nested Python sequences. A single tensor's strategy (a flat tuple of ints)
    is wrapped into a one-tuple. Every count must be a positive integer.
    """
    shown = value
    if isinstance(value, str):
        text = _strategy_text(value)
        try:
            with _AST_LOCK:
                value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise DialectError(
                f"strategy {shown!r} is not a tuple of positive integers or a tuple of "
                f"such tuples ({_EXAMPLE}){_layout_maps(text)}"
            ) from None
    items = as_items(value)
    if items is None:
        raise DialectError(
            f"strategy {shown!r} must be a tuple of positive integers or a tuple of such "
            f"tuples ({_EXAMPLE})"
        )
    if not items:
        raise DialectError(f"strategy {shown!r} is empty; expected slice counts ({_EXAMPLE})")
    nested = [as_items(item) for item in items]
    if all(n is None for n in nested):
        return (_counts(items, shown, None),)
    if all(n is not None for n in nested):
        _refuse_deeper(nested, shown)
        return tuple(_counts(n, shown, i) for i, n in enumerate(nested))
    raise DialectError(
        f"strategy {shown!r} mixes integers and tuples; expected either one tensor's slice "
        f"counts or one tuple per input ({_EXAMPLE})"
    )


#: MindSpore's own call text around a strategy: ``ops.MatMul().shard(...)``, ``in_strategy=...``.
_SHARD_CALL = re.compile(r"^\s*(?:(?:[\w.]|\(\))*\.)?shard\s*\((?P<args>.*)\)\s*$", re.S)
_KEYWORD = re.compile(r"^\s*(?:in_strategy|out_strategy|strategy)\s*=")


def _strategy_text(text: str) -> str:
    """The strategy in text copied from a MindSpore script: ``shard(((2, 1), (1, 4)))``, ``in_strategy=((2, 1),
    (1, 4))`` and ``ops.MatMul().shard(in_strategy=...)`` are ``((2, 1), (1, 4))``; other text as it is. A call
    that gives an out_strategy too is refused: it is a strategy of its own (``--out-strategy``)."""
    match = _SHARD_CALL.match(text)
    args = match.group("args") if match else text if _KEYWORD.match(text) else None
    if args is None:
        return text
    try:
        with _AST_LOCK:
            call = ast.parse(f"f({args})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return text
    parts = [*call.args, *(k.value for k in call.keywords)]  # type: ignore[attr-defined]
    if len(parts) != 1:
        raise DialectError(f"strategy {text!r} gives {counted(len(parts), 'argument')}; expected the in_strategy "
                           "alone (an out_strategy is given on its own: --out-strategy on the command line)")
    return ast.get_source_segment(f"f({args})", parts[0]) or text


def _layout_maps(text: str) -> str:
    """For MindSpore's strategy of Layouts, ``(layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None"))``: the
    Layout form that says the same, each input's tensor map as the command line writes it; else ""."""
    try:
        with _AST_LOCK:
            node = ast.parse(text.strip(), mode="eval").body
        calls = node.elts if isinstance(node, ast.Tuple) else [node]
        maps = [",".join(_map_entry(ast.literal_eval(arg)) for arg in call.args) for call in calls
                if isinstance(call, ast.Call) and not call.keywords]  # type: ignore[attr-defined]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ""
    if not maps or len(maps) != len(calls):
        return ""
    flags = {1: f"--tensor-map {maps[0]!r}", 2: f"--x-map {maps[0]!r} --w-map {maps[-1]!r}"}.get(len(maps), "")
    return (f"; a strategy of Layouts is the Layout form, a tensor map per input: Layout(device_matrix, "
            f"alias_name)(*map) ({flags + ' with ' if flags else ''}--device-matrix and --alias on the "
            "command line)")


def _map_entry(entry: object) -> str:
    """One tensor-map entry as a map flag writes it: mp, (sp,dp) or None."""
    if isinstance(entry, (tuple, list)):
        return "(" + ",".join(str(e) for e in entry) + ")"
    return "None" if entry is None else str(entry)


def _refuse_deeper(nested: list, shown: object) -> None:
    """DialectError where an input's counts hold tuples: a strategy nested three deep (text with a comma after
    its outer tuple, ``'((2,1),(1,4)),'``, reads as a tuple of it), rather than their count refused as a slice."""
    for i, counts in enumerate(nested):
        if any(as_items(item) is not None for item in counts):
            comma = (" (its trailing comma wraps it in one more tuple: drop the comma)"
                     if isinstance(shown, str) and shown.rstrip().endswith(",") else "")
            raise DialectError(
                f"strategy {shown!r} nests tuples three deep{comma}: input {i} is {tuple(counts)!r}; expected a "
                f"tuple of positive integers or a tuple of such tuples ({_EXAMPLE})"
            )


def _counts(items: list, shown: object, input_index: object) -> tuple[int, ...]:
    where = "" if input_index is None else f" of input {input_index}"
    out = []
    for tensor_dim, item in enumerate(items):
        count = as_int(item)
        if count is None or count <= 0:
            raise DialectError(
                f"strategy {shown!r} has {item!r} slices in dim {tensor_dim}{where}; "
                "expected a positive integer"
            )
        out.append(count)
    return tuple(out)


def format_strategy(strategy: StrategyLike) -> str:
    """MindSpore's spelling of a strategy: ``((2, 1), (1, 4))`` or ``((2, 1),)`` (a tuple's repr)."""
    return repr(parse_strategy(strategy))


def _device_layout(
    matrix: tuple[int, ...], names: tuple[str, ...], world_size: object, what: str
) -> Layout:
    """Layout of `matrix`, plus a right-hand "rep" axis when it uses fewer devices."""
    world = positive_int(world_size, "world_size")
    used = math.prod(matrix)
    if used > world:
        raise StrategySizeError(
            f"{what} needs {used} devices but the world size is {world}; "
            "the product of the slice counts must not exceed the number of ranks", used, world
        )
    if world % used != 0:
        raise StrategySizeError(
            f"{what} uses {used} devices, which does not divide the world size {world}; "
            "the product of the slice counts must divide the number of ranks", used, world, divides=True
        )
    repeats = world // used
    if repeats > 1 or not matrix:
        if REP_AXIS in names:  # Layout would say "alias_name ('dp', 'rep', 'rep') repeats a name"
            raise DialectError(f"mesh_axis_names {names!r} names an axis {REP_AXIS!r}, the name of the axis of "
                               f"repeats that {what} on {world} ranks adds ({repeats} copies of each shard); "
                               f"expected other names")
        matrix, names = matrix + (repeats,), names + (REP_AXIS,)
    return Layout(matrix, names)


def strategy_to_layout(
    strategy: StrategyLike,
    mesh_shape: Union[int, Sequence[int], Layout, object],
    ndim: Optional[int] = None,
    mesh_axis_names: Optional[Sequence[str]] = None,
    **others: object,
) -> TensorLayout:
    """TensorLayout of one tensor sharded by `strategy` on the ranks of `mesh_shape`.

    Given a number of ranks or a shape, only the number of ranks counts (any shape with
    that product), as MindSpore lays a strategy over a flat device list: the device matrix
    is the strategy (axes named by `mesh_axis_names`, one per tensor dim) and "rep". Given
    a spmdsim Layout or Mesh, the same ranks hold the same shards, written on that very
    Layout: each dim's count must be the product of the next mesh axes in order (``(2, 1)``
    on ``Layout((2, 4), ("dp", "mp"))`` is ``("dp", None)``), and the mesh names its axes.
    ``()`` is a scalar (only the "rep" axis); `ndim`, when given, must equal the strategy's length.
    """
    refuse_keywords(others, "strategy_to_layout")
    # () alone is ambiguous for parse_strategy (no inputs); here it can only be a scalar.
    parsed = ((),) if as_items(strategy) == [] else parse_strategy(strategy)
    if len(parsed) != 1:
        raise DialectError(
            f"strategy {strategy!r} has {len(parsed)} inputs; expected one tensor's slice counts"
        )
    counts = parsed[0]
    if ndim is not None and as_int(ndim) != len(counts):
        raise DialectError(f"strategy {counts!r} has {counted(len(counts), 'dim')} but ndim is "
                           f"{ndim!r}; expected one slice count per tensor dim")
    mesh = mesh_shape if isinstance(mesh_shape, Layout) else getattr(mesh_shape, "layout", None)
    if isinstance(mesh, Layout):
        mesh_of(mesh, mesh_axis_names)  # refuses names beside a mesh that names its axes
        return _on_mesh(counts, mesh)
    names = axis_names(mesh_axis_names, len(counts))
    shape, _, _ = mesh_of(mesh_shape, None)
    layout = _device_layout(counts, names, math.prod(shape), f"strategy {counts!r}")
    return layout(*names)


def _on_mesh(counts: tuple[int, ...], mesh: Layout) -> TensorLayout:
    """The strategy's layout on `mesh`: MindSpore's device matrix (counts, then "rep") flattened row-major
    is the mesh's when the mesh's axes, taken in order, group into the counts (the rest are "rep")."""
    what = f"strategy {counts!r}"
    _device_layout(counts, axis_names(None, len(counts)), mesh.num_devices, what)  # too many devices, or not a divisor
    sizes, at, tensor_map = mesh.device_matrix, 0, []
    for count in counts:
        axes, product = [], 1
        while product < count and at < len(sizes):
            axes += [mesh.alias_name[at]] if sizes[at] > 1 else []  # an axis of size 1 cuts nothing
            product, at = product * sizes[at], at + 1
        if product != count:
            raise DialectError(
                f"{what} does not lie on the mesh {mesh!r}: its slice count {count} is not the product of "
                f"the next mesh axes in order (MindSpore numbers the devices row-major over the strategy, "
                f"then the repeats); expected counts that group the mesh's axes, or the number of ranks "
                f"({mesh.num_devices}) for the strategy's own device matrix")
        tensor_map.append(tuple(axes))
    return mesh(*tensor_map)


def strategy_layout(strategy: StrategyLike, world_size: int) -> TensorLayout:
    """Deprecated name of `strategy_to_layout` (goes in the next release)."""
    deprecated("strategy_layout(strategy, world_size)", "strategy_to_layout(strategy, mesh_shape)")
    return strategy_to_layout(strategy, world_size)


@dataclass(frozen=True)
class MatMulLayouts:
    """The layouts MindSpore derives for ``MatMul().shard(((a, b), (b, c)))``.

    Attributes:
        x, w: the input layouts (in storage order, so transposed inputs map
            ``("k", "m")`` / ``("n", "k")``).
        out: output layout; partial over ``"k"`` when the contraction dim is split.
        layout: the shared device matrix (``batch*, m, k, n`` and maybe ``rep``).
        strategy: the parsed strategy as given.
        transpose_a, transpose_b: whether x / w are stored transposed.
    """

    x: TensorLayout
    w: TensorLayout
    out: TensorLayout
    layout: Layout
    strategy: tuple[tuple[int, ...], ...]
    transpose_a: bool = False
    transpose_b: bool = False

    #: The mesh axis of the contraction dim (partial axis of `out` when split).
    contraction_axis = "k"

    @property
    def reduced_out(self) -> TensorLayout:
        """The output after the AllReduce over ``"k"`` (no partial axes)."""
        return self.out.with_partial(())


def matmul_layouts(
    strategy: StrategyLike,
    world_size: int,
    transpose_a: bool = False,
    transpose_b: bool = False,
) -> MatMulLayouts:
    """Layouts of x, w and out for a MindSpore MatMul/BatchMatMul strategy.

    The strategy is given in storage order, as MindSpore does: with
    ``transpose_a`` x is stored (k, m) and its strategy reads (b, a); with
    ``transpose_b`` w is stored (n, k) and its strategy reads (c, b). Leading
    batch dims are aligned from the right and must be split equally.
    """
    refuse_mesh_as_count(world_size, "world_size",
                         "matmul_layouts takes the number of ranks (MindSpore lays a strategy over a flat "
                         "device list; the layouts come on the strategy's own device matrix: m, k, n and rep)",
                         lambda layout: layout.num_devices)
    transpose_a, transpose_b = as_flag(transpose_a, "transpose_a"), as_flag(transpose_b, "transpose_b")
    parsed = parse_strategy(strategy)
    if len(parsed) != 2:
        raise DialectError(
            f"matmul strategy {strategy!r} has {counted(len(parsed), 'input')}; expected two, "
            "((a, b), (b, c)) for x (m, k) and w (k, n)"
        )
    xs, ws = parsed
    for name, counts in (("x", xs), ("w", ws)):
        if len(counts) < 2:
            raise DialectError(
                f"matmul strategy for {name} {counts!r} has {counted(len(counts), 'dim')}; "
                "expected at least 2 (matrix rows and columns)"
            )
    a, k_x = (xs[-1], xs[-2]) if transpose_a else (xs[-2], xs[-1])
    k_w, c = (ws[-1], ws[-2]) if transpose_b else (ws[-2], ws[-1])
    if k_x != k_w:
        raise DialectError(
            f"contraction dim of x is split {counted(k_x, 'way')} but of w {counted(k_w, 'way')}; they must be "
            f"equal (matmul strategy {parsed!r}, transpose_a={transpose_a}, "
            f"transpose_b={transpose_b})"
        )
    batch = _batch_counts(xs[:-2], ws[:-2], parsed)
    batch_names = tuple(f"batch{i}" for i in range(len(batch)))
    layout = _device_layout(
        batch + (a, k_x, c), batch_names + ("m", "k", "n"), world_size,
        f"matmul strategy {parsed!r}",
    )
    x_batch = batch_names[len(batch) - (len(xs) - 2):]
    w_batch = batch_names[len(batch) - (len(ws) - 2):]
    x = layout(*x_batch, *(("k", "m") if transpose_a else ("m", "k")))
    w = layout(*w_batch, *(("n", "k") if transpose_b else ("k", "n")))
    out = layout(*batch_names, "m", "n", partial=("k",) if k_x > 1 else ())
    return MatMulLayouts(x, w, out, layout, parsed, transpose_a, transpose_b)


def _batch_counts(
    x_batch: tuple[int, ...], w_batch: tuple[int, ...], parsed: object
) -> tuple[int, ...]:
    """Batch slice counts of the longer input; the shorter one must agree from the right."""
    shared = min(len(x_batch), len(w_batch))
    for i in range(shared):
        ix, iw = len(x_batch) - shared + i, len(w_batch) - shared + i
        if x_batch[ix] != w_batch[iw]:
            raise DialectError(
                f"batch dim {ix} of x is split {counted(x_batch[ix], 'way')} but batch dim "
                f"{iw} of w {counted(w_batch[iw], 'way')}; they must be equal (matmul strategy {parsed!r})"
            )
    return x_batch if len(x_batch) >= len(w_batch) else w_batch


def layout_to_strategy(tl: TensorLayout) -> tuple[int, ...]:
    """Number of slices per tensor dim (always expressible; partial axes are not part of it)."""
    require_layout(tl)
    return tl.shards_per_dim


def strategy_of(*layouts: TensorLayout) -> tuple[tuple[int, ...], ...]:
    """Deprecated: ``tuple(layout_to_strategy(tl) for tl in layouts)`` (goes in the next release)."""
    deprecated("strategy_of(*layouts)", "tuple(layout_to_strategy(tl) for tl in layouts)")
    return tuple(layout_to_strategy(tl) for tl in layouts)
