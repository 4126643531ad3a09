"""What the docs state about the GPT's and MoE layer's defaults, checked where a statement is checkable.

docs/howto/experts.md: the MoE layer's initial values and which of its parameters take weight decay (the router
does, the experts' 2-D biases do not); docs/howto/pipelines.md: each microbatch's dropout seed; docs/howto/bf16.md:
the float32 master copy is made from the bfloat16 parameter at its first step.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.models.gpt import GPTConfig, constant, decays, dropout_seed, param_specs, seeded
from spmdsim.models.moe import MoEConfig
from spmdsim.nn.optim import AdamW

MOE = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, moe=MoEConfig(experts=4, top_k=2))


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_the_router_and_expert_weights_decay_and_the_expert_biases_do_not(mlp):
    cfg = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, mlp=mlp, moe=MoEConfig(experts=4, top_k=2))
    specs = {s.name: s for s in param_specs(cfg) if ".moe." in s.name}
    decaying = sorted(name for name, s in specs.items() if decays(s))
    weights = ["h1.moe.router", "h1.moe.w1", "h1.moe.w2"] + (["h1.moe.w3"] if mlp == "swiglu" else [])
    assert decaying == sorted(weights)
    biases = [name for name in specs if name.rsplit(".", 1)[1].startswith("b")]
    assert biases and all(len(specs[b].shape) == 2 and not decays(specs[b]) for b in biases)
    # norms' weights and biases (1-D) never decay
    assert not any(decays(s) for s in param_specs(cfg) if ".ln" in s.name or s.name.startswith("lnf"))


def test_the_moe_layers_initial_values_are_as_documented():
    by_name = {s.name: s for s in param_specs(MOE)}
    a = math.sqrt(3.0) * MOE.init_std
    for name in ("h1.moe.router", "h1.moe.w1"):
        t = seeded(MOE, by_name[name])
        assert t.seed == zlib.crc32(f"{MOE.seed}:{name}".encode()) and (t.low, t.high) == (-a, a)
    w2 = seeded(MOE, by_name["h1.moe.w2"])
    assert w2.high == pytest.approx(a / math.sqrt(2.0 * MOE.layers))
    assert all(constant(by_name[b]) == 0.0 for b in ("h1.moe.b1", "h1.moe.b2"))
    w1 = seeded(MOE, by_name["h1.moe.w1"]).full()
    assert not np.array_equal(w1[0], w1[1])  # each expert's slice its own values


def test_each_microbatch_draws_its_own_dropout_seed():
    cfg = GPTConfig(layers=2)
    for site in ("emb", "h0.attn", "h1.resid2"):
        assert dropout_seed(cfg, 3, site) == zlib.crc32(f"{cfg.seed}:dropout:3:{site}".encode())
        seeds = [dropout_seed(cfg, 3, site, micro=i) for i in range(4)]
        assert seeds == [zlib.crc32(f"{cfg.seed}:dropout:3:{site}:micro{i}".encode()) for i in range(4)]
        assert len(set(seeds + [dropout_seed(cfg, 3, site)])) == 5


def test_the_master_copy_is_the_bf16_parameter_at_its_first_step():
    pytest.importorskip("ml_dtypes")
    bf16 = spmdsim.base.precision.bfloat16()
    start = np.linspace(-1, 1, 8) / 3  # float64 values no bfloat16 holds

    def body():
        mesh = Mesh(Layout((1,), ("dp",)), spmdsim.world())
        try:
            w = DTensor.from_global(mesh, start.astype(bf16), mesh.layout(None)).requires_grad_()
            opt = AdamW([w], lr=0.0, weight_decay=0.0)
            assert not opt.master  # none before the first step
            w.grad = DTensor.from_global(mesh, np.ones(8, np.float32), mesh.layout(None))
            opt.step()
            (master,) = opt.master.values()
            return master.copy()
        finally:
            mesh.close()

    master = spmdsim.simulate(1, body)[0]
    assert master.dtype == np.float32
    assert np.array_equal(master, start.astype(bf16).astype(np.float32))  # the rounded value, not the float64 one
    assert not np.array_equal(master, start.astype(np.float32))
