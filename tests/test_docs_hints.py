"""Issue 55 items 9-11: synopsis lines are not shown as commands, hints say what is true,
usage errors print once under a launcher."""
from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from docs_commands import ROOT, quotes  # noqa: E402

DOCS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
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
    assert "spmdsim run embedding --mode vocab|dim" in (ROOT / "docs/operators.md").read_text()
    assert "python -m spmdsim.nets [NAME ...]" in (ROOT / "docs/networks.md").read_text()
    for doc, what in (("docs/operators.md", "--mode vocab|dim"), ("docs/networks.md", "[NAME ...]")):
        text = (ROOT / doc).read_text()
        at = text.index(what)
        fence = text.rfind("```", 0, at)
        assert text[fence:fence + 8] == "```text\n", (doc, what)


def test_nets_usage_error_is_printed_by_rank_zero_only(monkeypatch, capsys):
    from spmdsim.nets.__main__ import main

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
    from spmdsim.nets import digits

    source = pathlib.Path(digits.__file__).read_text()
    assert "spmdsim[data]" not in source and "pip install -e '.[data]'" in source
    assert "pip install -e \".[data]\"" in (ROOT / "README.md").read_text()


def test_cpi_docstring_names_itself():
    path = ROOT / "examples/mpi4py/cpi.py"
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert "python cpi.py" in doc and "cpi-buf" not in doc


def test_train_gpt_timeout_is_the_readme_one():
    doc = ast.get_docstring(ast.parse((ROOT / "examples/train_gpt.py").read_text()))
    run = re.search(r"timeout -k 5 (\d+) mpiexec -n 8 python examples/train_gpt.py --dp 2 --tp 4 --sp\n", doc)
    readme = re.search(r"timeout -k 5 (\d+) mpiexec -n 8 python examples/train_gpt.py --dp 2 --tp 4 --sp\n",
                       (ROOT / "README.md").read_text())
    assert run and readme and run.group(1) == readme.group(1) == "3600"
