"""`spmdsim autoshard` on the GPT of spmdsim.models.gpt: every operator a node, against Megatron's layouts."""
from __future__ import annotations

import math

import pytest

from docs_commands import ROOT
from spmdsim.tools.autoshard import autoshard, build
from spmdsim.tools.autoshard.candidates import candidates, make_candidate
from spmdsim.tools.autoshard.volume import redistribution_bytes
from spmdsim.tools.autoshard.gpt import gpt_graph
from spmdsim.tools.autoshard.networks import gpt_network
from spmdsim.tools.cli.main import main
from spmdsim.models.gpt.config import GPTConfig
from spmdsim.programs.infer.einsum import infer_einsum
from spmdsim.layouts.layout import Layout
from spmdsim.programs.plan import plan_redistribution
from testkit import unfold

RATE = 1e10
KIB = 1024
DOCS = ROOT / "docs" / "howto" / "autoshard.md"


def _hand(graph, hand):
    dtypes = [n.dtype for n in graph.nodes]
    out = []
    for node, h in zip(graph.nodes, hand):
        dts = tuple(dtypes[graph.index(i)] for i in node.inputs)
        out.append(make_candidate(node, (), (), dts) if h is None else
                   make_candidate(node, h.inputs, h.params, dts, h.out))
    return out


def test_every_operator_is_a_node():
    graph, hand = build("gpt", 8)
    assert len(graph.nodes) == 107 >= 100  # 25 a block, 4 blocks, plus 7
    kinds = {n.kind for n in graph.nodes}
    assert kinds == {"input", "embedding", "pointwise", "layernorm", "reshape", "einsum", "softmax",
                     "gelu", "cross_entropy"}
    assert sum(n.kind == "einsum" for n in graph.nodes) == 4 * 8 + 1  # q k v scores context proj fc1 fc2
    assert not graph.is_tree() and len(hand) == len(graph.nodes)
    assert len(gpt_graph(GPTConfig(layers=2), 8).nodes) == 2 * 25 + 7


@pytest.mark.parametrize("cfg", [GPTConfig(), GPTConfig(layers=2, d_model=64),
                                 GPTConfig(vocab=48, d_model=32, heads=2, layers=3, seq=16, batch=4, seed=7,
                                           init_std=0.3)])
def test_the_graphs_parameters_are_the_gpts(cfg):
    # autoshard's GPT states no weight of its own: its nodes read exactly spmdsim.models.gpt.params' parameters,
    # by name and shape, starting from the values the reference and the ranks start from.
    from dataclasses import replace

    import numpy as np

    from spmdsim.tools.autoshard.gpt import gpt_config
    from spmdsim.models.gpt.params import initial_value, param_specs

    graph = gpt_graph(cfg, 8)
    read: dict = {}
    for node in graph.nodes:
        for p in node.params:
            assert read.setdefault(p.name, p) is p, p.name  # one weight per name (the tied "wte" too)
    specs = param_specs(cfg)
    assert sorted((name, p.shape) for name, p in read.items()) == sorted((s.name, s.shape) for s in specs)
    for spec in specs:
        value = read[spec.name].source.full()
        assert value.dtype == np.float64 and np.array_equal(value, initial_value(cfg, spec)), spec.name
    assert [n.name for n in graph.nodes if any(p.name == "wte" for p in n.params)] == ["wte", "head"]
    assert gpt_config(graph) == replace(cfg, dropout=0.0)


