"""ZeRO-3 composed with expert parallelism (spmdsim.nn.fsdp on the MoE GPT's (dp, ep, tp) mesh): the experts'
parameters sharded over dp, the ranks that hold the same experts (the expert-data-parallel group), the dense
ones over dp x ep, as Megatron-Core and DeepSpeed shard them. Every step checked against one numpy process;
each layer's gathers and Reduce_scatters (one per group of its parameters on the same axes) read from the trace,
on their own axes, against its parameters' bytes; the MoE layer's backward holds no gathered expert between its forward
and its backward."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.models.moe import MoEConfig
from spmdsim.runtime.trace import collect_trace

CFG = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=8, dropout=0.1, moe=MoEConfig(experts=4, every=2))
TEXT = encode(load_text(20_000))
DP, EP, TP = 2, 2, 2


def _block_bytes(layout, shape, rank, itemsize=8) -> int:
    return int(np.prod([stop - start for start, stop in layout.bounds(rank, shape)])) * itemsize


def test_zero3_with_experts_shards_them_over_dp_and_the_dense_layers_over_dp_x_ep():
    def body():
        comm = spmdsim.world()
        with collect_trace() as trace:
            model, _ = train(CFG, comm, DP, TP, 1, TEXT, zero=3, ep=EP, check=False)  # (checked below)
        fs = model.fsdp
        sizes = {n: (fs.layouts[n], tuple(p.global_shape), fs.axes[n], p.local.shape) for n, p in model.params.items()}
        units = [model._unit(None)] + [model._unit(layer) for layer in range(CFG.layers)]
        return trace.entries, units, sizes, comm.Get_rank()

    for entries, units, sizes, rank in spmdsim.simulate(DP * EP * TP, body):
        experts = {n for n in sizes if ".moe.w" in n or ".moe.b" in n}  # (the router is dense)
        assert experts and all(sizes[n][2] == ("dp",) for n in experts)  # the ranks that hold the same experts
        assert all(axes == ("dp", "ep") for n, (_, _, axes, _) in sizes.items() if n not in experts)
        shards = {n: DP * (1 if n in experts else EP) for n in sizes}
        for n, (layout, shape, _, held) in sizes.items():  # 1/dp of its ep and tp block, or 1/(dp ep) of its tp one
            assert int(np.prod(held)) * 8 * shards[n] == _block_bytes(layout, shape, rank), n
        need = {n: _block_bytes(layout, shape, rank) * (shards[n] - 1) // shards[n]
                for n, (layout, shape, _, _) in sizes.items()}
        # each unit's parameters in groups by their axes (in the order of each group's first parameter): one
        # Allgather and one Reduce_scatter a group (spmdsim.nn.fsdp_flat)
        groups = []
        for unit in units:
            by_axes: dict = {}
            for n in unit:
                by_axes[sizes[n][2]] = by_axes.get(sizes[n][2], 0) + need[n]
            groups.append(list(by_axes.items()))
        root, layers = groups[0], groups[1:]
        order = root + [g for unit in layers for g in unit] + [g for unit in reversed(layers) for g in unit]
        gathers = [e for e in entries if e.op == "allgather" and e.axes in (("dp",), ("dp", "ep"))]
        assert [(e.axes, e.bytes_received) for e in gathers] == order
        assert len(groups[2]) == 2  # the MoE layer: its experts over dp, its dense parameters over dp x ep
        scatters = [e for e in entries if e.op == "reduce_scatter"]
        assert sorted((e.axes, e.bytes_sent) for e in scatters) == sorted(g for unit in groups for g in unit)
        moe_layer = [n for n in units[2] if n in experts]  # h1's experts: (dp-1)/dp of their blocks, each way
        assert sum(need[n] for n in moe_layer) == sum(
            e.bytes_sent for e in scatters if e.axes == ("dp",))
        assert not any(e.label.startswith("gradient bucket") and "dp" in e.axes for e in entries)  # no whole one


def test_the_moe_layer_keeps_no_gathered_expert_for_its_backward():
    """What the graph keeps after the forward is ZeRO-0's: the experts' weights are read again by the
    backward (gathered again under ZeRO-3), not held by the layer's node from its forward."""
    def body(zero):
        _, results = train(CFG, spmdsim.world(), DP, TP, 1, TEXT, zero=zero, ep=EP, check=False, memory=True)
        return dict(results[0].memory.kept)

    for dense, sharded in zip(spmdsim.simulate(8, body, 0), spmdsim.simulate(8, body, 3)):
        assert sharded["mlp"] == dense["mlp"] > 0, (dense, sharded)


@pytest.mark.parametrize("flags", [{}, {"replay": True}, {"recompute": "full"}, {"precision": "bf16-mixed"}])
def test_zero3_with_experts_steps_as_one_numpy_process(flags):
    steps = spmdsim.simulate(8, lambda: train(CFG, spmdsim.world(), DP, TP, 2, TEXT, zero=3, ep=EP, **flags)[1])[0]
    assert all(r.passed and all(e <= t for e, t in zip(r.errors, r.tolerances)) for r in steps), steps


def test_zero3_with_experts_over_a_pipeline_matches_one_numpy_process():
    cfg = GPTConfig(layers=4, d_model=16, heads=4, seq=8, batch=8, dropout=0.1, moe=MoEConfig(experts=4, every=2))

    def body():
        with collect_trace() as trace:
            _, results = train_pipelined(cfg, spmdsim.world(), 2, 2, 1, 2, TEXT, microbatches=2, zero=3, ep=2)
        return results, {(e.op, e.axes) for e in trace.entries}

    for results, kinds in spmdsim.simulate(8, body):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
        assert {("reduce_scatter", ("dp",)), ("reduce_scatter", ("dp", "ep"))} <= kinds


def test_the_estimates_dry_run_holds_the_runs_sharded_states_and_gathered_layers():
    """`spmdsim estimate --zero 3 --experts N --ep E` dry-runs the fully sharded step with experts: its
    parameters, gradients, optimizer states, buffers and gathered parameters are what the real run holds on
    each rank (the kept activations may differ: the dry run routes balanced)."""
    from spmdsim.tools.estimate.ledger import gpt_ledger

    [stage] = gpt_ledger(CFG, 1, DP, TP, zero=3, ep=EP)
    real = spmdsim.simulate(8, lambda: train(CFG, spmdsim.world(), DP, TP, 1, TEXT, zero=3, ep=EP, check=False,
                                             memory=True)[1][0].memory)
    fields = ("params", "grads", "states", "buffers", "gathered", "gathered_kept", "grads_peak")
    for report in real:
        assert all(getattr(report, f) == getattr(stage.memory, f) for f in fields), (report, stage.memory)
    assert stage.memory.gathered > 0 and stage.expert_params > 0
