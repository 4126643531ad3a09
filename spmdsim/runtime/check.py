"""Compare each rank's shard with its reference slice; every rank gets the same Verdict.

Default tolerances: spmdsim.references.tolerances. An element passes when |actual - expected| <=
atol + rtol x its scale: |expected|, or, given the magnitudes that entered it (`scale`: for a
sum or product the sum of its terms' absolute values), the larger of the two (docs/explanation/tolerances.md,
"Tolerances"). A NaN or Inf on either side, or in the scale, fails the check and
is counted in ``nonfinite``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CheckFailed, SpmdsimError
from ..base.validate import counted, plain_array
from . import door
from .engines import engine_of
from .shared_rows import gather_shared
from ..references.tolerances import default_tolerances  # noqa: F401 - importable from here as before

__all__ = ["Verdict", "default_tolerances", "local_stats", "agree", "checked_scale", "passed_record",
           "mismatch_record", "count_once", "place"]

# Layout of the per-rank record that one Allgather shares.
# "held" is this rank's count of non-finite values, never zeroed: a replica whose copy holds a NaN that the
# first holder's lacks (copies that differ) would otherwise fail with no word of the NaN.
# "at": the flat index of this rank's worst element (the first non-finite one, else the one furthest past its
# tolerance), in its block from local_stats, in the global tensor after `place`; -1 where none failed.
_FIELDS = ("passed", "max_abs", "max_rel", "nonfinite", "elements", "shape_ok", "nonfinite_reference", "held",
           "at")
#: The record's counts of global elements: a replica's are zeroed (`count_once`), the first holder counts them.
_COUNTS = [_FIELDS.index(name) for name in ("nonfinite", "elements", "nonfinite_reference")]


def passed_record(elements: int) -> np.ndarray:
    """The record of a block of `elements` that passes with nothing compared: an empty block, a dry run's."""
    return np.array([1.0, 0.0, 0.0, 0.0, float(elements), 1.0, 0.0, 0.0, -1.0])


def mismatch_record(elements: int) -> np.ndarray:
    """The record of a block of `elements` whose reference (or scale) has another shape: failed, errors infinite."""
    return np.array([0.0, np.inf, np.inf, 0.0, float(elements), 0.0, 0.0, 0.0, -1.0])


def place(record: np.ndarray, region: tuple, shape: tuple) -> None:
    """Turn `record`'s worst element from a flat index into this rank's block (`region` of a tensor of `shape`)
    into one into the whole tensor, in place."""
    if record[8] < 0 or not shape:
        return
    block = tuple(len(range(*s.indices(n))) for s, n in zip(region, shape))
    local = np.unravel_index(int(record[8]), block)
    record[8] = float(np.ravel_multi_index(tuple(s.indices(n)[0] + i for s, n, i in zip(region, shape, local)),
                                           shape))


def count_once(record: np.ndarray) -> None:
    """Zero `record`'s counts of elements in place: a replica's, whose elements another rank's record counts."""
    record[_COUNTS] = 0.0


