"""Machine files: what one GPU of a cluster computes, holds and sends, read from a small JSON file.

Pure (standard library only). A file (docs/howto/add-machine-file.md) names the machine, cites its
sources, and gives per GPU: its memory, its peak FLOP/s per dtype, its memory (HBM) bandwidth,
the GEMM efficiency model, and per level ("node", "cluster") the link's bandwidth (bytes/s per
GPU per direction) and latency (s), with the collective algorithm. `load_machine("a100-dgx")`
reads a shipped file (spmdsim/tools/estimate/machines/), `load_machine(path)` any other; `machines()`
lists the shipped names. Every bad value is refused in one line naming the file, the key, the
value and what was expected; a figure in another unit (GB/s for bytes/s) too (spmdsim.tools.estimate.machine_units).

The GEMM efficiency model is the roofline of NVIDIA's "Matrix Multiplication Background User's
Guide" capped at a fraction of peak: a product of ``flops`` FLOPs that reads and writes
``nbytes = itemsize * batch * (m*k + k*n + m*n)`` bytes of memory (an "fp8" product: its operands a byte an
element, its bfloat16 result two, machine_records.RESULT_BYTES) achieves

    efficiency = min(max_fraction, (flops / nbytes) * hbm_bandwidth / peak_flops[dtype])

of the dtype's peak, so it takes ``max(flops / (max_fraction * peak), nbytes / hbm_bandwidth)``
seconds: large products run at ``max_fraction`` of peak, products with a small dimension are
bound by memory bandwidth. An optional ``"waves": {"sms": N, "tile": [rows, cols], "source": ...}``
multiplies ``max_fraction`` by the share of its waves' tile slots a product's output fills
(`machine_records.Waves`: the guide's tile and wave quantization). Model ``"shape"`` is the same and also
caps a batched product (the attention core's scores and context) at what products of its smallest dimension
were measured to achieve: ``"batched": {"dtypes": [...], "contraction": [[dim, fraction], ...], "output":
[[dim, fraction], ...], "source": ...}``, interpolated, and scales a single product's cap by the shape of a
measured curve of its contraction length: ``"unbatched": {"dtypes": [...], "contraction": [[k, fraction],
...], "source": ...}`` (spmdsim.tools.estimate.gemm_shapes); it has one table or both.

Two optional achieved fractions, each an object ``{"fraction": f, "source": "..."}``:
``hbm_efficiency`` (the share of ``hbm_bandwidth`` a memory-bound kernel reaches: the element-wise
kernels and the optimizer's update are priced at ``hbm_bandwidth * fraction``) and a link's
``efficiency`` (its bus bandwidth as a collective achieves it: ``bandwidth * fraction``). Absent: 1.

An optional ``"attention_efficiency": {"forward": f, "backward": f, "source": "..."}``: the fraction of
peak a fused (flash) attention kernel reaches on the FLOPs it executes (a causal core's half), as the
kernel's published benchmarks measure it; the products the program runs inside that kernel
(spmdsim.nn.ops.flash, spmdsim.nn.ops.ring_attention) are priced at it, their score tiles never HBM
traffic. Absent: those products priced by the GEMM model like any other.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ...base.validate import MAX_JSON_TEXT, read_bounded
from ...errors import SpmdsimError
from .gemm_shapes import batched_from_dict, batched_to_dict, unbatched_from_dict, unbatched_to_dict
from .file_keys import _no_other_keys
from .machine_records import (_MISSING, ALGORITHMS, DTYPES, Achieved, AttentionEfficiency, GemmEfficiency, Link,
                              Machine, Waves, _achieved, _check_efficiency, _check_fields, _fail, _number, _text)
from .machine_units import check_units
from .records import LEVELS

__all__ = ["load_machine", "machines", "machine_from_dict", "machine_to_dict", "save_machine", "precision_peak_refusal"]

#: Format tag every machine file carries.
FORMAT = "spmdsim machine 1"


_SHIPPED = Path(__file__).resolve().parent / "machines"
_KEYS = ("format", "name", "description", "sources", "gpus_per_node", "memory_bytes", "peak_flops",
         "hbm_bandwidth", "hbm_efficiency", "gemm_efficiency", "attention_efficiency", "links", "algorithm",
         "reduction_rate")
_OPTIONAL = ("reduction_rate", "hbm_efficiency", "attention_efficiency")


def machine_from_dict(data: Any, where: str = "machine data") -> Machine:
    """A `Machine` from a machine file's JSON object; `where` (the file) starts every error."""
    if not isinstance(data, Mapping):
        raise SpmdsimError(f"{where}: is a JSON {type(data).__name__}; expected an object (a machine file)")
    _no_other_keys(where, "", data, _KEYS)
    for key in _KEYS:
        if key not in data and key not in _OPTIONAL:
            raise _fail(where, key, _MISSING, _WHAT[key])
    if data["format"] != FORMAT:
        raise _fail(where, "format", data["format"], repr(FORMAT))
    _text(where, "name", data["name"])
    data = _whole_bytes(data)
    fields = {key: data.get(key) for key in _KEYS}
    _check_fields(where, fields)
    eff = data["gemm_efficiency"]
    if not isinstance(eff, Mapping):
        raise _fail(where, "gemm_efficiency", eff, _WHAT["gemm_efficiency"])
    for key in ("model", "max_fraction", "source"):
        if key not in eff:
            raise _fail(where, f"gemm_efficiency.{key}", _MISSING, "present (see docs/howto/add-machine-file.md)")
    _no_other_keys(where, "gemm_efficiency", eff, _GEMM_KEYS)
    _check_efficiency(where, "gemm_efficiency.", eff["model"], eff["max_fraction"], eff["source"])
    waves = None if eff.get("waves") is None else _waves(where, eff["waves"])
    dtypes = _gemm_dtypes(where, eff.get("dtypes", {}))
    batched, unbatched = _tables(where, eff)
    links = data["links"]
    if not isinstance(links, Mapping):
        raise _fail(where, "links", links, _WHAT["links"])
    for level in links:
        if level not in LEVELS:
            raise _fail(where, f"links.{level}", links[level], f"a level among {LEVELS!r}")
    made = {}
    for level in LEVELS:
        link = links.get(level, _MISSING)
        if not isinstance(link, Mapping):
            raise _fail(where, f"links.{level}", link, "an object with 'bandwidth' and 'latency'")
        _no_other_keys(where, f"links.{level}", link, ("bandwidth", "latency", "efficiency"))
        bandwidth = _number(where, f"links.{level}.bandwidth", link.get("bandwidth", _MISSING),
                            "a number > 0 (bytes/s per GPU per direction)")
        latency = _number(where, f"links.{level}.latency", link.get("latency", _MISSING),
                          "a number >= 0 (seconds)", positive=False)
        efficiency = link.get("efficiency")
        made[level] = Link(bandwidth, latency,
                           None if efficiency is None else _achieved(where, f"links.{level}.efficiency", efficiency))
    check_units(where, data)
    rate = data.get("reduction_rate")
    hbm = data.get("hbm_efficiency")
    attention = data.get("attention_efficiency")
    return Machine(name=data["name"], description=data["description"], sources=tuple(data["sources"]),
                   gpus_per_node=data["gpus_per_node"], memory_bytes=data["memory_bytes"],
                   peak_flops=tuple((d, float(v)) for d, v in data["peak_flops"].items()),
                   hbm_bandwidth=float(data["hbm_bandwidth"]),
                   gemm_efficiency=GemmEfficiency(float(eff["max_fraction"]), eff["source"], eff["model"], waves,
                                                  dtypes, batched, unbatched),
                   node=made["node"], cluster=made["cluster"], algorithm=data["algorithm"],
                   reduction_rate=None if rate is None else float(rate),
                   hbm_efficiency=None if hbm is None else _achieved(where, "hbm_efficiency", hbm),
                   attention_efficiency=None if attention is None else _attention(where, attention))


