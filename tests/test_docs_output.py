"""What the docs say a command prints, run the way the docs quote it, within 100 columns."""
from __future__ import annotations

import re

from docs_commands import ROOT
from spmdsim.tools.cli.main import main

MLP = ["autoshard", "--network", "mlp", "--run", "--ranks", "8"]
MEGATRON = ["--fix", "fc1=((1,1),(1,8),(8,))", "--fix", "fc2=((1,8),(8,1),(1,))"]


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def test_nets_tables_fit_100_columns_with_their_totals_on_one_line(capsys):
    from spmdsim.models.nets.__main__ import main as nets

    assert nets(["--ranks", "8"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 100
    totals = [line for line in out.splitlines() if "total" in line]
    # One per network, the count and the bytes on the same line (not folded in a narrow column).
    assert len(totals) == 5, totals
    assert all(re.fullmatch(r" +total: \d+ collective calls? +[\d,]+ B", line) for line in totals), totals
    assert out.count("\nPASS\n") == 5
    # The check line leads with the tolerance that passed it.
    assert out.count("check passed: every element within atol ") == 5


def test_autoshard_mlp_is_what_readme_says(capsys):
    page = " ".join((ROOT / "docs/howto/autoshard.md").read_text().split())
    assert "spmdsim autoshard --network mlp --run --ranks 8" in page
    assert "The last line chooses data parallel" in page and "16,128 B per rank" in page

    assert main(MLP) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 100
    assert re.search(r"^fc1 +\d+ +\(\(8, 1\), \(1, 1\), \(1,\)\) +0 +0 ", out, re.M), out
    assert "\ntotal 0 B/rank\n" in out and out.rstrip().endswith("PASS")

    assert main(MLP + MEGATRON) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 100
    assert re.search(r"^fc2 +\d+ +\(\(1, 8\), \(8, 1\), \(1,\)\) +0 +16,128 +fixed", out, re.M), out
    assert "\ntotal 16,128 B/rank\n" in out and out.rstrip().endswith("PASS")


def test_the_seed_strategy_picture_of_lab_exercise_5_fits(capsys):
    lab = (ROOT / "docs" / "tutorials" / "lab.md").read_text()
    command = 'spmdsim show --strategy "((2,1,1,2,1),)" --world-size 8 --shape 2,1,1,2,1'
    assert command in lab
    assert main(["show", "--strategy", "((2,1,1,2,1),)", "--world-size", "8", "--shape", "2,1,1,2,1"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 80  # show's ASCII fits 80 columns (README)
    assert "Device matrix (axis_0=2, axis_1=1, axis_2=1, axis_3=2, axis_4=1, rep=2): each\n" in out


def test_docs_networks_tables_are_what_the_command_prints(capsys):
    import shlex

    from docs_commands import mismatch, quotes
    from spmdsim.models.nets.__main__ import main as nets

    quoted = [q for q in quotes("docs/reference/networks.md") if q.output
              and q.command.startswith("python -m spmdsim.models.nets")]
    assert len(quoted) == 5
    for quote in quoted:
        assert nets(shlex.split(quote.command)[3:]) == 0
        captured = capsys.readouterr()
        out = captured.err + captured.out  # the banner goes to stderr with --json only
        why = mismatch(quote.output, out)
        assert why is None, f"{quote.where()}: {why}\n{out}"
        assert _widest(out) <= 100, quote.where()


def test_demo_pass_counts_are_the_ones_the_docs_give(capsys):
    # README: the 8-rank table ends "18 passed"; at 16 ranks "14 of the 18 run".
    # docs/reference/operators.md: "18 of 18 pass at 8 ranks, 14 at 16 ..., 10 at 4, 9 at 6 ..., 6 at 3".
    readme = (ROOT / "docs/howto/install.md").read_text()
    operators = " ".join((ROOT / "docs" / "reference" / "operators.md").read_text().split())
    m = re.search(r"(\d+) of (\d+) pass at 8 ranks, (\d+) at 16 .*?, (\d+) at 4, (\d+) at 6 .*?, (\d+) at 3",
                  operators)
    assert m, "docs/reference/operators.md states the demo's counts"
    total = int(m.group(2))
    said = {8: int(m.group(1)), 16: int(m.group(3)), 4: int(m.group(4)), 6: int(m.group(5)), 3: int(m.group(6))}
    assert f"\n{said[8]} passed, 0 failed, 0 skipped\n```" in readme
    assert f"(at 16 ranks {said[16]} of the {total} run)" in " ".join(readme.split())
    for ranks, passed in said.items():
        code = main(["demo", "--ranks", str(ranks)])
        out, err = capsys.readouterr()
        assert f"\n{passed} passed, 0 failed, {total - passed} skipped\n" in out, (ranks, out[-300:])
        assert code == (3 if 2 * passed < total else 0), (ranks, err)


def test_docs_networks_says_how_loosely_its_error_figures_are_compared():
    # The page said this test "compares" its tables; a measured error matches within FACTOR of its quote
    # (docs_commands.close), so stale figures (1.19e-06 for 9.54e-07) passed: the page says how loose it is.
    from docs_commands import FACTOR, close

    text = " ".join((ROOT / "docs" / "reference" / "networks.md").read_text().split())
    assert f"within a factor of {FACTOR:g} of the quoted one" in text
    assert close(1.19e-06, 9.54e-07)  # why the page's stale figures passed


def test_docs_counts_in_e_notation_match_as_quoted():
    # A step's FLOPs quoted as 1.1436e+15 (docs/howto/estimate.md) were matched as a rounding error, within a factor
    # of 100: a count that moved to 1.2e+15 (or 1e+17) still passed. An error stays loose; a count is exact.
    from docs_commands import close

    assert close(9.5e-07, 9.54e-07) and close(1.19e-06, 9.54e-07)
    assert close(1.1436e+15, 1.1436e+15)
    assert not close(1.1436e+15, 1.1437e+15) and not close(1.1436e+15, 1e+17)


def test_docs_an_exact_zero_matches_an_error_no_larger_than_its_lines_others():
    # docs/howto/checkpoints.md's fp32 resume quotes a loss 1.1e-07 from the reference beside gradients 2.6e-07; on a
    # CPU whose BLAS kernels sum in another order the run printed 0.0e+00, which no factor of the quote reaches. A
    # zero matches an error no larger than another of its line, quoted or measured (the line's rounding); a float64
    # line's zero beside 3e-11 still refuses 8.8e-09.
    from docs_commands import close, mismatch

    row = "    3  4.3924           11      87,688             {}  2.6e-07  0.0e+00"
    assert mismatch((row.format("1.1e-07"),), row.format("0.0e+00") + "\n") is None
    assert mismatch((row.format("0.0e+00"),), row.format("1.1e-07") + "\n") is None
    assert mismatch((row.format("0.0e+00"),), row.format("8.3e-04") + "\n") is not None
    assert mismatch(("loss 4.2e-11 grads 0.0e+00",), "loss 3.0e-11 grads 8.8e-09\n") is not None
    assert not close(1.1e-07, 0.0) and close(1.1e-07, 0.0, 2.6e-07) and not close(0.0, 3e-07, 2.6e-07)
