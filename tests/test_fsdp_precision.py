"""ZeRO-3 under bf16-mixed: what the gathers and the Reduce_scatters move.

The parameters are bfloat16 and their gradients float32 (Megatron's main_grad, spmdsim.base.precision's
bf16-mixed): each layer's gathers move 2 bytes an element and its gradients are reduce-scattered in float32,
4 bytes an element, which is FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32). The
steps are checked against one numpy process under the same policy.
"""
from __future__ import annotations

import collections

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
    layer = [s for s in param_specs(cfg) if s.name.startswith("h0.")]
    elements = [s.shape[0] * (s.shape[1] if len(s.shape) > 1 else 1) for s in layer]
    steps = len(results)

    def moved(op: str, key: str) -> collections.Counter:
        return collections.Counter(getattr(e, key) for e in entries if e.op == op and e.axes == ("dp",))

    gathers, scatters = moved("allgather", "bytes_received"), moved("reduce_scatter", "bytes_sent")
    # (n-1)/n of each parameter's elements a call: gathered twice a step, reduce-scattered once (at these sizes
    # no 2-byte count of one parameter is a 4-byte count of another)
    for n in elements:
        assert gathers[n * 2 * (dp - 1) // dp] >= 2 * steps * elements.count(n)
        assert scatters[n * 4 * (dp - 1) // dp] >= steps * elements.count(n)


def test_the_position_tables_gradient_is_reduce_scattered_in_float32_as_zero0s():
    """wpe's view (reshaped for the add) read the gathered table, not a leaf, and so rounded its gradient to
    bfloat16 as an activation's, after an Allreduce of the whole float32 table over dp: 2 (n-1)/n of its
    bytes, and a rounding the unsharded run does not make. A parameter moved is a parameter: the gradient
    stays float32 and pending, and the gather's conjugate reduce-scatters it, (n-1)/n of its bytes; the steps
    are the unsharded run's, bit for bit."""
    dp = 8
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=8, dropout=0.0)

    def body(zero):
        with collect_trace() as trace:
            _, results = train(cfg, spmdsim.world(), dp, 1, 2, encode(load_text()), zero=zero, precision="bf16-mixed")
        return trace.entries, [r.loss for r in results], [r.errors for r in results]

    (entries, losses, errors), (_, losses0, errors0) = (spmdsim.simulate(dp, body, zero)[0] for zero in (3, 0))
    assert losses == losses0 and errors == errors0  # the same rounding as the unsharded run's
    wpe = cfg.seq * cfg.d_model * 4  # float32 bytes of the table's gradient
    sums = [e for e in entries if e.axes == ("dp",) and e.op == "allreduce" and e.label != "cross_entropy"]
    assert [e for e in sums if e.label != "check"] == []  # no parameter's gradient all-reduced over dp
    scatters = collections.Counter(e.bytes_sent for e in entries if e.op == "reduce_scatter")
    assert scatters[wpe * (dp - 1) // dp] == 2  # one a step
