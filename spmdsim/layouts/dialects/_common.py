"""Small validators and text splitting shared by the dialect converters (private)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Set as AbstractSet
from typing import Optional, Sequence

import numpy as np

from ...errors import DialectError, SpmdsimError
from ..layout import Layout, TensorLayout, default_axis_names
from ..notation import dialect_hint
# as_int: shared with layouts, data and plans; re-exported for the dialects
from ...base.validate import as_int, counted
from ...base.deprecated import deprecated


def positive_int(value: object, what: str) -> int:
    """Validate one positive integer argument, naming it as `what` in the error."""
    out = as_int(value)
    if out is None or out <= 0:
        raise DialectError(f"{what} {value!r} must be a positive integer")
    return out


def tensor_ndim(ndim: object, function: str, value: str, what: str, needed: int = 0) -> int:
    """`ndim`, the number of dims of the tensor a dialect's value lays out, as a non-negative int. Left out (None),
    the refusal says what is missing and how to pass it: `function` the converter, `value` its value as text, `what`
    what that value is ("an SBP"), which cannot tell the tensor's rank; `needed` the least ndim it reads on."""
    if ndim is None:
        example = max(needed, 2)
        raise DialectError(f"ndim is missing: {function} needs the number of dims of the tensor ({what} cannot "
                           f"tell it); pass it as the third argument, e.g. {function}({value!r}, mesh, {example}) "
                           f"for a {example}-D tensor")
    return ndim_of(ndim)


def ndim_of(ndim: object) -> int:
    """`ndim` given, the number of dims of a tensor, as a non-negative int; else a DialectError naming it."""
    dims = as_int(ndim)
    if dims is None or dims < 0:
        raise DialectError(f"ndim {ndim!r} must be a non-negative integer, the number of dims of the tensor")
    return dims


def as_flag(value: object, what: str) -> bool:
    """A True/False argument (numpy's bools too): "no" or 0 is no flag, as the frameworks' own checks say."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise DialectError(f"{what} {value!r} must be True or False")


def positive_ints(values: object, what: str) -> tuple[int, ...]:
    """Validate a non-empty sequence of positive integers (a mesh or placement shape)."""
    items = as_items(values)
    if not items:
        raise DialectError(f"{what} {values!r} must be a non-empty sequence of positive integers")
    out = []
    for item in items:
        size = as_int(item)
        if size is None or size <= 0:
            raise DialectError(f"{what} {values!r} must hold positive integers, got {item!r}")
        out.append(size)
    return tuple(out)


def as_items(value: object) -> Optional[list]:
    """The elements of a tuple/list/array-like value, or None for scalars and strings."""
    # Sets and mappings have no order to read dims or mesh axes from.
    if isinstance(value, (str, bytes, AbstractSet, Mapping)):
        return None
    if isinstance(value, (tuple, list)):
        return list(value)
    if hasattr(value, "__iter__") and hasattr(value, "__len__"):
        return list(value)  # numpy arrays and other sized sequences
    return None


def entry_tokens(value: object, what: str, expected: str, items: str, per: str,
                 plural: bool = False) -> list:
    """The entries of an nD SBP or placements value: split text, or the items of a sequence.

    Args:
        what: the value's name in messages ("sbp", "placements").
        expected: the grammar, appended to syntax errors.
        items: what a sequence holds ("SBPs"), for the type error.
        per: what one entry stands for ("placement axis"), for the empty error.
        plural: `what` takes plural verbs ("placements have").
    """
    has, is_ = ("have", "are") if plural else ("has", "is")
    if isinstance(value, str):
        try:
            tokens = split_top_level(value)
        except ValueError:
            raise DialectError(f"{what} {value!r} {has} unbalanced brackets; {expected}") from None
        if any(t == "" for t in tokens):
            raise DialectError(f"{what} {value!r} {has} an empty entry; {expected}")
    else:
        tokens = as_items(value)
        if tokens is None:
            raise DialectError(f"{what} {value!r} must be text or a sequence of {items}; {expected}")
    if not tokens:
        raise DialectError(f"{what} {value!r} {is_} empty; expected one per {per}")
    return tokens


def split_top_level(text: str, unwrap: bool = True) -> list[str]:
    """Split "S(0), (B), P" at commas outside brackets; first strip one outer pair (`unwrap`).

    Also splits the CLI's lists and tensor maps. Raises ValueError on unbalanced brackets.
    """
    body = text.strip()
    if unwrap and len(body) >= 2 and body[0] + body[-1] in ("()", "[]") and _encloses(body):
        body = body[1:-1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced brackets")
        elif ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    if depth != 0:
        raise ValueError("unbalanced brackets")
    parts.append(body[start:].strip())
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing comma, as in "(S(0),)"
    return parts


def _encloses(body: str) -> bool:
    """True when body's first bracket closes at its last character ("(a, b)", not "(a)(b)")."""
    depth = 0
    for i, ch in enumerate(body):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                return i == len(body) - 1
    return False


