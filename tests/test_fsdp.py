"""Fully sharded data parallelism (ZeRO-3, spmdsim.nn.fsdp) on simulated ranks: the GPT trained with its
parameters sharded over dp, checked against one numpy process each step; the bytes of each layer's gathers
and reduce-scatters read from the trace against FSDP's formula; what the graph keeps of the gathered
parameters with and without resharding after forward; the refusals."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.errors import LayoutError, SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.memory import zero_problem
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.fsdp import GATHERED, fully_shard, sharded_layout
from spmdsim.nn.fsdp_flat import REDUCE_LABEL, SUM_LABEL
from spmdsim.runtime.trace import collect_trace

CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.1)
TEXT = encode(load_text(20_000))


@pytest.mark.parametrize("dp, tp, sp, reshard, recompute", [
    (4, 1, False, True, "none"), (2, 2, False, False, "none"), (2, 2, True, True, "full"),
    (2, 2, True, False, "full"), (2, 2, False, True, "selective")])
def test_zero3_steps_match_one_numpy_process(dp, tp, sp, reshard, recompute):
    steps = spmdsim.simulate(dp * tp, lambda: train(CFG, spmdsim.world(), dp, tp, 2, TEXT, sp=sp, zero=3,
                                                    recompute=recompute, reshard_after_forward=reshard)[1])[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps


def test_zero3_gives_zero0s_parameters_with_a_dpth_of_each():
    """Two steps under ZeRO-3 and ZeRO-0: every rank's shard is the rows of its ZeRO-0 block it holds."""
    def body(zero):
        model, _ = train(CFG, spmdsim.world(), 2, 2, 2, TEXT, zero=zero, check=False)
        return {n: (p.local.copy(), p.slices) for n, p in model.params.items()}

    dense, sharded = (spmdsim.simulate(4, body, zero) for zero in (0, 3))
    for rank in range(4):
        for name, (block, where) in sharded[rank].items():
            whole, own = dense[rank][name]
            rows = slice(where[0].start - own[0].start, where[0].stop - own[0].start)
            assert block.shape[0] * 2 == whole.shape[0]
            np.testing.assert_allclose(block, whole[rows], rtol=1e-12, atol=1e-15)


def _block_bytes(layout, shape, rank, itemsize=8) -> int:
    return int(np.prod([stop - start for start, stop in layout.bounds(rank, shape)])) * itemsize


def _traced_step(dp: int, tp: int, reshard: bool, sp: bool = False) -> list:
    def body():
        comm = spmdsim.world()
        with collect_trace() as trace:
            model, _ = train(CFG, comm, dp, tp, 1, TEXT, sp=sp, zero=3, check=False,
                             reshard_after_forward=reshard)
        units = [model._unit(None)] + [model._unit(layer) for layer in range(CFG.layers)]
        sizes = {n: (model.fsdp.layouts[n], tuple(p.global_shape)) for n, p in model.params.items()}
        return trace.entries, units, sizes, comm.Get_rank()

    return spmdsim.simulate(dp * tp, body)


@pytest.mark.parametrize("dp, tp, sp, reshard", [(4, 1, False, True), (4, 1, False, False), (2, 2, True, True),
                                                 (2, 2, False, False)])
