"""`spmdsim pipeline`: the grids and figures within 100 columns, hand-written files, every error as one line,
and what docs/howto/pipelines.md says about the schedules."""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from fractions import Fraction

import pytest

from docs_commands import DOCS, ROOT, quotes
from spmdsim.tools.cli.main import SUBCOMMANDS, main
from spmdsim.programs.pipeline import build, bubble_formula, in_flight, parse, timeline
from testkit import unfold

WRONG = """# 1F1B with blocking calls: each stage sends, then receives
stage 0: F0 send-act0 F1 send-act1 recv-grad0 B0 F2 send-act2 recv-grad1 B1 recv-grad2 B2
stage 1: recv-act0 F0 B0 send-grad0 recv-act1 F1 B1 send-grad1 recv-act2 F2 B2 send-grad2
"""


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


@pytest.mark.parametrize("argv, cells, bubble", [
    (["--schedule", "gpipe", "--stages", "4", "--microbatches", "8"],
     "stage 3  .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B7 B6", "bubble 24/88 = 3/11 = 27.3% idle"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8"],
     "stage 0  F0 F1 F2 F3 .  .  .  B0 F4 B1", "formula (p-1)/(m+p-1) = 3/11 = 27.3%"),
    (["--stages", "3", "--microbatches", "2"], "stage 2  .  .  F0 B0 F1 B1", "bubble 12/24 = 1/2 = 50.0%"),
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "8"],
     "stage 3  .    .    .    F0.3 F1.3", "formula (p-1)/(v*m+p-1) = 3/19 = 15.8%"),
    (["--schedule", "interleaved", "--stages", "2", "--microbatches", "4", "--virtual-stages", "3"],
     "stage 1  .    F0.1 F1.1", "bubble 4/52 = 1/13 = 7.7% idle"),
    (["--schedule", "1f1b", "--stages", "1", "--microbatches", "3"], "stage 0  F0 B0 F1 B1 F2 B2", "= 0 = 0.0%"),
    (["--schedule", "1f1b", "--stages", "16", "--microbatches", "64"], "stage 15 ", "= 15/79 = 19.0%"),
])
def test_grids_and_figures_fit_100_columns(argv, cells, bubble):
    code, out, err = _run(["pipeline"] + argv)
    assert code == 0 and err == ""
    assert cells in out and bubble in out and "in flight per stage" in out
    assert out.rstrip().endswith("every send meets one receive, no deadlock")
    assert _widest(out) <= 100


def test_width_narrows_the_grid():
    code, out, _ = _run(["pipeline", "--stages", "4", "--microbatches", "8", "--width", "50"])
    assert code == 0 and _widest(out) <= 50 and out.count("\ntime ") == 2  # 22 units in bands of 14


def test_a_hand_written_file_is_checked_and_drawn(tmp_path):
    right = tmp_path / "right.txt"
    right.write_text(build("1f1b", 2, 3).text())
    code, out, err = _run(["pipeline", "--stages", "2", "--microbatches", "3", "--file", str(right)])
    assert code == 0 and err == ""
    assert out.startswith("right.txt (2 stages, 3 microbatches)\n")
    assert "stage 0  F0 F1 .  B0 F2 B1 .  B2" in out and "(as 1f1b)" in out


def test_the_deadlocking_file_is_refused_with_one_message_and_exit_2(tmp_path):
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(WRONG)
    code, out, err = _run(["pipeline", "--stages", "2", "--microbatches", "3", "--file", str(wrong)])
    assert code == 2 and out == ""
    assert "Traceback" not in err and _widest(err) <= 100
    assert err.replace("\n  ", " ").strip() == (
        "spmdsim: error: schedule 'wrong.txt' deadlocks: stage 0 waits in send act 1 -> stage 1 while stage 1 "
        "waits in send grad 0 -> stage 0; post each send with the receive it meets (as [send-act1 recv-grad0])")