def axis_names(
    names: Optional[Sequence[str]], count: int, what: str = "mesh_axis_names"
) -> tuple[str, ...]:
    """User-given mesh axis names, or ``axis_0, axis_1, ...`` when None."""
    if names is None:
        return default_axis_names(count)
    out = as_items(names)
    if out is None or len(out) != count or not all(isinstance(n, str) for n in out):
        raise DialectError(f"{what} {names!r} must give one name per mesh axis ({counted(count, 'axis')}), "
                           "each a string")
    for name in out:  # refused here, naming the argument, not by the Layout under its own field's name
        if not name or name == "None":
            raise DialectError(f"{what} {names!r} holds the name {name!r}; expected non-empty names other "
                               "than 'None', one per mesh axis")
    repeated = [name for i, name in enumerate(out) if name in out[:i]]
    if repeated:
        raise DialectError(f"{what} {names!r} names two mesh axes {repeated[0]!r}; expected a different name "
                           "for each mesh axis")
    return tuple(out)


#: Other frameworks' names for the converters' keywords, for the refusal of one: what to write here.
_KEYWORDS = {"dim_names": "Paddle's ProcessMesh name for mesh_axis_names",
             "alias_name": "MindSpore's Layout name for mesh_axis_names",
             "axis_names": "JAX's Mesh name for mesh_axis_names",
             "placement": "OneFlow's name for the mesh: pass its shape or ranks as mesh_shape",
             "process_mesh": "Paddle's name for the mesh: pass its shape or ranks as mesh_shape",
             "device_mesh": "PyTorch's name for the mesh: pass its shape or ranks as mesh_shape"}


def renamed_keyword(kwargs: dict, old: str, new: str, value: object, function: str) -> object:
    """`value`, or the deprecated keyword `old` from `kwargs` (with a DeprecationWarning)."""
    if old in kwargs:
        deprecated(f"{function}({old}=...)", f"{function}({new}=...)", stacklevel=4)
        if value is not None:
            raise DialectError(f"{function} got both {old}= and {new}=; expected only {new}=")
        value = kwargs.pop(old)
    refuse_keywords(kwargs, function)
    return value


def refuse_keywords(kwargs: dict, function: str) -> None:
    """Refuse the keywords a converter does not take, saying what another framework's name is here
    (``dim_names=``: mesh_axis_names)."""
    if kwargs:
        meant = [f"{key}= is {_KEYWORDS[key]}" for key in sorted(kwargs) if key in _KEYWORDS]
        raise TypeError(f"{function}() got unexpected keyword arguments {sorted(kwargs)!r}"
                        + (f" ({'; '.join(meant)})" if meant else ""))


def require_layout(tl: object) -> None:
    """Raise DialectError unless `tl` is a TensorLayout."""
    if not isinstance(tl, TensorLayout):
        raise DialectError(f"expected a TensorLayout, got {tl!r}")


def check_major_order(tl: TensorLayout, dialect: str, fix_hint: str) -> None:
    """Raise unless `tl` is a TensorLayout whose multi-axis tensor-map entries list axes in mesh order.

    SBP and DTensor placements say only *which* mesh axes split a dim; the
    lower mesh axis is always major, so another order is not expressible there.
    """
    require_layout(tl)
    for tensor_dim, axes in enumerate(tl.tensor_map):
        positions = [tl.layout.axis_index(a) for a in axes]
        if positions != sorted(positions):
            ordered = tuple(sorted(axes, key=tl.layout.axis_index))
            raise DialectError(
                f"tensor dim {tensor_dim} is split over {axes!r} with {axes[0]!r} major, "
                f"but in {dialect} the lower mesh axis is always major; only {ordered!r} "
                f"is expressible ({fix_hint})"
            )


#: The mesh forms every converter that takes a mesh accepts (its errors say so).
MESH_FORMS = "a mesh shape (a tuple of positive integers, or one for a 1-D mesh), a spmdsim Layout or a Mesh"


def mesh_of(mesh: object, names: Optional[Sequence[str]],
            what: str = "mesh shape") -> tuple[tuple[int, ...], tuple[str, ...], Optional[Layout]]:
    """(mesh shape, axis names, the Layout itself or None) of a mesh given as its shape (with `names`; a bare
    positive integer is a 1-D mesh), a spmdsim Layout or a Mesh (its ``layout``): the latter two name their
    axes, and `names` must be None. Every dialect converter that takes a mesh reads it here (`what` names
    the argument in errors, e.g. "placement shape")."""
    layout = mesh if isinstance(mesh, Layout) else getattr(mesh, "layout", None)
    if isinstance(layout, Layout):
        if names is not None:
            raise DialectError(f"mesh_axis_names {names!r}: a Layout or Mesh names its own axes "
                               f"{tuple(layout.alias_name)!r}; leave them out")
        return tuple(layout.device_matrix), tuple(layout.alias_name), layout
    if as_int(mesh) is not None:
        shape: tuple[int, ...] = (positive_int(mesh, what),)
    elif as_items(mesh) is None:
        raise DialectError(f"{what} {mesh!r} is not a mesh{_foreign(mesh)}; expected {MESH_FORMS}")
    else:
        shape = ranks_shape(mesh, what) or positive_ints(mesh, what)
    return shape, axis_names(names, len(shape)), None


