"""A submission's results against the expected ones: the first rank and slice that differ, said so it teaches."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...references.tolerances import default_tolerances

__all__ = ["first_difference", "show", "tolerance"]

#: The most values a message shows of an array.
_SHOWN = 6


def show(value: Any) -> str:
    """A short text of a value: arrays with their first few values, scalars in full."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        flat = value.ravel()
        body = ", ".join(_number(v) for v in flat[:_SHOWN])
        more = f", ... ({flat.size} values)" if flat.size > _SHOWN else ""
        return f"[{body}{more}]"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.10g}"
    text = repr(value)
    return text if len(text) <= 72 else text[:69] + "..."


def _number(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):  # (dtype object: of Python objects, not numbers; else alike in its words)
        return f"an array of shape {value.shape}" + (" and dtype object" if value.dtype == object else "")
    return f"a {type(value).__name__}"


def _slice(index: tuple, stop: int) -> str:
    """The text of `result[i, j, a:b]`: `index` with its last axis running to `stop`."""
    head = ", ".join(str(i) for i in index[:-1])
    last = f"{index[-1]}:{stop}" if stop > index[-1] + 1 else f"{index[-1]}"
    return f"[{head + ', ' if head else ''}{last}]"


def _array_difference(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> Optional[str]:
    if got.shape != want.shape:
        return f"returned shape {got.shape}, expected {want.shape}"
    if want.size == 0:
        return None
    if not np.issubdtype(got.dtype, np.number) and got.dtype != bool:
        return f"returned an array of dtype {got.dtype}, expected numbers ({want.dtype})"
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=False)
    if not bad.any():
        return _wider(got, want)
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if got.ndim else ()
    if not first:  # a 0-d array: said as a number
        gap = _number_gap(got[()], want[()], rtol, atol)
        return f"returned {show(got.item())}, expected {show(want.item())}{gap}"
    row_bad = bad[first[:-1]]
    stop = first[-1]
    while stop < row_bad.size and row_bad[stop] and stop - first[-1] < _SHOWN:
        stop += 1
    cut = first[:-1] + (slice(first[-1], stop),)
    where = _slice(first, stop)
    count = int(bad.sum())
    expected, shown = show(want[cut]), show(got[cut])
    kind = f" (returned dtype {got.dtype}, expected {want.dtype})" if got.dtype.kind != want.dtype.kind else ""
    return (f"result{where} differs ({count} of {bad.size} values wrong): expected {expected}, got {shown}"
            + (_unseen(got, want, bad, rtol, atol) if expected == shown else kind))


def _wider(got: np.ndarray, want: np.ndarray) -> Optional[str]:
    """Why right values in a wider float than the expected one fail (float64 where the exercise asks for
    float32: twice the memory and the bytes sent), or None."""
    if not got.dtype.kind == want.dtype.kind == "f" or got.itemsize <= want.itemsize:
        return None
    return (f"returned dtype {got.dtype}, expected {want.dtype}: the values are right, but the exercise asks for "
            f"{want.dtype} (twice the bytes or more to hold and send): compute in {want.dtype}, or convert the "
            f"result with .astype(np.{want.dtype})")


def _unseen(got: np.ndarray, want: np.ndarray, bad: np.ndarray, rtol: float, atol: float) -> str:
    """What the shown digits hide where they agree: the largest difference of a wrong value against what
    was allowed there, and the dtype returned where it is not the expected one."""
    diff = np.abs(got[bad].astype(np.float64) - want[bad].astype(np.float64))
    worst = int(np.argmax(diff))
    allowed = atol + rtol * abs(float(want[bad][worst]))
    dtype = f"; returned dtype {got.dtype}, expected {want.dtype}" if got.dtype != want.dtype else ""
    return f" (they differ past the digits shown: by up to {diff[worst]:.3g}, {allowed:.3g} allowed{dtype})"


def _number_gap(got: Any, want: Any, rtol: float, atol: float) -> str:
    """Why two numbers that look alike differ: a result of fewer bits than the expected one (a float32 sum of a
    float64 answer), and how far it is against what was allowed where the two agree to 4 digits or more."""
    diff, allowed = abs(float(got) - float(want)), atol + rtol * abs(float(want))
    mine, theirs = np.asarray(got).dtype, np.asarray(want).dtype
    notes = []
    if mine.kind == theirs.kind == "f" and mine.itemsize < theirs.itemsize:
        notes.append(f"returned {mine.name}, which keeps about {np.finfo(mine).precision} digits; expected "
                     f"{theirs.name}")
    if notes or diff <= 1e-4 * abs(float(want)):
        notes.append(f"off by {diff:.3g}, {allowed:.3g} allowed")
    return f" ({'; '.join(notes)})" if notes else ""


