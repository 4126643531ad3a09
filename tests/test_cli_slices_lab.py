"""Every single-line `spmdsim` command of docs/tutorials/lab.md that needs no MPI runs and exits 0."""
from __future__ import annotations

import os
import re
import shlex

import pytest

from spmdsim.tools.cli.main import main

LAB = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "tutorials", "lab.md")


def _lab_text() -> str:
    with open(LAB, encoding="utf-8") as fh:
        return fh.read()


def _commands() -> list[str]:
    text = _lab_text()
    found = []
    for block in re.findall(r"```\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("spmdsim ") and not line.rstrip().endswith("\\") and "<" not in line:
                found.append(line.strip())
    # Inline `spmdsim ...` commands given as checks.
    found += [c for c in re.findall(r"`(spmdsim [^`]+)`", text) if "--" in c]
    return sorted(set(found))


def test_lab_has_commands():
    assert len(_commands()) >= 10


@pytest.mark.parametrize("command", _commands())
def test_lab_command_runs(command, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib") if "--png" in command else None
    monkeypatch.chdir(tmp_path)
    case = re.search(r"cat > case.json <<'EOF'\n(.*?)EOF", _lab_text(), flags=re.S)
    (tmp_path / "case.json").write_text(case.group(1))
    assert main(shlex.split(command, comments=True)[1:]) == 0
    assert capsys.readouterr().out


def test_lab_exercise_9_answer(capsys):
    """The five dialect forms of exercise 9: four agree, the strategy numbers its copies as neighbours."""
    import json

    text = _lab_text().split("## 9.")[1].split("**Question")[0]
    commands = [line for line in text.splitlines() if line.startswith("spmdsim slices")]
    assert len(commands) == 5
    rows_of_rank_1 = []
    for command in commands:
        assert main(shlex.split(command, comments=True)[1:]) == 0
        rows_of_rank_1.append(json.loads(capsys.readouterr().out)["rank_slices"]["1"][0])
    assert rows_of_rank_1 == [[2, 4]] * 4 + [[0, 2]]