@dataclass(frozen=True)
class Verdict:
    """The agreed outcome of a distributed check (identical on every rank)."""

    passed: bool
    max_abs_error: float
    max_rel_error: float
    worst_rank: int
    atol: float
    rtol: float
    nonfinite: int
    elements: int = 0  # global elements compared (each replica counted once), like nonfinite
    failed_ranks: tuple[int, ...] = ()
    dry_run: bool = False  # a dry run's check (spmdsim.runtime.sim.dry): no values, nothing compared
    scaled: bool = False  # rtol multiplied the magnitudes that entered each element, not |ref|
    nonfinite_reference: int = 0  # of the `nonfinite` elements, those whose reference is NaN/Inf
    worst_element: tuple[int, ...] = ()  # the worst rank's worst element (global index); () where none failed

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.dry_run:
            return f"check not made: a dry run has no values ({counted(self.elements, 'element')})"
        if self.passed and not self.nonfinite and self.max_abs_error != float("inf"):
            # The tolerance first, so that a relative error above rtol cannot read as a failure:
            # every element passed |err| <= atol + rtol x |ref|, and where the relative error is
            # above rtol the reference is near 0 and atol is what covered it.
            covered = ("; above rtol only where atol covers it" if self.max_rel_error > self.rtol and not self.scaled
                       else "")
            scale = "the magnitudes that entered it" if self.scaled else "|ref|"
            return (f"check passed: every element within atol {self.atol:g} + rtol {self.rtol:g} x {scale} "
                    f"({counted(self.elements, 'element')})\n  max abs err {self.max_abs_error:.3g}, max rel err "
                    f"{self.max_rel_error:.3g} (worst rank {self.worst_rank}{covered})")
        head = "check passed" if self.passed else f"check FAILED on ranks {list(self.failed_ranks)!r}"
        # Non-finite values lead: the error figures only cover the finite ones.
        # Where they are: a NaN in the reference is a reference's bug, one in the result the program's.
        where = f"{self.nonfinite_reference or 'none'} in the reference"
        lead = (f"{counted(self.nonfinite, 'non-finite value')} (NaN/Inf; {where}); finite values: "
                if self.nonfinite else "")
        text = (f"{head}: {lead}max abs err {self.max_abs_error:.3g}, max rel err "
                f"{self.max_rel_error:.3g} (worst rank {self.worst_rank}{self._at()}; atol {self.atol:g}, "
                f"rtol {self.rtol:g}{' x the magnitudes that entered' if self.scaled else ''}; "
                f"{counted(self.elements, 'element')})")
        if self.max_abs_error == float("inf") and not self.nonfinite:
            text += "; shard shape differs from the reference region"
        return text

    def _at(self) -> str:
        """', element [9, 2]': where the worst rank's worst element is in the whole tensor, if one failed."""
        return f", element {list(self.worst_element)}" if self.worst_element else ""

    def raise_if_failed(self) -> "Verdict":
        """Raise CheckFailed (on every rank alike) unless the check passed."""
        if not self.passed:
            raise CheckFailed(str(self))
        return self


def checked_scale(scale: Any, what: str = "check: scale") -> np.ndarray:
    """`scale` as an array of magnitudes, or one SpmdsimError naming its first entry that is none: a magnitude
    is real and not negative (the check's arithmetic would take a negative one as its absolute value, a complex
    one as its modulus). A NaN or Inf passes here, as a magnitude that overflowed does: `local_stats` fails its
    element as non-finite (an infinite scale would otherwise pass any value)."""
    scale = plain_array(scale, what, SpmdsimError)
    if np.iscomplexobj(scale) or scale.dtype.kind in "bOSUM":
        raise SpmdsimError(f"{what} of dtype {scale.dtype} must hold real magnitudes (numbers >= 0)")
    wide = np.asarray(scale, np.float64)
    negative = wide < 0
    if negative.any():
        at = tuple(int(i) for i in np.argwhere(negative)[0])
        raise SpmdsimError(f"{what} holds {float(wide[at])!r} at {at}: a magnitude must be a number >= 0 "
                           f"({int(np.count_nonzero(negative))} such entries)")
    return scale