def _not_an_array(got: Any, want: np.ndarray, as_array: np.ndarray) -> str:
    """Why `got`, not an ndarray, is not taken for the array `want` (an exercise whose statement does not say
    "array-like"): a list of the right values passed, where the statement asks for a float64 array."""
    if isinstance(got, (list, tuple)) and as_array.shape != want.shape:  # arrays not joined into one
        return (f"returned {_kind(got)} of {len(got)} items (shape {as_array.shape} as one array), "
                f"expected {_kind(want)}")
    return (f"returned {_kind(got)}, expected a NumPy array (ndarray) of shape {want.shape} and dtype {want.dtype}: "
            "the exercise asks for an array; make one with np.asarray")


def _complex(got: np.ndarray, want: np.ndarray) -> Optional[str]:
    """Why a complex array is not taken for a real one of the same values (they compare equal where the
    imaginary parts are 0): its dtype, and its real part where that is all it holds."""
    if not np.iscomplexobj(got) or np.iscomplexobj(want):
        return None
    real = "its imaginary parts are all 0: return its real part (.real)" if not np.any(got.imag) else \
        "some of its values have an imaginary part"
    return f"returned an array of dtype {got.dtype}, expected {want.dtype}: {real}"


def tolerance(want: Any, rtol: Optional[float], atol: Optional[float]) -> tuple:
    """The exercise's RTOL and ATOL, each one it leaves out (None) taken by `want`'s dtype
    (spmdsim.references.tolerances: float64 1e-9 and 1e-12, float32 1e-4 and 1e-5); float64's for a value not of
    floats. A float32 exercise at float64's 1e-9 failed its own reference's Allreduce at 4 ranks (another order)."""
    dtype = want.dtype if isinstance(want, (np.ndarray, np.generic)) else None
    rtol_, atol_ = default_tolerances(dtype if dtype is not None and dtype.kind in "fc" else np.dtype(np.float64))
    return (rtol_ if rtol is None else rtol), (atol_ if atol is None else atol)


def _difference(got: Any, want: Any, rtol: Optional[float], atol: Optional[float],
                array_like: bool = False) -> Optional[str]:
    """How `got` differs from `want`, or None where it matches; where `want` is an array, `got` must be one
    too, unless `array_like` (a list or a tuple of its values then matches)."""
    if want is None:
        return None if got is None else f"returned {show(got)}, expected None (this rank returns nothing)"
    if got is None:
        return f"returned None, expected {_kind(want)}: return the result"
    if isinstance(want, np.ndarray):
        try:
            got_array = np.asarray(got)
        except Exception:  # noqa: BLE001 - anything a student returns
            return f"returned {_kind(got)}, expected {_kind(want)}"
        if got_array.dtype == object:
            return f"returned {_kind(got)}, expected {_kind(want)}"
        if not isinstance(got, np.ndarray) and (not array_like or got_array.shape != want.shape):
            return _not_an_array(got, want, got_array)
        return _complex(got_array, want) or _array_difference(got_array, want, *tolerance(want, rtol, atol))
    if isinstance(want, (int, float, np.number)):
        rtol, atol = tolerance(want, rtol, atol)
        if isinstance(got, np.ndarray) and got.size == 1:
            got = got.item()
        if not isinstance(got, (int, float, np.number)) or isinstance(got, bool):
            return f"returned {_kind(got)}, expected a number ({show(want)})"
        if np.iscomplexobj(got) and not np.iscomplexobj(want):  # (float() took its real part, with a warning)
            return f"returned a {np.asarray(got).dtype} number, {complex(got)}, expected a real number ({show(want)})"
        if not np.isclose(float(got), float(want), rtol=rtol, atol=atol, equal_nan=False):
            return f"returned {show(got)}, expected {show(want)}" + _number_gap(got, want, rtol, atol)
        return None
    if isinstance(want, tuple) and any(isinstance(item, np.ndarray) for item in want):
        return _outputs_difference(got, want, rtol, atol, array_like)
    if isinstance(want, (list, tuple)):
        return _sequence_difference(got, want)
    return None if got == want else f"returned {show(got)}, expected {show(want)}"


