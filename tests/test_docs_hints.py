"""Synopsis lines are not shown as commands, hints say what is true, usage errors print once under a launcher."""
from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from docs_commands import ROOT, quotes  # noqa: E402

DOCS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
_PROGRAMS = ("spmdsim ", "timeout ", "mpiexec ", "python ", "python3 ", "bash ", "pip ")
# `[--json]`, `[NAME ...]`, `...` as an argument, `vocab|dim`: a synopsis, not a command to paste.
_SYNOPSIS = re.compile(r"(?:^|\s)\[[-A-Z]|\s\.\.\.(?:\s|\]|$)|\b\w+\|\w+\b")


def _without_quoted(command: str) -> str:
    return re.sub(r"#.*$", "", re.sub(r"'[^']*'|\"[^\"]*\"", "''", command))


@pytest.mark.parametrize("doc", DOCS)
def test_commands_in_command_blocks_can_be_pasted(doc):
    bad = [q.where() for q in quotes(doc)
           if not q.inline and q.command.startswith(_PROGRAMS) and "\n" not in q.command
           and _SYNOPSIS.search(_without_quoted(q.command))]
    assert bad == []


def test_synopsis_lines_are_text_blocks():
    # The forms with alternatives and optional flags stay in the docs, in ```text blocks.
    assert "spmdsim run embedding --mode vocab|dim" in (ROOT / "docs/reference/operators.md").read_text()
    assert "python -m spmdsim.models.nets [NAME ...]" in (ROOT / "docs/reference/networks.md").read_text()
    for doc, what in (("docs/reference/operators.md", "--mode vocab|dim"),
                      ("docs/reference/networks.md", "[NAME ...]")):
        text = (ROOT / doc).read_text()
        at = text.index(what)
        fence = text.rfind("```", 0, at)
        assert text[fence:fence + 8] == "```text\n", (doc, what)


def test_nets_usage_error_is_printed_by_rank_zero_only(monkeypatch, capsys):
    from spmdsim.models.nets.__main__ import main

    for rank, printed in (("3", False), ("0", True)):
        monkeypatch.setenv("PMI_RANK", rank)
        with pytest.raises(SystemExit) as exit_:
            main(["no_such_net"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert ("unknown network(s) ['no_such_net']" in err) is printed
        if printed:
            assert max(len(line) for line in err.splitlines()) <= 100


def test_data_extra_hint_is_the_editable_install():
    from spmdsim.models.nets import digits

    source = pathlib.Path(digits.__file__).read_text()
    assert "spmdsim[data]" not in source and "pip install -e '.[data]'" in source
    assert "pip install -e \".[data]\"" in (ROOT / "docs/howto/train.md").read_text()


def test_cpi_docstring_names_itself():
    path = ROOT / "examples/mpi4py/cpi.py"
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert "python cpi.py" in doc and "cpi-buf" not in doc


def test_train_gpt_timeout_is_the_readme_one():
    doc = ast.get_docstring(ast.parse((ROOT / "examples/train_gpt.py").read_text()))
    run = re.search(r"timeout -k 5 (\d+) mpiexec -n 8 python examples/train_gpt.py --dp 2 --tp 4 --sp\n", doc)
    readme = re.search(r"timeout -k 5 (\d+) mpiexec -n 8 python examples/train_gpt.py --dp 2 --tp 4 --sp\n",
                       (ROOT / "docs/howto/train-gpt.md").read_text())
    assert run and readme and run.group(1) == readme.group(1) == "3600"


def _error(capsys, argv):
    from spmdsim.tools.cli.main import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err, argv
    assert max(len(line) for line in err.splitlines()) <= 100, err
    return err.splitlines()[-1] if "usage:" in err else err


@pytest.mark.parametrize("argv, line", [
    (["slices", "--device-matrix", "2", "--alias", "x", "--tensor-map", "x,None", "--shape", "-8,8"],
     "spmdsim: error: --shape '-8,8' must be sizes of at least 0, such as 2,4\n"),
    (["slices", "--device-matrix", "2", "--alias", "x", "--tensor-map", "x,None", "--shape=-8,8"],
     "spmdsim: error: --shape '-8,8' must be sizes of at least 0, such as 2,4\n"),
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "-8,8,8", "--ranks", "8", "--dry-run"],
     "spmdsim: error: --shape '-8,8,8' has a negative size; expected M,K,N (or B,...,M,K,N) >= 0\n"),
])
def test_a_negative_shape_is_a_value_not_an_option(capsys, argv, line):
    assert _error(capsys, argv) == line


@pytest.mark.parametrize("data, said", [
    ('{"version": 2, "alpha_s": 1, "source": "' + "x" * 300 + '"}', "its data has version 2; expected a"),
    ("[1, 2]", "its data is a JSON list, not an object; expected a"),
    ('{"alpha_s": 1}', "its data has no 'version'; expected a"),
])
def test_a_cost_file_of_another_version_says_which(tmp_path, monkeypatch, capsys, data, said):
    from spmdsim.programs.cost import CostModel
    from spmdsim.errors import SpmdsimError

    path = tmp_path / "cost.json"
    path.write_text(data)
    with pytest.raises(SpmdsimError) as exc:
        CostModel.load(path)
    assert str(exc.value) == (f"cost model {str(path)!r}: {said} version 1 spmdsim cost model "
                              "(spmdsim calibrate writes one)")


