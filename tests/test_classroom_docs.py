"""Every command README.md and docs/tutorials/lab.md quote runs, and prints what they quote (pure commands).

The MPI commands run in tests/mpi/test_classroom_docs.py at their own rank
count; the examples in tests/mpi/test_examples.py. The pictures beside a
command are made again and compared with the committed ones.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from docs_commands import DOCS, IN_PROCESS, PURE, ROOT, in_process, mismatch, page_quoting, quotes, run_here, shown

_BIN = pathlib.Path(sys.executable).parent
# Commands a test here does not run, and why (each must still be quoted as written).
_ELSEWHERE = (
    (re.compile(r"^python3 -m venv "), "the install itself"),
    (re.compile(r"^timeout -k 5 \d+ mpiexec "), "tests/mpi/test_classroom_docs.py and test_examples.py"),
    (re.compile(r"^spmdsim (launch|demo|calibrate|run)\b"), "MPI: named in prose, run in the MPI tests"),
    (re.compile(r"^grep -rnE "), "tests/test_engines.py, from the repository's root (the package's own files)"),
    (re.compile(r"^python -m pytest tests/test_[a-z_]+\.py( tests/test_[a-z_]+\.py)*$"),
     "this suite runs those test files itself"),
    (re.compile(r"^python examples/train_moe_gpt\.py --ranks 8 --pp .* --replay "),
     "tests/test_moe.py: its output, and each stage's program run at step 0 alone"),
    (re.compile(r"^python scripts/estimate_tables\.py$"),
     "tests/test_estimate_tables.py: its fast rows against the quoted table (all 18 take about 65 s)"),
    (re.compile(r"^spmdsim autoshard --network gpt --gpt layers=16,d_model=25600,.* --devices 3072 "
                r"--memory-limit 8\.5G "),
     "tests/test_estimate_bounds.py: its output against the quote, and the search's choice and counts"),
    (re.compile(r"^python examples/train_gpt\.py --ranks 8 .* --replay$"),
     "tests/test_gpt_parallel.py: its check's PASS, its widths, its rows against the steps run one by one"),
)


def _run_by_test_sim_cli(command: str) -> bool:
    """`python examples/NAME.py --ranks 8` exactly, for an example tests/test_sim_cli.py runs with no arguments
    of its own: that test runs this very command in process (exit 0, its PASS line, 100 columns)."""
    from testkit import EXAMPLE_ARGS

    m = re.fullmatch(r"python examples/(\w+)\.py --ranks 8", command.split("#")[0].strip())
    return bool(m) and (ROOT / "examples" / f"{m.group(1)}.py").is_file() and m.group(1) not in EXAMPLE_ARGS


def _run_by_test_readme(quote) -> bool:
    """A `spmdsim` command quoted here without output that README.md quotes with its output: tests/test_readme.py runs
    it (in process) and checks its exit code, that output and its widths (but a command a page here quotes with its
    output too, docs_commands.page_quoting: it runs here, once)."""
    return quote.output is None and quote.command.startswith("spmdsim ") and quote.command in {
        q.command for q in quotes("README.md") if q.output is not None and not page_quoting(q)}


#: The steps a training example the docs quote without output runs here when the command leaves them to its default,
#: by example: train_mindspore_tutorial.py's default 100 steps on 8 simulated ranks took 7.9 CPU-s, 20 take 1.8, and
#: each step runs and is checked as the first 20 are (examples whose default is short already are not listed).
SHORT_STEPS = {"examples/train_mindspore_tutorial.py": 20}


#: A command quoted without output whose run is another's on its page, quoted before it, with a flag that only adds
#: lines: train_mindspore_tutorial.py's --explain says what step 0's backward collectives answer, and its 20 steps (the
#: plain line's SHORT_STEPS) print the same lines besides (1.9 CPU-s a run). The plain line is checked on that run.
SAME_RUN = {"python examples/train_mindspore_tutorial.py --ranks 8":
            "python examples/train_mindspore_tutorial.py --ranks 8 --steps 20 --explain"}


def _bare(command: str) -> str:
    """`command` without its comment."""
    return command.split("#")[0].strip()


def _shortened(quote, what: str, argv: list, merged: bool) -> tuple[str, list, bool]:
    """run_here's arguments for `quote`, with ``--steps`` of SHORT_STEPS for a training example with no quoted
    output that leaves its step count to the default (nothing printed to compare: its exit code and widths are
    checked)."""
    if quote.output is None and what in SHORT_STEPS and "--steps" not in argv:
        argv = [*argv, "--steps", str(SHORT_STEPS[what])]
    return what, argv, merged


def _shell(command: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               SPMDSIM_COST_FILE=str(cwd / "no-calibration.json"))
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


#: The `spmdsim` subcommands run here in this process: those docs_commands.in_process runs, the PURE ones
#: quoted with shell syntax (`spmdsim pipeline ... 2>&1`), and `context` (pure, no ranks).
_HERE = IN_PROCESS + PURE + ("context",)
#: How a quoted command prints its exit code after what it printed: `COMMAND 2>&1; echo "exit $?"`.
_SAYS_EXIT = '; echo "exit $?"'


def _run(quote, workdir: pathlib.Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one quoted command, run in `workdir`."""
    if quote.argv is not None:  # a pure `spmdsim` command
        return run_here("main", quote.argv)
    says_exit = quote.command.endswith(_SAYS_EXIT)
    here = in_process(quote.command[:-len(_SAYS_EXIT)] if says_exit else quote.command, _HERE)
    if here is not None:  # a Python start and spmdsim's imports less (0.1-0.6 CPU-s each, ~35 commands)
        code, out, err = run_here(*_shortened(quote, *here))
        return (0, f"{out}exit {code}\n", err) if says_exit else (code, out, err)  # echo's exit code, 0
    # `python examples/...` and `python scripts/...` are quoted from the repository's root.
    done = _shell(quote.command, ROOT if quote.command.startswith("python ") else workdir)
    return done.returncode, done.stdout, done.stderr