def _outputs_difference(got: Any, want: tuple, rtol: Optional[float], atol: Optional[float],
                        array_like: bool) -> Optional[str]:
    """How a function's several outputs (a tuple with arrays: (dx, dw)) differ: the first output that does."""
    if not isinstance(got, (list, tuple)):
        return f"returned {_kind(got)}, expected {len(want)} outputs (a tuple or a list of them)"
    if len(got) != len(want):
        return f"returned {_kind(got)} of {len(got)} outputs, expected {len(want)}"
    for index, (mine, theirs) in enumerate(zip(got, want)):
        text = _difference(mine, theirs, rtol, atol, array_like)
        if text is not None:
            return f"output {index}: {text.replace('returned ', '', 1)}" if text.startswith("returned ") else \
                f"output {index}: {text}"
    return None


def _items(value: Any) -> Any:
    """A sequence's items with lists made tuples (["F", 0] and ("F", 0) say the same), or None."""
    if not isinstance(value, (list, tuple)):
        return None
    return [tuple(item) if isinstance(item, list) else item for item in value]


def _sequence_difference(got: Any, want: Any) -> Optional[str]:
    """How a returned sequence differs from the expected one: its first differing item, or its length."""
    mine, theirs = _items(got), _items(want)
    if mine is None:
        return f"returned {_kind(got)}, expected a list of {len(want)} items"
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return f"item {index} is {show(a)}, expected {show(b)} (expected {show(list(theirs))})"
    if len(mine) != len(theirs):
        return f"returned {len(mine)} items, expected {len(theirs)} (expected {show(list(theirs))})"
    return None


def _why(got: Any, want: Any, args: tuple, n: int) -> Optional[str]:
    """A guess at the mistake behind a wrong array: a sum taken twice or never, the input sent back."""
    if not isinstance(want, np.ndarray) or not isinstance(got, np.ndarray) or got.shape != want.shape:
        return None
    if not np.issubdtype(got.dtype, np.number) or not np.abs(want).sum():
        return None
    for array in args:  # (not where the input is itself the answer: one rank's sum, say)
        if isinstance(array, np.ndarray) and array.shape == got.shape and np.allclose(got, array) \
                and not np.allclose(array, want):
            return "it is this rank's own input, unchanged: no data from the other ranks reached it"
    for factor in range(2, max(3, n + 1)):
        if np.allclose(got, factor * want):
            return f"it is {factor} times the expected value: a sum taken more than once"
    return None


def _elsewhere(results: Sequence[Any], expected: Sequence[Any], rank: int, rtol: Optional[float], atol: Optional[float],
               array_like: bool = False) -> Optional[str]:
    """Where `rank` returned nothing, the rank that should return nothing and returned `rank`'s result instead
    (a root given wrong), said; else None."""
    if results[rank] is not None or expected[rank] is None:
        return None
    for other, (got, want) in enumerate(zip(results, expected)):
        if other != rank and want is None and got is not None and \
                _difference(got, expected[rank], rtol, atol, array_like) is None:
            return f"rank {other} returned it, where None was expected: the result belongs on rank {rank} (the root)"
    return None


def _guess(function: Any, *args: Any) -> Optional[str]:
    """`function(*args)`, a sentence that guesses at the mistake, or None where it cannot tell (or fails: an
    instructor's `explain` on a result of a shape it did not expect must not end the check)."""
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - a guess, never the verdict
        return None


def first_difference(results: Sequence[Any], expected: Sequence[Any], args: Sequence[tuple], rtol: Optional[float],
                     atol: Optional[float], explain: Any = None, case: Any = None, array_like: bool = False
                     ) -> Optional[str]:
    """The first rank whose result differs, said in one or two lines; None where every rank's matches. An
    expected array takes an array only, unless `array_like` (the exercise's statement says "array-like"); a
    tolerance None is taken by each expected value's dtype (`tolerance`)."""
    n = len(expected)
    for rank, (got, want) in enumerate(zip(results, expected)):
        text = _difference(got, want, rtol, atol, array_like)
        if text is None:
            continue
        why = _guess(explain, case, n, rank, got) if explain is not None else None
        why = why or _guess(_why, got, want, args[rank], n) or _elsewhere(results, expected, rank, rtol, atol,
                                                                          array_like)
        return f"rank {rank} {text}" + (f"\n  {why}" if why else "")
    return None
