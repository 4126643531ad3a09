"""Whether a machine file's figures are in its units (pure): a value that is right in another unit is refused.

A machine file gives bytes, bytes/s, FLOP/s and seconds. A figure copied from a datasheet in GB/s, TFLOP/s,
GB or microseconds (``"bandwidth": 300``, ``"peak_flops": {"bf16": 312}``, ``"latency": 2``) is a number the
file's own checks accept, and its step time comes out at hours or years. Each unit-bearing key has a range no
device of any kind falls outside (a laptop's CPU to a rack-scale GPU, a gigabit Ethernet port to NVLink), and
a value outside it is refused naming the unit it was probably written in:
``key 'links.node.bandwidth' is 300; expected bytes/s per GPU per direction, from 1e6 to 1e14 (if 300 means
GB/s, write 300e9)``. A dtype's peak more times another's than a dense peak is (fp8 at most twice bf16's) is
refused as a datasheet's figure with sparsity, twice the dense one.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .file_keys import _fail

__all__ = ["check_units", "quoted_hint", "UNIT_RANGES"]


#: Per unit-bearing key: (what it is, the lowest and highest plausible value, a typical value, the unit's
#: name). The typical value picks the prefix a value outside the range was probably written with.
UNIT_RANGES = {
    "memory_bytes": ("bytes per GPU", 1e5, 1e15, 8e10, "B"),
    "peak_flops": ("FLOP/s", 1e8, 1e17, 1e14, "FLOP/s"),
    "hbm_bandwidth": ("bytes/s", 1e8, 1e15, 2e12, "B/s"),
    "reduction_rate": ("bytes/s reduced", 1e6, 1e15, 1e12, "B/s"),
    "bandwidth": ("bytes/s per GPU per direction", 1e6, 1e14, 1e11, "B/s"),
    "latency": ("seconds per message", 0.0, 0.1, 5e-6, "s"),
}

#: The most one dtype's dense peak is of another's, (dtype, other, at most): FP8 products run at twice the bf16 and
#: fp16 rate and tf32 at half of it on the GPUs the shipped files cite (A100, H100) and on AMD's MI300X. A datasheet's
#: figure "with sparsity" (2:4 structured sparsity, which training's products do not have) is twice the dense one:
#: an H100 SXM's fp8 3,958 TFLOP/s against its dense bf16 989 is four times, and would price FP8 products at twice
#: their rate (an MFU above 100%). The ratios hold to the datasheets' rounding (the H100's fp8 1,979 is 2.001 times
#: its bf16 989): `_ROUNDING` allows for it.
_DENSE_MOST = (("fp8", "bf16", 2.0), ("fp8", "fp16", 2.0), ("tf32", "bf16", 0.5), ("tf32", "fp16", 0.5))
_ROUNDING = 1.01

_PREFIXES = {3: "k", 6: "M", 9: "G", 12: "T", 15: "P"}
_SMALL = {-3: "milliseconds", -6: "microseconds", -9: "nanoseconds"}


def check_units(where: str, data: Mapping[str, Any]) -> None:
    """Refuse the first unit-bearing value of a machine file's object `data` (already checked for type and
    sign) that lies outside its key's `UNIT_RANGES`, in one line naming the file, the key and the unit."""
    _in_range(where, "memory_bytes", "memory_bytes", data["memory_bytes"])
    for dtype, value in data["peak_flops"].items():
        _in_range(where, f"peak_flops.{dtype}", "peak_flops", value)
    _in_range(where, "hbm_bandwidth", "hbm_bandwidth", data["hbm_bandwidth"])
    if data.get("reduction_rate") is not None:
        _in_range(where, "reduction_rate", "reduction_rate", data["reduction_rate"])
    for level, link in data["links"].items():
        for key in ("bandwidth", "latency"):
            _in_range(where, f"links.{level}.{key}", key, link[key])
    _dense(where, data["peak_flops"])


