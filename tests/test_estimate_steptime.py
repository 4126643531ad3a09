"""Predicted step time (spmdsim.tools.estimate.steptime): hand-computed seconds, the bubble, overlap, refusals."""
from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import replace

import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.machine_records import GemmEfficiency, Link
from spmdsim.tools.estimate.records import Calls
from spmdsim.tools.estimate.steptime import SCHEDULES, Pipeline, StepTime, level_model, step_time
from spmdsim.programs.pipeline.schedule import SCHEDULES as PIPELINE_SCHEDULES

# A stand-in for spmdsim.base.flop_counts.Gemm (not on this branch): the same fields, flops = 2 batch m n k.
_Gemm = namedtuple("_Gemm", "batch m n k dtype phase flops")


def gemm(batch, m, n, k, dtype="bf16", phase="forward"):
    return _Gemm(batch, m, n, k, dtype, phase, 2 * batch * m * n * k)


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12)


# The datasheet machine (links and HBM at their full rates): the formulas below read its figures.
# Without the waves and the batched table (tests/test_estimate_machine.py, test_estimate_gemm_shapes.py check
# them): the GEMMs at the capped roofline alone.
_SHIPPED = load_machine("a100-dgx")
A100 = replace(_SHIPPED, node=Link(300e9, 2e-6), cluster=Link(25e9, 5e-6), hbm_efficiency=None,
               gemm_efficiency=replace(_SHIPPED.gemm_efficiency, waves=None, model="roofline", batched=None))
#: The a100-dgx's GEMM cap: 271.2 TFLOP/s measured, at the 1305 of 1410 MHz the A100 sustains (its file's source).
CAP = 0.8045


def test_achieved_fractions_and_memory_bound_kernels():
    shipped = load_machine("a100-dgx")
    n = 1 << 26
    st = step_time(shipped, [], [Calls("allreduce", 8, n, "node", "layers")],
                   traffic={"forward": 3 << 30, "backward": 5 << 30, "optimizer": 7 << 30})
    # the ring's bytes at the bus bandwidth NCCL achieves (0.775 of 300 GB/s), not the datasheet's
    assert close(st.comm_s, 2 * 7 * 2e-6 + 2 * 7 / 8 * n / (300e9 * 0.775))
    hbm = 2039e9 * 0.88
    assert close(st.memory_s, (8 << 30) / hbm) and close(st.optimizer_s, (7 << 30) / hbm)
    assert dict(st.memory_by_phase) == pytest.approx({"forward": (3 << 30) / hbm, "backward": (5 << 30) / hbm,
                                                      "recompute": 0.0}, rel=1e-12)
    assert close(st.total_s, st.comm_s + st.memory_s + st.optimizer_s)
    # the bubble counts the element-wise kernels (one microbatch's forward and backward), not the optimizer's
    piped = step_time(shipped, [], [], pipeline=Pipeline(4, 2), traffic={"forward": 1 << 30, "optimizer": 1 << 30})
    assert close(piped.bubble_s, 3 * ((1 << 30) / hbm) / 2)
    # the backward's element-wise kernels hide gradient sums too
    grads = Calls("reduce_scatter", 64, 1 << 20, "cluster", "gradients")
    hidden = step_time(shipped, [], [grads], overlap=("gradients",), traffic={"backward": 1 << 40})
    assert close(hidden.hidden_s, hidden.comm_s)


def test_compute_is_flops_over_peak_times_efficiency():
    big, thin = gemm(2, 4096, 8192, 4096), gemm(1, 1, 8192, 4096, "fp32", "backward")
    st = step_time(A100, [(big, 3), (thin, 5)], [])
    big_s = 3 * (2 * 2 * 4096 * 8192 * 4096) / (312e12 * CAP)
    # The thin product is memory-bound: its seconds are its bytes over the HBM bandwidth.
    thin_bytes = 4 * (1 * 4096 + 4096 * 8192 + 1 * 8192)
    thin_s = 5 * thin_bytes / 2039e9
    assert close(st.compute_s, big_s + thin_s)
    assert dict(st.compute_by_phase) == pytest.approx({"forward": big_s, "backward": thin_s, "recompute": 0.0},
                                                      rel=1e-12)
    assert st.comm_s == st.bubble_s == st.hidden_s == 0 and close(st.total_s, big_s + thin_s)


