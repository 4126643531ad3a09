"""The small MoE layer the replay tests of spmdsim.models.moe.layer share (not a test module)."""
from __future__ import annotations

import numpy as np

import spmdsim
from spmdsim.models.moe import MoEConfig
from spmdsim.runtime.dtensor import DTensor

#: Each parameter's tensor map by its last name: the experts split over ep, their hidden width over tp.
MAPS = {"router": (None, None), "w1": ("ep", None, "tp"), "b1": ("ep", "tp"), "w2": ("ep", "tp", None),
        "b2": ("ep", None)}


def layer_inputs(shape: tuple, T: int, B: int, D: int, E: int, capacity_factor: float, dropless: bool):
    """Layer "h1."'s inputs on a (dp, ep, tp) mesh of `shape` over this rank's world, drawn from seed 3:
    (mesh, its parameters as DTensors requiring gradients, three (T, B, D) token batches, the output's
    gradient as a DTensor, the tokens' layout, the MoEConfig of E experts, top-2)."""
    rng = np.random.default_rng(3)
    p = {"h1.moe.router": rng.standard_normal((D, E)), "h1.moe.w1": rng.standard_normal((E, D, 2 * D)) * 0.3,
         "h1.moe.b1": rng.standard_normal((E, 2 * D)) * 0.1, "h1.moe.w2": rng.standard_normal((E, 2 * D, D)) * 0.3,
         "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    xs = [rng.standard_normal((T, B, D)) for _ in range(3)]
    g = rng.standard_normal((T, B, D))
    moe = MoEConfig(experts=E, top_k=2, capacity_factor=capacity_factor, dropless=dropless)
    mesh = spmdsim.Mesh(spmdsim.Layout(shape, ("dp", "ep", "tp")), spmdsim.world())
    L = mesh.layout
    params = {n: DTensor.from_global(mesh, v, L(*MAPS[n.split(".")[-1]])).requires_grad_() for n, v in p.items()}
    tokens = L(None, ("dp", "ep"), None)
    return mesh, params, xs, DTensor.from_global(mesh, g, tokens), tokens, moe
