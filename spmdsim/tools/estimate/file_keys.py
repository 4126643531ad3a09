"""How a machine file's bad keys are refused (pure): one line naming the key, its value and what was expected.

Shared by the machine file's records (spmdsim.tools.estimate.machine_records, spmdsim.tools.estimate.machine)
and its table of batched products (spmdsim.tools.estimate.gemm_shapes).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...base.suggest import did_you_mean
from ...errors import SpmdsimError

__all__: list = []  # helpers of the estimate's machine-file modules

#: A key the file leaves out, as `_fail` shows it ("is missing").
_MISSING = object()


def _fail(where: str, key: str, value: Any, expected: str) -> SpmdsimError:
    shown = "missing" if value is _MISSING else repr(value)
    if len(shown) > 80:  # a whole object's text, cut where a reader sees it is cut (not mid-entry, unmarked)
        shown = f"{shown[:77]}..."
    return SpmdsimError(f"{where}: key {key!r} is {shown}; expected {expected}")


def _text(where: str, key: str, value: Any, expected: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, key, value, expected)
    return value


def _unknown(where: str, prefix: str, key: Any, value: Any, keys: Sequence[str]) -> SpmdsimError:
    """A key the object at `prefix` ("" the file itself) does not have: the keys it has, at every depth alike,
    and the likeliest meant (``links.node.bandwith``: 'bandwidth')."""
    hint = did_you_mean(key, keys) if isinstance(key, str) else ""
    whose = f"a machine file's {prefix}" if prefix else "a machine file"
    return _fail(where, f"{prefix}.{key}" if prefix else key, value,
                 f"no such key{f' ({hint})' if hint else ''}; {whose} has {tuple(keys)!r}")


def _no_other_keys(where: str, prefix: str, data: Any, keys: Sequence[str]) -> None:
    """Refuse a key the object at `prefix` ("" the file itself) does not have, as every level refuses one (an
    object that is no mapping is left to its caller's own refusal)."""
    for key in data if isinstance(data, Mapping) else ():
        if key not in keys:
            raise _unknown(where, prefix, key, data[key], keys)
