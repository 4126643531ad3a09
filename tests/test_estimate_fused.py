"""The estimate's pricing of fused kernels: flash attention's products at the machine file's attention efficiency
(its score tiles never HBM traffic), FP8 weight casts once a step, the gradients' accumulation fused into the
weight-gradient GEMM (--gradient-accumulation-fusion), and the FP8 column's dX sum counted as the unfused rule's."""
from __future__ import annotations

import json

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.base.flop_counts import Gemm
from spmdsim.base.flops import counting
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig
from spmdsim.nn import ops
from spmdsim.runtime import DTensor, Mesh
from spmdsim.tools.estimate.ledger import gpt_ledger, kernel_bytes
from spmdsim.tools.estimate.machine import load_machine, machine_from_dict, machine_to_dict
from spmdsim.tools.estimate.steptime import step_time

H100 = load_machine("h100-dgx")


def test_a_fused_attention_product_runs_at_the_attention_efficiency_on_the_share_it_executes():
    core = Gemm(32, 4096, 4096, 128, "bf16", "forward", "attention", 0.5)
    back = Gemm(32, 4096, 128, 4096, "bf16", "backward", "attention", 0.5)
    a = H100.attention_efficiency
    assert step_time(H100, [(core, 1)], []).compute_s == pytest.approx(0.5 * core.flops / (989e12 * a.forward))
    assert step_time(H100, [(back, 1)], []).compute_s == pytest.approx(0.5 * back.flops / (989e12 * a.backward))
    # the same product of its own: the roofline, its 4096 x 4096 scores written to HBM
    plain = Gemm(32, 4096, 4096, 128, "bf16", "forward")
    assert step_time(H100, [(plain, 1)], []).compute_s > 2 * step_time(H100, [(core, 1)], []).compute_s
    # a machine file without the key prices it as any product
    data = machine_to_dict(H100)
    del data["attention_efficiency"]
    bare = machine_from_dict(data)
    assert step_time(bare, [(core, 1)], []).compute_s == step_time(bare, [(plain, 1)], []).compute_s


def test_the_machine_files_attention_efficiency_round_trips_and_bad_values_are_refused_in_one_line():
    data = machine_to_dict(H100)
    assert machine_from_dict(json.loads(json.dumps(data))) == H100
    for bad in ({"forward": 1.5, "backward": 0.5, "source": "x"}, {"forward": 0.5, "source": "x"},
                {"forward": 0.5, "backward": 0.5, "source": ""}):
        with pytest.raises(SpmdsimError, match="attention_efficiency") as info:
            machine_from_dict(data | {"attention_efficiency": bad}, "f.json")
        assert "\n" not in str(info.value)
    with pytest.raises(SpmdsimError, match="kernel"):
        Gemm(1, 2, 2, 2, "bf16", "forward", "softmax")


def test_flash_marks_its_products_fused_half_executed_when_causal_and_reads_k_and_v_once():
    B, T, H, D = 2, 12, 4, 3
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((B, T, H, D)) for _ in range(3)]

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        out = {}
        for causal in (False, True):
            xs = [DTensor.from_global(mesh, a, mesh.layout(None, "dp", None, None)).requires_grad_() for a in arrays]
            with counting() as c:
                ops.sum(ops.attention(*xs, causal=causal, flash=True, tile=2)).backward()
            out[causal] = c
        return out

    counters = spmdsim.simulate(2, body)[0]
    for causal, c in counters.items():
        assert c.counts and all(g.kernel == "attention" for g in c.counts)  # the core's products, all in the kernel
        assert {g.share for g in c.counts} == {0.5 if causal else 1.0}
        (fwd,) = [k for k in c.kernels if k.op == "flash attention"]
        # q (this rank's 6 rows), k and v (all 12 keys) read once, the output and log-sum-exp written once
        assert (fwd.read, fwd.written) == (B * 6 * H * D + 2 * B * T * H * D, B * 6 * H * D + B * H * 6)
        assert c.kernels[fwd] == 1


CFG = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=4, vocab=64, dropout=0.0)


def test_fp8_weight_casts_are_counted_once_a_step_and_fused_accumulation_drops_the_gradient_adds():
    (one,) = gpt_ledger(CFG, 1, 1, 1, microbatches=1, fp8=True)
    (four,) = gpt_ledger(CFG, 1, 1, 1, microbatches=4, fp8=True)
    casts = {st: {k: n for k, n in st.kernels if k.op == "fp8_weight_cast"} for st in (one, four)}
    assert casts[one] and casts[four] == casts[one]  # the weights' casts, once a step however many microbatches
    inputs = {st: sum(n for k, n in st.kernels if k.op == "fp8_cast" and k.phase == "forward") for st in (one, four)}
    assert inputs[four] == 4 * inputs[one] > 0  # the inputs' casts, each microbatch
    adds = sum(k.nbytes * n for k, n in four.kernels if k.op == "add" and k.kind == "grads")
    assert adds > 0
    plain, fused = kernel_bytes(four.kernels, "bf16-mixed"), kernel_bytes(four.kernels, "bf16-mixed", True)
    grads = sum((k.read + k.written) * 4 * n for k, n in four.kernels if k.op == "add" and k.kind == "grads")
    assert plain["backward"] - fused["backward"] == grads


def test_the_fp8_columns_dx_sum_is_counted_as_the_unfused_rules():
    """QKV's three products' dX summed in the column's backward: the add kernels the Megatron rule counts
    (spmdsim.nn.autograd.rules.megatron), which spmdsim's graph (separate products, summed elsewhere) does not,
    the FP8 column counts alike."""
    def adds(**options):
        (st,) = gpt_ledger(CFG, 1, 1, 1, **options)
        return {(k.read, k.written): n for k, n in st.kernels
                if k.op == "add" and k.kind == "activations" and k.phase == "backward"}
    graph, megatron, fp8 = adds(), adds(kept="megatron"), adds(fp8=True)
    rule = {key: n for key, n in megatron.items() if key not in graph}
    assert rule and all(fp8.get(key) == n for key, n in rule.items())
