"""ZeRO-3 under bf16-mixed: what the gathers and the Reduce_scatters move.

The parameters are bfloat16 and their gradients float32 (Megatron's main_grad, spmdsim.base.precision's
bf16-mixed): each layer's one gather moves 2 bytes an element and its gradients are reduce-scattered in float32,
4 bytes an element, by one Reduce_scatter, which is FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32). The steps are checked against one numpy process under the same policy.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.params import param_specs
from spmdsim.models.gpt.train import train
from spmdsim.runtime.trace import collect_trace

pytest.importorskip("ml_dtypes")


def test_zero3_under_bf16_mixed_gathers_bfloat16_and_reduce_scatters_float32():
    dp = 4
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=8, dropout=0.0)

    def body():
        with collect_trace() as trace:
            _, results = train(cfg, spmdsim.world(), dp, 1, 2, encode(load_text()), zero=3, precision="bf16-mixed")
        return trace.entries, results

    entries, results = spmdsim.simulate(dp, body)[0]
    for r in results:  # the check ran under the policy: loss, gradients and parameters within its tolerances
        assert all(e <= t for e, t in zip(r.errors, r.tolerances)), (r.errors, r.tolerances)
    layer = sum(int(np.prod(s.shape)) for s in param_specs(cfg) if s.name.startswith("h0."))  # its elements
    steps = len(results)

    def moved(op: str, key: str, unit: str) -> list:
        return [getattr(e, key) for e in entries if e.op == op and e.axes == ("dp",) and f" {unit} " in e.label]

    # (n-1)/n of the layer's elements a call: its one Allgather twice a step at 2 bytes an element, its one
    # Reduce_scatter once at 4 (spmdsim.nn.fsdp_flat)
    assert moved("allgather", "bytes_received", "h0") == [layer * 2 * (dp - 1) // dp] * (2 * steps)
    assert moved("reduce_scatter", "bytes_sent", "h0") == [layer * 4 * (dp - 1) // dp] * steps


def test_the_position_tables_gradient_is_reduce_scattered_in_float32_as_zero0s():
    """wpe's view (reshaped for the add) read the gathered table, not a leaf, and so rounded its gradient to
    bfloat16 as an activation's, after an Allreduce of the whole float32 table over dp: 2 (n-1)/n of its
    bytes, and a rounding the unsharded run does not make. A parameter moved is a parameter: the gradient
    stays float32 and pending, and the root's Reduce_scatter (the gather's conjugate) sums it with the root's other
gradients, (n-1)/n of their float32 bytes; the steps
    are the unsharded run's, bit for bit."""
    dp = 8
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=8, dropout=0.0)

    def body(zero):
        with collect_trace() as trace:
            _, results = train(cfg, spmdsim.world(), dp, 1, 2, encode(load_text()), zero=zero, precision="bf16-mixed")
        return trace.entries, [r.loss for r in results], [r.errors for r in results]

    (entries, losses, errors), (_, losses0, errors0) = (spmdsim.simulate(dp, body, zero)[0] for zero in (3, 0))
    assert losses == losses0 and errors == errors0  # the same rounding as the unsharded run's
    root = sum(int(np.prod(s.shape)) for s in param_specs(cfg) if not s.name.startswith("h0."))  # wpe's unit
    sums = [e for e in entries if e.axes == ("dp",) and e.op == "allreduce" and e.label != "cross_entropy"]
    assert [e for e in sums if e.label != "check"] == []  # no parameter's gradient all-reduced over dp
    scatters = [e.bytes_sent for e in entries if e.op == "reduce_scatter" and " root " in e.label]
    assert scatters == [root * 4 * (dp - 1) // dp] * 2  # the root's gradients in float32, one Reduce_scatter a step