@pytest.mark.parametrize("argv, message", [
    (["--stages", "0", "--microbatches", "4"], "--stages 0 must be at least 1"),
    (["--stages", "2", "--microbatches", "-1"], "--microbatches -1 must be at least 1"),
    (["--schedule", "interleaved", "--stages", "2", "--microbatches", "2", "--virtual-stages", "0"],
     "--virtual-stages 0 must be at least 1"),
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "6"],
     "--microbatches 6 is not a multiple of --stages 4; the interleaved schedule needs one (as Megatron)"),
    (["--schedule", "interleaved", "--stages", "2", "--microbatches", "2", "--virtual-stages", "1"],
     "--virtual-stages 1 gives one chunk per stage; the interleaved schedule needs at least 2 (one chunk per "
     "stage is --schedule 1f1b)"),
    # It drew one stage running both chunks, a schedule training refuses (chunk k on stage k mod pp).
    (["--schedule", "interleaved", "--stages", "1", "--microbatches", "4"],
     "--stages 1 gives the interleaved schedule one stage; it puts chunk k on stage k mod p, so it needs --stages 2 "
     "or more, as training does (one stage is --schedule 1f1b)"),
    (["--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--virtual-stages", "2"],
     "--virtual-stages 2 is for --schedule interleaved (or --file); --schedule gpipe holds one chunk per stage"),
    (["--stages", "1024", "--microbatches", "1024"],
     "--stages 1024 x --microbatches 1024 x --virtual-stages 1 = 1,048,576 (microbatch, chunk) pairs is too "
     "many to draw; expected at most 65,536"),
    (["--stages", "2", "--microbatches", "2", "--width", "10"],
     "--width 10 is too narrow; expected at least 40 columns"),
    (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--file", "x.txt"],
     "--file 'x.txt' holds its own schedule, and --schedule '1f1b' names a built one; expected one of them"),
    (["--stages", "2", "--microbatches", "2", "--file", "/no/such/schedule.txt"],
     "--file '/no/such/schedule.txt' cannot be read: No such file or directory"),
    (["--stages", "2", "--microbatches", "2", "--file", "/dev/zero"],  # never ends: read up to the bound
     "--file '/dev/zero' is longer than 4,000,000 characters; expected a schedule of one line per stage"),
    (["--stages", "2", "--microbatches", "2", "--png", "grid.bmp"],
     "--png 'grid.bmp': picture file must end in one of ('.png', '.svg', '.pdf')"),
    (["--stages", "2", "--microbatches", "2", "--png", "/no/such/dir/grid.png"],
     "--png '/no/such/dir/grid.png' cannot be written: directory '/no/such/dir' does not exist"),
])
def test_bad_values_get_one_line(argv, message):
    code, out, err = _run(["pipeline"] + argv)
    assert code == 2 and out == "" and "Traceback" not in err
    assert _widest(err) <= 100
    assert err.startswith("spmdsim: error: ")
    assert message in err.replace("\n  ", " "), err


@pytest.mark.parametrize("text, message", [
    ("stage 0: F0 X1\nstage 1: F0", "stage 0 of 'bad.txt' has token 'X1'; expected F<mb>, B<mb>, send-act<mb>"),
    ("stage 0: F0 [send-act0", "stage 0 of 'bad.txt' opens a post '[' that never closes; expected ']'"),
    ("stage 0: F0\n", "schedule 'bad.txt' has no line for stage 1"),
    (b"stage 0: \xff", "--file"),
])
def test_bad_files_get_one_line(tmp_path, text, message):
    bad = tmp_path / "bad.txt"
    if isinstance(text, bytes):
        bad.write_bytes(text)
        message = f"--file {str(bad)!r} is not UTF-8 text; expected a schedule file"
    else:
        bad.write_text(text)
    code, out, err = _run(["pipeline", "--stages", "2", "--microbatches", "1", "--file", str(bad)])
    assert code == 2 and out == "" and "Traceback" not in err and _widest(err) <= 100
    assert message in err.replace("\n  ", " "), err


def test_a_file_whose_lines_all_name_stage_0_says_it_has_one_stage(tmp_path):
    # `stage 0:` typed on both lines (continuation lines of one stage) read as 1 stage; the refusal said only
    # "stage 0 has send act 0 -> stage 0, a message to the stage itself; expected none (chunks 0..0)".
    typo = tmp_path / "typo.txt"
    typo.write_text(WRONG.replace("stage 1:", "stage 0:"))
    code, out, err = _run(["pipeline", "--file", str(typo)])
    assert (code, out) == (2, "") and unfold(err) == (
        "spmdsim: error: schedule 'typo.txt': stage 0 has send act 0 -> stage 0, a message to the stage itself; "
        "expected none: the schedule has 1 stage (each other stage's line starts 'stage 1:', 'stage 2:', ...)\n")


def test_a_file_with_a_microbatch_number_too_long_names_the_token(tmp_path):
    # It said "schedule 'long.txt' has no token naming a microbatch", of a file whose token names one.
    long = tmp_path / "long.txt"
    long.write_text("stage 0: F99999999999999999999\n")
    code, out, err = _run(["pipeline", "--file", str(long)])
    assert (code, out) == (2, "") and unfold(err) == (
        "spmdsim: error: stage 0 of 'long.txt' has token 'F99999999999999999999', a number of more than 9 digits; "
        "expected a microbatch below 65,536\n")


