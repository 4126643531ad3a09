"""The GPT cut into pipeline chunks: which layers, and whether the embedding or the head, each holds.

Pure (numpy only). A pipeline of p stages with v virtual stages each runs p*v
model chunks; chunk c lives on stage c % p (Megatron's interleaving). Chunk 0
holds the token and position embeddings, the last chunk the final LayerNorm,
the head (tied to the token embedding: its own copy of ``wte``, whose
gradient is summed with the first chunk's, Megatron's embedding group; an
untied head, GPTConfig.tied False, its own "head.w" alone) and the loss.
The layers are balanced (the first chunks take one more where they
do not divide), or follow a split the user gives: one layer count per chunk.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

from ...errors import SpmdsimError
from ...base.validate import as_int
from .config import GPTConfig
from .params import ParamSpec, param_specs

__all__ = ["Part", "whole", "chunk_parts", "part_specs", "pipeline_problem"]


@dataclass(frozen=True)
class Part:
    """The pieces of the model one object holds: layers [first, stop), the embedding, the head."""

    first: int
    stop: int
    embed: bool
    head: bool

    def __str__(self) -> str:
        pieces = (["embedding"] if self.embed else []) + \
            ([f"layers {self.first}-{self.stop - 1}" if self.stop - self.first > 1 else f"layer {self.first}"]
             if self.stop > self.first else []) + (["head"] if self.head else [])
        return " + ".join(pieces) or "nothing"

    def holds(self, name: str, tied: bool = True) -> bool:
        """Whether the parameter `name` (spmdsim.models.gpt.params) is in this part; `tied`: GPTConfig.tied (an untied
        head holds its own "head.w", not the embedding's table)."""
        if name == "wte":
            return self.embed or (self.head and tied)
        if name == "wpe":
            return self.embed
        if name.startswith(("lnf.", "head.")):
            return self.head
        layer = int(name[1:name.index(".")])
        return self.first <= layer < self.stop


def whole(cfg: GPTConfig) -> Part:
    """The whole model as one part (no pipeline)."""
    return Part(0, cfg.layers, True, True)


def part_specs(cfg: GPTConfig, part: Part) -> tuple[ParamSpec, ...]:
    """The parameters `part` holds, in the optimizer's order (param_specs')."""
    return tuple(s for name, specs in _pieces(cfg) if part.holds(name, cfg.tied) for s in specs)


@functools.lru_cache(maxsize=16)  # each stage of a pipeline (and each dry-run representative) asks alike
def _pieces(cfg: GPTConfig) -> tuple[tuple[str, tuple[ParamSpec, ...]], ...]:
    """param_specs(cfg) in runs that a Part holds or leaves whole (wte, wpe, each layer's, lnf's), each with its
    first name: `part_specs` asks `Part.holds` once a run, not once a parameter (~1,900 at 128 layers)."""
    runs: list = []
    for spec in param_specs(cfg):
        piece = spec.name.split(".", 1)[0]
        if runs and runs[-1][0] == piece:
            runs[-1][1].append(spec)
        else:
            runs.append((piece, [spec]))
    return tuple((specs[0].name, tuple(specs)) for _, specs in runs)


def chunk_parts(cfg: GPTConfig, chunks: int, split: Optional[Sequence[int]] = None) -> tuple[Part, ...]:
    """The `chunks` parts of the model in pipeline order (see the module docstring), or the one-line
    SpmdsimError every rank raises alike."""
    problem = pipeline_problem(cfg, chunks, split)
    if problem:
        raise SpmdsimError(problem)
    if split is None:
        base, extra = divmod(cfg.layers, chunks)
        counts = [base + (c < extra) for c in range(chunks)]
    else:
        counts = [int(n) for n in split]
    parts, at = [], 0
    for c, n in enumerate(counts):
        parts.append(Part(at, at + n, c == 0, c == chunks - 1))
        at += n
    return tuple(parts)


def pipeline_problem(cfg: GPTConfig, chunks: int, split: Optional[Sequence[int]] = None) -> Optional[str]:
    """Why the model cannot be cut into `chunks` chunks (with `split`, layers per chunk), or None."""
    n = as_int(chunks)
    if n is None or n < 1:
        return f"pipeline chunks {chunks!r} must be an integer >= 1 (stages x virtual stages)"
    if split is None:
        if cfg.layers < n:
            return (f"{cfg.layers} layers cannot fill {n} pipeline chunks (stages x virtual stages): each "
                    "chunk needs a layer at least")
        return None
    counts = [as_int(x) for x in split]
    if len(counts) != n or any(c is None or c < 0 for c in counts):
        return f"split {tuple(split)!r} must give {n} layer counts >= 0, one per pipeline chunk"
    empty = [c for c, k in enumerate(counts) if k == 0 and 0 < c < n - 1]
    if empty:
        return (f"split {tuple(split)!r} leaves chunk {empty[0]} without a layer: only the first and last "
                "chunks, which hold the embedding and the head, may have none")
    if sum(counts) != cfg.layers:
        return f"split {tuple(split)!r} covers {sum(counts)} layers but the model has {cfg.layers}"
    return None
