"""Character-level text for the GPT: Python's standard library sources, the same on every machine.

The text is fifteen modules' sources (`MODULES`) as CPython 3.11.7 ships them, kept beside this
file (stdlib_text.zlib, 83 KiB; their license: stdlib_text_LICENSE.txt, the PSF License): each
Python version's own sources differ, so reading the running interpreter's would give another
text, other batches and other losses on every version, and the figures the docs quote would
hold on one Python only. `load_text(stdlib=folder)` reads the modules from a folder instead.

Token ids are byte values (vocab 128): bytes >= 128 become b"?". A batch is B windows of
T + 1 bytes whose starts come from a generator seeded by (cfg.seed, step): pure and
deterministic, the same on every rank.
"""
from __future__ import annotations

import os
import zlib
from typing import Any, Optional

import numpy as np

from ...errors import SpmdsimError
from ...base.validate import as_int
from .config import GPTConfig

__all__ = ["MODULES", "SHIPPED_TEXT", "SHIPPED_CHARS", "load_text", "encode", "decode", "show_sample", "batch",
           "text_problem", "MAX_SAMPLE", "sample_problem", "next_id", "logits_finite", "NOT_FINITE"]

#: The most characters a ``--sample`` flag draws (each one a forward pass, with nothing printed until the last).
MAX_SAMPLE = 2_000


def sample_problem(sample: Optional[int]) -> Optional[str]:
    """Why a ``--sample`` flag's value cannot be drawn (one line, naming the flag), or None (None: not given)."""
    if sample is not None and not 0 <= sample <= MAX_SAMPLE:
        return (f"--sample {sample:,} must be an integer from 0 to {MAX_SAMPLE:,} (characters to generate, each "
                "a forward pass of the model; 0: none)")
    return None


#: The standard library files read, in this order (missing ones are skipped).
MODULES = tuple(sorted(("bisect.py", "colorsys.py", "copy.py", "difflib.py", "fnmatch.py", "fractions.py",
                        "glob.py", "heapq.py", "queue.py", "random.py", "sched.py", "shlex.py",
                        "statistics.py", "string.py", "textwrap.py")))