def test_communication_uses_the_cost_model_formulas_per_level():
    n = 1 << 26
    transfers = [Calls("allreduce", 8, n, "node", "layers", 2),
                 Calls("allgather", 4, n, "cluster", "layers"),
                 Calls("reduce_scatter", 16, n, "cluster", "gradients", 3),
                 Calls("send", 2, n, "cluster", "pipeline", 4), Calls("recv", 2, n, "node", "pipeline"),
                 Calls("alltoall", 1, n, "node", "layers", 9)]  # a group of one costs nothing
    st = step_time(A100, [], transfers)
    a_node, b_node = 2e-6, 1 / 300e9
    a_cl, b_cl = 5e-6, 1 / 25e9
    allreduce = 2 * (2 * 7 * a_node + 2 * 7 / 8 * n * b_node)  # ring, gamma 0 (no reduction rate)
    allgather = 3 * a_cl + 3 / 4 * n * b_cl
    reduce_scatter = 3 * (15 * a_cl + 15 / 16 * n * b_cl)
    send, recv = 4 * (a_cl + n * b_cl), a_node + n * b_node
    level = dict(st.comm_by_level)
    assert close(level["node"], allreduce + recv) and close(level["cluster"], allgather + reduce_scatter + send)
    phase = dict(st.comm_by_phase)
    assert close(phase["layers"], allreduce + allgather)
    assert close(phase["gradients"], reduce_scatter) and close(phase["pipeline"], send + recv)
    assert close(st.comm_s, allreduce + allgather + reduce_scatter + send + recv) and close(st.total_s, st.comm_s)


def test_a_ring_across_nodes_takes_its_members_ports_side_by_side():
    """A ring collective of a "cluster" group with `lanes` members on the rank's node: its bytes at `lanes`
    ports' bandwidth (beta / lanes), no faster than the node's links (beta_node), alpha unchanged; an alltoall and
    a message at one port's, whatever their lanes (spmdsim.tools.estimate.links.lane_model)."""
    n = 1 << 26
    a_cl, b_cl, b_node = 5e-6, 1 / 25e9, 1 / 300e9

    def seconds(kind, group, lanes):
        return step_time(A100, [], [Calls(kind, group, n, "cluster", "gradients", lanes=lanes)]).comm_s

    assert close(seconds("reduce_scatter", 32, 4), 31 * a_cl + 31 / 32 * n * b_cl / 4)
    assert close(seconds("allgather", 32, 2), 31 * a_cl + 31 / 32 * n * b_cl / 2)
    assert close(seconds("allreduce", 32, 8), 2 * 31 * a_cl + 2 * 31 / 32 * n * b_cl / 8)
    assert close(seconds("allreduce", 64, 16), 2 * 63 * a_cl + 2 * 63 / 64 * n * b_node)  # 16 x 25 > 300 GB/s
    assert close(seconds("alltoall", 32, 4), seconds("alltoall", 32, 1))
    assert close(seconds("reduce_scatter", 32, 1), 31 * a_cl + 31 / 32 * n * b_cl)
    node = step_time(A100, [], [Calls("allreduce", 8, n, "node", "layers", lanes=1)]).comm_s
    assert close(node, 2 * 7 * 2e-6 + 2 * 7 / 8 * n * b_node)


def test_a_ledger_row_has_its_groups_members_on_the_node_as_lanes():
    """spmdsim.tools.estimate.transfers.placed: dp 8 x tp 2 on nodes of 4 (ranks tp fastest): a dp group holds 2
    ranks of each node, so its cluster rows have lanes 2; tp's rows stay within a node (lanes 1); a row over
    the whole mesh (the loss's mean) has 4 members a node."""
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.0)
    (stage,) = gpt_ledger(cfg, 1, 8, 2, sp=True, zero=1, gpus_per_node=4)
    sums = [t for t in stage.transfers if t.phase == "gradients"]
    assert sums and {(t.level, t.lanes) for t in sums} == {("cluster", 2)}
    assert {(t.group, t.level, t.lanes) for t in stage.transfers} <= {(2, "node", 1), (8, "cluster", 2),
                                                                       (16, "cluster", 4)}
    assert {t.group for t in stage.transfers} >= {2, 8}