def _whole_bytes(data: Mapping) -> Mapping:
    """`data` with a whole ``memory_bytes`` written as a float (JSON's ``80e9``) made an integer."""
    value = data.get("memory_bytes")
    if isinstance(value, float) and value.is_integer():
        return {**data, "memory_bytes": int(value)}
    return data


#: The keys of a machine file's gemm_efficiency ("waves" and "dtypes" optional, "batched" and "unbatched" with
#: model "shape").
_GEMM_KEYS = ("model", "max_fraction", "source", "waves", "dtypes", "batched", "unbatched")


def _tables(where: str, eff: Mapping) -> tuple:
    """gemm_efficiency.batched and .unbatched: the measured tables model "shape" reads, one or both
    (spmdsim.tools.estimate.gemm_shapes), which model "roofline" has none of."""
    for key in ("batched", "unbatched"):
        if key in eff and eff["model"] != "shape":
            raise _fail(where, f"gemm_efficiency.{key}", eff[key], "no such key with model 'roofline' (model "
                        "'shape' reads it)")
    if eff["model"] == "shape" and "batched" not in eff and "unbatched" not in eff:
        raise _fail(where, "gemm_efficiency.batched", _MISSING, "present with model 'shape', or 'unbatched' (its "
                    "measured tables, docs/howto/add-machine-file.md)")
    batched = batched_from_dict(where, eff["batched"], tuple(DTYPES)) if "batched" in eff else None
    unbatched = unbatched_from_dict(where, eff["unbatched"], tuple(DTYPES)) if "unbatched" in eff else None
    return batched, unbatched