def _dense(where: str, peaks: Mapping[str, float]) -> None:
    """Refuse a dtype's peak above `_DENSE_MOST`'s times another's: a figure with sparsity, twice the dense one."""
    for dtype, other, most in _DENSE_MOST:
        value = peaks.get(dtype)
        if value is None or other not in peaks or value <= most * peaks[other] * _ROUNDING:
            continue
        raise _fail(where, f"peak_flops.{dtype}", value,
                    f"a dense peak, at most {most:g} times peak_flops.{other} ({_written(peaks[other], 0)}); "
                    f"{_written(value, 0)} looks like a figure with sparsity, twice the dense one (write "
                    f"{_written(value / 2, 0)})")


def _in_range(where: str, key: str, kind: str, value: float) -> None:
    what, low, high, _, _ = UNIT_RANGES[kind]
    if low <= value <= high:
        return
    hint = _meant(kind, value)
    raise _fail(where, key, value, f"{what}, from {_short(low)} to {_short(high)}" + (f" ({hint})" if hint else ""))


def _meant(kind: str, value: float) -> str:
    """"if 300 means GB/s, write 300e9": the power of 1000 that brings `value` into range, nearest the typical
    value; empty where none does or the value is 0."""
    _, low, high, typical, unit = UNIT_RANGES[kind]
    if value <= 0:
        return ""
    fits = [e for e in range(-15, 16, 3) if e and low <= value * 10.0 ** e <= high]
    if not fits:
        return ""
    exp = min(fits, key=lambda e: abs(math.log10(value * 10.0 ** e / typical)))
    name = f"{_PREFIXES[exp]}{unit}" if exp in _PREFIXES else _SMALL.get(exp) if unit == "s" else None
    if name is None:
        return ""
    return f"if {value:g} means {name}, write {value:g}e{exp}"


#: A figure written as text with its unit: "80GB", "80 GiB", "2 us", "400 Gb/s", "989 TFLOP/s".
_QUOTED = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKMGTP]?)(i?)([a-zA-Zµ/]*)\s*$")
_DECIMAL = {"": 0, "K": 3, **{prefix: exp for exp, prefix in _PREFIXES.items()}}  # prefix -> power of 10
_TIMES = {"ms": -3, "us": -6, "µs": -6, "ns": -9}


def quoted_hint(value: str) -> str:
    """"a JSON number without quotes (if '80GB' means 80 GB, write 80e9)": what a figure a machine file gives as
    text reads as in its unit (a "Gb/s" in bits as bytes/s, a binary "GiB" as its bytes), or that hint alone."""
    found = _QUOTED.match(value)
    plain = "a JSON number without quotes"
    if not found:
        return plain
    digits, prefix, binary, unit = found.groups()
    if not prefix and not unit:
        return f"{plain} (write {digits})"
    if binary:
        whole = float(digits) * 1024 ** (_DECIMAL[prefix] // 3)
        return f"{plain} (if {value!r} means {digits} {prefix}i{unit or 'B'}, write {whole:.0f})"
    if unit in _TIMES and not prefix:
        return f"{plain} (if {value!r} means {digits} {unit}, write {_written(float(digits), _TIMES[unit])})"
    exp = _DECIMAL[prefix]
    if unit in ("b/s", "bps", "bit/s", "bits/s"):  # bits, as a NIC's 400 Gb/s: an eighth of as many bytes
        return (f"{plain} (if {value!r} means {digits} {prefix}bit/s, write "
                f"{_written(float(digits) / 8, exp)} bytes/s)")
    return f"{plain} (if {value!r} means {digits} {prefix}{unit}, write {_written(float(digits), exp)})"


def _written(number: float, exp: int) -> str:
    """number x 10**exp as a file would write it: 50e9 for (50, 9), 12.5e9 for (0.0125, 12), 5e-06 for (5e-6, 0)."""
    value = number * 10.0 ** exp
    if value <= 0 or not math.isfinite(value):
        return f"{value:g}"
    three = 3 * math.floor(math.log10(value) / 3)
    return f"{round(value / 10.0 ** three, 9):g}e{three}" if three else f"{value:g}"


def _short(bound: float) -> str:
    """1e8, 0.1, 0: a range's end as a file would write it."""
    if bound == 0 or 1e-3 <= bound < 1e3:
        return f"{bound:g}"
    return f"1e{round(math.log10(bound))}"