def test_each_layers_gathers_and_reduce_scatters_move_fsdps_bytes(dp, tp, sp, reshard):
    """Each unit (the root: embedding, final norm, head; each layer) is gathered by one Allgather and its gradients
    reduce-scattered by one Reduce_scatter (spmdsim.nn.fsdp_flat): each rank receives (n-1)/n of the unit's
    parameters (its tensor-parallel block of them) in each gather, twice a step for a layer with resharding after
    forward (forward, then again for the backward), once without, the root once; and sends (n-1)/n of the unit's
    gradient blocks in its Reduce_scatter. Every gather in the order the units run, on the data axis."""
    for entries, units, sizes, rank in _traced_step(dp, tp, reshard, sp):
        need = {n: _block_bytes(layout, shape, rank) * (dp - 1) // dp for n, (layout, shape) in sizes.items()}
        per_unit = [sum(need[n] for n in unit) for unit in units]
        root, layers = per_unit[0], per_unit[1:]
        order = [root] + layers + (layers[::-1] if reshard else [])
        gathers = [e for e in entries if e.op == "allgather" and e.axes == ("dp",)]
        assert [e.bytes_received for e in gathers] == order
        scatters = [e for e in entries if e.op == "reduce_scatter" and e.axes == ("dp",)]
        assert sorted(e.bytes_sent for e in scatters) == sorted(per_unit)
        assert all(e.label.startswith(("fsdp all-gather", "fsdp reduce-scatter")) for e in gathers + scatters)
        # per layer: (n-1)/n of its parameters' bytes, times the gathers a step
        assert sum(e.bytes_received for e in gathers) == root + (2 if reshard else 1) * sum(layers)
        assert sum(e.bytes_sent for e in scatters) == sum(need.values())


def test_the_graph_keeps_the_gathered_layers_only_without_resharding():
    """After the forward: no gathered layer kept with resharding; every layer's gathered blocks without."""
    def body(reshard):
        model, results = train(CFG, spmdsim.world(), 2, 2, 1, TEXT, zero=3, check=False, memory=True,
                               reshard_after_forward=reshard)
        rank = spmdsim.world().Get_rank()
        layers = [n for layer in range(CFG.layers) for n in model._unit(layer)]
        whole = sum(_block_bytes(model.fsdp.layouts[n], tuple(model.params[n].global_shape), rank) for n in layers)
        return dict(results[0].memory.kept).get(GATHERED, 0), whole

    for reshard in (True, False):
        for kept, whole in spmdsim.simulate(4, body, reshard):
            assert kept == (0 if reshard else whole) and whole > 0


def test_sharded_layout_splits_dim_0_after_its_axes():
    mesh = Layout((2, 2), ("dp", "tp"))
    assert sharded_layout(mesh("tp", None), "dp") == mesh(("tp", "dp"), None)
    assert sharded_layout(mesh(None, "tp"), "dp") == mesh("dp", "tp")


def test_sharded_layout_is_made_once_per_layout_and_axes():
    mesh = Layout((2, 2), ("dp", "tp"))
    first = sharded_layout(mesh("tp", None), ("dp",))
    assert sharded_layout(mesh("tp", None), ("dp",)) is first and first == mesh(("tp", "dp"), None)
    assert sharded_layout(mesh("tp", None), ["dp"]) == first  # (axes given as a list: made, not kept)
    with pytest.raises(LayoutError, match="more than once"):
        sharded_layout(mesh("dp", None), "dp")


def test_fully_shard_refuses_in_one_line():
    def body():
        mesh = spmdsim.Mesh(Layout((2,), ("dp",)), roles={"data": "dp"})
        odd = spmdsim.DTensor.from_global(mesh, np.ones((3, 4)), mesh.layout(None, None))
        with pytest.raises(SpmdsimError, match=r"parameter 'w' dim 0 of size 3 is not divisible by 2 shards"):
            fully_shard({"w": odd}, mesh)
        with pytest.raises(SpmdsimError, match=r"reshard_after_forward 'yes' must be True or False"):
            fully_shard({"w": odd}, mesh, reshard_after_forward="yes")
        plain = spmdsim.Mesh(Layout((2,), ("x",)))
        with pytest.raises(SpmdsimError, match=r"names no data axis"):
            fully_shard({"w": spmdsim.DTensor.from_global(plain, np.ones((4,)), plain.layout(None))}, plain)
        said = []
        for args, kwargs in ((({"w": odd}, mesh.layout), {}), (({"w": np.ones(3)}, mesh), {}),
                             (({"w": odd}, mesh), {"axis": "zz"}), (({"w": odd}, mesh), {"axis": 5})):
            with pytest.raises(SpmdsimError) as caught:
                fully_shard(*args, **kwargs)
            said.append(str(caught.value))
        assert said == [
            "fully_shard: mesh must be a spmdsim Mesh, got Layout Layout(device_matrix=(2,), alias_name=('dp',)); "
            "pass the Mesh the parameters live on (Mesh(layout) makes one of a Layout)",
            "fully_shard: parameter 'w' must be a DTensor, got ndarray of shape (3,)",
            "fully_shard: axis 'zz' is not an axis of the mesh; expected one of ('dp',) or a tuple of them",
            "fully_shard: axis int 5 is not an axis of the mesh; expected one of ('dp',) or a tuple of them"]
        return True

    assert all(spmdsim.simulate(2, body))


def test_a_zero_stage_that_is_not_one_is_refused_in_one_line():
    assert zero_problem(3) is None
    assert "not 0, 1, 2 or 3" in zero_problem(4)


@pytest.mark.parametrize("cfg, dp, tp, rows", [
    (CFG, 2, 2, [32, 32, 32, 32]),  # 128 rows over tp 2 x dp 2
    # vocab 257 on dp 4: the embedding's rows cut unevenly (spmdsim.nn.fsdp.CUT), 65, 65, 65, 62
    (GPTConfig(layers=2, d_model=34, heads=2, seq=16, batch=8, vocab=257, dropout=0.1), 4, 1, [65, 65, 65, 62])])
def test_a_stopped_zero3_run_resumes_bit_for_bit(tmp_path, cfg, dp, tp, rows):
    """Saved after 2 steps and resumed to 4: the same losses and shards as the run that never stopped; a run
    that is not fully sharded resumes from the shards, its loss the unstopped run's within 1e-10."""
    where = str(tmp_path / "ckpt")

    def body(steps, **kw):
        model, results = train(cfg, spmdsim.world(), dp, tp, steps, TEXT, zero=3, **kw)
        return [r.loss for r in results], {n: p.local.copy() for n, p in model.params.items()}

    whole = spmdsim.simulate(4, body, 4)
    spmdsim.simulate(4, body, 2, save=where)
    resumed = spmdsim.simulate(4, body, 4, resume=where)
    for (losses, blocks), (tail, again) in zip(whole, resumed):
        assert tail == losses[2:]
        assert all(np.array_equal(blocks[n], again[n]) for n in blocks)
    assert [blocks["wte"].shape[0] for _, blocks in resumed] == rows
    # a run not fully sharded resumes too, each rank's blocks from the shards (spmdsim.models.gpt.reshard)
    plain = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), dp, tp, 4, TEXT, resume=where)[1])[0]
    assert [r.step for r in plain] == [2, 3] and all(r.passed for r in plain), plain
    assert plain[-1].loss == pytest.approx(whole[0][0][-1], rel=1e-10)


