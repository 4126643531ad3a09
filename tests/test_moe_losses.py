"""An MoE layer's router losses (spmdsim.models.moe.losses): one node with the general operators' chain's bits.

The load-balancing loss and the z-loss were fourteen general operators' nodes a layer (mean, products, sums,
exp, log ...), each paying Python on every step; a repeated call is now one node. Its loss, its gradients,
the blocks it keeps for backward and the kernels its backward counts are the chain's, which a first call
(and a dry run, and a call under a counter) still runs.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.nn.autograd import kept_bytes
from spmdsim.base.flops import counting
from spmdsim.models.moe.losses import router_losses
from spmdsim.runtime.dtensor import DTensor

T, B, E = 6, 4, 4


def _inputs(dtype):
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(T, B, E))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    f = rng.uniform(size=E) / E
    return logits.astype(dtype), probs.astype(dtype), f.astype(dtype)


def _call(mesh, layouts, values, count=False):
    """(node name, loss block, d logits, d probs, kept bytes, the backward's counted kernels) of one call on
    fresh leaves (laid out by the same layout objects each call, as a model's step lays them out)."""
    (logits, probs, f), (tokens, whole) = values, layouts
    lg = DTensor.from_global(mesh, logits, tokens).requires_grad_()
    p = DTensor.from_global(mesh, probs, tokens).requires_grad_()
    fd = DTensor.from_global(mesh, f, whole)
    loss = router_losses(lg, p, fd, 0.01, 0.001, "h1")
    kept = kept_bytes([loss])
    name = loss._ag.describe()
    total = loss.redistribute(loss.layout.with_partial(()))
    # A counter open on any rank is seen by every rank's router_losses (spmdsim.base.flops._OPEN is the process's:
    # it then takes the chain's way): the ranks open one only after all have chosen, and close it before any goes on.
    mesh.comm.Barrier()
    kernels: dict = {}
    if count:
        with counting() as flops:
            total.backward()
        kernels = dict(flops.kernels)
    else:
        total.backward()
    mesh.comm.Barrier()
    return name, loss.local.tobytes(), lg.grad.local.tobytes(), p.grad.local.tobytes(), kept, kernels


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.usefixtures("empty_tables")  # (moe.losses' table of calls starts over at 256 entries: filled by
# earlier tests, it could start over between a rank's first call and its repeat: tests/bounded_tables.py)
def test_a_repeated_call_is_one_node_with_the_chains_loss_gradients_kept_blocks_and_counts(dtype):
    """The first call runs the chain (its last node the add of the two weighted losses), the second one node;
    everything else equal, bit for bit, on every rank. Before, every call made the chain's fourteen nodes."""
    values = _inputs(dtype)

    def body():
        mesh, layouts = _mesh()
        chain = _call(mesh, layouts, values)
        fused = _call(mesh, layouts, values)
        counted = _call(mesh, layouts, values, count=True)  # the backward of a fused node, under a counter
        return chain, fused, counted

    for chain, fused, counted in spmdsim.simulate(8, body):
        assert chain[0] == "add" and fused[0] == "moe router losses h1" == counted[0]
        assert fused[1:5] == chain[1:5]
        assert counted[5] and counted[5] == _chain_counts(values)


def _mesh():
    mesh = spmdsim.Mesh(spmdsim.Layout((2, 2, 2), ("dp", "ep", "tp")), spmdsim.world())
    return mesh, (mesh.layout(None, ("dp", "ep"), None), mesh.layout(None))


def _chain_counts(values):
    """The kernels the chain's backward counts (its forward outside the counter, as `_call`'s): a fresh mesh's
    layouts, a first call."""
    return spmdsim.simulate(8, lambda: _call(*_mesh(), values, count=True)[5])[0]
