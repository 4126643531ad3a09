"""A mesh whose groups fall unevenly on the machine's nodes (spmdsim.tools.estimate.transfers.uneven_on_nodes):
the dry run prices one rank of a stage for all of its ranks, so `--tp 6` on 8-GPU nodes priced every tp group's
collectives on the node's links, where ranks 6-11's cross two nodes; `spmdsim estimate` refuses it in one line
and the search by a machine file leaves such meshes out (docs/howto/estimate.md)."""
from __future__ import annotations

import json

import pytest

from docs_commands import run_here
from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate import machine as machine_mod
from spmdsim.tools.estimate.configs import configurations
from spmdsim.tools.estimate.ledger import gpt_ledger
from spmdsim.tools.estimate.transfers import placed, uneven_on_nodes
from testkit import unfold

MODEL = ["estimate", "gpt", "--layers", "2", "--hidden", "96", "--heads", "12", "--seq", "48", "--vocab", "96",
         "--global-batch", "4"]


@pytest.mark.parametrize("axes, pp, nodes, found", [
    ((("tp", 6), ("dp", 4)), 1, 8, ("tp", 6, 6, 0, 6)),
    ((("tp", 4), ("dp", 3)), 1, 6, ("tp", 4, 4, 0, 4)),
    ((("tp", 2), ("cp", 3), ("dp", 4)), 1, 8, ("cp", 3, 6, 0, 6)),
    ((("tp", 8), ("cp", 2), ("dp", 4)), 2, 8, None),  # whole nodes
    ((("tp", 16), ("dp", 2)), 1, 8, None),  # every tp group crosses nodes alike
    ((("tp", 4), ("dp", 3)), 2, 4, None),
    ((("tp", 1), ("dp", 1000)), 1, 6, None),  # a dp group crosses nodes from every rank (the last node part-full)
    ((("tp", 3),), 3, 8, ("pp", 3, 9, 0, 2)),  # stage 1's ranks 3-5 send to 6 and 7 on node 0, and to 8 on node 1
    ((("tp", 2), ("dp", 2)), 4, 8, None),
])
def test_uneven_on_nodes_finds_a_rank_whose_group_is_placed_otherwise(axes, pp, nodes, found):
    assert uneven_on_nodes(axes, pp, nodes) == found


@pytest.mark.parametrize("flags, line", [
    (["--tp", "6", "--dp", "4"], "--tp 6 falls unevenly on the a100-dgx's 8-GPU nodes: rank 0's tp group is within "
                                 "its node, rank 6's crosses nodes, and the estimate prices one rank of a stage for "
                                 "all of its ranks; expected a --tp that divides 8 (every group within a node) or "
                                 "is larger (every group across nodes)"),
    (["--tp", "2", "--cp", "3", "--dp", "4"],
     "--cp 3 falls unevenly on the a100-dgx's 8-GPU nodes: rank 0's cp group is within its node, rank 6's "
     "crosses nodes, and the estimate prices one rank of a stage for all of its ranks; expected --tp x --cp (6) "
     "dividing 8"),
    (["--tp", "6", "--pp", "2"],  # ranks 0-5 send to 6 and 7 on node 0, and to 8-11 on node 1
     "--pp 2 falls unevenly on the a100-dgx's 8-GPU nodes: rank 0's pp group is within its node, rank 2's crosses "
     "nodes, and the estimate prices one rank of a stage for all of its ranks; expected the ranks of a stage, --tp "
     "(6), dividing 8 or a multiple of it"),
])
def test_the_estimate_refuses_a_mesh_it_would_price_as_its_first_ranks_in_one_line(flags, line):
    """Before: `--tp 6 --dp 4` said "ranks 0-23: 24 ranks alike" and priced every tp group's Allreduce on NVLink."""
    code, out, err = run_here("main", [*MODEL, *flags])
    assert code == 2 and out == ""
    assert " ".join(err.split()) == f"spmdsim: error: {line}"