@pytest.mark.parametrize("reshard", [True, False])
def test_a_replayed_zero3_step_matches_one_numpy_process(reshard):
    """Step 0 captured, the later ones replayed (spmdsim.runtime.replay): the gathers, the gathers again for the
    backward and the Reduce_scatters are kernels of the captured step; every replayed step is checked."""
    steps = spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 3, TEXT, zero=3, replay=True,
                                              reshard_after_forward=reshard)[1])[0]
    assert len(steps) == 3 and all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert len({(r.calls, r.bytes_sent) for r in steps}) == 1


@pytest.mark.parametrize("flags, message", [
    (["--pp", "2", "--zero", "3", "--prefetch"], "--prefetch with a pipeline: its chunks are fully sharded over dp "
                                                 "and resharded after forward"),
    (["--zero", "3", "--reshard-after-forward", "maybe"], "--reshard-after-forward 'maybe' must be true or false"),
    # nothing is gathered without ZeRO-3: the flag ran as if not typed, exit 0 (its default, true, still runs)
    (["--reshard-after-forward", "false"], "--reshard-after-forward false is for ZeRO-3's gathered parameters: give "
                                           "--zero 3 with it"),
    (["--zero", "1", "--reshard-after-forward", "true"], "--reshard-after-forward true is for ZeRO-3's gathered "
                                                         "parameters: give --zero 3 with it")])
def test_train_gpt_refuses_what_zero3_does_not_compose_with_in_one_line(flags, message):
    from testkit import run_train_gpt, unfold

    out = run_train_gpt(["--ranks", "2", "--tp", "1", "--steps", "1"] + flags)
    assert out.returncode == 2 and " step" not in out.stdout, out.stdout
    assert unfold(out.stderr).strip().splitlines()[-1] == f"spmdsim: error: {message}"