def test_a_pipelines_messages_have_at_most_their_two_ranks_as_lanes():
    """pp 8 x dp 2 on nodes of 8: a node holds 4 of a pipeline's 8 stages, and its messages (a group of 2, the
    sender and the receiver) were given lanes 4, which the step time refused: `spmdsim estimate gpt --pp 8
    --dp 2` exited 2 with "transfer lanes 4 must be an integer from 1 to its group 2". A message between two stages
    of one node is a "node" row, lanes 1 (tests/test_estimate_pipeline_hops.py)."""
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(layers=8, d_model=32, heads=4, seq=16, batch=4, dropout=0.0)
    stages = gpt_ledger(cfg, 8, 2, 1, microbatches=2, gpus_per_node=8)
    messages = {(t.kind, t.group, t.level, t.lanes) for st in stages for t in st.transfers if t.phase == "pipeline"}
    assert messages == {("send", 2, "cluster", 2), ("recv", 2, "cluster", 2), ("send", 2, "node", 1),
                        ("recv", 2, "node", 1)}
    assert all(step_time(A100, [], st.transfers).comm_s > 0 for st in stages)


@pytest.mark.parametrize("lanes", [0, 3, True, 1.5])
def test_lanes_outside_the_group_are_refused_in_one_line(lanes):
    with pytest.raises(SpmdsimError) as info:
        step_time(A100, [], [Calls("allgather", 2, 64, "cluster", "layers", lanes=lanes)])
    assert str(info.value) == f"transfer lanes {lanes!r} must be an integer from 1 to its group 2 (the group's " \
                              "members on a node)"


def test_a_reduction_rate_and_the_tree_algorithm_reach_the_formulas():
    m = replace(A100, reduction_rate=100e9, algorithm="tree")
    n = 1 << 20
    st = step_time(m, [], [Calls("allreduce", 8, n, "node", "layers")])
    # tree allreduce: log2(g) (alpha + n beta + n gamma)
    assert close(st.comm_s, 3 * (2e-6 + n / 300e9 + n / 100e9))
    model = level_model(m, "cluster")
    assert (model.alpha_s, model.beta_s_per_byte, model.gamma_s_per_byte, model.algorithm) == (
        5e-6, 1 / 25e9, 1 / 100e9, "tree")


def test_pipeline_bubble_is_p_minus_1_over_v_microbatch_times():
    g = gemm(1, 4096, 4096, 4096)
    compute = 10 * g.flops / (312e12 * CAP)
    for pipeline, bubble in [(Pipeline(4, 16), 3 * compute / 16),
                             (Pipeline(4, 16, schedule="gpipe"), 3 * compute / 16),
                             (Pipeline(8, 32, 4, "interleaved"), 7 / 4 * compute / 32),
                             (Pipeline(1, 4), 0.0)]:
        st = step_time(A100, [(g, 10)], [Calls("send", 2, 1 << 20, "cluster", "pipeline", 8)],
                       pipeline=pipeline)
        assert close(st.bubble_s, bubble) if bubble else st.bubble_s == 0
        assert close(st.total_s, compute + st.comm_s + bubble)
    assert SCHEDULES == PIPELINE_SCHEDULES


def test_overlap_hides_named_phases_under_the_backward_compute():
    fwd, bwd, rec = gemm(1, 4096, 4096, 4096), gemm(1, 4096, 4096, 4096, phase="backward"), \
        gemm(1, 4096, 4096, 4096, phase="recompute")
    one = fwd.flops / (312e12 * CAP)
    grads = Calls("reduce_scatter", 64, 1 << 30, "cluster", "gradients")
    grad_s = 63 * 5e-6 + 63 / 64 * (1 << 30) / 25e9
    small = Calls("allreduce", 8, 1 << 20, "node", "gradients")
    small_s = 14 * 2e-6 + 14 / 8 * (1 << 20) / 300e9
    pairs = [(fwd, 1), (bwd, 2), (rec, 1)]
    plain = step_time(A100, pairs, [grads])
    assert plain.hidden_s == 0 and close(plain.total_s, 4 * one + grad_s)
    # More communication than backward + recompute compute (3 GEMMs): only the excess shows.
    hidden = step_time(A100, pairs, [grads], overlap=("gradients",))
    assert close(hidden.hidden_s, 3 * one) and close(hidden.total_s, one + grad_s)
    # Less: all of it hidden.
    quiet = step_time(A100, pairs, [small], overlap="gradients")
    assert close(quiet.hidden_s, small_s) and close(quiet.total_s, 4 * one)
    assert step_time(A100, pairs, [small], overlap=("layers",)).hidden_s == 0  # not the phase named


