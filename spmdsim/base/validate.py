"""Validators for the plain values that enter the library: integers, shapes, dtypes, tolerances.

Pure (numpy only). One rule everywhere: Python and numpy integers are
integers; bools, floats and strings are not, so ``16.9``, ``True`` or ``"168"``
raise instead of being truncated or read as a sequence. Each validator raises
the caller's error class with a message that quotes the bad value.
"""
from __future__ import annotations

import math
import numbers
import operator
import os
from typing import Any, Optional, TextIO, Union

from ..errors import DTypeError, ShapeError, SpmdsimError
from .._lazy import numpy_on_first_use
from .precision import named_dtype

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["loads_json", "MAX_JSON_DEPTH", "read_bounded", "MAX_JSON_TEXT", "as_int", "int_arg", "shape_arg",
           "dtype_arg", "tolerance_arg", "counted", "dtype_name", "float_max", "SUPPORTED_DTYPES",
           "describe", "plain_array", "long_double", "dims_expected"]

#: What `dtype_arg` accepts, as its messages say it.
SUPPORTED_DTYPES = "bool, int8..int64, uint8..uint64, float16..float64, complex64, complex128"

# Kinds MPI can move and sum (bool only moves: MPI has no SUM for it), in native byte order.
_KINDS = "biufc"


def counted(n: int, noun: str) -> str:
    """`n` and `noun` in messages: "1 dim", "3 dims", "1 entry", "2 entries", "2 ways", "2 microbatches", "2 axes",
    "2 MoE layers" (a noun phrase's last word made plural: `_plural`)."""
    return f"1 {noun}" if n == 1 else f"{n} {_plural(noun)}"


#: Nouns whose plural no rule of `_plural` gives (the ones messages name, and their kin).
_IRREGULAR = {"axis": "axes", "index": "indices", "matrix": "matrices", "vertex": "vertices", "basis": "bases",
              "child": "children", "datum": "data"}


def _plural(noun: str) -> str:
    """The plural of `noun` (its last word's, in a phrase: "MoE layer", "batch dim"): `_IRREGULAR`'s (axis: axes),
    a consonant's y as ies (entry: entries; way, key: ways, keys), -es after ch, sh, s, x and z (batch: batches),
    else -s."""
    head, space, word = noun.rpartition(" ")
    lower = word.lower()
    if lower in _IRREGULAR:
        many = _IRREGULAR[lower]
        many = many if word == lower else word[:1] + many[1:]  # (a capital kept: Axis, Axes)
    elif lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        many = word[:-1] + "ies"
    elif lower.endswith(("ch", "sh", "s", "x", "z")):
        many = word + "es"
    else:
        many = word + "s"
    return head + space + many


def as_int(value: object) -> Optional[int]:
    """`value` as a Python int if it is an integer (numpy ints too, bool not), else None."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[return-value]
    if kind is bool or getattr(getattr(value, "dtype", None), "kind", None) == "b":
        return None  # Python's bool and numpy's (numpy before 2.3 gives np.bool_ an __index__: True would be 1)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def int_arg(value: object, what: str, low: Optional[int] = None,
            error: type[SpmdsimError] = ShapeError) -> int:
    """`value` as a Python int, at least `low` when given; else `error` naming it as `what`."""
    out = as_int(value)
    if out is None or (low is not None and out < low):
        bound = {None: "", 0: " >= 0", 1: " >= 1"}.get(low, f" >= {low}")
        raise error(f"{what} {value!r} must be an integer{bound}")
    return out


def dims_expected(ndim: int) -> str:
    """What a dim argument of a tensor of `ndim` dims may be, for the refusals: "(expected an integer from -2 to
    1)", or for a 0-d tensor that it has none (not "from 0 to -1")."""
    return f"(expected an integer from {-ndim} to {ndim - 1})" if ndim > 0 else "(it has no dim to name)"