@pytest.mark.parametrize("reshard", [True, False])
def test_the_dry_runs_ledger_is_the_real_runs_memory(reshard):
    """The estimate's ledger (spmdsim.tools.estimate.ledger.gpt_ledger: the dry run of the same step, shapes only)
    holds what a real run of the step measured on every rank: the bytes kept for backward by kind, the
    gradients, optimizer states, buffers, the peak of its looks and the most gathered parameters at once;
    the parameters' blocks within page rounding."""
    from spmdsim.models.gpt.sharded_run import train_sharded
    from spmdsim.tools.estimate.ledger import gpt_ledger

    ids = np.arange(2 * CFG.seq + 2, dtype=np.int64) % 128

    def body():
        run, steps = train_sharded(CFG, spmdsim.world(), 1, 2, 2, 1, ids, sp=True, memory=True, check=False,
                                   reshard_after_forward=reshard)
        run.close()
        return steps[-1].memory

    (stage,) = gpt_ledger(CFG, 1, 2, 2, sp=True, zero=3) if reshard else (None,)
    for real in spmdsim.simulate(4, body):
        dry = stage.memory if reshard else spmdsim.simulate(4, body, dry_run=True)[0]
        assert (real.kept, real.grads, real.master, real.states, real.buffers, real.gathered, real.grads_peak) == \
            (dry.kept, dry.grads, dry.master, dry.states, dry.buffers, dry.gathered, dry.grads_peak)
        assert 0 <= real.params - dry.params < 4096 * 40 and 0 <= real.peak - dry.peak < 4096 * 40
        assert dry.gathered > 0


def test_the_estimate_gives_zeros_figure_1_for_the_75b_model():
    """Rajbhandari et al. (ZeRO), Figure 1: Psi 7.5B, K 12, N_d 64; model states per rank (2 + 2 + K) Psi = 120 GB,
    P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB ((2 + 2 + K) Psi / N_d = 1.875 GB, rounded). The estimate's
    dry run of a 36-layer, hidden-4096 GPT (7,463,444,480 parameters) at fp16-mixed: each within 1% of the
    figure's formula at Psi = 7.5e9 (0.5% below, as its parameters are), and the formula at its own Psi (0.05%)."""
    import contextlib
    import io
    import json

    from spmdsim.tools.cli.main import main

    psi, k, nd = 7_463_444_480, 12, 64
    figure = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.875e9}
    own = {0: (4 + k) * psi, 1: 4 * psi + k * psi / nd, 2: 2 * psi + (2 + k) * psi / nd, 3: (4 + k) * psi / nd}
    for zero in (0, 1, 2, 3):  # in this process: four Pythons and their imports less (~0.6 CPU-s each)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["estimate", "gpt", "--layers", "36", "--hidden", "4096", "--heads", "32", "--seq", "1024",
                         "--vocab", "51200", "--micro-batch", "1", "--global-batch", "64", "--dp", "64", "--precision",
                         "fp16-mixed", "--zero", str(zero), "--json"]) == 0
        held = json.loads(out.getvalue())["stages"][0]["bytes"]
        states = sum(held[role] for role in ("parameters", "gradients", "master copy", "optimizer states"))
        assert abs(states / figure[zero] - 1) <= 0.01, (zero, states)
        assert abs(states / own[zero] - 1) <= 5e-4, (zero, states)