def test_lines_fit_100_columns_and_name_every_part():
    st = step_time(A100, [(gemm(1, 4096, 4096, 4096), 3), (gemm(1, 4096, 4096, 4096, phase="backward"), 6)],
                   [Calls("allreduce", 8, 1 << 28, "node", "layers", 4),
                    Calls("reduce_scatter", 64, 1 << 30, "cluster", "gradients")],
                   pipeline=Pipeline(4, 8), overlap=("gradients",))
    lines = st.lines()
    assert all(len(line) <= 100 for line in lines)
    assert lines[0] == "predicted step time of one rank on a100-dgx"
    names = [line[:24].strip() for line in lines[2:]]
    assert names == ["compute", "forward phase", "backward phase", "communication", "node links",
                     "cluster links", "layers phase", "gradients phase", "hidden by overlap", "pipeline bubble",
                     "step total"]
    assert lines[-1].endswith(f"{st.total_s * 1e3:,.3f}   100.0%")
    assert isinstance(st, StepTime) and hash(st) == hash(replace(st))


@pytest.mark.parametrize("call, line", [
    (lambda: step_time(A100, [(gemm(1, 2, 2, 2), -1)], []), "gemm count -1 must be an integer >= 0"),
    (lambda: step_time(A100, [], [], traffic={"warmup": 1}), "traffic phase 'warmup' is unknown; expected one of "
                                                           "('forward', 'backward', 'recompute', 'optimizer')"),
    (lambda: step_time(A100, [], [], traffic={"forward": -1}), "traffic bytes count -1 must be an integer >= 0"),
    (lambda: step_time(A100, [], [], traffic=[1]), "traffic [1] must be a mapping of phase to bytes, or None"),
    (lambda: step_time(A100, [(gemm(1, 2, 2, 2, "int8"), 1)], []),
     "gemm dtype 'int8' has no peak in machine 'a100-dgx'; expected one of ('bf16', 'fp16', 'tf32', 'fp32', "
     "'fp64')"),
    (lambda: step_time(A100, [(gemm(1, 2, 2, 2, phase="warmup"), 1)], []),
     "gemm phase 'warmup' is unknown; expected one of ('forward', 'backward', 'recompute')"),
    (lambda: step_time(A100, [(gemm(1, -2, 2, 2), 1)], []),
     "gemm dimensions (batch, m, n, k) (1, -2, 2, 2) must be integers >= 0"),
    (lambda: step_time(A100, [gemm(1, 2, 2, 2)], []), "gemms entry _Gemm(batch=1, m=2, n=2, k=2, dtype='bf16', "
                                                      "phase='forward', flops=16) must be a (gemm, count) pair"),
    (lambda: step_time(A100, [((1, 2), 1)], []), "gemm (1, 2) has no 'batch'; expected an object with batch, m, "
                                                 "n, k, dtype, phase and flops (spmdsim.base.flop_counts.Gemm)"),
    (lambda: step_time(A100, [], [Calls("allreduce", 8, 64, "rack", "layers")]),
     "transfer level 'rack' is unknown; expected one of ('node', 'cluster')"),
    (lambda: step_time(A100, [], [Calls("allreduce", 8, 64, "node", "layers", -2)]),
     "transfer count -2 must be an integer >= 0"),
    (lambda: step_time(A100, [], [Calls("scatter", 8, 64, "node", "layers")]),
     "transfer kind 'scatter' is unknown; expected one of ('allgather', 'reduce_scatter', 'allreduce', "
     "'alltoall', 'alltoallv', 'bcast', 'send', 'recv')"),
    (lambda: step_time(A100, [], [Calls("allreduce", 8, -64, "node", "layers")]),
     "transfer nbytes -64 must be an integer >= 0"),
    (lambda: step_time(A100, [], [Calls("allreduce", 0, 64, "node", "layers")]),
     "transfer group 0 must be an integer >= 1 (ranks in the communicator)"),
    (lambda: step_time(A100, [], [Calls("allreduce", 8, 64, "node", "idle")]),
     "transfer phase 'idle' is unknown; expected one of ('layers', 'gradients', 'pipeline', 'context', "
     "'parameters', 'updates')"),
    (lambda: step_time(A100, [], [], overlap=("recompute",)),
     "overlap phase 'recompute' is unknown; expected phases among ('layers', 'gradients', "
     "'pipeline', 'context', 'parameters', 'updates')"),
    (lambda: step_time("a100-dgx", [], []), "machine 'a100-dgx' is a str; expected a Machine "
                                            "(spmdsim.tools.estimate.machine.load_machine)"),
    (lambda: step_time(A100, [], [], pipeline=(4, 8)), "pipeline (4, 8) is a tuple; expected a Pipeline or None"),
    (lambda: Pipeline(0, 8), "pipeline stages 0 must be an integer >= 1"),
    (lambda: Pipeline(4, 8, schedule="zb"), "pipeline schedule 'zb' is unknown; expected one of ('gpipe', '1f1b', "
                                            "'interleaved')"),
    (lambda: Pipeline(4, 8, schedule="1F1B"), "pipeline schedule '1F1B' is unknown; expected one of ('gpipe', "
                                              "'1f1b', 'interleaved') (lower-case: '1f1b')"),
    (lambda: Pipeline(4, 8, 2), "pipeline schedule '1f1b' has one chunk per rank, not virtual_stages 2; "
                                "expected 1 (or schedule 'interleaved')"),
    (lambda: Link(-1.0, 0.0), "Link: key 'bandwidth' is -1.0; expected a number > 0 (bytes/s per GPU per "
                              "direction)"),
    (lambda: GemmEfficiency(0.0, "x"), "GemmEfficiency: key 'max_fraction' is 0.0; expected a number in (0, 1] "
                                       "(fraction of peak)"),
])
def test_every_bad_input_is_refused_in_one_line(call, line):
    with pytest.raises(SpmdsimError) as info:
        call()
    assert str(info.value) == line


