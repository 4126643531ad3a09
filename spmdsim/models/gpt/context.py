"""Context parallelism for the GPT: the sequence split over the "cp" axis for the whole block, and the way
attention meets it (spmdsim.programs.context: the split, the ring's program, each method's bytes).

Between blocks the activations (T, B, D) are split over cp on T (and over tp too with sequence parallelism,
T over ("cp", "tp")); inside a block everything but attention works token by token. The attention core
by `Context.method`:

- "allgather": the core's own rule (spmdsim.programs.infer.attention: query rows may be split, keys and
  values whole) gathers K and V over cp before the core, and its backward reduce-scatters their
  gradients: Llama 3's method;
- "alltoall": Q, K and V moved from the sequence split to a head split over ("tp", "cp") with whole
  sequences, the core run there, its output moved back: DeepSpeed-Ulysses (heads and K/V heads must
  divide by tp x cp);
- "ring": ring attention (spmdsim.nn.ops.ring_attention), the blocks of K and V passed round the cp ring.

`Context.split`: "balanced" (Megatron-LM's for causal masks: 2 cp chunks, rank r holding r and 2cp-1-r;
the sequence laid out in `spmdsim.programs.context.order`, every position-dependent piece reading the
true positions) or "naive" (contiguous chunks; shows the imbalance).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ...programs.context import METHODS, SPLITS, check_heads, check_split, order
from ...runtime.dtensor import DTensor
from ..axes import CONTEXT
from .config import GPTConfig
from .layouts import folded_by

__all__ = ["Context", "Laid", "checked_order", "context_problem", "position_ids", "ring_core", "runs_as"]


@dataclass(frozen=True)
class Context:
    """How the GPT's attention meets a sequence split over cp: `method` ("ring", "allgather", "alltoall")
    and `split` ("balanced", "naive")."""

    method: str = "ring"
    split: str = "balanced"

    @property
    def balanced(self) -> bool:
        return self.split == "balanced"

    def positions(self, cp: int, seq: int) -> Optional[tuple[int, ...]]:
        """The true position of each index of the sequence as laid out (None where it is the index itself:
        a naive split, or cp 1)."""
        return order(cp, seq, True) if self.balanced and cp > 1 else None


def context_problem(cfg: GPTConfig, cp: int, tp: int, sp: bool, context: Optional[Context]) -> Optional[str]:
    """Why the model cannot split its sequence over cp (one line), or None."""
    context = context or Context()
    if context.method not in METHODS:
        return f"context-parallel method {context.method!r} is not one of {', '.join(METHODS)}"
    if context.split not in SPLITS:
        return f"context-parallel split {context.split!r} is not one of {', '.join(SPLITS)}"
    if cp == 1:
        return None
    try:
        check_split(cp, cfg.seq, context.balanced)
        check_heads(context.method, cp, cfg.heads, cfg.kv, tp)
    except ValueError as exc:
        return str(exc)
    if sp and (cfg.seq // cp) % tp:
        return f"seq {cfg.seq} split over cp {cp} leaves {cfg.seq // cp} tokens, not divisible by tp {tp} (sp)"
    by = folded_by(cfg, tp)  # the tp ranks outside the experts' own tp, each routing its share (dropless)
    if cfg.moe is not None and cfg.moe.dropless and by > 1 and (cfg.seq // cp) % by:
        return (f"seq {cfg.seq} split over cp {cp} leaves {cfg.seq // cp} tokens, not divisible by tp {by} (etp "
                f"{tp // by}, dropless: each tp rank routes its share of its cp chunk's tokens)")
    return None


def position_ids(mesh: Any, positions: tuple) -> Any:
    """The positions of a sequence as laid out, a DTensor (T, 1) split over cp as the activations' T."""
    ids = np.asarray(positions, np.int64).reshape(-1, 1)
    return DTensor.from_global(mesh, ids, mesh.layout(CONTEXT, None), verify=False)


class Laid(tuple):
    """A sequence's positions as the context-parallel ranks hold it (index i holds position ``self[i]``) and `cp`:
    its `groups` are the cp chunks that experts of a capacity route apart, rank by rank, each with its own capacity
    (spmdsim.models.moe.reference.moe_forward)."""

    cp: int = 1

    @property
    def groups(self) -> tuple:
        """(the positions in the ranks' order, how many chunks a sequence makes)."""
        return self, self.cp


def ring_core(model: Any) -> bool:
    """Whether `model`'s attention core is ring attention (a sequence split over cp > 1 by the ring), whose
    rounding points the check's low-precision reference follows (spmdsim.models.gpt.mixed)."""
    context = model.context
    return context is not None and context.method == "ring" and model.mesh.layout.axis_size(CONTEXT) > 1


def runs_as(cfg: Any, recompute: str, cp: int, method: str) -> str:
    """The recomputation a GPT step of `cfg` with `cp` ranks of context parallelism by `method` runs: "selective"
    recomputes the attention core's scores, which flash attention (cfg.attention "flash") and ring attention (cp > 1
    by the ring) never keep, so there its program is "none"'s (spmdsim.models.gpt.parallel.GPT: `_selective` and
    `_core`); any other value as given. A dry run of one stands for the other
    (spmdsim.tools.estimate.ledger.dry_key)."""
    if recompute == "selective" and (getattr(cfg, "attention", None) == "flash" or
                                     isinstance(cp, int) and cp > 1 and method == "ring"):
        return "none"
    return recompute


def checked_order(model: Any) -> Optional[tuple]:
    """The order the check's reference reads `model`'s sequences in (a GPT of spmdsim.models.gpt.parallel): its
    positions (None: each index its own position), or with MoE layers of a capacity over cp > 1 a `Laid` of them
    (the ranks route each chunk of a sequence apart, with a capacity of its own tokens)."""
    cfg, positions = model.cfg, model.positions
    cp = model.mesh.layout.axis_size(CONTEXT) if model.context is not None else 1
    if cp == 1 or cfg.moe is None or cfg.moe.dropless:
        return positions
    laid = Laid(range(cfg.seq) if positions is None else positions)
    laid.cp = cp
    return laid
