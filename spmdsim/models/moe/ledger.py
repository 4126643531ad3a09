"""One rank's bytes for its MoE layers at one step: the experts' memory and the dispatch's traffic (pure).

The trainer (spmdsim.models.gpt.train) fills an `ExpertBytes` each step from what the
rank holds and did: the expert parameters' blocks (every MoE layer's w1, b1,
w2, b2 on this rank), their gradients, the optimizer's moments of them
(spmdsim.nn.optim.AdamW.states_of), the dispatch's send and receive buffers
(spmdsim.models.moe.stats.MoEStats) and the bytes the dispatches, combines and their
backward sent (the step's trace rows labelled with the layers' names). In a
dry run these are the dry engine's blocks and trace (docs/howto/experts-memory.md, "The
dry run"), so the figures are the program's, for the routing the dry run
chose (spmdsim.models.moe.routing.planned).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...base.validate import counted

__all__ = ["ExpertBytes", "ROUTING_WORDS", "EXCHANGE_WORDS"]

#: What each routing a ledger can be made under means, in a few words.
ROUTING_WORDS = {
    "router": "the router's",
    "balanced": "balanced, k x seq / experts assignments per expert and sequence",
    "worst": "worst, every token to experts 0..k-1 (rank 0 holds expert 0: it gets every ep peer's)",
}
#: What an MoE layer's exchanges' trace labels start with after its name ("h1 dispatch counts", "h1 combine backward").
EXCHANGE_WORDS = (" dispatch", " combine")


@dataclass(frozen=True)
class ExpertBytes:
    """One rank's MoE bytes at one step (see the module docstring).

    Attributes:
        rank: the mesh rank; layers: the MoE layers; held: experts this rank holds per layer; experts: per
            layer in all; tp: the tensor-parallel ranks each expert is split over.
        params, grads, states: bytes of the expert parameters this rank holds, of their gradients, of the
            optimizer's moments of them (all MoE layers).
        send, received: bytes of the dispatch's send and receive buffers, all MoE layers of one forward
            (the combine reuses the two sizes the other way, as do the backward's exchanges).
        sent, calls: bytes the dispatches, combines and their backward sent (counts' Alltoalls included),
            and how many such calls, as the trace counted them.
        routing: "router" (a real run) or the dry run's rule ("balanced", "worst").
    """

    rank: int
    layers: int
    held: int
    experts: int
    tp: int
    params: int
    grads: int
    states: int
    send: int
    received: int
    sent: int
    calls: int
    routing: str

    def lines(self) -> list[str]:
        """The ledger as lines of at most 100 characters."""
        words = ROUTING_WORDS.get(self.routing, self.routing)
        split = f", each split over tp {self.tp}" if self.tp > 1 else ""
        layers = counted(self.layers, "MoE layer")
        return [f"experts on rank {self.rank}: {layers} x {self.held} of {self.experts} experts{split}; bytes per step",
                f"  routing: {words}",
                f"  expert parameters {self.params:,}, their gradients {self.grads:,}, "
                f"optimizer states {self.states:,}",
                f"  dispatch buffers: send {self.send:,}, receive {self.received:,}",
                f"  sent by the dispatches and combines, forward and backward: {self.sent:,} in {self.calls} calls"]
