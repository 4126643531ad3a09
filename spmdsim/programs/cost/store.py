"""Persistence: a `CostModel` as JSON, its default path, and the saved-or-default model.

Pure (standard library only; never imports mpi4py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, TypeVar

from ...errors import SpmdsimError
from ...base.validate import MAX_JSON_TEXT, loads_json, read_bounded
from .terms import OpParams

#: The model class `CostModel.from_dict` and `CostModel.load` pass in (spmdsim.programs.cost.model, which calls
#: this module); the functions that take a model read its fields and `to_dict`.
_Model = TypeVar("_Model")

__all__ = ["default_path", "model_to_dict", "model_from_dict", "save_model", "load_model"]

_FORMAT_VERSION = 1


def model_to_dict(model: Any) -> dict:
    """`CostModel.to_dict`: the JSON-ready form, tagged with the format version."""
    return {
        "version": _FORMAT_VERSION,
        "alpha_s": model.alpha_s,
        "beta_s_per_byte": model.beta_s_per_byte,
        "gamma_s_per_byte": model.gamma_s_per_byte,
        "algorithm": model.algorithm,
        "per_op": [{"op": p.op, "group_size": p.group_size, "alpha_s": p.alpha_s,
                    "beta_s_per_byte": p.beta_s_per_byte,
                    "gamma_s_per_byte": p.gamma_s_per_byte} for p in model.per_op],
        "source": model.source,
        "copy_s_per_byte": model.copy_s_per_byte,
    }


def model_from_dict(cls: type[_Model], data: Mapping[str, Any]) -> _Model:
    """`CostModel.from_dict`: a `cls` from `model_to_dict` output (or an early file's)."""
    if not isinstance(data, Mapping) or data.get("version") != _FORMAT_VERSION:
        if not isinstance(data, Mapping):
            what = f"is a JSON {type(data).__name__}, not an object"
        elif "version" not in data:
            what = "has no 'version'"
        else:
            what = f"has version {data['version']!r:.40}"
        raise SpmdsimError(f"cost model data {what}; expected a version {_FORMAT_VERSION} spmdsim cost model "
                           f"(spmdsim calibrate writes one)")
    try:
        raw = data.get("per_op", [])
        if isinstance(raw, Mapping):  # early files: {op: {alpha_s, ...}}
            raw = [dict(vals, op=op) for op, vals in raw.items()]
        per_op = tuple(OpParams(**dict(vals)) for vals in raw)
        return cls(float(data["alpha_s"]), float(data["beta_s_per_byte"]),
                   float(data.get("gamma_s_per_byte", 0.0)), str(data.get("algorithm", "ring")),
                   per_op, str(data.get("source", "")), float(data.get("copy_s_per_byte", 0.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpmdsimError(f"cost model data is malformed: {exc}") from None


def save_model(model: Any, path: str | os.PathLike | None = None) -> Path:
    """`CostModel.save`: write `model` as JSON (default `default_path()`); returns the path."""
    target = Path(path) if path is not None else default_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(model.to_dict(), indent=2) + "\n")
    tmp.replace(target)  # atomic: a reader never sees half a file
    return target


def load_model(cls: type[_Model], path: str | os.PathLike | None = None) -> _Model:
    """`CostModel.load`: read a saved model (default `default_path()`); raises if missing or malformed."""
    source = Path(path) if path is not None else default_path()
    try:
        text = read_bounded(source, MAX_JSON_TEXT, f"cost model {str(source)!r}", "a saved cost model")
    except OSError as exc:
        raise SpmdsimError(f"cannot read cost model {str(source)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpmdsimError(f"cost model {str(source)!r} is not text (UTF-8 JSON expected)") from None
    data = loads_json(text, f"cost model {str(source)!r}", "a saved cost model", "JSON")
    try:
        return cls.from_dict(data)
    except SpmdsimError as exc:  # the file's name first: which file to fix or remove
        raise SpmdsimError(f"cost model {str(source)!r}: {exc}".replace(": cost model data ", ": its data ")) from None


def default_path() -> Path:
    """$SPMDSIM_COST_FILE, else ~/.cache/spmdsim/cost.json (honours $XDG_CACHE_HOME)."""
    env = os.environ.get("SPMDSIM_COST_FILE")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "spmdsim" / "cost.json"