def test_a_machine_files_own_node_size_decides(tmp_path):
    """--tp 4 divides a DGX's 8 GPUs, not a 6-GPU node's (a Summit-like machine file)."""
    data = json.loads((machine_mod._SHIPPED / "a100-dgx.json").read_text())
    six = tmp_path / "six.json"
    six.write_text(json.dumps(dict(data, gpus_per_node=6)))
    code, _, err = run_here("main", [*MODEL, "--tp", "4", "--dp", "1"])
    assert code == 0, err
    code, _, err = run_here("main", [*MODEL, "--tp", "4", "--dp", "2", "--machine", str(six)])
    assert code == 2 and "--tp 4 falls unevenly on the a100-dgx's 6-GPU nodes: rank 0's tp group" in " ".join(
        err.split())
    code, _, err = run_here("main", [*MODEL, "--tp", "3", "--dp", "2", "--machine", str(six)])
    assert code == 0, err


def test_the_search_leaves_out_the_meshes_the_estimate_refuses():
    """The search took tp <= a node's GPUs: tp 4 (and tp 2 x cp 2) on 6-GPU nodes, priced as rank 0's."""
    cfg = GPTConfig(layers=2, d_model=96, heads=12, seq=48, vocab=96, batch=12, dropout=0.1)
    every = configurations(cfg, 12, 6)
    meshes = {(c.tp, c.cp, c.ep, c.dp, c.pp) for c in every}
    assert {tp for tp, *_ in meshes} == {1, 2, 3, 6}
    assert all(uneven_on_nodes((("tp", tp), ("cp", cp), ("ep", ep), ("dp", dp)), pp, 6) is None
               for tp, cp, ep, dp, pp in meshes)
    assert (1, 1, 1, 12, 1) in meshes and (4, 1, 1, 3, 1) not in meshes


def test_a_search_left_with_no_even_mesh_says_so(tmp_path, capsys):
    """8 devices of 6-GPU nodes, a GPT of 4 heads, 2 layers and a batch of 1: tp 4 x pp 2 and tp 2 x cp 2 x pp 2
    fall unevenly, and the refusal named only rules every one of them keeps (tp 4 divides the heads within a
    node of 6, pp 2 the layers)."""
    data = json.loads((machine_mod._SHIPPED / "a100-dgx.json").read_text())
    six = tmp_path / "six.json"
    six.write_text(json.dumps(dict(data, gpus_per_node=6)))
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=1",
            "--devices", "8", "--machine", str(six)]
    assert main(argv) == 2
    assert unfold(capsys.readouterr().err).rstrip("\n") == (
        "spmdsim: error: no configuration of the GPT runs on 8 devices (tp must divide the heads 4 and vocab 128 "
        "within a node of 6, pp the layers 2, dp the batch 1, 2 x cp the seq 64 with tp x cp within a node, and each "
        "axis's groups placed alike on the 6-GPU nodes)")


def test_groups_that_all_cross_nodes_unevenly_are_priced_at_the_fewest_ports():
    """--tp 12 on 8-GPU nodes: ranks 0-11 are 8 on node 0 and 4 on node 1, ranks 12-23 4 on node 1 and 8 on node 2,
    and each group's rings leave a node by the 4 ports of its smaller side. Rank 0's tp collectives were priced at
    the 8 ports of its own node (an Allreduce across the nodes at twice its bandwidth)."""
    cfg = GPTConfig(layers=2, d_model=96, heads=12, seq=48, vocab=96, batch=4, dropout=0.1)
    (st,) = gpt_ledger(cfg, 1, 2, 12, gpus_per_node=8)
    tp = [t for t in st.transfers if t.group == 12]
    assert tp and {(t.level, t.lanes) for t in tp} == {("cluster", 4)}
    # --tp 10: ranks 0-9 are 8 + 2, ranks 10-19 6 + 4, 20-29 4 + 6: the stage at its slowest group's 2 from any rank
    calls = (("allreduce", 10, 1000, ("tp",), "layers", 1, 1000, 8, "", ()),)
    for rank in (0, 10, 20):
        group = tuple(range(rank // 10 * 10, rank // 10 * 10 + 10))
        assert [(t.level, t.lanes) for t in placed(calls, {("tp",): group}, rank, 8, tuple(range(40)))] == [
            ("cluster", 2)]
    assert placed(calls, {("tp",): tuple(range(10, 20))}, 10, 8)[0].lanes == 4  # its own group alone: 6 + 4