def _gemm_dtypes(where: str, data: Any) -> tuple:
    """gemm_efficiency.dtypes: {"fp8": {"fraction": f, "source": "..."}, ...}, each dtype's own cap."""
    if not isinstance(data, Mapping):
        raise _fail(where, "gemm_efficiency.dtypes", data, "an object of {'fraction', 'source'} per dtype")
    for dtype, value in data.items():
        if dtype not in DTYPES:
            raise _fail(where, f"gemm_efficiency.dtypes.{dtype}", value, f"a dtype among {tuple(DTYPES)!r}")
    return tuple((dtype, _achieved(where, f"gemm_efficiency.dtypes.{dtype}", value)) for dtype, value in data.items())


def _waves(where: str, data: Any) -> Waves:
    """gemm_efficiency.waves: {"sms": N, "tile": [rows, cols], "source": "..."}."""
    what = "an object with 'sms', 'tile' and 'source'"
    _no_other_keys(where, "gemm_efficiency.waves", data, ("sms", "tile", "source"))
    if not isinstance(data, Mapping) or set(data) != {"sms", "tile", "source"}:
        raise _fail(where, "gemm_efficiency.waves", data, what)
    sms, tile = data["sms"], data["tile"]
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
        raise _fail(where, "gemm_efficiency.waves.sms", sms, "an integer >= 1 (the GPU's streaming multiprocessors)")
    if not (isinstance(tile, list) and len(tile) == 2 and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in tile)):
        raise _fail(where, "gemm_efficiency.waves.tile", tile, "a list of two integers >= 1 (rows, columns)")
    _text(where, "gemm_efficiency.waves.source", data["source"])
    return Waves(sms, (tile[0], tile[1]), data["source"])


def _attention(where: str, data: Any) -> AttentionEfficiency:
    """attention_efficiency: {"forward": f, "backward": f, "source": "..."}."""
    _no_other_keys(where, "attention_efficiency", data, ("forward", "backward", "source"))
    if not isinstance(data, Mapping) or set(data) != {"forward", "backward", "source"}:
        raise _fail(where, "attention_efficiency", data, "an object with 'forward', 'backward' and 'source'")
    for key in ("forward", "backward"):
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise _fail(where, f"attention_efficiency.{key}", value, "a number in (0, 1] (fraction of peak)")
    _text(where, "attention_efficiency.source", data["source"])
    return AttentionEfficiency(float(data["forward"]), float(data["backward"]), data["source"])


_WHAT = {
    "format": repr(FORMAT), "name": "a non-empty string", "description": "a non-empty string",
    "sources": "a non-empty list of citation strings", "gpus_per_node": "an integer >= 1",
    "memory_bytes": "an integer >= 1 (bytes per GPU)", "peak_flops": "an object of FLOP/s per dtype",
    "hbm_bandwidth": "a number > 0 (bytes/s)",
    "gemm_efficiency": "an object with 'model', 'max_fraction' and 'source'",
    "links": f"an object with one link per level {LEVELS!r}", "algorithm": f"one of {ALGORITHMS!r}",
}


def machine_to_dict(machine: Machine) -> dict:
    """The JSON object of a machine file (`machine_from_dict` reads it back equal)."""
    out = {"format": FORMAT, "name": machine.name, "description": machine.description,
           "sources": list(machine.sources), "gpus_per_node": machine.gpus_per_node,
           "memory_bytes": machine.memory_bytes, "peak_flops": dict(machine.peak_flops),
           "hbm_bandwidth": machine.hbm_bandwidth,
           "gemm_efficiency": {"model": machine.gemm_efficiency.model,
                               "max_fraction": machine.gemm_efficiency.max_fraction,
                               "source": machine.gemm_efficiency.source},
           "links": {level: _link_dict(machine.link(level)) for level in LEVELS},
           "algorithm": machine.algorithm}
    if machine.gemm_efficiency.dtypes:
        out["gemm_efficiency"]["dtypes"] = {d: _achieved_dict(a) for d, a in machine.gemm_efficiency.dtypes}
    if machine.gemm_efficiency.batched is not None:
        out["gemm_efficiency"]["batched"] = batched_to_dict(machine.gemm_efficiency.batched)
    if machine.gemm_efficiency.unbatched is not None:
        out["gemm_efficiency"]["unbatched"] = unbatched_to_dict(machine.gemm_efficiency.unbatched)
    waves = machine.gemm_efficiency.waves
    if waves is not None:
        out["gemm_efficiency"]["waves"] = {"sms": waves.sms, "tile": list(waves.tile), "source": waves.source}
    if machine.hbm_efficiency is not None:
        out["hbm_efficiency"] = _achieved_dict(machine.hbm_efficiency)
    if machine.attention_efficiency is not None:
        a = machine.attention_efficiency
        out["attention_efficiency"] = {"forward": a.forward, "backward": a.backward, "source": a.source}
    if machine.reduction_rate is not None:
        out["reduction_rate"] = machine.reduction_rate
    return out