class _Ran(dict):
    """{doc: [(quote, (code, out, err))]} for every pure command a doc quotes, run when a doc is first asked for,
    in one folder (README and docs/tutorials/lab.md quote some commands twice, with and without their output: each runs
    once), and the folder, where the pictures they draw are, under the key "workdir". Run doc by doc, not all at the
    first test: each test's time limit (pytest-timeout) covers its own doc's commands only."""

    def __init__(self, workdir: pathlib.Path) -> None:
        super().__init__(workdir=workdir)
        self._done: dict = {}

    def __missing__(self, doc: str) -> list:
        workdir, done, results = self["workdir"], self._done, []
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(workdir)  # case files and pictures the commands write land here
            mp.setenv("SPMDSIM_COST_FILE", str(workdir / "no-calibration.json"))  # built-in model
            for quote in shown(doc):
                if any(pattern.match(quote.command) for pattern, _ in _ELSEWHERE):
                    continue
                if quote.output is None and (_run_by_test_sim_cli(quote.command) or _run_by_test_readme(quote)):
                    continue
                if quote.argv is None and quote.inline and quote.command.split()[1:2] \
                        and len(quote.command.split()) < 3:
                    continue  # a subcommand's name in prose
                if quote.output is None and _bare(quote.command) in SAME_RUN:  # that run, made before it
                    (ran,) = [run for command, run in done.items() if _bare(command) == SAME_RUN[_bare(quote.command)]]
                    results.append((quote, ran))
                    continue
                if quote.command not in done:
                    done[quote.command] = _run(quote, workdir)
                results.append((quote, done[quote.command]))
        self[doc] = results
        return results


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> _Ran:
    """Every pure command the docs quote, run once, doc by doc as the tests ask (_Ran)."""
    return _Ran(tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("doc", DOCS)
def test_every_pure_command_runs_and_prints_what_the_doc_quotes(doc, ran):
    for quote, (code, out, err) in ran[doc]:
        assert code == 0, f"{quote.where()}\n{err}"
        if quote.output:
            why = mismatch(quote.output, out)
            assert why is None, f"{quote.where()}: {why}\n{out}"
        if "--json" not in quote.command:  # JSON stays complete, any width
            assert max((len(line) for line in out.splitlines()), default=0) <= 100, quote.where()
    least = {"docs/tutorials/lab.md": 10, "docs/tutorials/lab-part2.md": 5, "docs/tutorials/walkthrough.md": 10}
    assert len(ran[doc]) >= least.get(doc, 1)  # every page listed quotes commands; the lab pages many
    # quote many


def test_a_command_readme_quotes_too_prints_what_readme_quotes(ran):
    """A command README.md quotes with its output that a page here quotes with its output too
    (docs_commands.page_quoting: the 16-device MoE search of docs/howto/choose-configuration.md) runs once, here:
    its output matches README's quote as well, within 100 columns (tests/test_readme.py leaves it to this test)."""
    shared = [q for q in quotes("README.md") if page_quoting(q)]
    assert [q.command.split()[:2] for q in shared] == [["spmdsim", "autoshard"]]
    for quote in shared:
        (code, out, err), = {done for q, done in ran[page_quoting(quote)] if q.command == quote.command}
        assert code == 0, f"{quote.where()}\n{err}"
        why = mismatch(quote.output, out)
        assert why is None, f"{quote.where()}: {why}\n{out}"
        assert max((len(line) for line in out.splitlines()), default=0) <= 100, quote.where()


def _pixels(path: pathlib.Path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


#: The matplotlib the docs' pictures were drawn with (major, minor): another draws text and lines a few
#: percent of pixels apart (3.10 against 3.11: 3.5% of rows_partial_dp.png), so only their sizes are compared.
PICTURES_MATPLOTLIB = (3, 11)


def test_the_pictures_are_made_by_the_commands_beside_them(ran):
    """Each picture a doc shows is drawn again by the command beside it (run once, in `ran`)."""
    matplotlib = pytest.importorskip("matplotlib")
    same_drawing = tuple(int(v) for v in matplotlib.__version__.split(".")[:2]) == PICTURES_MATPLOTLIB
    checked = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        commands = [q for q in shown(doc) if q.argv and "--png" in q.argv]
        for name in re.findall(r"!\[[^\]]*\]\((?:docs/|\.\./)?img/([\w./]+\.png)\)", text):
            # `--png NAME.png` (show), or `--png DIR` writing DIR/NAME.png (plan)
            maker = [q for q in commands if q.argv[q.argv.index("--png") + 1] in (name, name.split("/")[0])]
            if not maker:  # drawn under MPI (`spmdsim collective --png DIR`): a command must say how
                assert any("--png" in q.command for q in shown(doc)), f"{doc}: who draws {name}?"
                continue
            assert any(q.command == maker[0].command for q, _ in ran[doc]), maker[0].where()
            made, kept = _pixels(ran["workdir"] / name), _pixels(ROOT / "docs" / "img" / name)
            assert made.shape == kept.shape, (name, made.shape, kept.shape)
            if same_drawing:
                differ = float((abs(made - kept) > 0.05).any(axis=-1).mean())
                assert differ < 0.01, (f"{name}: {differ:.1%} of the pixels differ; "
                                       f"remake it with {maker[0].command}")
            checked.append(name)
    assert sorted(checked) == ["matmul_partial.png", "plan_dtensor/bytes.png",
                               "plan_dtensor/moves_01.png", "rows_partial_dp.png", "seed_layout.png"]
    if not same_drawing:
        pytest.skip(f"the pictures' sizes match; their pixels are compared under matplotlib "
                    f"{'.'.join(map(str, PICTURES_MATPLOTLIB))}, not {matplotlib.__version__}")


def test_a_command_checked_on_anothers_run_is_that_run_with_fewer_lines(ran):
    """Each SAME_RUN line is quoted without output after the command whose run it is checked on, whose argv is the
    line's as run here (SHORT_STEPS's steps) and --explain, and whose run printed its explanation."""
    found = []
    for doc in DOCS:
        for quote, (code, out, _) in ran[doc]:
            if _bare(quote.command) not in SAME_RUN:
                continue
            other = SAME_RUN[_bare(quote.command)]
            first = next(q for q in shown(doc) if _bare(q.command) == other)
            assert quote.output is None and first.line < quote.line, quote.where()
            plain = _shortened(quote, *in_process(_bare(quote.command), _HERE))[1]
            assert in_process(other, _HERE)[1] == [*plain, "--explain"], other
            assert code == 0 and "backward collectives (this rank)" in out, out
            found.append(doc)
    assert found == ["docs/howto/train.md"]


def test_every_mpiexec_the_docs_quote_runs_under_a_timeout():
    launched = [q for doc in DOCS for q in shown(doc) if "mpiexec" in q.command]
    assert len(launched) >= 10
    for quote in launched:
        assert re.search(r"(^|&& )timeout -k 5 \d+ mpiexec -n \d+ ", quote.command), quote.where()


def test_quoted_output_matching():
    from docs_commands import mismatch

    assert mismatch(("a", "...", "c 1.5e-06"), "a\nb\nc 2.25e-07\n") is None
    assert mismatch(("a", "c"), "a\nb\nc\n") == "expected 'c', got 'b'"
    assert mismatch(("...", "z"), "a\n") == "quoted line 'z' is not in the output"
    assert mismatch(("t 2.268 ms",), "t 0.5 ms") is None


def test_a_predicted_step_time_is_quoted_exactly_and_a_measured_one_loosely():
    """A measured time in ms (a search's own, a benchmark's) differs between runs and matches any value; autoshard's
    choice and its bound are predictions of the program, the same on every run: a stale one fails."""
    from docs_commands import mismatch

    assert mismatch(("a step took 1.5 ms",), "a step took 9.2 ms\n") is None
    chosen = "chosen: tp 1, pp 1, dp 2, 1 mb, none, ZeRO 1: {} ms, 43.1 MiB at its peak"
    assert mismatch((chosen.format("0.537"),), chosen.format("0.537") + "\n") is None
    assert mismatch((chosen.format("0.095"),), chosen.format("0.537") + "\n") is not None


def test_a_quoted_error_must_be_near_the_measured_one():
    """A measured error matches its quote within a factor of 100 (the BLAS build's and CPU's rounding); two
    at rounding level (at most 1e-12) match whatever their ratio; a quote further off is stale and fails."""
    from docs_commands import mismatch

    assert mismatch(("c 1.5e-06",), "c 1.5e-04\n") is None
    assert mismatch(("c 1.5e-06",), "c 1.6e-04\n") == "expected 'c 1.5e-06', got 'c 1.6e-04'"
    assert mismatch(("c 1.5e-06",), "c 1.4e-08\n") is not None
    assert mismatch(("loss 4.2e-11 grads 0.0e+00",), "loss 3.0e-11 grads 8.8e-16\n") is None
    assert mismatch(("loss 4.2e-11 grads 0.0e+00",), "loss 3.0e-11 grads 8.8e-09\n") is not None
    assert mismatch(("max abs err 0 worst rank 3",), "max abs err 2.2e-16 worst rank 5\n") is None
    assert mismatch(("max abs err 1.1e-16",), "max abs err 3.5e-10\n") is not None
    assert mismatch(("c -2.0e-03",), "c 3.0e-03\n") is None  # a signed error: its size is compared
    assert mismatch(("c 2.0e-03",), "c nan\n") is not None
    # The share of its own rounding the worst bf16 gradient reaches: a measured error too (numpy 2.4's OpenBLAS
    # prints docs/howto/bf16.md's 0.10, numpy 2.5's 0.09 on the same machine); the bound beside it is not.
    within = "each gradient within {} of what its own rounding allows (at most {})"
    assert mismatch((within.format("0.10", 1),), within.format("0.09", 1) + "\n") is None
    assert mismatch((within.format("0.10", 1),), within.format("0.09", 2) + "\n") is not None


def test_a_quoted_pytest_command_names_files_this_suite_runs():
    """The docs' `python -m pytest tests/...` lines are not run again here: the files they name are this suite's."""
    named = [q for doc in DOCS for q in shown(doc) if q.command.startswith("python -m pytest ")]
    assert named  # docs/explanation/architecture.md's import rules
    for quote in named:
        assert any(pattern.match(quote.command) for pattern, _ in _ELSEWHERE), quote.where()
        for path in quote.command.split()[3:]:
            assert (ROOT / path).is_file() and pathlib.Path(path).name.startswith("test_"), quote.where()


def test_the_examples_left_to_test_sim_cli_are_the_ones_it_runs():
    """The docs' `python examples/NAME.py --ranks 8` lines this file leaves out are run by test_sim_cli as written."""
    import test_sim_cli

    left = [q.command for doc in DOCS for q in shown(doc) if q.output is None and _run_by_test_sim_cli(q.command)]
    assert len(left) >= 2, left  # the llama_block and attention lines
    stems = {path.stem for path in test_sim_cli.EXAMPLES}
    for command in left:
        assert command.split("/")[1].split(".py")[0] in stems, command
    assert not _run_by_test_sim_cli("python examples/train_gpt.py --ranks 8")  # run with its own arguments there
    assert not _run_by_test_sim_cli("python examples/attention.py --ranks 8 --dry-run")


def test_the_lab_counts_its_own_exercises():
    """docs/tutorials/lab.md's opening said "Sixteen short exercises" (answers "10-16", in-process "13 to 16")
    over nineteen sections: the count, the answers' range and the in-process range follow the sections."""
    text = (ROOT / "docs" / "tutorials" / "lab.md").read_text()
    both = text + (ROOT / "docs" / "tutorials" / "lab-part2.md").read_text()
    last = max(int(n) for n in re.findall(r"^## (\d+)\. ", both, re.M))
    words = {16: "Sixteen", 17: "Seventeen", 18: "Eighteen", 19: "Nineteen", 20: "Twenty"}
    assert text.split("\n\n")[1].startswith(f"{words[last]} short exercises"), last
    assert f"those of 10-{last} under each" in text and f"13 to {last} simulate their ranks" in text
