"""A GPT checkpoint's files (spmdsim.models.gpt.checkpoint): their names, its metadata read and checked, the
optimizer's dict as JSON beside its arrays (bfloat16 as its 16 bits: no pickle), writing a file aside and renaming
it into place, and what a rank file's header must say (its rank, the step and world size of the checkpoint's
metadata). Shared by resuming on the same mesh (spmdsim.models.gpt.checkpoint) and on another
(spmdsim.models.gpt.reshard)."""
from __future__ import annotations

import glob
import json
import os
import re
import threading
from typing import Any, Optional

import numpy as np

from ...errors import SpmdsimError
from ...base.files import reason, write_aside as base_write_aside
from ...base.precision import bfloat16

__all__ = ["META", "FORMAT", "VERSION", "Arrays", "rank_file", "pending_file", "saved_file", "put_in_place",
           "remove_past", "reason", "encode", "decode", "write_aside", "header_problem", "read_meta"]

#: The metadata file rank 0 writes.
META = "checkpoint.json"

#: What its "format" and "version" say.
FORMAT, VERSION = "spmdsim GPT checkpoint", 1


#: numpy reads each array's header in an .npz with ast.literal_eval, and CPython 3.11 and 3.12 keep the AST
#: constructor's recursion depth per interpreter, not per thread: simulated ranks reading their files at once
#: fail now and then with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905; seen on
#: 3.11.7). One array read at a time in this process.
_READING = threading.Lock()


class Arrays:
    """A rank file opened for reading (np.load of its .npz, no pickle; a context manager): ``files``, and each
    array by its key, read whole, one read at a time in this process (`_READING`)."""

    def __init__(self, path: str) -> None:
        self._npz = np.load(path, allow_pickle=False)
        self.files = self._npz.files

    def __getitem__(self, key: str) -> np.ndarray:
        with _READING:
            return self._npz[key]

    def close(self) -> None:
        self._npz.close()

    def __enter__(self) -> "Arrays":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rank_file(directory: str, rank: int) -> str:
    """The path of rank `rank`'s file in `directory`."""
    return os.path.join(directory, f"rank-{rank:05d}.npz")


def pending_file(directory: str, rank: int, step: int) -> str:
    """Where a save of `step` writes rank `rank`'s file until the metadata names that step: a save that stops
    before leaves the checkpoint it would have replaced whole (checkpoint.save)."""
    return os.path.join(directory, f"rank-{rank:05d}.step-{step}.npz")


def saved_file(directory: str, rank: int, step: int) -> str:
    """Rank `rank`'s file of the checkpoint in `directory` whose metadata says `step`: its own (`rank_file`), or
    where a save that stopped between writing the metadata and renaming the files left it (`pending_file`)."""
    pending = pending_file(directory, rank, step)
    return pending if os.path.exists(pending) else rank_file(directory, rank)


def put_in_place(directory: str, rank: int, step: int) -> Optional[str]:
    """Rank `rank`'s file of `step`, written aside (`pending_file`), renamed onto its own, any other step's left
    aside by a save that stopped removed; None, or why not."""
    path = rank_file(directory, rank)
    try:
        os.replace(pending_file(directory, rank, step), path)
        for left in glob.glob(glob.escape(path[:-len(".npz")]) + ".step-*.npz"):
            os.remove(left)
    except OSError as e:
        return f"cannot write {path}: {reason(e)}"
    return None


#: A rank's file, in place or written aside (`rank_file`, `pending_file`): its rank.
_RANK_FILE = re.compile(r"rank-(\d{5,})(\.step-\d+)?\.npz")


def remove_past(directory: str, world: int) -> None:
    """Remove from `directory` the files of ranks at or past `world`: an earlier checkpoint's, saved on more ranks,
    that the one just written replaced (never read: a resume opens the files of the ranks its metadata counts).
    As far as it can: a file it cannot remove stays, unread."""
    for name in os.listdir(directory):
        found = _RANK_FILE.fullmatch(name)
        if found and int(found.group(1)) >= world:
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