def _achieved_dict(a: Achieved) -> dict:
    return {"fraction": a.fraction, "source": a.source}


def _link_dict(link: Link) -> dict:
    out: dict = {"bandwidth": link.bandwidth, "latency": link.latency}
    if link.efficiency is not None:
        out["efficiency"] = _achieved_dict(link.efficiency)
    return out


def save_machine(machine: Machine, path: str | os.PathLike) -> Path:
    """Write `machine` as a machine file at `path` (atomically); returns the path."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(machine_to_dict(machine), indent=2) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target


def machines() -> tuple[str, ...]:
    """Names of the shipped machine files, sorted."""
    return tuple(sorted(p.stem for p in _SHIPPED.glob("*.json")))


def precision_peak_refusal(machine: Machine, precision: str, dtypes: tuple[str, ...],
                           others: tuple[str, ...]) -> None:
    """SpmdsimError, before any dry run, where `machine`'s file gives no peak for one of `dtypes`, those
    `--precision precision` prices the products at (`spmdsim estimate` and `spmdsim autoshard` alike): its line names
    the precisions among `others` the file does price (a V100's file has fp16 but no bf16, the default's)."""
    missing = [d for d in dtypes if d not in machine.dtypes]
    if not missing:
        return
    if missing[0] == "fp8":
        instead = "give a machine whose file has one, such as h100-dgx"
    else:
        instead = (f"give --precision {' or '.join(others)}, or a machine whose file has one" if others else
                   "give a machine whose file has one")
    raise SpmdsimError(f"--precision {precision}: machine {machine.name!r} has no {missing[0]} peak (peak_flops "
                       f"gives {', '.join(machine.dtypes)}); {instead}")


class _Twice(Exception):
    """A key an object of the file gives twice: (key, the first value, the second)."""


def _once_each(pairs: list) -> dict:
    """json's object_pairs_hook: the object, or _Twice where a key comes again."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key, out[key], value)
        out[key] = value
    return out


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def load_machine(name_or_path: str | os.PathLike) -> Machine:
    """A shipped machine by name (`machines()`), else the machine file at a path."""
    text = os.fspath(name_or_path)
    shipped = _SHIPPED / f"{text}.json"
    if not text:  # Path("") is ".", a directory: it would be read as "machine file '.'"
        raise SpmdsimError(f"machine name is empty; expected one of {machines()!r} or a path to a machine file")
    if text in machines():
        path = shipped
    elif os.sep in text or text.endswith(".json") or Path(text).exists():
        path = Path(text)
    else:
        raise SpmdsimError(f"machine {text!r} is neither a shipped machine nor a file; "
                           f"expected one of {machines()!r} or a path to a machine file")
    where = f"machine file {str(path)!r}"
    try:
        raw = read_bounded(path, MAX_JSON_TEXT, f"{where}:", "a JSON machine file")
    except OSError as exc:
        raise SpmdsimError(f"{where}: cannot be read ({exc.strerror or exc}); expected a machine file") from None
    except UnicodeDecodeError:
        raise SpmdsimError(f"{where}: is not UTF-8 text; expected a JSON machine file") from None
    if not raw.strip():
        raise SpmdsimError(f"{where}: is empty; expected a JSON machine file")
    try:
        data = json.loads(raw, object_pairs_hook=_once_each)
    except _Twice as exc:  # a copied file edited by adding a line and keeping the old one: JSON keeps the last
        key, first, then = exc.args
        raise SpmdsimError(f"{where}: key {key!r} is given twice in one object ({_shown(first)}, then "
                           f"{_shown(then)}); expected each key once (JSON would keep the last silently)") from None
    except json.JSONDecodeError as exc:
        raise SpmdsimError(f"{where}: is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "expected a JSON machine file") from None
    except RecursionError:  # the parser recurses per bracket (spmdsim.base.validate.loads_json's case too)
        raise SpmdsimError(f"{where}: nests too deeply; expected a JSON machine file") from None
    if isinstance(data, dict) and "beta_s_per_byte" in data and "format" not in data:
        # (else its first key would be refused: "key 'version' is 1; expected no such key")
        raise SpmdsimError(f"{where}: is a cost model (spmdsim calibrate --output's alpha_s, beta_s_per_byte), not "
                           "a machine file; expected the file spmdsim calibrate --machine-out PATH writes")
    return machine_from_dict(data, where)
