"""The commands README.md and the docs pages quote, and the outputs they show, for the docs tests.

A fenced block is a list of commands (continuation lines joined) or, when its
first line starts with ``$ ``, one command followed by the output it prints.
A quoted output matches when its lines appear in order in the real output:
``...`` stands for any number of lines; milliseconds match any number, and a
measured error in e-notation (or after "max abs err" / "max rel err", or the
share of its own rounding a bf16 gradient's difference reaches, after "each
gradient within") matches one within a factor of 100 of it, any two at or
below 1e-12 alike, and an exact zero one no larger than another error of the
same line, quoted or measured (that line's rounding, which one CPU's BLAS kernels
leave and another's cancel: an fp32 loss 1.1e-07 beside gradients 2.6e-07 is
0.0e+00 on another CPU); their rounding depends on the BLAS build and the CPU; a
quote 100 times off is stale;
an e-notation number of 1 or more is a count (a step's FLOPs), matched as quoted.
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The pages whose pure commands tests/test_classroom_docs.py runs (README.md's: tests/test_readme.py).
DOCS = ("docs/tutorials/walkthrough.md", "docs/tutorials/lab.md", "docs/tutorials/lab-part2.md",
        "docs/explanation/architecture.md", "docs/howto/pipelines.md", "docs/howto/estimate.md",
        "docs/explanation/estimate-published.md", "docs/explanation/estimate-h100.md",
        "docs/howto/choose-configuration.md", "docs/howto/experts.md", "docs/howto/experts-memory.md",
        "docs/howto/experts-folding.md",
        "docs/howto/train.md", "docs/howto/train-gpt.md", "docs/howto/autoshard.md", "docs/explanation/algorithms.md",
        "docs/howto/simulate.md", "docs/explanation/context-parallel.md")
#: The pages whose `timeout -k 5 N mpiexec -n N spmdsim ...` commands tests/mpi/test_classroom_docs.py runs.
MPI_DOCS = DOCS + ("docs/howto/install.md", "docs/reference/operators.md")
#: Pages of DOCS whose commands are run here only in these sections ("": the part before the first "## "
#: heading); their other sections' commands run in the tests named beside each page.
SECTIONS = {
    "docs/howto/train.md": ("",),  # the rest: tests/test_train_*.py, test_optim_state.py
    "docs/howto/train-gpt.md": ("## General operators and the GPT",),  # test_train_vocab_docs, test_gpt_*
    "docs/howto/autoshard.md": ("## At a glance",),  # test_autoshard_*.py
    "docs/reference/operators.md": ("## Running the operators",),  # (MPI_DOCS) test_ops_infer.py, test_docs_hints.py
    "docs/explanation/algorithms.md": ("## At a glance",),  # test_algorithms_cli.py
    "docs/howto/simulate.md": ("## At a glance",),  # test_sim_docs.py
    "docs/howto/choose-configuration.md": ("", "## Choosing a configuration by predicted time"),  # test_autoshard_*
}

#: Subcommands that run without MPI (the others need mpiexec, or measure for long).
PURE = ("slices", "explain", "show", "plan", "convert", "pipeline", "estimate")

_FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`(spmdsim [^`]+)`")
_MPI = re.compile(r"^timeout -k 5 (\d+) mpiexec -n (\d+) (.*)$")
_FLOAT = re.compile(r"(?:\\-)?\d\\.\d+e[+\\-]+\d+")  # escaped, as _pattern sees a line
_MS = re.compile(r"\d+\\.\d+\\ ms")
#: Lines whose "ms" figures are predictions (autoshard's choice), not a measured time: matched exactly.
_PREDICTED = ("chosen: ", "not proven best: ")


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
    return list(_parsed(doc))


@functools.cache
def _parsed(doc: str) -> tuple[Quote, ...]:
    """`quotes(doc)`, the page read and parsed once a process: test_classroom_docs.py asks for every page's
    quotes for each command it runs (page_quoting), 7 CPU-s of parsing where each page was read again."""
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
    return tuple(found)


# A check's rounding errors, and which rank holds the largest, depend on the BLAS build. Matched in an escaped line:
# a measured error after "max abs err " / "max rel err " (any number), or in e-notation; the share of its own
# rounding the worst bf16 gradient reaches (options.py's "each gradient within 0.10 of what its own rounding
# allows": 0.10 with numpy 2.4's OpenBLAS, 0.09 with numpy 2.5's, on the same machine).
_WORST = re.compile(r"worst\\ rank\\ \d+")
_ERROR = re.compile(r"(?<=max\\ abs\\ err\\ )[0-9.e+\\-]+|(?<=max\\ rel\\ err\\ )[0-9.e+\\-]+|"
                    r"(?<=each\\ gradient\\ within\\ )[0-9.\\]+|" + _FLOAT.pattern)


def _pattern(line: str) -> tuple[re.Pattern, tuple[float, ...]]:
    """The line as a pattern whose groups are its measured errors, and their quoted values."""
    errors: list[float] = []

    def error(m: re.Match) -> str:
        errors.append(float(m.group(0).replace("\\", "")))
        return "([-0-9.e+]+)"

    escaped = _ERROR.sub(error, _WORST.sub(r"worst\\ rank\\ \\d+", re.escape(line)))
    if line.startswith(_PREDICTED):  # a predicted step time: the program's, quoted exactly
        return re.compile(escaped + r"\Z"), tuple(errors)
    return re.compile(_MS.sub(r"[-0-9.]+\\ ms", escaped) + r"\Z"), tuple(errors)


#: Measured errors at or below this are rounding alike, whatever their ratio (float64 sums of a few thousand terms).
ROUNDING = 1e-12
#: How far a measured error may be from its quote: rounding depends on the BLAS build and the CPU.
FACTOR = 100.0
#: A number in e-notation at or above this is a count the program made (FLOPs: 1.1436e+15), not a rounding error:
#: it matches as quoted, to its printed digits.
COUNTED = 1.0


def close(quoted: float, actual: float, level: float = 0.0) -> bool:
    """Whether a measured error `actual` agrees with its quoted value (see the module docstring); `level`: the
    largest other error of the line, quoted or measured, which an error beside an exact zero may reach."""
    q, a = abs(quoted), abs(actual)
    if max(q, a) <= ROUNDING:
        return True
    if max(q, a) >= COUNTED:  # a count in e-notation (a step's FLOPs), not an error: as quoted
        return quoted == actual
    if min(q, a) == 0:  # rounding one CPU leaves and another cancels, where the line shows rounding as large
        return max(q, a) <= level
    return max(q, a) / min(q, a) <= FACTOR


def _matches(pattern: tuple[re.Pattern, tuple[float, ...]], line: str) -> bool:
    regex, errors = pattern
    m = regex.match(line)
    if m is None:
        return False
    try:
        pairs = [(q, float(a)) for q, a in zip(errors, m.groups())]
    except ValueError:  # what stood in a number's place is not one
        return False
    sizes = [abs(v) if abs(v) < COUNTED else 0.0 for pair in pairs for v in pair]  # (nan: no level)
    return all(close(q, a, max([v for k, v in enumerate(sizes) if k // 2 != i] or [0.0]))
               for i, (q, a) in enumerate(pairs))


def mismatch(quoted: tuple[str, ...], actual: str) -> Optional[str]:
    """None when the quoted lines appear in `actual` as described above, else the first one missing."""
    lines = actual.splitlines()
    at, skipping = 0, False
    for want in quoted:
        if want.strip() == "...":
            skipping = True
            continue
        pattern = _pattern(want)
        while at < len(lines) and not _matches(pattern, lines[at]):
            if not skipping:
                return f"expected {want!r}, got {lines[at]!r}"
            at += 1
        if at == len(lines):
            return f"quoted line {want!r} is not in the output"
        at += 1
        skipping = False
    return None


def shown(doc: str) -> list[Quote]:
    """The quotes of `doc` that tests/test_classroom_docs.py runs: all, or those of its SECTIONS."""
    return list(_shown(doc))


@functools.cache
def _shown(doc: str) -> tuple[Quote, ...]:
    """`shown(doc)`, found once a process (as `_parsed`)."""
    if doc not in SECTIONS:
        return _parsed(doc)
    text = (ROOT / doc).read_text()
    starts = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(r"^## ", text, re.M)] + [text.count("\n") + 2]
    spans = []
    for heading in SECTIONS[doc]:
        if heading == "":
            spans.append((0, starts[0]))
            continue
        at = text.count("\n", 0, text.index("\n" + heading) + 1) + 1
        spans.append((at, min(s for s in starts if s > at)))
    return tuple(q for q in _parsed(doc) if any(a <= q.line < b for a, b in spans))


def page_quoting(quote: Quote) -> Optional[str]:
    """The DOCS page whose commands tests/test_classroom_docs.py runs (`shown`) that quotes `quote`'s command with its
    output too, or None: that test checks its one run against both quotes (README.md's 16-device MoE search, 2-3
    CPU-s, ran in it and in tests/test_readme.py)."""
    if quote.output is None:
        return None
    return next((doc for doc in DOCS for q in shown(doc) if q.command == quote.command and q.output is not None),
                None)


def section(doc: str, heading: str) -> list[Quote]:
    """The quotes of `doc` under the heading line `heading` (to the next "## " heading)."""
    text = (ROOT / doc).read_text()
    start = text.count("\n", 0, text.index(heading))
    after = text.find("\n## ", text.index(heading) + 1)
    stop = text.count("\n", 0, after if after >= 0 else len(text))
    return [q for q in quotes(doc) if start <= q.line <= stop]


def run_shell(command: str) -> subprocess.CompletedProcess:
    """`command` in bash from the repository's root, this Python's folder first on PATH."""
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


#: `spmdsim` subcommands run in this process (in_process): the others need mpiexec, or are PURE (Quote.argv).
IN_PROCESS = ("autoshard", "collective", "mpirun")
#: Scripts that run their ranks simulated only (spmdsim.simulate), run in this process like an example's `--ranks N`.
SIMULATING_SCRIPTS = ("scripts/memory_table.py",)


def in_process(command: str, subcommands: tuple = IN_PROCESS) -> Optional[tuple[str, list[str], bool]]:
    """(what, argv, merged) for a command this process can run as bash would (run_here): what is "main" for
    `spmdsim <one of subcommands> ...`, else the path of `python examples/NAME.py ... --ranks N ...` (simulated
    ranks, no MPI) or of a SIMULATING_SCRIPTS script; merged: the command ends in `2>&1`. None for any other
    command (shell syntax, mpiexec): a Python start and spmdsim's imports less (0.3-0.7 CPU-s each)."""
    line = command.split("#")[0].strip()
    merged = line.endswith(" 2>&1")
    line = line[:-len(" 2>&1")] if merged else line
    if "\n" in command or any(c in line for c in "|<>;&$`"):
        return None
    words = shlex.split(line)
    if len(words) >= 2 and words[0] == "spmdsim" and words[1] in subcommands:
        return "main", words[1:], merged
    if len(words) >= 2 and words[0] == "python" and (
            (re.fullmatch(r"examples/\w+\.py", words[1]) and "--ranks" in words) or words[1] in SIMULATING_SCRIPTS):
        return words[1], words[2:], merged
    return None


