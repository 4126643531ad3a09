"""Issue 103, items 1-7: what a new user met from outside (tracebacks, unbounded work, a PASS on NaN, long
lines, an unproven choice, "1e+03 KiB"), each as the one-line answer or the bound it should be."""
from __future__ import annotations

import pytest

from spmdsim.base.sizes import format_size

KIB, MIB = 1024, 1024 ** 2


@pytest.mark.parametrize("n, shown", [(1000 * KIB, "0.977 MiB"), (1023 * KIB, "0.999 MiB"), (MIB - 1, "1 MiB"),
                                      (999 * KIB, "999 KiB"), (1536 * MIB, "1.5 GiB"),
                                      (5000 * 1024 ** 8, "5,000 YiB")])
def test_format_size_rounds_into_the_next_unit(n: int, shown: str) -> None:
    """1000-1023 KiB read "1e+03 KiB" (the 1T model's gradients in `spmdsim estimate`): never an exponent."""
    assert format_size(n) == shown
    assert "e+" not in format_size(n)