def test_usage_errors_exit_2():
    for argv in (["pipeline", "--stages", "2", "--microbatches", "two"],
                 ["pipeline", "--schedule", "zb", "--stages", "2", "--microbatches", "2"]):
        with pytest.raises(SystemExit) as exit_:
            _run(argv)
        assert exit_.value.code == 2


@pytest.mark.parametrize("argv, message", [
    ([], "no schedule to draw; expected --stages P and --microbatches M to build one, or --file FILE"),
    (["--stages", "2"], "--stages 2 without --microbatches M; expected both to build a schedule, or --file FILE"),
    (["--microbatches", "4"], "--microbatches 4 without --stages P; expected both"),
])
def test_a_built_schedule_without_its_sizes_is_one_line(argv, message):
    code, out, err = _run(["pipeline"] + argv)
    assert code == 2 and out == "" and err.startswith("spmdsim: error: ") and "Traceback" not in err
    assert message in err.replace("\n  ", " ") and len(err.replace("\n  ", " ").strip().splitlines()) == 1, err


@pytest.mark.parametrize("kind, stages, microbatches, virtual", [
    ("1f1b", 2, 3, 1), ("gpipe", 3, 2, 1), ("interleaved", 2, 4, 2), ("interleaved", 4, 4, 3)])
def test_a_file_alone_gives_its_own_sizes(tmp_path, kind, stages, microbatches, virtual):
    """--stages, --microbatches and --virtual-stages left out are the file's: the grid is the built one's."""
    path = tmp_path / "mine.txt"
    path.write_text(build(kind, stages, microbatches, virtual).text())
    code, out, err = _run(["pipeline", "--file", str(path)])
    assert code == 0 and err == ""
    built = _run(["pipeline", "--schedule", kind, "--stages", str(stages), "--microbatches", str(microbatches)]
                 + (["--virtual-stages", str(virtual)] if kind == "interleaved" else []))[1]

    def grid(text: str) -> list:
        return [line for line in text.splitlines() if line.startswith(("time ", "stage ", "in flight"))]
    assert grid(out) == grid(built) and len(grid(out)) >= stages + 2
    chunks = f", {virtual} chunks per stage" if virtual > 1 else ""
    assert out.startswith(f"mine.txt ({stages} stages, {microbatches} microbatches{chunks})")


@pytest.mark.parametrize("text, message", [
    ("# nothing\n", "schedule 'bad.txt' has no 'stage N: tokens' line; expected one line per stage"),
    ("stage 0: [ ]\n", "schedule 'bad.txt' has no token naming a microbatch"),
    ("stage 0: F999999999\n", "schedule 'bad.txt' names stages 0..0, microbatches 0..999999999 and chunks 0..0: "
                               "1,000,000,000 (microbatch, chunk) pairs is too many; expected at most 65,536"),
    ("stage 0: F0\nstage 1: recv-act0 F0 X\n", "stage 1 of 'bad.txt' has token 'X'"),
])
def test_a_file_whose_sizes_cannot_be_read_is_one_line(tmp_path, text, message):
    bad = tmp_path / "bad.txt"
    bad.write_text(text)
    code, out, err = _run(["pipeline", "--file", str(bad)])
    assert code == 2 and out == "" and "Traceback" not in err and _widest(err) <= 100
    assert message in err.replace("\n  ", " "), err