def test_long_errors_fold_at_spaces_and_unfold_to_the_message(capsys):
    from spmdsim.errors import fold_message

    message = "spmdsim: error: --x 'v' " + " ".join(f"word{i}" for i in range(60))
    folded = fold_message(message)
    lines = folded.splitlines()
    assert lines[0].startswith("spmdsim: error: --x 'v' ") and len(lines) > 1
    assert all(len(line) <= 100 for line in lines) and all(line.startswith("  ") for line in lines[1:])
    assert folded.replace("\n  ", " ") == message
    assert fold_message("short\n  and indented") == "short\n  and indented"
    # An unknown network's name list (185 columns on one line before).
    err = _error(capsys, ["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "zz,None",
                          "--shape", "8,8"])
    assert err.startswith("spmdsim: error: ") and "'zz'" in err.splitlines()[0]


def test_demo_list_folds_long_titles_and_wide_keeps_one_line(capsys):
    from spmdsim.tools.cli.main import main
    from spmdsim.tools.demo import scenarios

    names = [sc.name for sc in scenarios()]
    assert main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100  # was 111 (train_gpt's title)
    at = next(i for i, line in enumerate(lines) if line.startswith("train_gpt "))
    assert lines[at] == "train_gpt                A 1-layer GPT: one AdamW step with sequence parallelism,"
    assert lines[at + 1] == " " * 25 + "gradient of the token embedding"
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == names
    assert main(["demo", "--list", "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert len(wide) == len(names) and wide[-1].endswith("sequence parallelism, gradient of the token embedding")


def test_demo_too_few_ran_line_is_folded(capsys):
    from spmdsim.tools.cli.main import main

    only = "linear_row,matmul_2x1_1x4,matmul_2x4_4x1,matmul_1x8_8x1"
    assert main(["demo", "--ranks", "3", "--only", only]) == 3
    err = capsys.readouterr().err
    assert max(map(len, err.splitlines())) <= 100
    assert err.replace("\n  ", " ") == ("spmdsim demo: fewer than half the scenarios ran (1 of 4 ran on 3 ranks); "
                                        "8 run them all (mpiexec -n 8, or --ranks 8)\n")


def test_an_infinite_compute_rate_is_refused(capsys):
    # 1e400 reads as inf; it was accepted and every compute time priced at 0.
    argv = ["autoshard", "--network", "mlp", "--devices", "8", "--flops"]
    assert _error(capsys, argv + ["1e400"]) == ("spmdsim: error: --flops 1e400 (read as inf) must be a finite "
                                                "number > 0 (FLOP/s of one rank)\n")
    assert _error(capsys, argv + ["-1e9"]) == ("spmdsim: error: --flops -1e9 must be a finite number > 0 (FLOP/s "
                                               "of one rank)\n")


def test_reliability_says_how_every_example_guards_its_ranks():
    """docs/explanation/reliability.md said `spmdsim.script(__file__)` is "the first line of every example": the
    training examples call run_main instead, and the others parse their arguments first (--help, unknown arguments).
    The doc says so now, and every example does as it says: run_main, or script(__file__) the statement after
    parse_args() (the two port_*_mlp.py examples too: they called it after their imports and refused --help)."""
    text = " ".join((ROOT / "docs" / "explanation" / "reliability.md").read_text(encoding="utf-8").split())
    assert "the first line of every example" not in text
    assert ("the training examples through `spmdsim.models.nets.train.run_main`, the others with "
            "`spmdsim.script(__file__)` on the line after they parse their arguments") in text
    ways = {}
    for path in sorted((ROOT / "examples").glob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        calls = [ast.unparse(s.value if isinstance(s, (ast.Expr, ast.Assign)) else s).replace("spmdsim.script(",
                                                                                                 "script(")
                 for s in body]
        if any("run_main(" in ast.unparse(s) for s in body):
            ways[path.name] = "run_main"
        elif any(c.startswith("script(__file__") for c in calls):  # script(__file__, ranks=8) too
            at = next(i for i, c in enumerate(calls) if c.startswith("script(__file__"))
            before = body[at - 1]
            ways[path.name] = ("script after parse_args" if calls[at - 1].endswith(".parse_args()") else
                               "script after imports" if isinstance(before, (ast.Import, ast.ImportFrom)) else
                               calls[at - 1])
        else:
            ways[path.name] = "neither"
    assert set(ways.values()) == {"run_main", "script after parse_args"}, ways
    assert {n for n, w in ways.items() if w == "run_main"} == {
        "train_gpt.py", "train_megatron_block.py", "train_mindspore_tutorial.py", "train_moe_gpt.py",
        "train_seed_networks.py"}