@pytest.mark.parametrize("name, limit", [("gpt", 768 * KIB), ("gpt_sp", 640 * KIB)])
def test_training_choice_needs_no_more_than_megatron(name, limit):
    # The limit is Megatron's own largest operator (pure data parallelism would hold every weight).
    graph, hand = build(name, 8)
    assert max(c.memory for c in _hand(graph, hand)) == limit
    r = autoshard(name, 8, training=True, memory_limit=limit, flops_per_s=RATE)
    assert r.outcome.proven and r.outcome.method == "variable elimination"
    mine = r.total_bytes_per_rank + r.backward_bytes_per_rank
    theirs = r.hand_written_total_bytes_per_rank + r.hand_written_backward_bytes_per_rank
    assert mine <= theirs
    assert (mine, theirs) == (7_863_832, {"gpt": 8_861_712, "gpt_sp": 8_763_408}[name])
    assert all(op.candidate.memory <= limit for op in r.ops)
    text, table = DOCS.read_text(), r.table()
    for fwd, bwd in ((r.total_bytes_per_rank, r.backward_bytes_per_rank),
                     (r.hand_written_total_bytes_per_rank, r.hand_written_backward_bytes_per_rank)):
        assert f"| {fwd:,} | {bwd:,} | {fwd + bwd:,} |" in text
    assert all(len(line) <= 100 for line in table.splitlines())
    if name == "gpt":  # the docs quote this table's totals
        totals = [line for line in table.splitlines() if line.startswith(("training ", "hand-written ", "total "))]
        assert len(totals) == 3 and all(line in text for line in totals), totals
        free = autoshard(name, 8, training=True, flops_per_s=RATE)  # no limit: every operator whole
        assert (free.total_bytes_per_rank, free.backward_bytes_per_rank) == (3584, 0)
        assert "| `--training`, no limit | 3,584 | 0 | 3,584 |" in text
        assert max(op.candidate.memory for op in free.ops) == 2 * 8 * 64 * 512 * 8 + 512 * 8 == 4_198_400
        assert "holding up to 4,198,400 B" in text


def test_megatron_forward_is_an_allreduce_per_row_parallel_product():
    graph, hand = build("gpt", 8)
    hc = _hand(graph, hand)
    tp_allreduce = plan_redistribution(Layout((2, 4), ("dp", "tp"))("dp", None, None, partial="tp"),
                                       Layout((2, 4), ("dp", "tp"))("dp", None, None), (8, 64, 128),
                                       "float64").max_bytes_received
    own = {n.name: c.own_bytes for n, c in zip(graph.nodes, hc) if c.own_bytes}
    assert {k: v for k, v in own.items() if v == tp_allreduce} == {
        k: tp_allreduce for k in ["wte"] + [f"h{i}.{p}" for i in range(4) for p in ("proj", "fc2")]}
    assert set(own) - {"wte", "loss"} == {f"h{i}.{p}" for i in range(4) for p in ("proj", "fc2")}


@pytest.mark.parametrize("name", ["gpt", "gpt_sp"])
def test_megatron_hops_and_collectives_are_the_planners(name):
    graph, hand = build(name, 8)
    hc = _hand(graph, hand)
    moved = 0
    first = [(p, q, pos) for p, q, pos in graph.edges if graph.nodes[q].name.startswith(("wte", "wpe", "h0."))]
    for p, q, pos in first:  # the embeddings and the first block
        s, t, shape = hc[p].out, hc[q].inputs[pos], graph.nodes[q].in_shapes[pos]
        planned = plan_redistribution(s, t, shape, "float64").max_bytes_received
        assert redistribution_bytes([s], [t], shape, "float64")[0, 0] == planned
        moved += planned
    # The ids (split 8 ways, wanted 2 ways); sp: the Allgathers into Q, K, V (once) and into fc1.
    assert moved == 1536 + (2 * 196_608 if name == "gpt_sp" else 0)
    for node, c in zip(graph.nodes, hc):  # own collectives on the pending axes = the whole mesh's
        if node.kind == "einsum" and c.own:
            shapes = tuple(node.in_shapes) + tuple(pr.shape for pr in node.params)
            local = infer_einsum(node.spec, tuple(c.inputs + c.params), shapes, "float64").local
            whole = plan_redistribution(local, c.out, node.out_shape, "float64")
            assert c.own_bytes == whole.max_bytes_received > 0
            assert [s.op for s in c.own[0].steps] == [s.op for s in whole.steps]


