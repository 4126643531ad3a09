"""docs/tutorials/first-program.md as a new user follows it: the program saved under the name the page gives, in a
folder of its own, prints what the page shows, and refuses the wrong rank count with the line the page quotes."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from docs_commands import ROOT, mismatch, quotes
from testkit import unfold

PAGE = "docs/tutorials/first-program.md"


def _saved(folder) -> str:
    """Save the page's program under the name the page asks for, in `folder`; return that name."""
    text = (ROOT / PAGE).read_text()
    name = re.search(r"^Save this as `(\w+\.py)`", text, re.M).group(1)
    (folder / name).write_text(re.search(r"^```python\n(.*?)^```", text, re.S | re.M).group(1))
    return name


def _run(folder, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=folder, capture_output=True, text=True, timeout=120)


def test_the_program_prints_what_the_page_shows_on_8_simulated_ranks(tmp_path):
    name = _saved(tmp_path)
    shown = [q for q in quotes(PAGE) if q.output is not None]
    assert [q.command for q in shown] == [f"python {name} --ranks 8"]
    done = _run(tmp_path, name, "--ranks", "8")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    why = mismatch(shown[0].output, done.stdout)
    assert why is None, f"{shown[0].where()}: {why}\n{done.stdout}"
    assert max(len(line) for line in done.stdout.splitlines()) <= 100


def test_the_wrong_rank_count_is_the_one_line_the_page_quotes(tmp_path):
    name = _saved(tmp_path)
    text = " ".join((ROOT / PAGE).read_text().split())
    quoted = re.search(r"`--ranks 4` ends in one message before any collective, `([^`]+) \.\.\.`", text).group(1)
    done = _run(tmp_path, name, "--ranks", "4")
    assert done.returncode == 2
    assert unfold(done.stderr).startswith(f"spmdsim: error: {quoted} `--ranks 8`"), done.stderr
    assert len(done.stderr.splitlines()) == 2 and "Traceback" not in done.stderr  # one message, folded once


def test_the_divergence_guard_names_the_rank_whose_layout_differs_as_the_page_quotes(tmp_path):
    """The page sends a user whose mpiexec job hangs to SPMDSIM_CHECK=1, quoting the line it prints when rank 2
    alone puts x on layout("dp", None): the program saved so changed prints that line."""
    name = _saved(tmp_path)
    text = " ".join((ROOT / PAGE).read_text().split())
    quoted = re.search(r"it reads `(spmdsim: error: collectives diverge: [^`]+) \.\.\.`", text).group(1)
    program = (tmp_path / name).read_text()
    line = 'x = DTensor.from_seeded(mesh, layout("dp", "mp"), xs)'
    assert line in program
    (tmp_path / name).write_text(program.replace(
        line, 'x = DTensor.from_seeded(mesh, layout("dp", "mp") if mesh.rank != 2 else layout("dp", None), xs)'))
    done = subprocess.run([sys.executable, name, "--ranks", "8"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SPMDSIM_CHECK": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert unfold(done.stderr).startswith(quoted), done.stderr
    assert max(len(line) for line in done.stderr.splitlines()) <= 100, done.stderr  # folded, as under mpiexec