def _mlp_step(shard: bool, reshard: bool = True) -> dict:
    """One AdamW step of a two-layer MLP on 4 data-parallel ranks, fully sharded or not: name -> the rank's
    updated block, with where it lies (its slices)."""
    from spmdsim import DTensor, Mesh, ops
    from spmdsim.nn.autograd.engine import backward
    from spmdsim.nn.optim import AdamW

    def body():
        mesh = Mesh(Layout((4,), ("dp",)), roles={"data": "dp"})
        rng = np.random.default_rng(0)
        params = {name: DTensor.from_global(mesh, rng.standard_normal(shape) / 4, mesh.layout(None, None))
                  .requires_grad_() for name, shape in (("w1", (16, 32)), ("w2", (32, 8)))}
        x = DTensor.from_global(mesh, rng.standard_normal((8, 16)), mesh.layout("dp", None))
        if shard:
            fs = fully_shard(params, mesh, reshard_after_forward=reshard)
            h = fs.unit(["w1"], lambda h, used: ops.tanh(h @ used["w1"]), x)
            y = fs.unit(["w2"], lambda h, used: h @ used["w2"], h)
            params = fs.params
        else:
            y = ops.tanh(x @ params["w1"]) @ params["w2"]
        optimizer = AdamW(list(params.values()), lr=0.01)
        loss = ops.sum(y * y)
        backward(loss)  # unsharded: each gradient's dp sum at its leaf; sharded: reduce-scattered in the walk
        optimizer.step()
        return {n: (p.local.copy(), p.slices) for n, p in params.items()}

    return spmdsim.simulate(4, body)


@pytest.mark.parametrize("reshard", [True, False])
def test_fully_shard_trains_a_users_mlp_as_the_unsharded_one(reshard):
    """A user's two-layer MLP, each layer a unit: every rank's updated shard is its rows of the unsharded run's."""
    dense, sharded = _mlp_step(False), _mlp_step(True, reshard)
    for rank in range(4):
        for name, (block, where) in sharded[rank].items():
            whole = dense[rank][name][0]
            np.testing.assert_allclose(block, whole[where[0]], rtol=1e-12, atol=1e-14)


def _hsdp_mesh(dp: int, fs: int, tp: int):
    from spmdsim.models.axes import model_layout, roles_of

    shape, names = model_layout(tp, dp, fs=fs)
    return spmdsim.Mesh(Layout(shape, names), spmdsim.world(), roles=roles_of(names))


