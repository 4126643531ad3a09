"""FP8's tables of a resharded resume (spmdsim.models.gpt.reshard): each of the run's tables of amax histories and
scales (spmdsim.base.fp8.Scales: the one model's, or each pipeline chunk's) built by key from the saved tables.

A table's key names its layer on the whole model, whatever chunk casts it ("h3.attn.wq:w", "h3.mlp:x": layer 3's
on any stage), and a tensor's amax is agreed over every rank that casts it (the whole mesh without a pipeline, the
stage's mesh with one: the other stages hold none of its layer), so a layer's rows are the same in every table
that holds them. A resumed table takes, for each layer its chunk holds, that layer's rows (in the order a saved
table holds them) from the file of a saved rank that held the layer's parameters (`holders`: a pipeline's stage
saved only its own layers' keys); a layer whose rows that file lacks, a key that names no layer, or histories of
another length than the run's recipe keeps are said in one line (`tables`). No collective.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Union

import numpy as np

__all__ = ["layer_of", "holders", "tables"]

_LAYER = re.compile(r"h(\d+)\.")


def layer_of(key: str) -> Optional[int]:
    """The layer an FP8 key names ("h3.attn.wq:w": 3), or None."""
    found = _LAYER.match(key)
    return int(found.group(1)) if found else None


def holders(recorded: Any, layers: list) -> Union[dict, str]:
    """layer -> the saved ranks whose files hold its FP8 rows: those with a block of its parameters (a name
    "h<layer>." in `recorded`, the checkpoint's regions: None for a pipeline stage's rank that does not hold it),
    for each of `layers`; or why not."""
    out = {}
    for layer in layers:
        name = next((n for n in (recorded or {}) if n.startswith(f"h{layer}.")), None)
        blocks = (recorded[name] if isinstance(recorded[name], dict) else {}).get("blocks") if name else None
        out[layer] = [r for r, b in enumerate(blocks or ()) if b is not None]
        if not out[layer]:
            return f"the checkpoint records no rank that holds layer {layer}, whose FP8 scales this run needs"
    return out


def tables(opened: dict, given: dict, layers: list, history: int) -> Union[list, str]:
    """[(keys and formats, scales, histories)]: each of this run's tables (`layers`: the layers of each), each
    layer's rows from the saved rank `given[layer]` (`opened`: rank -> (its .npz, its header, ...)), in the order
    its tables hold them; or why not (`history`: the steps of amaxes this run's recipe keeps)."""
    rows: dict = {}  # saved rank -> layer -> [(key, format, scale, history)]
    out = []
    for held in layers:
        one = []
        for layer in held:
            r = given[layer]
            if r not in rows:
                rows[r] = _rows(r, *opened[r][:2], history)
                if isinstance(rows[r], str):
                    return rows[r]
            if not rows[r].get(layer):
                return (f"rank {r}'s file holds no FP8 scales of layer {layer} (keys h{layer}.*), which this run's "
                        "table needs")
            one += rows[r][layer]
        out.append(([[k, f] for k, f, _, _ in one], np.array([s for _, _, s, _ in one], np.float32).reshape(-1),
                    np.array([h for _, _, _, h in one], np.float32).reshape(len(one), history)))
    return out


def _rows(r: int, npz: Any, header: dict, history: int) -> Union[dict, str]:
    """layer -> [(key, format, scale, history)] of every table in saved rank `r`'s file (`npz`, `header`), in
    table and row order; or why not."""
    out: dict = {}
    for i, keys in enumerate(header.get("fp8", ())):
        scales, histories = np.asarray(npz[f"fp8.{i}.scales"]), np.asarray(npz[f"fp8.{i}.history"])
        if histories.ndim != 2 or histories.shape[1] != history:
            return (f"rank {r}'s file holds FP8 amax histories of shape {histories.shape}, this run's recipe "
                    f"keeps {history} steps of each key's")
        if scales.shape != (len(keys),) or histories.shape[0] != len(keys):
            return f"rank {r}'s file holds {len(keys)} FP8 keys with scales {scales.shape} and histories " \
                   f"{histories.shape}"
        for (key, fmt), scale, past in zip(keys, scales, histories):
            layer = layer_of(str(key))
            if layer is None:
                return f"rank {r}'s file holds the FP8 key {key!r}, which names no layer (h<n>.)"
            out.setdefault(layer, []).append((str(key), str(fmt), scale, past))
    return out