def test_png_is_written_after_the_grid(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "grid.png"
    code, out, err = _run(["pipeline", "--schedule", "interleaved", "--stages", "4", "--microbatches", "4",
                           "--png", str(path)])
    assert code == 0 and err == ""
    assert out.rstrip().endswith(f"wrote {path}")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pipeline_is_a_subcommand_that_runs_without_mpi():
    """The command's own modules are pure (tests/test_datagen_and_purity.py); the CLI runs it without MPI."""
    assert "pipeline" in SUBCOMMANDS
    code = ("import sys\nfrom spmdsim.tools.cli.main import main\n"
            "code = main(['pipeline', '--stages', '2', '--microbatches', '2'])\n"
            "assert 'mpi4py' not in sys.modules\n"
            "raise SystemExit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv", [
    ["pipeline", "--stages", "2", "--microbatches", "2"],
    ["explain", "--device-matrix", "2,2", "--alias", "x,y", "--tensor-map", "x,y", "--shape", "4,4"]])
def test_under_a_launcher_a_pure_command_runs_on_rank_0_alone(argv, monkeypatch, capsys):
    """`mpiexec -n 4 spmdsim pipeline ... --png f.png` printed the grid four times and four processes wrote one
    file at once: a command that needs no MPI runs on the launcher's rank 0 only (the others exit 0 at once)."""
    for rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("PMI_RANK", rank)
        monkeypatch.setenv("PMI_SIZE", "2")
        assert main(argv) == 0
        assert bool(capsys.readouterr().out) is printed, rank


# --- docs/howto/pipelines.md ----------------------------------------------------------------------------------------


DOC = (ROOT / "docs" / "howto" / "pipelines.md").read_text()


def test_the_doc_is_run_with_the_other_docs_and_shows_each_schedule_and_the_lab():
    assert "docs/howto/pipelines.md" in DOCS  # tests/test_classroom_docs.py runs its commands, compares the output
    shown = [q.command for q in quotes("docs/howto/pipelines.md") if q.output]
    for name in ("gpipe", "1f1b", "interleaved"):
        assert any(f"--schedule {name} --stages 4 --microbatches 8" in c for c in shown), name
    assert any("--file pipeline_wrong.txt" in c for c in shown) and any("pipeline_right.txt" in c for c in shown)
    assert "## Running a pipeline\n\n`examples/train_gpt.py` trains the GPT over a pipeline" in DOC


def test_the_wrong_and_right_files_of_the_lab_are_the_ones_tested():
    blocks = re.findall(r"cat > (pipeline_\w+\.txt) <<'EOF'\n(.*?)^EOF$", DOC, re.S | re.M)
    files = dict(blocks)
    assert set(files) == {"pipeline_wrong.txt", "pipeline_right.txt"}
    assert files["pipeline_wrong.txt"].splitlines()[1:] == WRONG.splitlines()[1:]
    assert parse(files["pipeline_right.txt"], 2, 3).programs == build("1f1b", 2, 3).programs


def test_the_python_example_prints_what_its_comment_says(capsys):
    block = re.search(r"```python\n(.*?)```", DOC, re.S).group(1)
    said = re.search(r"^# (.*)$", block, re.M).group(1)
    exec(compile(block, "docs/howto/pipelines.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[0] == said


def test_the_table_at_8_stages_is_measured():
    table = DOC[DOC.index("### At 8 stages"):DOC.index("## The check")]
    rows = re.findall(r"^\s*(\d+)\s+(\d+/\d+)\s+([\d.]+)%\s+(\d+)\s+(\d+/\d+)\s+([\d.]+)%\s+([\d.]+) \((\d+)/2\)"
                      r"\s+(\d+/\d+)\s+([\d.]+)%\s+([\d.]+) \((\d+)/4\)$", table, re.M)
    assert [int(r[0]) for r in rows] == [8, 16, 32]
    for row in rows:
        m = int(row[0])
        for (name, v), (bubble, percent, holds) in zip((("1f1b", 1), ("interleaved", 2), ("interleaved", 4)),
                                                       ((row[1], row[2], row[3]), (row[4], row[5], row[7]),
                                                        (row[8], row[9], row[11]))):
            schedule = build(name, 8, m, v)
            assert timeline(schedule).bubble == bubble_formula(name, 8, m, v) == Fraction(bubble), (name, m)
            assert f"{float(Fraction(bubble)):.1%}" == f"{percent}%"
            assert in_flight(schedule)[0] == int(holds), (name, m)
        assert Fraction(row[6]) == Fraction(int(row[7]), 2) and Fraction(row[10]) == Fraction(int(row[11]), 4)


@pytest.mark.parametrize("typed, name", [("1F1B", "1f1b"), ("GPipe", "gpipe"), ("Interleaved", "interleaved"),
                                         ("1f1b", "1f1b")])
def test_every_schedule_flag_takes_the_name_in_any_case(typed, name):
    # The docs write 1F1B and GPipe; --schedule 1F1B was argparse's "invalid choice" in `spmdsim pipeline`,
    # `spmdsim estimate` and the training examples (spmdsim.programs.pipeline.options.pipeline_arguments):
    # one rule for all.
    import argparse

    from spmdsim.tools.cli.main import build_parser
    from spmdsim.programs.pipeline.options import pipeline_arguments

    parser = build_parser()
    assert parser.parse_args(["pipeline", "--schedule", typed, "--stages", "2", "--microbatches", "4"]).schedule == name
    assert parser.parse_args(["estimate", "gpt", "--schedule", typed]).schedule == name
    examples = argparse.ArgumentParser()
    pipeline_arguments(examples)
    assert examples.parse_args(["--schedule", typed]).schedule == name


def test_an_unknown_schedule_is_still_an_invalid_choice():
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(err):
        main(["pipeline", "--schedule", "1F2B", "--stages", "2", "--microbatches", "4"])
    assert exit_.value.code == 2
    assert unfold(err.getvalue()).splitlines()[-1] == (
        "spmdsim pipeline: error: argument --schedule: invalid choice: '1F2B'; did you mean '1f1b'? "
        "(choose from 'gpipe', '1f1b', 'interleaved')")