def local_stats(actual: np.ndarray, expected: Any, rtol: float, atol: float, scale: Any = None) -> np.ndarray:
    """This rank's record: passed, max abs, max rel error, nonfinite count, elements, shape ok, of the
    nonfinite elements those whose expected value is NaN/Inf, and the nonfinite count again (`count_once`
    leaves that one: a replica's own).

    `scale`: the magnitudes that entered each expected element (its shape); rtol multiplies the
    larger of it and |expected|. The max rel error stays relative to |expected|.
    """
    expected = np.asarray(expected)
    if scale is not None:
        scale = np.asarray(scale)
        if scale.shape != actual.shape:
            return mismatch_record(actual.size)
    if expected.shape != actual.shape:
        return mismatch_record(actual.size)
    if actual.size == 0:
        return passed_record(0)
    wide = np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64
    a = actual.astype(wide, copy=False)
    b = expected.astype(wide, copy=False)
    scale_finite = True if scale is None else bool(np.isfinite(scale).all())
    fast = _finite_stats(a, b, rtol, atol, scale) if scale_finite else None
    if fast is not None:
        exact = fast[0] and not (atol or rtol) and actual.dtype.kind in "biu" and expected.dtype.kind in "biu"
        return _exactly(fast, actual, expected) if exact else fast
    finite = np.isfinite(a) & np.isfinite(b)
    if not scale_finite:  # an element whose magnitudes overflowed fails as non-finite, whatever its values
        finite &= np.isfinite(scale)
    nonfinite = int(finite.size - np.count_nonzero(finite))
    in_reference = int(b.size - np.count_nonzero(np.isfinite(b))) if nonfinite else 0
    if nonfinite:
        a = np.where(finite, a, 0)
        b = np.where(finite, b, 0)
    err = np.abs(a - b)
    mag = np.abs(b)
    max_abs = float(err.max())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(mag > 0, err / np.where(mag > 0, mag, 1), np.where(err > 0, np.inf, 0.0))
    max_rel = float(rel.max())
    if scale is not None:
        mag = np.maximum(mag, np.where(finite, np.abs(scale.astype(np.float64, copy=False)), 0))
    past = err - (atol + rtol * mag)
    ok = bool(np.all(past <= 0)) and nonfinite == 0
    at = -1 if ok else int(np.argmin(finite) if nonfinite else np.argmax(past))
    return np.array([float(ok), max_abs, max_rel, float(nonfinite), float(actual.size), 1.0, float(in_reference),
                     float(nonfinite), float(at)])