def test_split_hidden_layer_norm_pays_two_row_allreduces():
    graph, _ = build("gpt", 8)
    ln = graph.nodes[graph.index("h0.ln1")]
    (c,) = [c for c in candidates(ln, 8) if c.strategy[0] == (2, 1, 4)]
    x = c.inputs[0]
    stats = x.layout(x.tensor_map[0], x.tensor_map[1], (), partial=x.tensor_map[2])
    one = plan_redistribution(stats, stats.with_partial(()), (8, 64, 1), "float64").max_bytes_received
    # Each rank's (4, 64) rows of float64, Allreduced over the 4 ranks splitting the hidden dim.
    assert c.own_bytes == 2 * one == 2 * (2 * 3 * 4 * 64 * 8 // 4)


def test_4096_devices_fully_use_them():
    r = autoshard("gpt", 4096, flops_per_s=RATE)
    assert r.outcome.proven and len(r.ops) == 107
    shown = r.table().splitlines()
    assert max(len(line) for line in shown) <= 100
    for line in shown[:8] + [f"total {r.total_bytes_per_rank:,} B/rank"]:
        assert line in DOCS.read_text().splitlines(), line
    graph, short = r.graph, set()
    for node, op in zip(graph.nodes[1:], r.ops[1:]):
        if _used(op.candidate) < 4096:
            # A softmax's rows (8 x 4 x 64), a head reshape: no strategy using every device runs,
            # so every strategy is a candidate.
            dts = tuple(graph.nodes[graph.index(i)].dtype for i in node.inputs)
            assert candidates(node, 4096, dts, full=True) == candidates(node, 4096, dts), node.name
            short.add(node.kind)
    assert short == {"softmax", "reshape"}
    assert r.total_bytes_per_rank == sum(op.bytes_per_rank for op in r.ops) > 0


def _used(c) -> int:
    layout = c.out.layout
    return layout.num_devices // (layout.axis_size("rep") if "rep" in layout.alias_name else 1)


@pytest.mark.parametrize("extra, needle", [
    (["--gpt", "layers=x"], "--gpt layers 'x' must be an integer >= 1"),
    (["--gpt", "layer=2"], "--gpt 'layer=2' must read KEY=VALUE"),
    (["--gpt", "layer=2"], "e.g. 'layers=2,d_model=64'; did you mean 'layers'?"),
    (["--gpt", "dmodel=64"], "; did you mean 'd_model'?"),
    (["--gpt", "heads=3"], "the default d_model 128 must be divisible by --gpt heads 3"),
    (["--gpt", "seq=0"], "--gpt seq '0' must be an integer >= 1"),
    (["--gpt", "layers=1,layers=2"], "--gpt layers=1 and layers=2 set layers two ways; give one"),  # kept the last
])
def test_bad_gpt_options_are_one_line(capsys, extra, needle):
    assert main(["autoshard", "--network", "gpt", "--flops", "1e10"] + extra) == 2
    out, err = capsys.readouterr()
    err = unfold(err)
    assert out == "" and len(err.splitlines()) == 1 and needle in err, err


def test_gpt_option_on_another_network_is_one_line(capsys):
    assert main(["autoshard", "--network", "mlp", "--gpt", "layers=1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--network 'mlp' is not 'gpt' or 'gpt_sp'" in err


def test_small_gpt_from_the_command_line(capsys):
    assert main(["autoshard", "--network", "gpt_sp", "--gpt", "layers=1,d_model=32,seq=16,vocab=32",
                 "--devices", "8", "--flops", "1e10"]) == 0
    out = capsys.readouterr().out
    assert "GPT 1 layer, d_model 32, 4 heads, seq 16, batch 8, vocab 32" in out
    assert "hand-written" in out and "variable elimination, proven optimal" in out
    assert math.isfinite(len(out))


def _measured_step(cfg: GPTConfig, sp: bool) -> tuple[int, int]:
    """Bytes the busiest of 8 simulated ranks receives in the GPT's forward and its backward (Megatron)."""
    import numpy as np

    import spmdsim
    from spmdsim.models.gpt.parallel import GPT

    def body() -> tuple[int, int]:
        from spmdsim.runtime import DTensor, Mesh, collect_trace

        mesh = Mesh(Layout((2, 4), ("dp", "tp")), spmdsim.world())
        model = GPT(cfg, mesh, sp=sp)
        rng = np.random.default_rng(0)
        x, y = (DTensor.from_global(mesh, rng.integers(0, cfg.vocab, (cfg.batch, cfg.seq)),
                                    mesh.layout("dp", None)) for _ in range(2))
        with collect_trace() as fwd:
            loss = model.loss(x, y, None, train=False)
        with collect_trace() as bwd:
            loss.backward()
        return tuple(sum(e.bytes_received for e in t.entries if e.group_size > 1) for t in (fwd, bwd))

    out = spmdsim.simulate(8, body)
    return max(f for f, _ in out), max(b for _, b in out)


@pytest.mark.parametrize("sp", [False, True])
def test_megatron_prices_equal_a_simulated_training_step(sp):
    # spmdsim.models.gpt.parallel's GPT on 8 simulated ranks, its collectives' bytes measured.
    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=8, vocab=32)
    graph, hand = gpt_network(8, cfg, sp)
    r = autoshard(graph, 8, hand=hand, training=True, flops_per_s=RATE)
    fwd, bwd = _measured_step(cfg, sp)
    # The graph's ids arrive split 8 ways and move to Megatron's 2 (the runtime's start there).
    ids_hop = r.hand_ops[graph.index("wte")].in_bytes
    assert fwd == r.hand_written_total_bytes_per_rank - ids_hop == 76_048
    # The tied table's two gradients (embedding, head) are summed once, as the engine does.
    assert bwd == r.hand_written_backward_bytes_per_rank


def test_devices_no_strategy_can_all_use_are_searched_as_the_usable_ones():
    """384 = 3 x 128: the small GPT's power-of-two shapes use at most 128 devices, each block repeated on
    3 ranks, which changes no byte. Fully using the devices means using those 128, as at 128 devices (every
    strategy was kept before: up to ~1,800 per operator on the full GPT, and the search did not finish)."""
    from spmdsim.tools.autoshard.candidates import most_devices

    cfg = GPTConfig(vocab=32, d_model=32, heads=2, layers=1, seq=16, batch=8)
    g384, g128 = gpt_graph(cfg, 384), gpt_graph(cfg, 128)
    assert most_devices(g384.nodes, 384) == 128 and most_devices(g128.nodes, 128) == 128
    r384, r128 = (autoshard(g, n, flops_per_s=RATE) for g, n in ((g384, 384), (g128, 128)))
    assert r384.outcome.proven and r128.outcome.proven
    assert [op.considered for op in r384.ops] == [op.considered for op in r128.ops]
    assert max(op.considered for op in r384.ops) == 342
    assert r384.total_bytes_per_rank == r128.total_bytes_per_rank
    assert [op.candidate.text for op in r384.ops] == [op.candidate.text for op in r128.ops]


def test_hops_priced_on_fewer_ranks_move_the_same_bytes():
    """`fewer_ranks`: layouts whose "rep" axis the factor 3 divides, priced on a third of the ranks."""
    from spmdsim.tools.autoshard.cost import fewer_ranks

    cfg = GPTConfig(vocab=32, d_model=32, heads=2, layers=1, seq=16, batch=8)
    graph = gpt_graph(cfg, 24)
    node = graph.nodes[graph.index("h0.q")]
    outs = list(dict.fromkeys(c.out for c in candidates(node, 24, ("float64",))))
    ins = list(dict.fromkeys(c.inputs[0] for c in candidates(node, 24, ("float64",))))
    few_s, few_t = fewer_ranks(outs + ins, len(outs))
    assert few_s[0].layout.num_devices == 8 and len(few_t) == len(ins)
    shape = (8, 16, 32)
    assert (redistribution_bytes(few_s, few_t, shape, "float64")
            == redistribution_bytes(outs, ins, shape, "float64")).all()
