"""`spmdsim autoshard --precision fp8`: the search prices each configuration by its FP8 dry run (the linear
layers' products at the fp8 peak, spmdsim.tools.estimate.ledger's `fp8`), and its bounds stay below those prices:
the closed forms' products at the fp8 peak, the layer cells made of FP8 dry runs."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

import spmdsim.tools.estimate.ledger as ledger
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate.bounds import Cells
from spmdsim.tools.estimate.closed_forms import comm_bounds, lower_bounds, stage_elements
from spmdsim.tools.estimate.configs import configurations
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.search import price, search
from docs_commands import mismatch, quotes
from testkit import unfold

H100 = load_machine("h100-dgx")
SMALL = GPTConfig(layers=2, d_model=32, heads=4, seq=32, vocab=64, batch=4, dropout=0.1)


@pytest.fixture(scope="module", params=["megatron", "graph"])
def exhaustive(request):
    """(kept, {config: (seconds, bytes held, peak bytes)}): every configuration of SMALL on 4 devices without
    context parallelism (ZeRO 0 to 3), priced by its own FP8 dry run, under each kept set."""
    kept = request.param
    return kept, {c: price(SMALL, c, H100, "fp8", kept) for c in configurations(SMALL, 4, 8, cp=1)}


def test_every_bound_lies_below_the_fp8_price_and_the_search_chooses_the_fastest(exhaustive):
    kept, exhaustive = exhaustive
    cells = Cells(SMALL, kept, 8, fp8=True)
    assert {c.zero for c in exhaustive} == {0, 1, 2, 3}
    assert {c.pp for c in exhaustive} == {1, 2} and {c.tp for c in exhaustive} == {1, 2, 4}
    assert {c.recompute for c in exhaustive} == {"none", "selective", "full"} and {c.sp for c in exhaustive} == {0, 1}
    for c, (seconds, nbytes, _) in exhaustive.items():
        flop_s, states = lower_bounds(SMALL, c, H100, "fp8", 4)
        assert flop_s <= seconds and states <= nbytes, c
        sums = comm_bounds(SMALL, c, H100, "fp8", *stage_elements(SMALL, c))[1:]
        assert cells.time_bound(c, H100, "fp8", *sums) <= seconds * (1 + 1e-12), c
        assert cells.memory_bound(c, "fp8") <= nbytes, c
    # the same configuration priced at bf16-mixed is faster: the FP8 products' contraction (32) is at the fp8
    # curve's first point, 0.392 / 0.768 of the fp8 cap, 658 TFLOP/s where bf16's run at 708, and the casts add
    c = min(exhaustive, key=lambda c: exhaustive[c][0])
    assert exhaustive[c][0] > price(SMALL, c, H100, "bf16-mixed", kept)[0]
    r = search(SMALL, 4, H100, 1 << 40, precision="fp8", kept=kept, max_dry_runs=1000,
               pricer=lambda cfg, c, *rest: exhaustive[c], cells=cells, fixed={"cp": 1})
    assert r.chosen.step_s == min(s for s, *_ in exhaustive.values()) and r.dry_runs < len(exhaustive)
    assert all(c.bound_s >= r.chosen.step_s for c in r.candidates if c.verdict.endswith("bound above the best"))


def test_the_pages_fp8_search_prints_what_it_quotes_and_its_estimate_command_the_same_step(capsys):
    """docs/howto/choose-configuration.md, "FP8" (a section tests/test_classroom_docs.py leaves out)."""
    quote, = [q for q in quotes("docs/howto/choose-configuration.md")
              if "--precision fp8" in q.command and q.output is not None]
    assert main(shlex.split(quote.command)[1:]) == 0
    out = capsys.readouterr().out
    assert mismatch(quote.output, out) is None, out
    chosen = next(line for line in out.splitlines() if line.startswith("chosen: "))
    step = chosen.split(": ")[2].split(",")[0]  # "0.362 ms"
    command = out[out.index("  spmdsim estimate gpt "):].replace("\\\n", " ").split()
    assert command[command.index("--precision") + 1] == "fp8" and command[command.index("--kept") + 1] == "megatron"
    assert main(command[1:]) == 0
    assert f"predicted step time: {step} (stage 0's" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--machine", "a100-dgx"], "--precision fp8: machine 'a100-dgx' has no fp8 peak (peak_flops gives bf16, "
                                "fp16, tf32, fp32, fp64); give a machine whose file has one, such as h100-dgx")])
def test_what_the_fp8_step_does_not_run_is_refused_in_one_line(capsys, extra, message):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=4",
            "--devices", "4", "--precision", "fp8", *extra]
    assert main(argv) == 2
    err = unfold(capsys.readouterr().err)
    assert err.rstrip("\n") == f"spmdsim: error: {message}"
    with pytest.raises(SpmdsimError):
        search(SMALL, 8, load_machine(extra[1]), 1 << 40, precision="fp8")


def test_an_fp8_search_with_workers_chooses_as_alone(capsys, monkeypatch):
    """With --jobs the workers run the FP8 dry runs, and this process, which ran none, prices the cells' e4m3
    copies: their width resolved through ml_dtypes though no dry run here loaded it (it raised "data type
    'float8_e4m3fn' not understood"). The table of finished dry runs starts empty for each search (else the
    second found every dry run the first made, and no worker ran one). Recomputation held at none: 40
    configurations, 8 dry runs of the step and 40 of cells, not 120, 19 and 120 (half the CPU-s, the same paths)."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=4",
            "--devices", "4", "--machine", "h100-dgx", "--precision", "fp8", "--fix", "cp=1", "--fix", "recompute=none",
            "--json"]
    here: list = []
    real = ledger._dry_ledger
    monkeypatch.setattr(ledger, "_dry_ledger", lambda *key: here.append(key) or real(*key))
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    assert main(argv) == 0
    alone = json.loads(capsys.readouterr().out)
    assert here, "the search alone ran its dry runs in this process"
    here.clear()
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    assert main(argv + ["--jobs", "2"]) == 0
    ahead = json.loads(capsys.readouterr().out)
    assert here == []  # every dry run a worker's
    assert ahead["estimate_command"] == alone["estimate_command"]  # the same choice
    assert [(c["config"], c["step_s"], c["verdict"]) for c in ahead["candidates"]] == \
        [(c["config"], c["step_s"], c["verdict"]) for c in alone["candidates"]]  # (bounds: sums in another order)
    code = ("import sys; from spmdsim.base.flop_counts import Kernel; "
            "print(Kernel('fp8_cast', 'forward', 'activations', 'float8_e4m3fn', 3, 5).nbytes)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "8\n", done.stderr
