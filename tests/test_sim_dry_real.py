"""A dry run counts what the real run allocates: one training step of a small GPT, run for real and dry
(``spmdsim.simulate(n, ..., dry_run=True)``) at the same precision, gives every rank the same record.

The record is each product's and kernel's blocks the rank holds nowhere else (spmdsim.base.flop_counts.Fresh, by
identity: a block the step keeps for its backward, a parameter or its gradient is held; a product's result that nothing
keeps is the moment's own, what the estimate's peak adds, spmdsim.tools.estimate.ledger.largest_transient), the
products and kernels themselves, and the bytes kept for the backward, the master copy, the optimizer's states
and the buffers (StepResult.memory). Dense and MoE GPTs (GELU experts with biases, Mixtral's SwiGLU experts
without; a dense Llama under Megatron's kept set), float32 and bf16-mixed, a few tp, ep and pp values.

Under bf16-mixed the attention core's backward products are compared too (they were left out: the dry
gradients were bfloat16 copies of q, k and v; the grouped products since count alike).
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.base.flops import counting
from spmdsim.models.gpt import GPTConfig
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.moe.config import MoEConfig


def _gpt(batch: int, layers: int = 1, moe: MoEConfig | None = None, **llama) -> GPTConfig:
    return GPTConfig(layers=layers, d_model=64, heads=4, seq=8, batch=batch, vocab=128, moe=moe, **llama)


#: Mixtral's options (docs/howto/experts.md): SwiGLU experts without biases, RMSNorm, grouped-query attention, RoPE.
MIXTRAL = dict(mlp="swiglu", bias=False, norm="rms", kv_heads=2, positions="rope", tied=False)


def _moe(top_k: int = 1) -> MoEConfig:
    return MoEConfig(experts=4, top_k=top_k, every=1)


def _step(cfg: GPTConfig, precision: str, dry: bool, pp: int = 1, tp: int = 1, ep: int = 1, **kw) -> list:
    """Per rank: (stage, its Fresh records, products, kernels, (kept, master, states, buffers)) of one step."""
    ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % 128

    def body():
        with counting(blocks=True) as flops:
            run, steps = train_pipelined(cfg, spmdsim.world(), pp, 1, tp, 1, ids, memory=True, check=False, ep=ep,
                                         precision=precision, **kw)
        memory = steps[-1].memory
        out = (run.stage, set(flops.fresh()), dict(flops.counts), dict(flops.kernels),
               (memory.kept, memory.master, memory.states, memory.buffers))
        run.close()
        return out

    return spmdsim.simulate(pp * ep * tp, body, dry_run=dry)


CASES = {
    # the head's product of one sequence a rank: (t, 1, v) -> (1, t, v) is the product itself, kept by the loss
    "dense fp32 b1": (_gpt(1), "fp32", {}),
    # the head's weight gradient reads the layer norm's output copied into (b t, d) order: a block of its own
    "dense fp32 b2 tp2": (_gpt(2), "fp32", dict(tp=2)),
    "dense bf16 b1 tp2": (_gpt(1), "bf16-mixed", dict(tp=2)),
    # the routing's gates in the router's dtype (float32), as a real step's (the dry run's were float64)
    "moe fp32 ep2": (_gpt(2, moe=_moe()), "fp32", dict(ep=2)),
    # fc2's output in the activations' dtype, and at ep 1 with one sequence the combine's result itself, kept
    "moe bf16 b1 tp2": (_gpt(1, moe=_moe()), "bf16-mixed", dict(tp=2)),
    "moe bf16 ep2 tp2 top2": (_gpt(2, moe=_moe(2)), "bf16-mixed", dict(ep=2, tp=2)),
    # SwiGLU experts without biases: fc3's output kept beside fc1's, no bias blocks
    "moe swiglu fp32 ep2 tp2 top2": (_gpt(2, moe=_moe(2), **MIXTRAL), "fp32", dict(ep=2, tp=2)),
    "moe swiglu bf16 b1 tp2 top2": (_gpt(1, moe=_moe(2), **MIXTRAL), "bf16-mixed", dict(tp=2)),
    # Llama's options under Megatron's kept set: its fused SwiGLU (spmdsim.nn.ops.megatron)
    "llama megatron fp32 b2 tp2": (_gpt(2, **MIXTRAL), "fp32", dict(tp=2, kept="megatron")),
    "llama megatron bf16 b1 tp2": (_gpt(1, **MIXTRAL), "bf16-mixed", dict(tp=2, kept="megatron")),
    # the GPT's own LayerNorm under Megatron's kept set (its fused layer norm), bf16: its gradients float32
    "dense megatron bf16 b1 tp2": (_gpt(1), "bf16-mixed", dict(tp=2, kept="megatron")),
    # flash attention (GPTConfig attention): the output and log-sum-exp kept, a tile's scores the moment's own
    "dense flash fp32 b2 tp2": (_gpt(2, attention="flash"), "fp32", dict(tp=2)),
    "llama flash megatron bf16 b1 tp2": (_gpt(1, attention="flash", **MIXTRAL), "bf16-mixed",
                                         dict(tp=2, kept="megatron")),
    # a pipeline's later microbatches keep their blocks as the first does
    "dense fp32 pp2": (_gpt(2, layers=2), "fp32", dict(pp=2, microbatches=2)),
    "moe bf16 pp2 ep2": (_gpt(4, layers=2, moe=_moe()), "bf16-mixed", dict(pp=2, ep=2, microbatches=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_dry_step_counts_what_the_real_step_allocates(case):
    cfg, precision, kw = CASES[case]
    if precision == "bf16-mixed":
        pytest.importorskip("ml_dtypes")
    real, dry = _step(cfg, precision, False, **kw), _step(cfg, precision, True, **kw)
    assert len(real) == len(dry) > 0
    for rank, (ours, theirs) in enumerate(zip(dry, real)):
        fresh, got = ours[1], theirs[1]
        assert fresh == got, (rank, sorted(map(str, fresh - got)), sorted(map(str, got - fresh)))
        assert ours[0] == theirs[0] and ours[2:] == theirs[2:], rank
        # the experts are the model's: SwiGLU ones run their gate (and no bias) where the MLP's options say so
        ops = {k.op for k in theirs[3]}
        assert ("swiglu" in ops) == (cfg.moe is not None and cfg.mlp == "swiglu"), ops
        assert ("moe bias" in ops) == (cfg.moe is not None and cfg.bias), ops


@pytest.mark.parametrize("dtypes, drop", [
    (("float32", "float64", "float32"), 0.0),  # the scores float64: so the probabilities kept and the result
    (("float32", "float32", "float64"), 0.25),  # the result float64 (the probabilities, the dropout's, float32)
    (("float32", "float64", "float64"), 0.25),
    (("float64", "float32", "float32"), 0.0),  # q's dtype, as before
])
def test_attention_of_mixed_float_dtypes_types_its_dry_blocks_as_the_real_run(dtypes, drop):
    """ops.attention with q float32 and k or v float64: the real run's result is float64 (numpy promotes the
    products), the dry run's was q's float32, and the probabilities it keeps for the backward half their real
    bytes. The dry blocks take numpy's promotion now: the result's dtype, the bytes kept and the products and
    kernels counted are the real run's."""
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops
    from spmdsim.nn.autograd.kept import kept_bytes

    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        rng = np.random.default_rng(0)
        q, k, v = (DTensor.from_global(mesh, rng.standard_normal((2, 4, 2, 4)).astype(d),
                                       mesh.layout(None, None, "tp", None)).requires_grad_() for d in dtypes)
        with counting() as counter:
            o = ops.attention(q, k, v, causal=True, dropout=drop, seed=3 if drop else None)
            kept = kept_bytes([o], exclude=(q, k, v), masks=True)
            ops.sum(o).backward()
        return (o.local.dtype.name, kept, [t.grad.local.dtype.name for t in (q, k, v)], counter.counts,
                counter.kernels)

    real = spmdsim.simulate(2, body)[0]
    dry = spmdsim.simulate(2, body, dry_run=True)[0]
    assert real[0] == np.result_type(*dtypes).name
    assert dry == real