def load_text(max_chars: int = 200_000, stdlib: Optional[str] = None) -> bytes:
    """The first `max_chars` ASCII bytes of the MODULES' sources, concatenated.

    Args:
        max_chars: at most this many bytes (>= 1; the shipped text has SHIPPED_CHARS).
        stdlib: a folder to read the modules from (a standard library's, ``sysconfig.get_paths()["stdlib"]``
            for this interpreter's own); default the text shipped with spmdsim (CPython 3.11.7's).
    """
    n = as_int(max_chars)
    if n is None or n < 1:
        raise SpmdsimError(f"max_chars {max_chars!r} must be an integer >= 1")
    if stdlib is None:
        return _shipped()[:n]
    parts, total = [], 0
    for name in MODULES:
        path = os.path.join(stdlib, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            parts.append(f.read(n - total))
        total += len(parts[-1])
        if total >= n:
            break
    if not total:
        raise SpmdsimError(f"no standard library sources found in {stdlib!r} (looked for {', '.join(MODULES)})")
    raw = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    raw[raw >= 128] = ord("?")
    return raw.tobytes()


#: The shipped text: its file, its length in bytes and its CRC-32 (checked when it is read).
SHIPPED_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdlib_text.zlib")
SHIPPED_CHARS, SHIPPED_CRC32 = 308_276, 1_283_960_579
_SHIPPED: list = []  # the text, once read


def _shipped() -> bytes:
    """The shipped text (read and checked once)."""
    if not _SHIPPED:
        try:
            with open(SHIPPED_TEXT, "rb") as f:
                text = zlib.decompress(f.read())
        except (OSError, zlib.error) as exc:
            raise SpmdsimError(f"the GPT's text {SHIPPED_TEXT!r} cannot be read ({exc}); reinstall spmdsim, or "
                               "pass load_text(stdlib=folder) to read the modules from a folder") from None
        crc = zlib.crc32(text)
        if len(text) != SHIPPED_CHARS or crc != SHIPPED_CRC32:
            raise SpmdsimError(f"the GPT's text {SHIPPED_TEXT!r} is not the one spmdsim shipped ({len(text):,} "
                               f"bytes, CRC-32 {crc}; expected {SHIPPED_CHARS:,} and "
                               f"{SHIPPED_CRC32}); reinstall spmdsim")
        _SHIPPED.append(text)
    return _SHIPPED[0]


def encode(text: bytes) -> np.ndarray:
    """Token ids (int64) of ASCII bytes; a str is encoded as ASCII with "?" for the rest."""
    if isinstance(text, str):
        text = text.encode("ascii", errors="replace")
    if not isinstance(text, (bytes, bytearray)):
        raise SpmdsimError(f"text {type(text).__name__} must be bytes or str")
    ids = np.frombuffer(bytes(text), dtype=np.uint8).astype(np.int64)
    ids[ids >= 128] = ord("?")
    return ids


def decode(ids: Any) -> str:
    """Text of token ids; ids that are not printable ASCII (or newline, tab) show as "?"."""
    arr = np.asarray(ids, dtype=np.int64).ravel()
    printable = ((arr >= 32) & (arr < 127)) | (arr == 10) | (arr == 9)
    return np.where(printable, arr, ord("?")).astype(np.uint8).tobytes().decode("ascii")


#: A sample's refusal where the logits are not finite (`next_id`; a greedy one's: spmdsim.models.gpt.parallel's).
NOT_FINITE = "generate: the next token's logits are not finite (the parameters diverged in training)"


def next_id(rng: Any, logits: np.ndarray, temperature: float) -> int:
    """The id drawn from the last position's `logits` (one per id): their argmax at temperature 0, else drawn by
    `rng` from softmax(logits / temperature); one line where they are not finite (the parameters diverged:
    numpy's choice raised "Probabilities contain NaN" with its traceback), or the temperature makes them so."""
    with np.errstate(over="ignore"):
        z = logits if temperature == 0 else logits / temperature
    if not np.isfinite(z).all():
        raise SpmdsimError(NOT_FINITE if not np.isfinite(logits).all() else f"generate: temperature {temperature!r} "
                           f"takes the logits (up to {np.abs(logits).max():.3g}) past float range; "
                           "expected a larger one")
    if temperature == 0:
        return int(np.argmax(z))
    p = np.exp(z - z.max())
    return int(rng.choice(z.size, p=p / p.sum()))


def logits_finite(block: np.ndarray) -> bool:
    """Whether a block of logits holds no NaN and no +inf (-inf: a masked entry, a padded vocabulary's)."""
    return not (np.isnan(block).any() or (block == np.inf).any())


def show_sample(prompt: bytes, sample: np.ndarray) -> None:
    """Print `prompt` and the characters drawn after it, each line cut into lines of at most 100 columns."""
    for line in decode(np.concatenate([encode(prompt), sample])).splitlines():
        print("\n".join(line[i:i + 100] for i in range(0, max(len(line), 1), 100)))


def text_problem(text_ids: Any, cfg: GPTConfig) -> Optional[str]:
    """Why the GPT `cfg` cannot train on `text_ids` (one line, alike on every rank: they share the text), or
    None: an id outside the vocabulary, or a sequence longer than the text holds (with its next-token targets: the
    text's length less 2), found before the first step rather than at the step that draws it."""
    ids = np.asarray(text_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or not ids.size:
        return None  # `batch` names these
    if ids.size < cfg.seq + 2:  # (the value as typed: a flag's "--seq 199998", not "199,998")
        most = max(ids.size - 2, 0)
        return (f"seq {cfg.seq} is longer than the text holds: its {ids.size:,} tokens give sequences of at most "
                f"{most:,} (each with its next-token targets); expected --seq {most} or less")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= cfg.vocab:
        need = f"; expected vocab {high + 1} or more (--vocab)" if low >= 0 else ""
        return f"the text's token ids run from {low} to {high}, outside the vocabulary [0, {cfg.vocab}){need}"
    return None


def batch(text_ids: Any, cfg: GPTConfig, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs x and targets y (int64, (B, T)) of training step `step`; y is x shifted by one.

    Starts: ``default_rng(crc32(f"{seed}:batch:{step}")).integers(0, n - T - 1, B)``.
    """
    ids = np.asarray(text_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise SpmdsimError(f"text_ids of shape {ids.shape} and dtype {ids.dtype} must be a 1-d integer array")
    n, T = ids.shape[0], cfg.seq
    if n < T + 2:
        raise SpmdsimError(f"text of {n} tokens is too short for seq {T}; expected at least {T + 2}")
    s = as_int(step)
    if s is None or s < 0:
        raise SpmdsimError(f"step {step!r} must be an integer >= 0")
    rng = np.random.default_rng(zlib.crc32(f"{cfg.seed}:batch:{s}".encode()))
    starts = rng.integers(0, n - T - 1, cfg.batch)
    window = starts[:, None] + np.arange(T + 1)
    xy = ids[window].astype(np.int64)
    low, high = int(xy.min()), int(xy.max())
    if low < 0 or high >= cfg.vocab:
        bad = low if low < 0 else high
        raise SpmdsimError(f"token id {bad!r} in the text is outside the vocabulary [0, {cfg.vocab})")
    return xy[:, :-1].copy(), xy[:, 1:].copy()
