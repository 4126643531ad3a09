"""docs/howto/simulate.md: its Python example and every command of its bash blocks run and do what it says."""
from __future__ import annotations

import pathlib
import re
import runpy
import shlex
import sys

import pytest

from spmdsim.tools.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "howto" / "simulate.md").read_text()
#: The page without its "At a glance" section (its commands run in tests/test_classroom_docs.py).
DOC = PAGE[:PAGE.index("## At a glance")] + PAGE[PAGE.index("\n## ", PAGE.index("## At a glance") + 1):]
COMMANDS = [line for block in re.findall(r"```bash\n(.*?)```", DOC, re.S) for line in block.splitlines() if line]


def test_the_python_example_runs_on_8_ranks(capsys):
    code = re.search(r"```python\n(.*?)```", DOC, re.S).group(1)
    exec(compile(code, "docs/howto/simulate.md", "exec"), {"__name__": "simulate_md"})
    assert capsys.readouterr().out.strip() == str([(True, {"allreduce": 1})] * 8)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_runs_in_one_process(command, monkeypatch, capsys):
    argv = shlex.split(command)
    if argv[0] == "spmdsim":
        code = main(argv[1:])
    else:
        assert argv[0] == "python", command
        monkeypatch.setattr(sys, "argv", argv[1:])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(ROOT / argv[1]), run_name="__main__")
        code = done.value.code
    out = capsys.readouterr().out
    assert code == 0, out
    if "--ranks" in argv:
        assert out.startswith("spmdsim: ") and "simulated ranks in one process" in out.splitlines()[0]
    if "--dry-run" in argv or "dry_scale" in command:
        assert "peak held B" in out
    if "dry_scale" in command:
        assert "1024 simulated ranks on a (8, 128) mesh" in out and "all ranks equal" in out
