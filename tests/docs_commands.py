"""The commands README.md and docs/lab.md quote, and the outputs they show, for the docs tests.

A fenced block is a list of commands (continuation lines joined) or, when its
first line starts with ``$ ``, one command followed by the output it prints.
A quoted output matches when its lines appear in order in the real output:
``...`` stands for any number of lines, and numbers that depend on the machine
(errors in e-notation, milliseconds) match any number.
"""
from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/lab.md", "docs/architecture.md", "docs/pipeline.md", "docs/estimate.md", "docs/experts.md")

#: Subcommands that run without MPI (the others need mpiexec, or measure for long).
PURE = ("slices", "explain", "show", "plan", "convert", "pipeline", "estimate")

_FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`(spmdsim [^`]+)`")
_MPI = re.compile(r"^timeout -k 5 (\d+) mpiexec -n (\d+) (.*)$")
_FLOAT = re.compile(r"(?:\\-)?\d\\.\d+e[+\\-]+\d+|\d+\\.\d+\\ ms")


@dataclass(frozen=True)
class Quote:
    """One command a doc shows, where it stands, and the output quoted under it (or None)."""

    doc: str
    line: int
    command: str
    output: Optional[tuple[str, ...]] = None
    inline: bool = False

    @property
    def mpi(self) -> Optional[tuple[int, list[str]]]:
        """(ranks, argv after `mpiexec -n N`) for an MPI command, else None."""
        m = _MPI.match(self.command)
        return (int(m.group(2)), shlex.split(m.group(3))) if m else None

    @property
    def argv(self) -> Optional[list[str]]:
        """The argv of a plain `spmdsim <pure subcommand> ...` call (no shell syntax), else None."""
        if any(c in self.command for c in "|<>;&$"):
            return None
        words = shlex.split(self.command, comments=True)
        if len(words) < 3 or words[0] != "spmdsim" or words[1] not in PURE:
            return None  # `spmdsim show` alone names a command in prose
        return words[1:]

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.command}"


def _joined(lines: list[str]) -> list[str]:
    out, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        out.append(pending + line.strip())
        pending = ""
    return out


def quotes(doc: str) -> list[Quote]:
    """Every command quoted in `doc` (fenced blocks and inline `spmdsim ...` spans), in order."""
    text = (ROOT / doc).read_text()
    found = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        if m.group(1) in ("python", "text"):
            continue  # a program to save and launch, or a picture: not a command line
        body = m.group(2).splitlines()
        if body and body[0].startswith("$ "):
            found.append(Quote(doc, line, body[0][2:].strip(), tuple(body[1:])))
            continue
        heredoc = [i for i, b in enumerate(body) if "<<" in b]
        if heredoc:  # a here-document: the whole block is one shell command
            found.append(Quote(doc, line, "\n".join(body)))
            continue
        for command in _joined(body):
            if command and not command.startswith("#"):
                found.append(Quote(doc, line, command))
    for m in _INLINE.finditer(text):
        found.append(Quote(doc, text.count("\n", 0, m.start()) + 1, m.group(1), inline=True))
    return found


# A check's rounding errors, and which rank holds the largest, depend on the BLAS build.
_WORST = re.compile(r"worst\\ rank\\ \d+")
_ERR = re.compile(r"(max\\ (?:abs|rel)\\ err\\ )[0-9.e+\\-]+")


def _pattern(line: str) -> re.Pattern:
    escaped = _ERR.sub(r"\1[-0-9.e+]+", _WORST.sub(r"worst\\ rank\\ \\d+", re.escape(line)))
    return re.compile(_FLOAT.sub(r"[-0-9.e+]+( ms)?", escaped) + r"\Z")


def mismatch(quoted: tuple[str, ...], actual: str) -> Optional[str]:
    """None when the quoted lines appear in `actual` as described above, else the first one missing."""
    lines = actual.splitlines()
    at, skipping = 0, False
    for want in quoted:
        if want.strip() == "...":
            skipping = True
            continue
        pattern = _pattern(want)
        while at < len(lines) and not pattern.match(lines[at]):
            if not skipping:
                return f"expected {want!r}, got {lines[at]!r}"
            at += 1
        if at == len(lines):
            return f"quoted line {want!r} is not in the output"
        at += 1
        skipping = False
    return None


def section(doc: str, heading: str) -> list[Quote]:
    """The quotes of `doc` under the heading line `heading` (to the next "## " heading)."""
    text = (ROOT / doc).read_text()
    start = text.count("\n", 0, text.index(heading))
    stop = text.count("\n", 0, text.index("\n## ", text.index(heading) + 1))
    return [q for q in quotes(doc) if start <= q.line <= stop]


def run_shell(command: str) -> subprocess.CompletedProcess:
    """`command` in bash from the repository's root, this Python's folder first on PATH."""
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def assert_prints_quote(quote: Quote, returncode: int = 0) -> subprocess.CompletedProcess:
    """Run the quoted command (run_shell) and assert it exits with `returncode` and prints the quoted lines."""
    done = run_shell(quote.command)
    assert done.returncode == returncode, quote.where() + "\n" + done.stderr[-2000:]
    why = mismatch(quote.output, done.stdout)
    assert why is None, f"{quote.where()}: {why}\n{done.stdout}"
    return done


def run_long(quote: Quote, mpiexec: Optional[str]) -> subprocess.CompletedProcess:
    """A command marked ``# long`` run with ``--steps 2 --sample 0`` in place of its step count (asserted to
    exit 0); the calling test is skipped for an MPI one where there is no `mpiexec`."""
    command, _, note = quote.command.partition("#")
    assert note.strip() == "long", quote.where()
    if "mpiexec" in command and not mpiexec:
        import pytest

        pytest.skip("no mpiexec")
    short = re.sub(r"--steps \d+", "--steps 2 --sample 0", command.strip())
    assert short != command.strip()
    done = run_shell(short)
    assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
    return done