def ranks_shape(mesh: object, what: str) -> Optional[tuple[int, ...]]:
    """The shape of a mesh written as its array of ranks, as OneFlow's ``flow.placement("cpu", ranks=[[0, 1],
    [2, 3]])``, Paddle's ``ProcessMesh([[0, 1], [2, 3]])`` and PyTorch's ``DeviceMesh("cpu", [[0, 1], [2, 3]])``
    write it: nested lists, or a flat ``[0, 1, 2, 3]`` (a shape holds no 0). None for anything else (a shape).
    spmdsim numbers a mesh's ranks row-major, so ranks in another order are refused in one line."""
    items = as_items(mesh)
    nested = any(as_items(item) is not None for item in items)
    if not nested and not (len(items) > 1 and as_int(items[0]) == 0):  # (0,): a shape of no devices
        return None
    try:
        ranks = np.asarray(items)
    except ValueError:  # ragged: numpy refuses it
        ranks = None
    if ranks is None or ranks.dtype == object or ranks.size == 0 or ranks.dtype.kind not in "iu" or \
            _holds_bool(items):  # ([[0, True]]: numpy makes it [[0, 1]])
        if not nested:
            return None
        raise DialectError(f"{what} {mesh!r} is not a mesh; expected {MESH_FORMS}, or an array of ranks "
                           "such as [[0, 1], [2, 3]] (rectangular, integers)")
    if not nested and sorted(ranks.tolist()) != list(range(ranks.size)):
        return None  # (0, 4): a shape with a 0, refused as a shape
    shape = tuple(int(n) for n in ranks.shape)
    in_order = np.arange(ranks.size).reshape(shape)
    if not np.array_equal(ranks, in_order):
        raise DialectError(f"{what} {mesh!r} numbers its ranks in another order than spmdsim does: spmdsim numbers a "
                           f"mesh's ranks row-major (the last axis fastest); expected {in_order.tolist()!r} "
                           f"(or its shape, {shape!r})")
    return shape


def _holds_bool(items: list) -> bool:
    """Whether a bool (Python's or numpy's) is among `items` or the lists nested in them."""
    for item in items:
        inner = as_items(item)
        if isinstance(item, (bool, np.bool_)) or inner is not None and _holds_bool(inner):
            return True
    return False


def refuse_mesh_as_count(value: object, what: str, takes: str, count_of) -> None:
    """Refuse a spmdsim Layout or Mesh (or a mesh shape) given where a converter takes a count (the ranks of
    `matmul_layouts`, Paddle's `num_partitions`), in one line, the same on every rank: `takes` says what
    the count is, and ``count_of(layout)`` the number to pass for that mesh (None: no number fits it)."""
    layout = value if isinstance(value, Layout) else getattr(value, "layout", None)
    if isinstance(layout, Layout):
        given = f"{what} {layout!r} is a mesh" if layout is value else f"{what} is a Mesh (on {layout!r})"
    else:
        items = None if as_int(value) is not None else as_items(value)
        if not items or not all(as_int(i) is not None and as_int(i) > 0 for i in items):
            return
        layout = Layout(tuple(as_int(i) for i in items), default_axis_names(len(items)))
        given = f"{what} {value!r} is a mesh shape"
    count = count_of(layout)
    raise DialectError(f"{given}, not a count; {takes}: pass "
                       + (f"{count} for this mesh" if count is not None else "that number"))


def _foreign(mesh: object) -> str:
    """For another framework's mesh object (Paddle's ProcessMesh, PyTorch's DeviceMesh, JAX's Mesh): what it
    is and the spmdsim Layout of its shape and names, which is what to pass instead."""
    kind, package = type(mesh).__name__, type(mesh).__module__.split(".")[0]
    made = {("ProcessMesh", "paddle"): "Layout(mesh.shape, mesh.dim_names)",
            ("DeviceMesh", "torch"): "Layout(mesh.shape, mesh.mesh_dim_names)",
            ("Mesh", "jax"): "Layout(mesh.devices.shape, mesh.axis_names)"}.get((kind, package))
    return f" (a {package} {kind}, which spmdsim does not read: pass {made} instead)" if made else ""


