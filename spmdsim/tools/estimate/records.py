"""The rows a step's ledger is made of: pure, frozen values every module of spmdsim.tools.estimate shares."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEVELS", "Calls"]

#: Where a message travels: between ranks of one node (NVLink-class links) or across nodes (the network).
LEVELS = ("node", "cluster")


@dataclass(frozen=True)
class Calls:
    """`count` calls of one collective (or point-to-point message) one rank takes part in: a row of a step's
    ledger. Its bytes are the trace's, whose rows the executor wrote from the step records' formulas
    (spmdsim.programs.transfer.MOVED); one message itself is a spmdsim.programs.transfer.Transfer.

    kind: "allgather", "reduce_scatter", "allreduce", "alltoall", "alltoallv", "bcast" (the names of
        spmdsim.programs.cost.model.OPS) or "send" / "recv" (point-to-point);
    group: ranks in the communicator (2 for a message);
    nbytes: the call's per-rank buffer as spmdsim.programs.cost.model takes it (the gathered output of an
        allgather, the unreduced input of a reduce_scatter, the buffer of an allreduce, the message);
    level: "node" when every member is on this rank's node, else "cluster" (a pipeline's message: "node"
        when its peer is on this rank's node);
    phase: "layers" (tensor/sequence-parallel collectives inside the forward and backward),
        "gradients" (data-parallel sums, ZeRO-1's buckets) or "pipeline" (messages between stages);
    count: how many such calls one step makes;
    sent: bytes this rank sends in one such call (what its trace recorded; 0 for a receive);
    width: 0 where the elements are the run's floats (a float64 dry run's, `nbytes` and `sent` counted at 8
        bytes an element: spmdsim.tools.estimate.ledger.transfers_at prices them at the precision's width
        for the phase), else the bytes of one element as moved at every precision (1: FP8 values, moved
        as bytes; 8: integers such as the experts' token counts);
    role: "" where a float row's width is its phase's (the activations', the gradients' for "gradients", the
        parameters' for "parameters"), "parameters" for ZeRO-1's and ZeRO-2's gathers of the updated
        parameters, which run with the gradient sums (phase "gradients") but move the parameters' elements
        (spmdsim.nn.distrib_optim gathers bf16 parameters in bf16, as Megatron's distributed optimizer does);
    lanes: a "cluster" row's group members on this rank's node (1 for "node" rows): a ring collective's
        cross-node traffic leaves a node over that many GPUs' network ports side by side.
    """

    kind: str
    group: int
    nbytes: int
    level: str
    phase: str
    count: int = 1
    sent: int = 0
    width: int = 0
    role: str = ""
    lanes: int = 1
