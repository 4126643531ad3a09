"""ZeRO-3 (spmdsim.nn.fsdp) on parameters whose rows the shards do not divide: cut as PyTorch FSDP2 cuts them
(torch.chunk's rule: pieces of ceil(rows / shards), the last ones short or empty), each rank's piece padded to
the first one's in the gathers and the reduce-scatters; the steps checked against one numpy process, the padded
bytes read from the trace, the dry run's ledger against the real run's memory."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.fsdp import CUT, fully_shard
from spmdsim.runtime.trace import collect_trace

# vocab 257 and d_model 34 over dp 4: the embedding's rows 65, 65, 65, 62, a norm's 9, 9, 9, 7
CFG = GPTConfig(layers=2, d_model=34, heads=2, seq=16, batch=8, vocab=257, dropout=0.1)
TEXT = encode(load_text(20_000))


def _chunks(rows: int, shards: int) -> list:
    piece = -(-rows // shards)
    return [max(0, min(piece, rows - i * piece)) for i in range(shards)]


@pytest.mark.parametrize("cfg, dp, tp, sp", [
    (CFG, 4, 1, False),
    # vocab 260 over tp 2, each half's rows over dp 3: 44, 44, 42
    (GPTConfig(layers=2, d_model=40, heads=4, seq=16, batch=6, vocab=260, dropout=0.1), 3, 2, True),
    # d_model 20 over dp 8: a norm's rows 3, 3, 3, 3, 3, 3, 2 and none on the last rank
    (GPTConfig(layers=1, d_model=20, heads=4, seq=16, batch=8, vocab=256), 8, 1, False)])
def test_uneven_rows_are_cut_as_torch_chunk_and_the_steps_match_one_numpy_process(cfg, dp, tp, sp):
    def body():
        model, steps = train(cfg, spmdsim.world(), dp, tp, 2, TEXT, sp=sp, zero=3)
        return steps, {name: p.local.shape[0] for name, p in model.params.items()}

    out = spmdsim.simulate(dp * tp, body)
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in out[0][0]), out[0][0]
    norm = [rows["lnf.w"] for _, rows in out[::tp]]  # one rank of each tp group, in dp order
    assert norm == _chunks(cfg.d_model, dp) and sum(norm) == cfg.d_model
    if tp == 1:
        assert [rows["wte"] for _, rows in out] == _chunks(cfg.vocab, dp)
    assert any(n != norm[0] for n in norm)  # (the point: uneven)


def test_hybrid_sharding_and_a_pipeline_cut_uneven_rows_alike():
    """HSDP (dp 2 x fs 2, vocab 257: 129 and 128 rows over fs, the Reduce_scatter's result summed over dp) and an
    interleaved pipeline (pp 2 x dp 2 x tp 2, vocab 258: each tp half's 129 rows 65 and 64 over dp), 4
    microbatches: each step within the check's tolerance."""
    from spmdsim.models.axes import model_layout, roles_of
    from spmdsim.models.gpt.pipeline import train_pipelined

    def hybrid():
        shape, names = model_layout(1, 2, fs=2)
        mesh = Mesh(Layout(shape, names, CUT), spmdsim.world(), roles=roles_of(names))
        model, steps = train(CFG, spmdsim.world(), 4, 1, 2, TEXT, zero=3, mesh=mesh)
        return steps, model.params["wte"].local.shape[0]

    def pipelined():
        cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, vocab=258, dropout=0.1)
        run, steps = train_pipelined(cfg, spmdsim.world(), 2, 2, 2, 2, TEXT, sp=True, schedule="interleaved",
                                     microbatches=4, virtual=2, zero=3)
        run.close()
        return steps

    out = spmdsim.simulate(4, hybrid)
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in out[0][0]), out[0][0]
    assert [rows for _, rows in out] == [129, 128, 129, 128]  # (dp, fs): the shards over fs, dp replicas
    steps = spmdsim.simulate(8, pipelined)[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps


def test_each_gather_sends_the_padded_pieces_fsdp2_sends():
    """Each unit's Allgather on dp receives (dp - 1) pieces of the first shard's rows of each parameter, whatever
    rows the sender holds (FSDP2 pads the short ones); its Reduce_scatter sends as many."""
    def body():
        with collect_trace() as trace:
            model, _ = train(CFG, spmdsim.world(), 4, 1, 1, TEXT, zero=3, check=False,
                             reshard_after_forward=False)
        units = [model._unit(None)] + [model._unit(layer) for layer in range(CFG.layers)]
        padded = {n: int(np.prod(p.layout.max_local_shape(p.global_shape))) * 8 * 3 for n, p in model.params.items()}
        return trace.entries, [sum(padded[n] for n in unit) for unit in units]

    for entries, per_unit in spmdsim.simulate(4, body):
        gathers = [e.bytes_received for e in entries if e.op == "allgather" and e.axes == ("dp",)]
        scatters = [e.bytes_sent for e in entries if e.op == "reduce_scatter" and e.axes == ("dp",)]
        assert gathers == per_unit and sorted(scatters) == sorted(per_unit)


@pytest.mark.parametrize("d_model, vocab", [(32, 257), (36, 256)])
def test_the_dry_runs_ledger_is_the_uneven_real_runs_memory(d_model, vocab):
    """The dry run (shapes only) of a ZeRO-3 step holds what the real run measured on its first rank (vocab 257: the
    embedding's rows 65, 65, 65, 62, the most any rank holds), to the byte: a layer's gathered blocks of 64 KiB
    and more (d_model 36) are placed as the real run's (spmdsim.base.buffers.empty: a page longer)."""
    from spmdsim.models.gpt.sharded_run import train_sharded

    cfg = GPTConfig(layers=2, d_model=d_model, heads=2, seq=16, batch=8, vocab=vocab, dropout=0.1)
    ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % 128

    def body():
        run, steps = train_sharded(cfg, spmdsim.world(), 1, 4, 1, 1, ids, memory=True, check=False)
        run.close()
        return steps[-1].memory

    real, dry = spmdsim.simulate(4, body), spmdsim.simulate(4, body, dry_run=True)
    r = real[0]  # the dry run runs one rank for all (spmdsim.runtime.sim.dry): the first, whose shards are largest
    for d in dry:
        assert (r.kept, r.grads, r.master, r.states, r.buffers, r.gathered, r.grads_peak) == \
            (d.kept, d.grads, d.master, d.states, d.buffers, d.gathered, d.grads_peak)
    if vocab == 257:
        assert [x.states for x in real] == [r.states] * 3 + [r.states - 3 * 32 * 8 * 2]  # m and v: 3 rows fewer


@pytest.mark.parametrize("example, argv", [
    ("examples/train_gpt.py", ["--ranks", "6", "--dp", "3", "--tp", "2", "--batch", "6", "--vocab", "128",
                                "--sample", "0"]),
    ("examples/train_moe_gpt.py", ["--ranks", "8", "--dp", "4", "--ep", "2", "--experts", "4"])])
def test_the_examples_train_what_even_shards_refused(example, argv):
    """vocab 128 over tp 2 x dp 3, four experts' rows over ep 2 x dp 4: once refused, now cut unevenly and checked."""
    from docs_commands import run_example

    done = run_example(example, *argv, "--zero", "3", "--steps", "2", "--layers", "2", "--d-model", "32",
                       "--seq", "16")
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("check: 2 steps") and line.endswith("PASS") for line in done.stdout.splitlines()), \
        done.stdout


def test_fully_shard_cuts_unevenly_on_a_chunk_mesh_and_says_how_on_an_even_one():
    def body(cut):
        mesh = Mesh(Layout((4,), ("dp",), cut), roles={"data": "dp"})
        w = spmdsim.DTensor.from_global(mesh, np.arange(30.0).reshape(10, 3), mesh.layout(None, None))
        try:
            fs = fully_shard({"w": w}, mesh)
        except SpmdsimError as e:
            return str(e)
        whole = fs.unshard(["w"], held=False)["w"]
        return fs.params["w"].local.shape[0], whole.local.copy()

    said = spmdsim.simulate(4, body, "even")[0]
    assert said == ("fully_shard: parameter 'w' dim 0 of size 10 is not divisible by 4 shards (axes ('dp',)) on a "
                    f"mesh that cuts evenly; a mesh of Layout(..., cut={CUT!r}) shards it as FSDP2 does, the last "
                    "shards short")
    got = spmdsim.simulate(4, body, CUT)
    assert [rows for rows, _ in got] == [3, 3, 3, 1]
    for _, whole in got:
        np.testing.assert_array_equal(whole, np.arange(30.0).reshape(10, 3))