def _finite_stats(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, scale: Any) -> Any:
    """`local_stats`' record when every difference is finite (the common case), in about half the passes over
    the arrays and with half the temporaries (each made once, then written in place): the same numbers bit for
    bit (the same operations on the same elements); None when a value is not finite (or a difference overflows),
    for local_stats' own path."""
    with np.errstate(over="ignore", invalid="ignore"):  # the general path warns, as before, if it must
        err = np.asarray(a - b)  # an array also for 0-d operands (their difference is a numpy scalar)
    err = np.abs(err, out=err) if err.dtype.kind == "f" else np.abs(err)  # complex: a new float array
    max_abs = float(err.max())
    if not math.isfinite(max_abs):  # an inf or nan in either, or an overflow: the general path
        return None
    mag = np.abs(b, out=np.empty(err.shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.divide(err, mag, out=np.empty(err.shape))  # inf where only the expected value is 0; nan where both are
    max_rel = float(rel.max())
    if math.isnan(max_rel):
        rel = np.where(np.isnan(rel), 0.0, rel)
        max_rel = float(rel.max())
    if scale is not None:  # |scale| where rel was: the larger of it and |expected|, in place
        np.maximum(mag, np.abs(scale.astype(np.float64, copy=False), out=rel), out=mag)
    mag *= rtol  # atol + rtol x the magnitude, in place
    mag += atol
    ok = bool(np.less_equal(err, mag).all())
    at = -1 if ok else int(np.argmax(np.subtract(err, mag, out=err)))  # the furthest past its tolerance
    return np.array([float(ok), max_abs, max_rel, 0.0, float(a.size), 1.0, 0.0, 0.0, float(at)])


def _exactly(record: np.ndarray, actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """`record`, passed with every float64 difference 0, of integer (or bool) blocks compared exactly (atol and
    rtol 0): failed where two integers differ that float64 holds as one (past 2**53: 2**62 + 1 is 2**62 there),
    with those elements' exact errors (Python integers)."""
    differ = actual != expected  # numpy compares integers exactly, signed beside unsigned too
    if not differ.any():
        return record
    want = expected[differ].astype(object)
    err = np.abs(actual[differ].astype(object) - want)
    at = np.flatnonzero(differ.ravel())[int(np.argmax(err))]
    return np.array([0.0, float(err.max()), float((err / np.abs(want)).max()), 0.0, record[4], 1.0, 0.0, 0.0,
                     float(at)])


def agree(comm: Any, stats: np.ndarray, rtol: float, atol: float, polite: bool = False,
          scaled: bool = False, elements: Any = None, shape: tuple = ()) -> Verdict:
    """Share every rank's record ("check" to runtime.debug_calls) and build the same Verdict.

    Under MPI one Allgather: each rank reads its own table of every rank's record. Simulated ranks share one
    table (spmdsim.runtime.shared_rows: one Gather to rank 0, numbered and fingerprinted as the Allgather
    is), and the first of them to read it builds the Verdict for all (the same object on every rank): an
    Allgather gave each of p ranks its own p records, and each rank built the Verdict from them (805 MB and
    O(p^2) work at 4,096 ranks).

    On a dry run's communicator (spmdsim.runtime.sim.dry) the Allgather is made as a real check makes it (its call
    and its table's bytes count), but the table is not read: it holds no rank's figures (this rank's record
    repeated while it fits in 64 KiB, zeros past 1,170 ranks) and nothing was compared. The verdict is then
    the same at every rank count: passed (a program's raise_if_failed() lets its dry run go on), with
    ``dry_run=True``, no error, and `elements` (the global elements the check stands for; else this rank's
    record's, once per rank)."""
    send = np.ascontiguousarray(stats, np.float64)
    shared = gather_shared(comm, send, "check", polite)
    if shared is not None:
        return shared.derived(_verdict, rtol, atol, scaled, shape)
    table = np.empty((comm.Get_size(), len(_FIELDS)), np.float64)
    engine = engine_of(comm)
    door.transfer(comm, "check", (), send, (), polite, engine.all_gather, send, table)
    if engine.dry:
        count = int(send[4]) * len(table) if elements is None else int(elements)
        return Verdict(passed=True, max_abs_error=0.0, max_rel_error=0.0, worst_rank=0, atol=float(atol),
                       rtol=float(rtol), nonfinite=0, elements=count, dry_run=True, scaled=scaled)
    return _verdict(table, rtol, atol, scaled, shape)


def _verdict(table: np.ndarray, rtol: float, atol: float, scaled: bool, shape: tuple = ()) -> Verdict:
    """`agree`'s Verdict from the table of every rank's record (a row per rank), with numpy (4,096 ranks reading
    4,096 rows each in Python would take two thirds of a check's 41 s; simulated ranks build it once for all).
    Failed: the ranks whose record did not pass; the worst rank, the failing one (else any) with the largest
    error, a non-finite one counting as infinite; a NaN wins a maximum, the first of equals is taken (numpy's
    max and argmax). The non-finite count is each global element's once, or, where copies that differ hold
    more on one replica than the first holders counted, that replica's. The worst element is the worst rank's
    (its record's "at", a flat index into a tensor of `shape`)."""
    ok, abs_err, rel_err, nonfinite, elements = (table[:, i] for i in range(5))
    held = table[:, 7]  # each rank's own count: a replica's NaN that its first holder lacks shows here only
    failed = np.flatnonzero(~(ok > 0))
    score = np.where(held > 0, np.inf, abs_err)
    among = failed if failed.size else np.arange(len(table))
    worst = int(among[int(np.argmax(score[among]))])
    at = int(table[worst, 8])
    element = tuple(int(i) for i in np.unravel_index(at, shape)) if shape and 0 <= at < math.prod(shape) else ()
    return Verdict(passed=not failed.size, max_abs_error=float(np.max(abs_err)), max_rel_error=float(np.max(rel_err)),
                   worst_rank=worst, atol=float(atol), rtol=float(rtol),
                   nonfinite=max(int(nonfinite.sum()), int(held.max())),
                   elements=int(elements.sum()), failed_ranks=tuple(int(r) for r in failed), scaled=scaled,
                   nonfinite_reference=int(table[:, 6].sum()), worst_element=element)
