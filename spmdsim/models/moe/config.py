"""A mixture-of-experts layer's settings: one frozen, validated value (pure).

``MoEConfig(experts=8, top_k=2)`` on a ``GPTConfig(moe=...)`` makes every
`every`-th block's MLP (blocks every-1, 2*every-1, ...) a layer of `experts`
MLPs behind a router (docs/howto/experts.md): the GPT's own kind, GELU or, with its
mlp "swiglu", SwiGLU, with or without biases as its `bias` says (Mixtral's). `capacity_factor` > 0 counts each
expert's slots per sequence (Switch Transformer: tokens past them are dropped
and pass through the residual); ``dropless=True`` sends every token to its
experts with the true counts (Alltoallv).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ...errors import SpmdsimError
from ...base.validate import as_int, counted
from .routing import ROUTINGS

__all__ = ["MoEConfig", "AUX_LOSS_COEFF", "Z_LOSS_COEFF"]

#: Switch Transformer's load-balancing coefficient (Fedus et al. 2021, section 2.2: alpha = 1e-2).
AUX_LOSS_COEFF = 1e-2
#: ST-MoE's router z-loss coefficient (Zoph et al. 2022, section 3.1: c_z = 1e-3).
Z_LOSS_COEFF = 1e-3


@dataclass(frozen=True)
class MoEConfig:
    """Experts behind a top-k router, their capacity and the router's two auxiliary losses.

    Args:
        experts: the number of experts per MoE layer.
        top_k: experts per token, 1 (Switch) or 2 (GShard, Mixtral).
        every: every `every`-th block is an MoE layer (2: blocks 1, 3, ...).
        capacity_factor: each expert's slots per sequence of T tokens are
            min(T, ceil(top_k * T * capacity_factor / experts)); ignored when `dropless`.
        dropless: no capacity, no dropping: the counts are exchanged, then the tokens (Alltoallv).
        hidden: each expert's hidden width (0: the dense MLP's, GPTConfig ffn or 4 * d_model: GPTConfig.expert_hidden).
        aux_loss_coeff: weight of the load-balancing loss E * sum_e f_e P_e.
        z_loss_coeff: weight of the router z-loss, the mean of logsumexp(logits)^2.
        dry_routing: how a dry run routes, having no probabilities (spmdsim.models.moe.routing.planned):
            "balanced" or "worst" (every token to experts 0 .. k-1); real runs route by the router.
        etp: the experts' tensor-parallel size (Megatron's --expert-tensor-parallel-size): 0, the mesh's tp;
            1 folds attention's tp ranks into the experts' expert-parallel group (spmdsim.models.moe.fold).
    """

    experts: int = 8
    top_k: int = 2
    every: int = 2
    capacity_factor: float = 1.0
    dropless: bool = False
    hidden: int = 0
    aux_loss_coeff: float = AUX_LOSS_COEFF
    z_loss_coeff: float = Z_LOSS_COEFF
    dry_routing: str = "balanced"
    etp: int = 0

    def __post_init__(self) -> None:
        for name, low in (("experts", 1), ("every", 1), ("hidden", 0), ("etp", 0)):
            value = getattr(self, name)
            n = as_int(value)
            if n is None or n < low:
                raise SpmdsimError(f"MoEConfig {name} {value!r} must be an integer >= {low}")
            object.__setattr__(self, name, n)
        k = as_int(self.top_k)
        if k not in (1, 2):
            raise SpmdsimError(f"MoEConfig top_k {self.top_k!r} must be 1 or 2 (experts per token)")
        object.__setattr__(self, "top_k", k)
        if k > self.experts:
            raise SpmdsimError(f"MoEConfig top_k {k} must not exceed experts {self.experts}")
        if not isinstance(self.dropless, bool):
            raise SpmdsimError(f"MoEConfig dropless {self.dropless!r} must be True or False")
        if not self.dropless and not (_real(self.capacity_factor) and self.capacity_factor > 0):
            raise SpmdsimError(f"MoEConfig capacity_factor {self.capacity_factor!r} must be a finite number > 0 "
                               "(or dropless=True)")
        for name in ("aux_loss_coeff", "z_loss_coeff"):
            value = getattr(self, name)
            if not (_real(value) and value >= 0):
                raise SpmdsimError(f"MoEConfig {name} {value!r} must be a finite number >= 0")
            object.__setattr__(self, name, float(value))
        if self.dry_routing not in ROUTINGS:
            raise SpmdsimError(f"MoEConfig dry_routing {self.dry_routing!r} is not one of "
                               f"{', '.join(map(repr, ROUTINGS))}")
        if _real(self.capacity_factor):
            object.__setattr__(self, "capacity_factor", float(self.capacity_factor))

    def is_moe(self, layer: int) -> bool:
        """Whether block `layer` (0-based) has an MoE layer in place of its MLP."""
        return layer % self.every == self.every - 1

    def capacity(self, tokens: int) -> int:
        """An expert's slots in a group of `tokens` tokens (one sequence): ceil(k * tokens * factor / E), at
        most `tokens`; the group's whole count of assignments, k * tokens, when dropless (nothing is dropped).

        A token's k choices are k different experts, so no expert is sent more than `tokens` of them: slots past
        that would stay empty (a factor of E / k or more drops nothing), and a huge factor (1e17) would ask for
        buffers no machine holds. Compared before rounding: k * tokens * factor may be inf, which ceil refuses.
        """
        if self.dropless:
            return self.top_k * tokens
        slots = self.top_k * tokens * self.capacity_factor / self.experts
        return max(1, tokens if slots >= tokens else math.ceil(slots))

    def describe(self) -> str:
        """One short line: experts, k, the router losses' weights."""
        return (f"{self.experts} per MoE layer, top-{self.top_k}; router losses: aux {self.aux_loss_coeff:g}, "
                f"z {self.z_loss_coeff:g}")

    def describe_capacity(self, seq: int) -> str:
        """One line on an expert's slots per sequence of `seq` tokens: dropless, none dropped, or how many."""
        if self.dropless:
            return "dropless: the counts by Alltoall, then the tokens by Alltoallv with the true counts"
        formula = f"ceil({self.top_k} x {seq} x {self.capacity_factor:g} / {self.experts})"
        if self.capacity(seq) == seq:
            # A slot per token is room for all of a sequence's assignments to an expert (a token's k choices are
            # k different experts), whether the factor reached E / k or the ceiling reached T below it
            # (3.99 with 8 experts, top-2, seq 16; any factor at seq 1): none can be dropped, so none is said to.
            why = (f"factor {self.capacity_factor:g} >= {self.experts} / {self.top_k}"
                   if self.top_k * self.capacity_factor >= self.experts else f"{formula} = {seq}")
            return f"capacity: {counted(seq, 'slot')} per expert per sequence, one per token ({why}): none dropped"
        return (f"capacity: {counted(self.capacity(seq), 'slot')} per expert per sequence ({formula}), the rest "
                "dropped")


def _real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
