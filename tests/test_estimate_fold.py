"""`spmdsim estimate gpt --etp 1`: the folded experts (spmdsim.models.moe.fold) priced by the dry run of their
step: whole experts over ep x tp ranks, each tp rank's share of the tokens dispatched, no Allreduce of an
expert's product, the output gathered over tp; `--etp 2` beside `--tp 4` alike with each expert over 2 ranks;
and the flags' refusals (docs/howto/estimate.md)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from docs_commands import run_here
from spmdsim.tools.cli.autoshard_common import gpt_config
from spmdsim.tools.cli.autoshard_machine import estimate_command
from spmdsim.tools.estimate.configs import Config

MODEL = ("--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128", "--experts", "8",
         "--global-batch", "8", "--machine", "h100-dgx")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    code, out, err = run_here("main", ["estimate", "gpt", *argv])
    return subprocess.CompletedProcess(argv, code, out, err)


def _stage(*argv: str, tp: str = "2") -> dict:
    done = _cli(*MODEL, "--tp", tp, *argv, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["stages"][0]


def test_folding_on_the_same_ranks_halves_each_ranks_dispatch_and_drops_the_experts_allreduce():
    """8 ranks, tp 2: experts split over ep 4, each over tp 2 (etp = tp), against ep 8 whole experts (etp 1).
    The experts' elements a rank holds are the same (one expert's columns either way, the biases aside); each
    rank dispatches its own half of its tp group's sequences, so the Alltoalls carry half the bytes; the output
    is gathered over tp (forward) and its gradient reduce-scattered there (backward), and no collective sums
    an expert's product over tp."""
    same = _stage("--ep", "4", "--micro-batch", "2")
    folded = _stage("--ep", "8", "--etp", "1", "--micro-batch", "2")
    assert folded["ranks"] == same["ranks"] == [0, 7]  # (the first rank and the last of the stage)
    D, F = 64, 256
    assert same["expert_params"] == 2 * (D * F // 2 + F // 2 + F // 2 * D + D)  # 2 experts a rank, columns split
    assert folded["expert_params"] == 1 * (D * F + F + F * D + D)  # 1 expert a rank, whole
    # each rank's send buffer: the same slots of half the sequences, 7 of its 8 blocks leaving (against 3 of 4)
    assert folded["sent"]["alltoall node"] * 3 * 2 * 8 == same["sent"]["alltoall node"] * 4 * 7
    assert "allgather node" in folded["sent"] and "allgather node" not in same["sent"]
    assert folded["sent"]["allreduce node"] < same["sent"]["allreduce node"]  # no sum of fc2's product over tp
    # the routers' products on each rank's own tokens, not on its tp group's (the experts' the same)
    assert folded["flops"]["forward"] < same["flops"]["forward"]


def test_etp_2_beside_tp_4_splits_each_expert_over_2_ranks_and_folds_the_other_2_into_ep():
    """8 ranks, tp 4: experts over ep 2, each over tp 4 (etp = tp), against etp 2 x ep 4 (the mesh's tp as
    ("tp" 2, "etp" 2)): 2 experts a rank, half of each one's columns; each "tp" rank dispatches half its group's
    sequences over 4 ranks (3 of 4 blocks leaving, against 1 of 2 of all of them: 3/4 of the bytes), gathers the
    output over "tp" and sums fc2's product over etp's 2 ranks alone."""
    same = _stage("--ep", "2", "--micro-batch", "2", tp="4")
    half = _stage("--ep", "4", "--etp", "2", "--micro-batch", "2", tp="4")
    assert half["ranks"] == same["ranks"] == [0, 7]
    D, F = 64, 256
    assert same["expert_params"] == 4 * (D * F // 4 + F // 4 + F // 4 * D + D)
    assert half["expert_params"] == 2 * (D * F // 2 + F // 2 + F // 2 * D + D)
    assert half["sent"]["alltoall node"] * 4 == same["sent"]["alltoall node"] * 3
    assert half["sent"]["allgather node"] > 0 and "allgather node" not in same["sent"]
    assert half["sent"]["allreduce node"] < same["sent"]["allreduce node"]
    done = _cli(*MODEL, "--tp", "4", "--ep", "4", "--etp", "2", "--micro-batch", "2")
    text = " ".join(done.stdout.split())
    assert "mesh pp 1 x dp 1 x ep 2 x tp 4 (8 ranks)" in text
    assert "2 per ep rank (etp 2 x ep 4 x edp 1: attention's tp folded into ep)" in text


def test_the_report_names_the_experts_groups():
    done = _cli(*MODEL, "--tp", "2", "--ep", "8", "--etp", "1", "--micro-batch", "2")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stderr
    assert "mesh pp 1 x dp 1 x ep 4 x tp 2 (8 ranks)" in text
    assert "1 per ep rank (etp 1 x ep 8 x edp 1: attention's tp folded into ep)" in text


def test_dropless_folding_splits_the_sequence_so_a_microbatch_of_one_runs():
    """Dropless, each tp rank routes its share of every sequence's tokens (as Megatron's sequence-parallel
    tokens reach its dispatcher): --micro-batch 1 runs; with a capacity it is refused in one line."""
    stage = _stage("--ep", "8", "--etp", "1", "--micro-batch", "1", "--dropless", "--routing", "balanced")
    assert stage["sent"]["alltoallv node"] > 0
    done = _cli(*MODEL, "--tp", "2", "--ep", "8", "--etp", "1", "--micro-batch", "1")
    said = " ".join(done.stderr.split())  # (wrapped at 100 columns)
    assert done.returncode == 2 and said.endswith("--micro-batch 1 must be a multiple of --tp 2"), done.stderr
    assert said.startswith("spmdsim: error: --etp 1 with --tp 2: each tp rank routes its own share of a microbatch's "
                           "sequences (with a capacity, whole sequences; --dropless splits them)")


@pytest.mark.parametrize("argv, message", [
    (("--tp", "2", "--ep", "4", "--etp", "0"), "--etp 0 must be >= 1"),
    (("--tp", "4", "--ep", "2", "--etp", "3"), "--etp 3: etp 3 with tp 4: the experts' tensor-parallel size must "
                                               "divide tp (4)"),
    (("--tp", "4", "--ep", "3", "--etp", "2"), "--etp 2: etp 2 folds attention's tp 4 ranks into the experts' ep: "
                                               "ep 3 must be a multiple of tp / etp = 2"),
    (("--tp", "4", "--ep", "4", "--etp", "2", "--micro-batch", "1"),
     "--etp 2 with --tp 4: each tp rank routes its own share of a microbatch's sequences (with a capacity, whole "
     "sequences; --dropless splits them); --micro-batch 1 must be a multiple of --tp / --etp 2"),
    (("--tp", "2", "--ep", "3", "--etp", "1"), "--etp 1: etp 1 folds attention's tp 2 ranks into the experts' "
                                                    "ep: ep 3 must be a multiple of tp 2"),
])
def test_bad_foldings_are_refused_in_one_line(argv, message):
    done = _cli(*MODEL, *argv)
    assert done.returncode == 2 and message in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("spmdsim: error:")


def test_etp_without_experts_is_refused():
    done = _cli("--layers", "2", "--tp", "2", "--etp", "1")
    assert done.returncode == 2 and "--etp 1 sets the MoE layers: give --experts N" in done.stderr


def test_the_search_holds_an_experts_tp_between_1_and_tp_with_fix():
    """`--fix etp=2` beside `--fix tp=4` searches the experts at etp 2 alone (the other half of tp folded into
    their ep): the table's etp column and the chosen command's --etp 2; an etp that no tp left divides is one
    line naming the experts' tps there are."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=8,experts=8",
            "--devices", "8", "--machine", "h100-dgx", "--fix", "tp=4", "--max-dry-runs", "4"]
    code, out, err = run_here("main", argv + ["--fix", "etp=2"])
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if re.match(r"\d+ +4(\+sp)? +\d+ +\d+ +\d+ +\d+ +\d+ ", line)]
    assert len(rows) == 4 and all(row[6] == "2" for row in rows), out  # the 4 priced: tp 4, etp 2
    text = " ".join(out.split())
    assert ", etp 2, " in text.split("chosen: ")[1].split(":")[0] and "--etp 2" in text
    # as the search found it before --moe-cells searched every etp between 1 and tp: 90 configurations, 4 priced
    assert "90 configurations in " in text and ("chosen: tp 4, pp 2, dp 1, ep 2, etp 2, 1 mb, none, ZeRO 0: 0.236 "
                                                "ms, 3.5 MiB at its peak") in text
    code, out, err = run_here("main", argv + ["--fix", "etp=3"])
    assert code == 2 and " ".join(err.split()).endswith("--fix etp=3 leaves no configuration of the GPT on 8 devices "
                                                        "with --fix tp=4; etp can be 1, tp")


GPT = "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=8,experts=8"
CELLS = ["autoshard", "--network", "gpt", "--gpt", GPT, "--devices", "8", "--machine", "h100-dgx", "--fix", "tp=4",
         "--fix", "pp=1", "--fix", "mb=1", "--fix", "recompute=none", "--fix", "zero=1", "--fix", "sp=1"]


def _search(*argv: str) -> dict:
    code, out, err = run_here("main", CELLS + list(argv) + ["--json"])
    assert code == 0, err
    return json.loads(out)


def test_moe_cells_search_the_experts_tp_between_1_and_tp_priced_as_the_estimate_prices_it():
    """`--moe-cells` beside tp 4 tries the experts at etp 2 too (the other half of tp folded into their ep: the
    experts' ep 2 or 4, the mesh's 1 or 2), with etp 4 (split over tp) and etp 1 (whole): 9 configurations,
    each priced by its dry run, one cell a mesh; each etp 2 one at the step time and peak of `spmdsim estimate
    --tp 4 --ep N --etp 2`. `--fix etp=2` searches those 3 alone, at the same prices, choosing as it did before
    (cp 2 ring at 0.270 ms, 18 small dry runs of cells). Without --moe-cells the note names both foldings."""
    data = _search("--moe-cells")
    found = {Config(**c["config"]): c for c in data["candidates"]}
    assert {(c.experts_ep, c.experts_tp, c.dp, c.cp) for c in found} == {
        (1, 4, 1, 2), (1, 4, 2, 1), (2, 4, 1, 1), (4, 1, 1, 2), (4, 1, 2, 1), (8, 1, 1, 1),
        (2, 2, 1, 2), (2, 2, 2, 1), (4, 2, 1, 1)}
    assert data["dry_runs"] == 9 and data["cell_runs"] == 9 * 6 and data.get("note") is None
    cfg = gpt_config(GPT, sizes=False, moe=True)
    halves = [c for c in found if c.etp == 2]
    for c in halves:
        command = estimate_command(cfg, c, "h100-dgx", "bf16-mixed", "megatron")
        assert f" --ep {c.experts_ep} --etp 2 " in command and " --tp 4 " in command
        code, out, err = run_here("main", command.split()[1:] + ["--json"])
        assert code == 0, err
        estimate = json.loads(out)
        assert estimate["step_time_s"] == pytest.approx(found[c]["step_s"], rel=1e-12)
        assert max(s["peak_bytes"] for s in estimate["stages"]) == found[c]["peak"]
    held = _search("--moe-cells", "--fix", "etp=2")
    assert {Config(**c["config"]): c["step_s"] for c in held["candidates"]} == {c: found[c]["step_s"] for c in halves}
    chosen = Config(**held["chosen"]["config"])
    assert (chosen.experts_ep, chosen.dp, chosen.cp, round(held["chosen"]["step_s"] * 1e3, 3)) == (2, 1, 2, 0.270)
    assert held["cell_runs"] == 18 and " --ep 2 --etp 2 " in held["estimate_command"]
    assert _search()["note"].startswith("not searched: the experts folded into ep, whole or in part (etp 1, 2); "
                                        "--moe-cells or --fix etp=N adds them")
