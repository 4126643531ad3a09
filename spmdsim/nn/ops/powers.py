"""Integer powers with a negative exponent, refused on every rank alike as numpy refuses them (its kernel's
ValueError would be raised on the ranks holding such an entry alone)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import OperatorError
from . import _common
from ...base.buffers import CAPTURE
from ._common import DRY_ZEROS_BYTES, describe
from ...runtime import door, replay


def _negative_powers(mesh: Any, args: tuple, xs: Any) -> None:
    """Refuse, on every rank alike, an integer power (numpy's integer loop: an integer or bool base, a signed
    integer exponent) with a negative exponent where the result has entries, as numpy refuses it (its kernel's
    ValueError, raised on the ranks holding such an entry alone, would leave the others going on into the next
    collective). A number's exponent is every rank's: checked here. A DTensor's values differ between ranks:
    each rank's least exponent among those its result block uses, the least of them agreed over the mesh (one
    small Allreduce of control traffic, for this kind of call only; in a dry run, where one rank runs for all,
    its own block's, a large one's zeros not looked at). While capturing (spmdsim.runtime.replay), that check is
    recorded as a kernel: each replay checks the exponent it is given again, on every rank alike."""
    base, exponent = xs
    cls = _common._DTENSOR
    block = exponent._local
    if type(args[1]) is not cls:  # a number: every rank's
        least = int(block.min()) if math.prod(base._shape) else 0
        if least < 0:
            raise _negative_power(base._local.dtype if type(args[0]) is cls else None, least, args[0])
        return
    what = f"a DTensor of {base._local.dtype.name}" if type(args[0]) is cls else describe(args[0])
    if mesh.engine.dry:  # one rank runs for all: its own block, unless a large one (zeros, not looked at)
        least = int(block.min()) if block.size and base._local.size and block.nbytes < DRY_ZEROS_BYTES else 0
        if least < 0:
            raise _negative_exponents(what, block.dtype, least)
        return

    if CAPTURE.on and replay.capturing():  # the values a replay is given are not the capture's: checked again
        replay.kernel(_least_exponent)(mesh.comm, block, base._local.size, what)
    else:
        _least_exponent(mesh.comm, block, base._local.size, what)


def _least_exponent(comm: Any, block: np.ndarray, base_size: int, what: str) -> None:
    """`_negative_powers`' check of a DTensor's exponent `block` (this rank's, beside a base block of
    `base_size` entries): the least entry over `comm`'s ranks, a negative one refused on every rank alike."""
    least = door.all_reduce_object(comm, int(block.min()) if block.size and base_size else 0, "min")
    if least < 0:
        raise _negative_exponents(what, block.dtype, least)


def _negative_exponents(what: str, dtype: np.dtype, least: int) -> OperatorError:
    """The refusal of `what` (a DTensor or a number, described) to the powers of a DTensor of integer `dtype`
    whose least entry is `least`, the same on every rank."""
    return OperatorError(f"pow: {what} to the powers of a DTensor of {dtype.name} whose entries include "
                         f"{least}: numpy refuses integers to negative integer powers; convert first, e.g. "
                         "exponent.astype('float64')")


def _negative_power(dtype: Any, exponent: int, base: Any = None) -> OperatorError:
    """The refusal of a DTensor of integer `dtype` (None: the number `base`) to the negative integer power
    `exponent`, the same on every rank."""
    what = f"a DTensor of {dtype.name}" if dtype is not None else describe(base)
    return OperatorError(f"pow: {what} to the negative integer power {exponent}: numpy refuses integers to "
                         f"negative integer powers; use a float exponent ({float(exponent)!r}) or convert x first, "
                         "e.g. x.astype('float64')")