def run_here(what: str, argv: list[str], merged: bool = False) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `spmdsim ARGV` (what "main", in the current folder) or `python WHAT ARGV`
    from the repository's root, in this process (in_process); merged: stderr written into stdout (`2>&1`)."""
    import contextlib
    import io
    import runpy

    import pytest

    out = io.StringIO()
    err = out if merged else io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setattr(sys, "excepthook", sys.excepthook)  # install_excepthook replaces it
        try:
            if what == "main":
                from spmdsim.tools.cli.main import main

                code = main(argv)
            else:  # as `python WHAT`: its folder first on sys.path, run as __main__
                mp.chdir(ROOT)
                mp.setattr(sys, "argv", [str(ROOT / what), *argv])
                mp.setattr(sys, "path", [str((ROOT / what).parent), *sys.path])
                runpy.run_path(str(ROOT / what), run_name="__main__")
                code = 0
        except SystemExit as exc:  # as the interpreter exits: None is 0, a message is printed and 1
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if code == 1 and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
    return code, out.getvalue(), "" if merged else err.getvalue()


def run_quoted(command: str) -> subprocess.CompletedProcess:
    """`command` as run_shell runs it, in this process where in_process can (run_here)."""
    here = in_process(command)
    if here is None:
        return run_shell(command)
    code, out, err = run_here(*here)
    return subprocess.CompletedProcess(command, code, out, err)


