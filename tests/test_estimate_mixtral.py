"""Megatron-Core's Mixtral 8x7B row of docs/explanation/estimate-h100.md: what the
comparison rests on, on a model of the row's mesh and options with small widths.

The row's mapping (Megatron-LM's MoE README, "Reference Best Parallel Mapping"): 64 GPUs, tp 1, ep 8, pp 4 with 8
virtual stages, micro-batch 1, batch 256, top-2 of 8 experts, dropless, the all-to-all dispatcher. Megatron's
expert-parallel group is a sub-group of its data-parallel one (dp 16 for attention = spmdsim's dp 2 x ep 8), so
the dense gradients are summed over 16 ranks and the experts' over 2; the eight ranks of an expert-parallel group
are one node's, so the tokens' all-to-all runs on NVLink."""
from __future__ import annotations

import json

from docs_commands import run_here

LAYERS, HIDDEN, HEADS, KV, FFN, SEQ, VOCAB, EXPERTS, TOP_K, BATCH = 32, 64, 4, 2, 128, 16, 128, 8, 2, 256
PP, VIRTUAL, DP, EP = 4, 8, 2, 8
ROW = ["estimate", "gpt", "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--kv-heads",
       str(KV), "--ffn", str(FFN), "--norm", "rms", "--mlp", "swiglu", "--untied", "--rope", "--no-bias", "--dropout",
       "0", "--attention", "flash", "--vocab", str(VOCAB), "--seq", str(SEQ), "--micro-batch", "1", "--global-batch",
       str(BATCH), "--tp", "1", "--pp", str(PP), "--virtual-stages", str(VIRTUAL), "--dp", str(DP), "--experts",
       str(EXPERTS), "--ep", str(EP), "--top-k", str(TOP_K), "--moe-every", "1", "--dropless", "--zero", "1",
       "--kept", "megatron", "--machine", "h100-dgx", "--overlap", "pp", "--gradient-accumulation-fusion", "--json"]


def _row() -> dict:
    code, out, err = run_here("main", ROW)
    assert code == 0, err
    return json.loads(out)


def _megatron_flops(batch: int, seq: int, layers: int, hidden: int, heads: int, groups: int, ffn: int, top_k: int,
                    vocab: int) -> int:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, MCore v0.9: the count its
    "TFLOP/s/GPU" divides; a 128-dimension head, SwiGLU's 3/2, top-k experts a token, every score of the causal
    square), in integers: 12 B s L h^2 (1 + g/a + s/h + f/h k 3/2 + V/(2 L h))."""
    per_token_layer = 12 * hidden * hidden + 12 * hidden * hidden * groups // heads + 12 * seq * hidden \
        + 18 * ffn * hidden * top_k
    return batch * seq * (layers * per_token_layer + 6 * hidden * vocab)


def test_the_rows_model_flops_are_megatrons_count_and_the_routers_product():
    """The dry run's model FLOPs (the forward and backward products, all ranks) are Megatron's count plus the
    router's (h x E, forward and both backward products: 6 h E a token a layer, which Megatron leaves out: at
    the row's sizes 7.6e-5 of the step), integer for integer: spmdsim's TFLOP/s and Megatron's published ones
    divide the same work."""
    d = _row()
    megatron = _megatron_flops(BATCH, SEQ, LAYERS, HIDDEN, HEADS, KV, FFN, TOP_K, VOCAB)
    router = 6 * HIDDEN * EXPERTS * BATCH * SEQ * LAYERS
    assert d["utilization"]["model_flops"] == megatron + router
    assert d["utilization"]["gpus"] == PP * DP * EP == 64
    assert d["microbatches"] == BATCH // (DP * EP) == 16


def test_the_tokens_all_to_all_stays_on_nvlink_and_each_gradient_is_summed_over_its_own_group():
    """Each stage's ranks send the tokens' all-to-all on node links only: 4 Alltoallv (dispatch and combine,
    forward and backward) a MoE layer a microbatch, each the rank's k s tokens of h bf16 values but the 1/ep it
    routes to its own experts; and its
    ZeRO-1 reduce-scatter sends (g - 1)/g of each fp32 gradient buffer, g = dp x ep = 16 for the attention's,
    the embedding's and the head's, g = dp = 2 for the experts' (Megatron's expert data-parallel group)."""
    d = _row()
    layers_a_stage = LAYERS // PP
    for stage in d["stages"]:
        sent = stage["sent"]
        assert "alltoallv cluster" not in sent
        # (routed balanced: 1/ep of a rank's rows go to its own experts, copied within the rank)
        assert sent["alltoallv node"] == (4 * layers_a_stage * d["microbatches"] * TOP_K * SEQ * HIDDEN * 2
                                          * (EP - 1) // EP)
        experts, dense = stage["expert_params"], stage["params"] - stage["expert_params"]
        assert experts == layers_a_stage * EXPERTS // EP * 3 * HIDDEN * FFN
        assert sent["reduce_scatter cluster"] == 4 * dense * (DP * EP - 1) // (DP * EP) + 4 * experts * (DP - 1) // DP