def encode(value: Any, arrays: dict) -> Any:
    """`value` (an optimizer's state_dict) as JSON holds it, each array put into `arrays` and named there."""
    if isinstance(value, np.ndarray):
        key = f"optimizer.{len(arrays)}"
        name = value.dtype.name
        arrays[key] = value.view(np.uint16) if name == "bfloat16" else value
        return {"array": key, "dtype": name}
    if isinstance(value, dict):
        return {"dict": [[encode(k, arrays), encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [encode(v, arrays) for v in value]}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise SpmdsimError(f"checkpoint: cannot save {type(value).__name__} {value!r} of the optimizer's state")


def decode(value: Any, arrays: Any) -> Any:
    """What `encode` made of a value, back, its arrays read from `arrays` (an .npz's: each one read when named);
    `arrays` None leaves each array as its reference, {"array": name, "dtype": name}, unread."""
    if isinstance(value, dict):
        if "array" in value:
            if arrays is None:
                return value
            array = arrays[value["array"]]
            return array.view(bfloat16()) if value["dtype"] == "bfloat16" else array
        if "dict" in value:
            return {decode(k, arrays): decode(v, arrays) for k, v in value["dict"]}
        if "tuple" in value:
            return tuple(decode(v, arrays) for v in value["tuple"])
        return [decode(v, arrays) for v in value["list"]]
    return value


def write_aside(path: str, write: Any) -> Optional[str]:
    """`write(file)` into a file beside `path`, renamed onto it (spmdsim.base.files.write_aside: a link kept, its
    mode too): a reader never sees half a file. None, or why not (the file beside it then removed)."""
    why = base_write_aside(path, write)
    return why and f"cannot write {path}: {why}"


def header_problem(path: str, rank: int, header: dict, step: int, world: int) -> Optional[str]:
    """Why rank `rank`'s file at `path`, whose header is `header`, is not of the checkpoint whose metadata says
    `step` of `world` ranks, or None."""
    if header.get("rank") != rank:
        return f"rank {rank}'s file {path} holds rank {header.get('rank')!r}'s blocks (a file copied or renamed?)"
    if (header.get("step"), header.get("world size")) != (step, world):
        return (f"rank {rank}'s file {path} is of step {header.get('step')!r} of {header.get('world size')!r} "
                f"ranks, the checkpoint's {META} of step {step} of {world} ranks (a save that did not finish?)")
    return None


def read_meta(directory: str) -> tuple[Optional[dict], Optional[str]]:
    """(the metadata of the checkpoint in `directory`, None) or (None, why it cannot be read)."""
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        return None, f"--resume {directory}: {what} (expected a checkpoint directory that --save wrote)"
    path = os.path.join(directory, META)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None, f"--resume {directory}: no {META} in it (expected a checkpoint directory that --save wrote)"
    except ValueError as e:  # damaged: a save cut short, or an edit (UnicodeDecodeError is one too)
        return None, f"--resume {directory}: cannot read {META}: {reason(e)} (expected the JSON --save writes)"
    except OSError as e:
        return None, f"--resume {directory}: cannot read {META}: {reason(e)}"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        return None, (f"--resume {directory}: {META} is not a checkpoint of this version ({FORMAT!r}, version "
                      f"{VERSION})")
    step = meta.get("step")
    if type(step) is not int or step < 1:
        return None, f"--resume {directory}: {META} step {step!r} must be an integer >= 1"
    for key, (kind, what) in _FIELDS.items():  # what every --save wrote (checkpoint.run_meta)
        if not isinstance(meta.get(key), kind):
            found = repr(meta[key])[:40] if key in meta else "missing"
            return None, f"--resume {directory}: {META}'s {key!r} is {found}, expected {what} as --save writes it"
    return meta, None


#: The metadata every --save wrote (checkpoint.run_meta), each's type and how a refusal says it.
_FIELDS = {"world size": (int, "an integer"), "mesh": (dict, "an object"), "sequence parallelism": (bool, "a boolean"),
           "config": (dict, "an object"), "layouts": (dict, "an object"), "precision": (str, "a string"),
           "optimizer": (str, "a string")}