def shape_arg(shape: object, what: str = "shape", error: type[SpmdsimError] = ShapeError) -> tuple[int, ...]:
    """`shape` as a tuple of non-negative Python ints; a string is not a sequence of sizes here."""
    if type(shape) is tuple and all(type(s) is int and s >= 0 for s in shape):
        return shape  # the common case: already a shape
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise error(f"{what} {shape!r} must be a sequence of integers")
    items = tuple(shape)  # type: ignore[arg-type]
    out = []
    for tensor_dim, size in enumerate(items):
        n = as_int(size)
        if n is None:
            raise error(f"{what} {items!r} must hold integers, got {size!r} in dim {tensor_dim}")
        if n < 0:
            raise error(f"{what} {items!r} must not have negative sizes, got {size!r} in dim {tensor_dim}")
        out.append(n)
    return tuple(out)


def dtype_arg(dtype: Any, what: str = "dtype", error: type[SpmdsimError] = DTypeError) -> np.dtype:
    """`dtype` as a numpy dtype that MPI can move: bool, integer, float or complex, native byte order."""
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise error(f"{what} None is not a dtype; expected one of {SUPPORTED_DTYPES}")
    try:  # ml_dtypes' names whether or not it was imported (precision.named_dtype)
        out = named_dtype(dtype, what)
    except (TypeError, ValueError):
        raise error(f"{what} {dtype!r} is not a numpy dtype; expected one of {SUPPORTED_DTYPES}") from None
    if dtype_name(out) == "bfloat16":  # ml_dtypes' (kind 'V'): moved as 16-bit words, summed widened to float32
        return out
    if out.kind not in _KINDS or not out.isnative:
        if out.kind in _KINDS:
            raise error(f"{what} {out.str!r} ({out.name}) is not in native byte order; convert it "
                        f"with .astype({out.name!r}) (supported: {SUPPORTED_DTYPES})")
        fp8 = ("; FP8 is a cast inside a product with its scale (spmdsim.nn.ops.fp8_linear, --precision fp8: "
               "docs/howto/bf16.md), not a tensor's dtype") if out.name.startswith("float8") else ""
        raise error(f"{what} {out.str!r} ({out.name}) is not numeric; expected one of {SUPPORTED_DTYPES}{fp8}")
    problem = long_double(out, what)  # (under mpiexec from_global refused equal arrays)
    if problem:
        raise error(problem)
    return out


def long_double(dtype: np.dtype, what: str = "dtype") -> Optional[str]:
    """Why `dtype` is refused where it is numpy's long double (float128, complex256), `what` naming it, else None:
    tensors (`dtype_arg`) and the raw collectives (spmdsim.runtime.arguments) say it alike."""
    if dtype.type is not np.longdouble and dtype.type is not np.clongdouble:
        return None
    return (f"{what} {dtype.str!r} ({dtype.name}) is numpy's long double, whose width and padding bytes differ "
            f"between machines and processes; expected one of {SUPPORTED_DTYPES}: convert it with "
            f".astype({'complex128' if dtype.kind == 'c' else 'float64'!r})")


def plain_array(value: Any, what: str, error: type[SpmdsimError] = DTypeError) -> np.ndarray:
    """`value` as a numpy array (np.asarray's), unless it is a numpy masked array: np.asarray keeps its data and
    drops its mask, so the masked elements would enter the results as numbers; refused in one line, as are nested
    lists of unequal lengths."""
    if isinstance(value, np.ma.MaskedArray):
        masked = int(np.ma.count_masked(value))
        raise error(f"{what} is a numpy masked array of shape {value.shape!r} with {counted(masked, 'masked element')}"
                    ": a tensor has no mask; expected a plain array: pass its .filled(value) (masked elements set "
                    "to value) or its .data (the numbers under the mask)")
    try:
        return np.asarray(value)
    except SpmdsimError:
        raise  # an object's own refusal (a DTensor's __array__: it says to gather)
    except ValueError:  # nested lists of unequal lengths: numpy's "inhomogeneous shape", a traceback
        raise ShapeError(f"{what} {describe(value)} is not rectangular: its nested sequences differ in length; "
                         "expected one length per dim, as an ndarray has") from None