# -- text: the CLI's flags and partition_spec_to_layout read tensor maps and JAX specs alike --------------
def parse_name_list(text: str, key: str = "value") -> tuple[str, ...]:
    """'dp,sp,mp' -> ('dp', 'sp', 'mp'); quotes are optional."""
    try:
        parts = split_top_level(text)
        names = tuple(p.strip("'\" ") for p in parts if p)
        if len(names) != len(parts) and parts != [""]:
            names = ("",)  # 'a,,b': a name left out, refused below
    except ValueError:
        names = ("(",)  # unbalanced brackets: refused below
    if any(not n or any(c in n for c in "()[]") for n in names):
        raise SpmdsimError(f"{key} {text!r} must be comma-separated axis names such as dp,mp")
    return names


def parse_tensor_map(text: str, what: str = "tensor map", takes: Optional[Mapping[str, str]] = None) -> tuple:
    """'mp,(sp,dp),None' -> ('mp', ('sp', 'dp'), None); Python-style brackets are optional.

    `what` names the text in errors ("partition spec" for JAX's, which is written the same way); `takes`, the
    flags that take the other dialects ("placements" -> "--placements", ...), which the refusal of an entry
    written in one names (notation.dialect_hint).
    """
    body = text.strip()
    try:
        # '(b, d, e)' alone is the whole map written as a tuple; 'a, (b, d)' is not.
        parts = split_top_level(body, unwrap=False) if body else []
        if len(parts) == 1:
            parts = split_top_level(body)
    except ValueError:
        raise SpmdsimError(f"{what} {text!r} has unbalanced brackets") from None
    if parts == [""]:
        parts = []  # "()": a scalar's map
    out: list = []
    for tensor_dim, part in enumerate(parts):
        if not part.strip():  # "a,,b": a typo more often than a way to write None
            raise SpmdsimError(f"{what} {text!r} has an empty entry for tensor dim {tensor_dim}; "
                               "write None for a dim that is not split")
        if part.startswith(("(", "[")):
            out.append(parse_name_list(part, f"{what} entry"))
        elif part.strip("'\"") in ("None", "none", "null", ""):
            out.append(None)
        else:
            name = part.strip("'\" ")
            if any(c in name for c in "()[] "):
                hint = dialect_hint(part.strip(), parts, takes or {}, "give the layout with")
                raise SpmdsimError(f"{what} {text!r} has a malformed entry {part!r}{'; ' + hint if hint else ''}")
            out.append(name)
    return tuple(out)


_SPEC_CALL = re.compile(r"^\s*(?:(?:jax\.sharding\.)?PartitionSpec|P)\s*\((.*)\)\s*$", re.S)
#: A keyword in a PartitionSpec call, as JAX prints its unreduced= and reduced= axes.
_SPEC_KEYWORD = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=(?!=)")
_SPEC_KEYWORDS = {
    "unreduced": "JAX's unreduced= axes, whose devices hold addends of a pending sum: spmdsim's partial axes, which "
                 "its spec does not carry; write mesh.layout(<entries>, partial=<those axes>), e.g. mesh.layout('dp', "
                 "None, partial=('tp',))",
    "reduced": "JAX's reduced= axes, over which the tensor is replicated (its gradient left unreduced): leave them "
               "out, as a mesh axis the spec does not name is replicated"}


def parse_partition_spec(text: str) -> tuple:
    """A JAX PartitionSpec as text: ``('x', None)``, ``x,None``, or as JAX prints and writes it,
    ``PartitionSpec('x', None)`` / ``P(('x', 'y'))`` (each argument of the call one entry; ``P()`` a scalar's)."""
    call = _SPEC_CALL.match(text)
    if call is None:
        return parse_tensor_map(text, "partition spec")
    args = call.group(1).strip()
    if keyword := _SPEC_KEYWORD.search(args):  # JAX's unreduced= / reduced= axes: no entry of a dim
        said = _SPEC_KEYWORDS.get(keyword.group(1), f"a keyword {keyword.group(1)}=; expected only entries, one a dim")
        raise SpmdsimError(f"partition spec {text!r} has {said}")
    # The call's arguments are the entries: as a tuple with a trailing comma, P(('x', 'y')) stays one entry.
    body = args.removesuffix(",").rstrip()
    if args and not body:  # P(,): Python's syntax error, not a scalar's spec
        raise SpmdsimError(f"partition spec {text!r} has an empty entry for tensor dim 0; write P() for a scalar, "
                           "None for a dim that is not split")
    inner = f"({body},)" if body else "()"
    try:
        return parse_tensor_map(inner, "partition spec")
    except SpmdsimError as exc:  # named as the user wrote it
        raise SpmdsimError(str(exc).replace(f"partition spec {inner!r}", f"partition spec {text!r}", 1)) from None
