"""spmdsim.models.gpt.wholes: parameters made whole from every rank's blocks, as placing each rank's in order would,
and on simulated ranks once per step between them (inside the shared reference step)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.wholes import assemble, peaks, regions, stage_regions
from spmdsim.layouts.layout import Layout, TensorLayout

MESH = Layout((2, 4), ("dp", "tp"))
SHAPES = {"split": ((8, 6), ("tp", None)), "both": ((4, 8), ("dp", "tp")), "whole": ((5,), (None,)),
          "columns": ((3, 8), (None, "tp"))}


def _params(table: np.ndarray) -> dict:
    """name -> a stand-in for this rank's DTensor (layout, global shape, block) over MESH."""
    out = {}
    for name, (shape, tensor_map) in SHAPES.items():
        layout = TensorLayout(MESH, tensor_map)
        block = tuple(b - a for a, b in layout.bounds(0, shape))
        out[name] = SimpleNamespace(layout=layout, global_shape=shape, local=np.zeros(block))
    return out


def _rank_order(params: dict, table: np.ndarray) -> dict:
    """Each rank's block placed in rank order (the later rank's where two hold the same region)."""
    out, at = {}, 0
    for name, t in params.items():
        whole, n = np.empty(t.global_shape), t.local.size
        for rank in range(MESH.num_devices):
            whole[t.layout.slices(rank, t.global_shape)] = table[rank, at:at + n].reshape(t.local.shape)
        out[name], at = whole, at + n
    return out


def test_assembled_wholes_are_rank_orders_placement_bit_for_bit():
    params = _params(None)
    width = sum(t.local.size for t in params.values())
    table = np.random.default_rng(0).standard_normal((MESH.num_devices, width))  # replicas differ: order shows
    where = regions(params, MESH.num_devices)
    built = assemble(where, where.used(table))[0]
    expected = _rank_order(params, table)
    assert list(built) == list(expected)
    for name in expected:
        assert built[name].tobytes() == expected[name].tobytes(), name
    assert where.rows == tuple(range(8))  # "both" is split over dp and tp: every rank holds its own
    # Without it, the last dp's ranks hold every region last: only their rows are read, as a view of the table.
    replicated = regions({n: t for n, t in params.items() if n != "both"}, MESH.num_devices)
    assert replicated.rows == (4, 5, 6, 7) and np.shares_memory(replicated.used(table), table)


def test_two_tables_in_one_gather_are_assembled_apart():
    params = _params(None)
    width = sum(t.local.size for t in params.values())
    table = np.random.default_rng(1).standard_normal((MESH.num_devices, 2 * width))
    where = regions(params, MESH.num_devices)
    first, second = assemble(where, where.used(table), 2)
    assert all(np.array_equal(first[n], v) for n, v in _rank_order(params, table[:, :width]).items())
    assert all(np.array_equal(second[n], v) for n, v in _rank_order(params, table[:, width:]).items())


def test_peaks_are_the_largest_magnitudes():
    assert peaks({"a": np.array([1.0, -3.0]), "b": np.zeros(0)}) == {"a": 3.0, "b": 0.0}


def _assemblies(monkeypatch, train) -> list:
    """Each rank's results of `train(cfg, comm, ids)` on 8 simulated ranks (2 steps) and how many times the
    check assembled the reference's start (spmdsim.models.gpt.reference_step.assemble)."""
    from spmdsim.models.gpt import reference_step as module

    calls = []
    real = module.assemble

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(module, "assemble", counted)
    cfg = GPTConfig(layers=2, d_model=32, seq=16, heads=4, batch=4)
    ids = encode(load_text())

    def body():
        run, results = train(cfg, spmdsim.world(), ids)
        run.mesh.close()
        return [r.passed for r in results]

    return spmdsim.simulate(8, body), len(calls)


def test_simulated_ranks_assemble_the_reference_start_once_a_step(monkeypatch):
    from spmdsim.models.gpt.train import train

    passed, calls = _assemblies(monkeypatch, lambda cfg, comm, ids: train(cfg, comm, 2, 4, 2, ids, sp=True))
    assert passed == [[True, True]] * 8
    assert calls == 2  # one rank of eight, each step


def test_stage_regions_place_each_stages_blocks_as_rank_order_does():
    # Two stages of MESH's 8 ranks each; "split" on both (a tied table), "whole" on the first, "columns" on the
    # second: rows differ by stage and are padded to the longer stage's.
    layouts = {name: TensorLayout(MESH, tensor_map) for name, (_, tensor_map) in SHAPES.items()}
    shapes = {name: shape for name, (shape, _) in SHAPES.items()}
    stages = [["split", "whole"], ["split", "columns"]]
    sizes = [[int(np.prod(layouts[n].local_shape(shapes[n]))) for n in names] for names in stages]
    width = max(map(sum, sizes))
    table = np.random.default_rng(2).standard_normal((2 * 8, width))  # the stages' tied copies differ
    expected = {n: np.empty(shapes[n]) for n in ("split", "whole", "columns")}
    for rank in range(16):
        stage, place = divmod(rank, 8)
        at = 0
        for name, n in zip(stages[stage], sizes[stage]):
            region = layouts[name].slices(place, shapes[name])
            expected[name][region] = table[rank, at:at + n].reshape([s.stop - s.start for s in region])
            at += n
    where = stage_regions(stages, layouts, shapes, 8)
    built = assemble(where, where.used(table))[0]
    assert list(built) == ["split", "whole", "columns"]  # shapes' order
    for name in expected:
        assert built[name].tobytes() == expected[name].tobytes(), name
    # The tied table from the second stage's last dp; the first stage's "whole" from its last rank alone.
    assert where.width == width and where.rows == (7, 12, 13, 14, 15)


def test_simulated_pipeline_ranks_assemble_the_reference_start_once_a_step(monkeypatch):
    from spmdsim.models.gpt.pipeline import train_pipelined

    passed, calls = _assemblies(monkeypatch, lambda cfg, comm, ids: train_pipelined(
        cfg, comm, 2, 2, 2, 2, ids, sp=True, microbatches=2))
    assert passed == [[True, True]] * 8
    assert calls == 2  # one rank of eight, each step


def test_an_uneven_cut_places_each_ranks_own_block_sizes():
    # Layout cut "balanced": 10 rows over tp 4 are 3, 3, 2, 2, so rank rows differ in length. Each rank's row
    # holds its own blocks (Layout.local_shape of its rank), padded to the longest: `regions` places them so.
    mesh = Layout((2, 4), ("dp", "tp"), cut="balanced")
    shapes = {"rows": ((10, 3), ("tp", None)), "cols": ((2, 7), (None, "tp"))}
    params = {name: SimpleNamespace(layout=TensorLayout(mesh, m), global_shape=s, local=None)
              for name, (s, m) in shapes.items()}
    whole = {name: np.random.default_rng(2).standard_normal(s) for name, (s, _) in shapes.items()}
    where = regions(params, mesh.num_devices)
    rows = []
    for rank in range(mesh.num_devices):
        row = np.concatenate([whole[n][p.layout.slices(rank, p.global_shape)].reshape(-1) for n, p in params.items()])
        rows.append(np.pad(row, (0, where.width - row.size)))
    assert where.width == 3 * 3 + 2 * 2 and len({r.size for r in rows}) == 1  # the longest row: tp rank 0's
    built = assemble(where, where.used(np.array(rows)))[0]
    for name in shapes:
        assert built[name].tobytes() == whole[name].tobytes(), name