def tolerance_arg(value: object, what: str, error: type[SpmdsimError] = SpmdsimError) -> float:
    """A check tolerance: a finite real number >= 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0:
        raise error(f"{what} {value!r} must be a finite number >= 0")
    return float(value)


_NAMES: dict = {}


def dtype_name(dtype: np.dtype) -> str:
    """dtype.name, cached: numpy computes it in Python (~5 us), and every collective's signature has it."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def float_max(dtype: Any) -> float:
    """The largest finite value of float dtype `dtype` (a dtype or its name), cached: np.finfo takes ~1 us, and
    every seeded parameter and filled constant of a model asks."""
    top = _FLOAT_MAX.get(dtype)
    if top is None:
        top = _FLOAT_MAX[dtype] = float(np.finfo(dtype).max)
    return top


_FLOAT_MAX: dict = {}


#: Longest JSON file `read_bounded` reads for a saved cost model or a machine file, in characters (one is a
#: few thousand); as a JSON case (spmdsim.tools.cli.cases.MAX_CASE_TEXT).
MAX_JSON_TEXT = 4_000_000


def read_bounded(source: Union[str, os.PathLike, TextIO], most: int, where: str, expected: str) -> str:
    """The text of the file `source` (a path, or an open text stream), read up to `most` characters: one more
    is read, and a longer text refused in one SpmdsimError naming `where` and `expected` (/dev/zero or
    `yes |` would never end). A leading UTF-8 byte order mark (Windows Notepad saves one) is dropped, as
    utf-8-sig reads it. OSError and UnicodeDecodeError reach the caller, which words them; a stream that
    decoded bytes that are no UTF-8 as lone surrogates (Python's stdin under the C and C.UTF-8 locales,
    errors="surrogateescape") raises the UnicodeDecodeError a file of those bytes does."""
    if hasattr(source, "read"):
        text = source.read(most + 1)
        text = text[1:] if text.startswith("\ufeff") else text
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # (json read them as "Expecting value: line 1 column 1")
            text.encode("utf-8", "surrogateescape").decode("utf-8")
    else:
        with open(source, encoding="utf-8-sig") as fh:
            text = fh.read(most + 1)
    if len(text) > most:
        raise SpmdsimError(f"{where} is longer than {most:,} characters; expected {expected}")
    return text


#: Deepest nesting of lists and objects a JSON input may have (a case needs 3; Python's parser and
#: repr recurse, so a file of 100,000 brackets gave a RecursionError traceback).
MAX_JSON_DEPTH = 64


def loads_json(text: str, where: str, expected: str, invalid: str = "valid JSON") -> Any:
    """`json.loads(text)`, or one SpmdsimError naming `where`: empty, not JSON, or nested past MAX_JSON_DEPTH."""
    if not text.strip():  # json's "Expecting value: line 1 column 1 (char 0)" does not say the file is empty
        raise SpmdsimError(f"{where} is empty{' (only white space)' if text else ''}; expected {expected}")
    depth = deepest = 0
    quoted = escaped = False
    for ch in text:  # brackets outside strings, before the recursive parser sees them
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    raise SpmdsimError(f"{where} nests lists or objects more than {MAX_JSON_DEPTH} deep; "
                                       f"expected {expected}")
        elif ch in "]}":
            depth -= 1
    import json  # here: spmdsim mpirun's start (as_int) reads no JSON

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpmdsimError(f"{where} is not {invalid}: {exc}{_python_hint(text, exc.pos)}") from None
    except RecursionError:
        raise SpmdsimError(f"{where} nests too deeply; expected {expected}") from None


#: What json's "Expecting value" meets where a value is written as Python writes it, and JSON's way.
_PYTHON_SPELLINGS = (("None", "JSON writes null where Python writes None"),
                     ("True", "JSON writes true and false where Python writes True and False"),
                     ("False", "JSON writes true and false where Python writes True and False"),
                     ("'", "JSON strings take double quotes"))


def _python_hint(text: str, pos: int) -> str:
    """" (JSON writes null where Python writes None)" where the value json could not read at `pos` is written as
    Python writes it, or ""."""
    return next((f" ({hint})" for word, hint in _PYTHON_SPELLINGS if text.startswith(word, pos)), "")


def describe(value: Any) -> str:
    """A short account of a value for messages: "ndarray of shape (4, 4)", "list [1, 2]" (a long repr cut at
    60 characters: an array passed where a mesh or a layout goes would print whole, many lines)."""
    if value is None:
        return "None"
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":  # (numpy not loaded for it)
        return f"ndarray of shape {value.shape!r}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