def run_example(path: str, *args: str) -> subprocess.CompletedProcess:
    """`python PATH ARGS` from the repository's root, as run_quoted runs it (an example on `--ranks N`: in this
    process)."""
    return run_quoted(shlex.join(["python", path, *args]))


def assert_prints_quote(quote: Quote, returncode: int = 0) -> subprocess.CompletedProcess:
    """Run the quoted command (run_quoted) and assert it exits with `returncode` and prints the quoted lines."""
    done = run_quoted(quote.command)
    assert done.returncode == returncode, quote.where() + "\n" + done.stderr[-2000:]
    why = mismatch(quote.output, done.stdout)
    assert why is None, f"{quote.where()}: {why}\n{done.stdout}"
    return done


def _shortened(quote: Quote) -> str:
    """A command marked ``# long``, with ``--steps 2 --sample 0`` in place of its step count."""
    command, _, note = quote.command.partition("#")
    assert note.strip() == "long", quote.where()
    short = re.sub(r"--steps \d+", "--steps 2 --sample 0", command.strip())
    assert short != command.strip()
    return short


def run_long(quote: Quote) -> subprocess.CompletedProcess:
    """A simulated command marked ``# long`` run with ``--steps 2 --sample 0`` in place of its step count (run_quoted;
    asserted to exit 0). The MPI ones run together (run_long_together)."""
    short = _shortened(quote)
    assert "mpiexec" not in short, quote.where()
    done = run_quoted(short)
    assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
    return done