def test_zero_sized_products_and_calls_cost_nothing():
    st = step_time(A100, [(gemm(1, 0, 4096, 4096), 5), (gemm(1, 64, 64, 64), 0)],
                   [Calls("allreduce", 8, 1 << 20, "node", "layers", 0)])
    assert st.total_s == 0


def test_tp_and_pp_overlap_hide_at_most_the_compute_they_run_under():
    """`overlap` "layers" (Megatron's --tp-comm-overlap) hides the layers' collectives under the products of every
    GEMM phase, not the element-wise kernels; "pipeline" (overlap_p2p_comm) the messages under the products and
    the kernels; each at most its own communication, all of them together at most the compute and kernels
    (the step is never shorter than its compute, nor than its communication). Before, "layers" and "pipeline"
    shared the gradients' window, the backward's, and --overlap did not exist."""
    fwd, bwd, rec = gemm(1, 4096, 4096, 4096), gemm(1, 4096, 4096, 4096, phase="backward"), \
        gemm(1, 4096, 4096, 4096, phase="recompute")
    one = fwd.flops / (312e12 * CAP)
    pairs = [(fwd, 1), (bwd, 2), (rec, 1)]
    traffic = {"forward": 1 << 30, "backward": 2 << 30}
    kernels_s = (3 << 30) / 2039e9
    big = {"layers": Calls("allreduce", 8, 1 << 34, "node", "layers"),
           "gradients": Calls("reduce_scatter", 64, 1 << 31, "cluster", "gradients"),
           "pipeline": Calls("send", 2, 1 << 31, "cluster", "pipeline", 2)}
    small = {"layers": Calls("allreduce", 8, 1 << 20, "node", "layers"),
             "pipeline": Calls("send", 2, 1 << 20, "cluster", "pipeline")}

    def comm(transfers):
        return dict(step_time(A100, pairs, transfers, traffic=traffic).comm_by_phase)

    seconds = comm(list(big.values()))
    assert seconds["layers"] > 4 * one + kernels_s and seconds["pipeline"] > 4 * one + kernels_s  # more than any window
    # the layers' collectives: at most the products (4 GEMMs), the kernels' seconds not theirs to hide under
    st = step_time(A100, pairs, [big["layers"]], traffic=traffic, overlap=("layers",))
    assert close(st.hidden_s, 4 * one) and dict(st.hidden_by_phase) == {"layers": st.hidden_s, "gradients": 0.0,
                                                                        "pipeline": 0.0, "context": 0.0,
                                                                        "parameters": 0.0, "updates": 0.0}
    assert close(st.total_s, st.compute_s + st.memory_s + st.comm_s - 4 * one)
    # the pipeline's messages: at most the products and the kernels, so the step is its communication
    st = step_time(A100, pairs, [big["pipeline"]], traffic=traffic, overlap="pipeline")
    assert close(st.hidden_s, 4 * one + kernels_s) and close(st.total_s, st.comm_s)
    # less than the window: all of it, and the step is its compute
    for phase in ("layers", "pipeline"):
        st = step_time(A100, pairs, [small[phase]], traffic=traffic, overlap=(phase,))
        assert close(st.hidden_s, st.comm_s) and close(st.total_s, 4 * one + kernels_s)
    # all three, each more than its window: the gradients first under the backward (3 GEMMs, its kernels), the
    # rest of the compute to the layers; together no more than the compute and the kernels
    st = step_time(A100, pairs, list(big.values()), traffic=traffic, overlap=("gradients", "layers", "pipeline"))
    hidden = dict(st.hidden_by_phase)
    assert close(hidden["gradients"], 3 * one + (2 << 30) / 2039e9)
    assert close(hidden["layers"], one + (1 << 30) / 2039e9) and hidden["pipeline"] == 0
    assert close(st.hidden_s, 4 * one + kernels_s) and close(st.total_s, st.comm_s)
    assert all(hidden[p] <= s for p, s in st.comm_by_phase)
    # the default (the gradients alone) is as it was: only the backward's window
    st = step_time(A100, pairs, list(big.values()), traffic=traffic, overlap=("gradients",))
    assert close(st.hidden_s, 3 * one + (2 << 30) / 2039e9)
    assert close(st.total_s, st.compute_s + st.memory_s + st.comm_s - st.hidden_s)
    names = [line[:24].strip() for line in st.lines()[2:]]
    assert names.count("gradients phase") == 1  # one phase hides: no rows of its own under "hidden by overlap"
    both = step_time(A100, pairs, [small["layers"], big["gradients"]], overlap=("gradients", "layers")).lines()
    assert [line[:24].strip() for line in both].count("layers phase") == 2  # its seconds, and those hidden