@pytest.mark.parametrize("reshard, sp", [(True, False), (False, True)])
def test_hybrid_sharding_on_a_2_by_2_data_parallel_mesh_matches_one_numpy_process(reshard, sp):
    """HSDP: (dp 2, fs 2, tp 2); each parameter sharded over fs, replicated over dp, the batch over both. Each
    layer's gathers and Reduce_scatters run over fs only; each unit's Reduce_scatter result is then summed over dp
    by one Allreduce (FSDP2's foreach_reduce), so no parameter's gradient is summed over dp on its own."""
    def body():
        with collect_trace() as trace:
            _, steps = train(CFG, spmdsim.world(), 4, 2, 2, TEXT, sp=sp, zero=3, mesh=_hsdp_mesh(2, 2, 2),
                             reshard_after_forward=reshard)
        return steps, [(e.op, e.axes, e.label) for e in trace.entries if "dp" in e.axes or "fs" in e.axes]

    steps, calls = spmdsim.simulate(8, body)[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    kinds = {(op, axes) for op, axes, _ in calls}
    assert {("allgather", ("fs",)), ("reduce_scatter", ("fs",)), ("allreduce", ("dp",))} <= kinds
    assert not {k for k in kinds if k[0] in ("allgather", "reduce_scatter") and "dp" in k[1]}
    scatters = [label for op, _, label in calls if op == "reduce_scatter"]
    sums = [label.replace(SUM_LABEL, REDUCE_LABEL) for op, axes, label in calls if op == "allreduce"
            and label.startswith(SUM_LABEL)]
    assert sums == scatters and len(sums) == 2 * (CFG.layers + 1), calls  # a unit's one sum, each of 2 steps
    assert all(axes == ("dp",) for op, axes, label in calls if label.startswith(SUM_LABEL))
    assert not [label for op, axes, label in calls if label.startswith("gradient bucket")]  # no leaf's own sum


@pytest.mark.parametrize("sp, precision", [(False, "fp64"), (True, "bf16-mixed")])
def test_hybrid_shardings_dry_run_holds_the_real_runs_memory_and_a_replay_the_same_calls(sp, precision):
    """HSDP on (dp 2, fs 2, tp 2): the dry run of a step (shapes only) holds, rank by rank, what the real run
    measured, each unit's Reduce_scatter result (float32 under bf16-mixed) summed over dp in place; a replayed
    step (spmdsim.runtime.replay) makes the captured step's calls and still matches one numpy process."""
    def body(replay):
        _, steps = train(CFG, spmdsim.world(), 4, 2, 1 + 2 * replay, TEXT, sp=sp, zero=3, mesh=_hsdp_mesh(2, 2, 2),
                         memory=not replay, check=replay, replay=replay, precision=precision)
        return steps

    fields = ("kept", "grads", "master", "states", "buffers", "gathered", "grads_peak", "peak", "params")
    for real, dry in zip(spmdsim.simulate(8, body, False), spmdsim.simulate(8, body, False, dry_run=True)):
        assert [getattr(real[-1].memory, f) for f in fields] == [getattr(dry[-1].memory, f) for f in fields]
    replayed = spmdsim.simulate(8, body, True)[0]
    assert all(r.passed for r in replayed), replayed  # (each step's check, at its precision's tolerances)
    assert len({(r.calls, r.bytes_sent) for r in replayed}) == 1


def test_a_shard_group_is_refused_in_one_line_unless_it_divides_dp_under_zero3():
    from spmdsim.models.gpt.memory import shard_group_problem

    assert shard_group_problem(4, 3, 8) is None
    assert shard_group_problem(3, 3, 8) == "--shard-group 3 must be a positive divisor of the dp ranks (8)"
    assert shard_group_problem(2, 1, 8) == "--shard-group 2 shards parameters: give --zero 3 with it"


def test_hybrid_sharding_with_context_parallelism_shards_over_fs_and_cp():
    """HSDP beside cp: the mesh (dp, fs, cp, tp), each parameter sharded over fs x cp (the cp ranks hold the same
    parameters) and replicated over dp; its gathers and Reduce_scatters over (fs, cp), the sum across the groups
    over dp; every step matches one numpy process. It was refused ("hybrid sharding's mesh has no
    context-parallel axis")."""
    from spmdsim.models.axes import model_layout, roles_of

    def body():
        shape, names = model_layout(1, 2, fs=2, cp=2)
        mesh = spmdsim.Mesh(Layout(shape, names), spmdsim.world(), roles=roles_of(names))
        with collect_trace() as trace:
            model, steps = train(CFG, spmdsim.world(), 4, 1, 2, TEXT, zero=3, mesh=mesh, cp=2)
        shard = {name: t.local.shape for name, t in model.params.items()}
        return steps, shard, {(e.op, e.axes) for e in trace.entries if "fs" in e.axes}

    steps, shard, kinds = spmdsim.simulate(8, body)[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert shard["wpe"] == (CFG.seq // 4, CFG.d_model)  # a quarter of its rows: over fs 2 x cp 2
    assert {("allgather", ("fs", "cp")), ("reduce_scatter", ("fs", "cp"))} <= kinds


def test_prefetching_holds_two_layers_gathered_and_the_ledger_says_so():
    """With prefetch the next layer's gathers run before each layer's forward (the previous layer's before each
    layer's backward): the same collectives and bytes, the same values, and two layers' gathered parameters held
    at once beside the root's, the real run's and the dry run's ledger's alike. A unit's gather holds its gathered
    buffer beside the blocks copied out of it (spmdsim.nn.fsdp_flat): a layer's bytes more at that moment, so the
    most held is the root, one layer and its buffer without prefetch, and with it the root, two layers and one
    buffer."""
    from spmdsim.models.gpt.sharded_run import train_sharded
    from spmdsim.tools.estimate.ledger import gpt_ledger

    def body(prefetch):
        run, steps = train_sharded(CFG, spmdsim.world(), 1, 2, 2, 2, TEXT, memory=True, prefetch=prefetch)
        layer = 2 * sum(p.local.nbytes for n, p in run.params.items() if n.startswith("h0."))  # gathered over dp 2
        run.close()
        return steps, layer

    plain, ahead = (spmdsim.simulate(4, body, p) for p in (False, True))
    for (a, layer), (b, _) in zip(plain, ahead):
        assert all(r.passed for r in a + b)
        assert [(r.calls, r.bytes_sent, r.loss) for r in a] == [(r.calls, r.bytes_sent, r.loss) for r in b]
        root = a[-1].memory.gathered_kept
        assert root > 0 and layer > root
        assert a[-1].memory.gathered == root + 2 * layer
        assert b[-1].memory.gathered == root + 3 * layer
    (stage,) = gpt_ledger(CFG, 1, 2, 2, zero=3, prefetch=True)
    assert stage.memory.gathered == ahead[0][0][-1].memory.gathered


def test_the_estimate_keeps_the_layers_gathered_as_the_run_does_without_resharding():
    """`spmdsim estimate --zero 3 --reshard-after-forward false` dry-runs train_sharded without resharding: every
    layer's gathered parameters held from its forward to its backward (the real run's and the dry run's ledger's
    alike), one gather a layer where resharding makes two (the root's once either way), a faster step, and the
    header says so."""
    import json
    from docs_commands import run_here
    from spmdsim.models.gpt.sharded_run import train_sharded
    from spmdsim.tools.estimate.ledger import gpt_ledger

    def body():
        run, steps = train_sharded(CFG, spmdsim.world(), 1, 2, 2, 2, TEXT, memory=True, reshard_after_forward=False)
        layer = 2 * sum(p.local.nbytes for n, p in run.params.items() if n.startswith("h0."))  # gathered over dp 2
        run.close()
        return steps, layer

    steps, layer = spmdsim.simulate(4, body)[0]
    assert all(r.passed for r in steps)
    root = steps[-1].memory.gathered_kept - CFG.layers * layer
    assert root > 0 and steps[-1].memory.gathered == root + (CFG.layers + 1) * layer  # and one layer's buffer
    (kept,) = gpt_ledger(CFG, 1, 2, 2, zero=3, reshard=False)
    (resharded,) = gpt_ledger(CFG, 1, 2, 2, zero=3)
    assert (kept.memory.gathered, kept.memory.gathered_kept) == (steps[-1].memory.gathered,
                                                                 steps[-1].memory.gathered_kept)
    assert resharded.memory.gathered_kept == root
    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128",
            "--global-batch", "4", "--dp", "4", "--zero", "3"]
    runs = {}
    for reshard in ("true", "false"):
        code, out, err = run_here("main", argv + ["--reshard-after-forward", reshard, "--json"])
        assert code == 0, err
        runs[reshard] = json.loads(out)
    gathers = {r: run["stages"][0]["sent"]["allgather node"] for r, run in runs.items()}
    root_bytes = 2 * gathers["false"] - gathers["true"]  # true: root + 2 x layers; false: root + layers
    assert 0 < root_bytes < gathers["false"] - root_bytes
    assert runs["false"]["step_time_s"] < runs["true"]["step_time_s"]
    assert runs["false"]["config"]["reshard_after_forward"] == "false"
    code, out, err = run_here("main", argv + ["--reshard-after-forward", "false"])
    assert code == 0 and "ZeRO 3 (each layer kept gathered until its backward)" in " ".join(out.split())


def test_a_pipelined_zero3_step_reports_the_layer_it_gathers_as_the_plain_step_does():
    """Under several microbatches (spmdsim.models.gpt.pipeline's trainer) the step reported no gathered
    parameters, so the estimate's peak left out the layer a ZeRO-3 step gathers for each forward and backward;
    now the most held at once: one layer and its gathered buffer, as the plain step's beyond its root (which a
    pipeline's microbatch holds in its graph, among the kept bytes), the real run's and the dry run's alike."""
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.models.gpt.sharded_run import train_sharded
    from spmdsim.tools.estimate.ledger import gpt_ledger

    def body(microbatches):
        trainer = train_pipelined if microbatches > 1 else train_sharded
        run, steps = trainer(CFG, spmdsim.world(), 1, 2, 2, 2, TEXT, microbatches=microbatches, zero=3, memory=True)
        layer = 2 * sum(p.local.nbytes for n, p in run.params.items() if n.startswith("h0."))  # gathered over dp 2
        run.close()
        return steps, layer

    plain, split = (spmdsim.simulate(4, body, m) for m in (1, 2))
    for (a, layer), (b, _) in zip(plain, split):
        assert all(r.passed for r in a + b)
        assert b[-1].memory.gathered == 2 * layer and b[-1].memory.gathered_kept == 0
        assert a[-1].memory.gathered - a[-1].memory.gathered_kept == 2 * layer
    (stage,) = gpt_ledger(CFG, 1, 2, 2, zero=3, microbatches=2)
    assert stage.memory.gathered == split[0][0][-1].memory.gathered


def test_the_estimate_prices_zero3s_gathers_and_hides_them_only_when_prefetched():
    """`spmdsim estimate --zero 3`: the gathers are phase "parameters" on their links, the Reduce_scatters
    "gradients" (hidden under the backward); with --prefetch the gathers hide under the layers' compute, at most
    it, and what exceeds it stays exposed."""
    import json
    from docs_commands import run_here

    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128",
            "--global-batch", "4", "--dp", "4", "--zero", "3", "--json"]
    runs = {}
    for extra in ([], ["--prefetch"]):
        code, out, err = run_here("main", argv + extra)
        assert code == 0, err
        runs[bool(extra)] = json.loads(out)
    for run in runs.values():
        assert {"allgather node", "reduce_scatter node"} <= set(run["stages"][0]["sent"])
    assert runs[True]["step_time_s"] < runs[False]["step_time_s"]
    assert "ZeRO-3's prefetched gathers hidden under the layers' compute" in runs[True]["assumptions"]
    assert "prefetched" not in " ".join(runs[False]["assumptions"])


@pytest.mark.parametrize("schedule, virtual, sp", [("1f1b", 1, False), ("interleaved", 2, True)])
def test_zero3_over_a_pipeline_matches_one_numpy_process(schedule, virtual, sp):
    """pp 2 x dp 2 x tp 2, 4 microbatches: each chunk's parameters sharded over its stage's dp ranks, each
    microbatch's forward gathering its layers (and its root: the first chunk's embedding, the last's head) and its
    backward reduce-scattering into the shards; the tied table's two ends summed as without ZeRO."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, dropout=0.1)

    def body():
        run, steps = train_pipelined(cfg, spmdsim.world(), 2, 2, 2, 2, TEXT, sp=sp, schedule=schedule,
                                     microbatches=4, virtual=virtual, zero=3)
        kinds = {(e.op, e.axes) for e in run.trace.entries}
        run.close()
        return steps, kinds

    steps, kinds = spmdsim.simulate(8, body)[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert {("allgather", ("dp",)), ("reduce_scatter", ("dp",))} <= kinds


def test_a_pipelines_zero3_ledger_is_what_its_real_run_sends_and_keeps():
    """The estimate's dry run of ZeRO-3 over a pipeline (pp 2 x dp 2 x tp 2, sp, 2 microbatches: the pipeline's
    trainer) sends, by kind, what a real run of the step sends on every rank, and keeps what it keeps."""
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, vocab=128, dropout=0.1)
    ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % 128

    def body():
        run, steps = train_pipelined(cfg, spmdsim.world(), 2, 2, 2, 1, ids, sp=True, microbatches=2, zero=3,
                                     memory=True, check=False)
        sent: dict = {}
        for e in run.trace.entries:
            if e.group_size > 1:
                key = "send" if e.op in ("sendrecv", "recv", "send") else e.op
                sent[key] = sent.get(key, 0) + e.bytes_sent
        out = (run.stage, steps[-1].memory, sent)
        run.close()
        return out

    ledger = gpt_ledger(cfg, 2, 2, 2, sp=True, microbatches=2, zero=3)
    for stage, memory, sent in spmdsim.simulate(8, body):
        mine = ledger[stage]
        ours: dict = {}
        for (kind, _), n in mine.sent().items():
            ours[kind] = ours.get(kind, 0) + n
        assert {k: v for k, v in ours.items() if v} == {k: v for k, v in sent.items() if v}
        assert sent["allgather"] > 0 and sent["reduce_scatter"] > 0
        assert (memory.kept, memory.states, memory.master) == (mine.memory.kept, mine.memory.states,
                                                                mine.memory.master)