#: Flags of examples/train_gpt.py that change what a run prints, not what it computes: --every (which steps' rows),
#: --memory (rank 0's memory report, counted whether or not it is printed), --sample 0 (no sample drawn).
_PRINTING = {"--every": 1, "--memory": 0, "--sample": 1}


def _run_flags(command: str) -> tuple[list[str], int]:
    """(a simulated train_gpt.py command's words without --steps and the _PRINTING flags, its --steps)."""
    words, kept, steps, i = shlex.split(command, comments=True), [], None, 0
    while i < len(words):
        if words[i] == "--steps":
            steps, i = int(words[i + 1]), i + 2
        elif words[i] in _PRINTING:
            i += 1 + _PRINTING[words[i]]
        else:
            kept, i = kept + [words[i]], i + 1
    return kept, steps


def long_run_in(quote: Quote, shown: list[Quote]) -> Optional[Quote]:
    """The command of `shown` quoted with its output that runs what `quote` (marked ``# long``, simulated) runs with
    ``--steps 2 --sample 0`` (run_long): the same command with at least 2 steps, differing only in _PRINTING flags,
    whose quote shows its check PASS; else None. Its first 2 steps are run_long's 2 (the step count changes no
    step), so a test that checks its output against the quote checks run_long's claim: no need to run both."""
    flags, _ = _run_flags(_shortened(quote))
    for other in shown:
        if other.output is None or other.mpi is not None:
            continue
        kept, steps = _run_flags(other.command)
        passed = any(re.fullmatch(r"check: \d+ steps vs one numpy process .*: PASS", line) for line in other.output)
        if kept == flags and steps is not None and steps >= 2 and passed:
            return other
    return None


def mpi_long(quote: Quote) -> bool:
    """Whether `quote` is an MPI launch of examples/train_gpt.py marked ``# long``: tests/test_train_docs_mpi.py runs
    every such command of docs/howto/train.md and docs/howto/replay.md (run_long_together), the pages' other
    tests the rest."""
    command, _, note = quote.command.partition("#")
    return quote.mpi is not None and quote.mpi[1][:2] == ["python", "examples/train_gpt.py"] and note.strip() == "long"


def run_long_together(shown: list[Quote], mpiexec: str) -> dict:
    """{quote: (each rank's exit code, what the job printed for it)} for MPI commands marked ``# long``, all at one
    rank count, each with ``--steps 2 --sample 0`` in place of its step count: ONE mpiexec job runs them all in
    turn (testkit.mpi_batch: each as `python PATH ARGS` would, on every rank), under the largest of their
    timeouts. mpiexec's start and each rank's Python and imports are most of a two-step run's cost (8 ranks
    on 2 cores: 13-15 CPU-s a launch where five commands together took 33)."""
    from testkit import mpi_batch

    programs, ranks, timeout = [], set(), 0
    for quote in shown:
        m = _MPI.match(_shortened(quote))
        assert m, quote.where()
        words = shlex.split(m.group(3))
        assert words[0] == "python" and words[1].endswith(".py"), quote.where()
        programs.append((quote.where(), str(ROOT / words[1]), words[2:]))
        ranks.add(int(m.group(2)))
        timeout = max(timeout, int(m.group(1)))
    assert len(ranks) == 1, ranks
    found = mpi_batch(programs, ranks.pop(), cwd=ROOT, timeout=timeout, mpiexec=mpiexec)
    return {quote: found[quote.where()] for quote in shown}