def test_gradient_sums_start_with_each_chunks_last_microbatch():
    """As DDP's no_sync and Megatron's --overlap-grad-reduce run them: a chunk's sums start with its last
    microbatch's backward, one chunk's after another on the link, under the backward left after it and the idle
    of stage s after its last backward (s microbatch-backwards); one microbatch: the whole backward, as before."""
    bwd = gemm(1, 4096, 4096, 4096, phase="backward")
    one = bwd.flops / (312e12 * CAP)  # one backward GEMM
    sums = Calls("allreduce", 8, 1 << 30, "cluster", "gradients")
    sums_s = 2 * 5e-6 * 7 + 2 * 7 / 8 * (1 << 30) / 25e9  # ring allreduce on the datasheet's cluster link
    pairs = [(bwd, 16)]
    backward = 16 * one

    def hidden(pipeline, stage=0):
        return step_time(A100, pairs, [sums], pipeline=pipeline, overlap="gradients", stage=stage).hidden_s

    assert sums_s > backward  # the sums outlast even the whole backward here
    assert close(hidden(None), backward) and close(hidden(Pipeline(1, 1)), backward)
    # 1F1B, 8 microbatches: stage 0 hides them under its last microbatch's backward alone; stage 3 also under
    # the 3 microbatch-backwards it idles after its last one
    t = backward / 8
    assert close(hidden(Pipeline(4, 8)), t) and close(hidden(Pipeline(4, 8), stage=3), 4 * t)
    assert close(hidden(Pipeline(1, 8)), t)  # gradient accumulation without a pipeline: the same rule
    # interleaved, 2 chunks a stage: chunk 1's half of the sums starts p backwards before chunk 0's last
    u = backward / 16  # a chunk's backward of one microbatch
    starts = [-(1 * 4 + 1) * u, -(0 * 4 + 1) * u]
    done = max(starts[0] + sums_s / 2, starts[1]) + sums_s / 2
    assert close(hidden(Pipeline(4, 8, 2, "interleaved")), sums_s - done)
    # sums shorter than one microbatch's backward: all hidden, at every stage
    small = Calls("allreduce", 8, 1 << 10, "cluster", "gradients")
    st = step_time(A100, pairs, [small], pipeline=Pipeline(4, 8), overlap="gradients")
    assert close(st.hidden_s, st.comm_s)
    with pytest.raises(SpmdsimError, match=r"^stage 4 must be an integer from 0 to 3 \(the pipeline's stages\)"):
        step_time(A100, pairs, [sums], pipeline=Pipeline(4, 8), stage=4)
