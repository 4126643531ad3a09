"""`spmdsim --help` lists the commands by task, one line each within 100 columns; every command's help
shows an example right after its usage, and every example runs as printed."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from spmdsim.tools.cli.helptext import EXAMPLE_HEAD, EXAMPLES, GROUPS, one_liners, subcommands
from spmdsim.tools.cli.main import SUBCOMMANDS, build_parser, main

#: What each example's output holds (a value the command computes, not only a banner).
EXPECTED = {
    "slices": '"7": [[6, 8], [0, 6]]',
    "explain": "[2:4, 2:4]  10 11 14 15",
    "show": "sum     = [[28, 34], [76, 98]]",
    "demo": "2 passed, 0 failed",
    "collective": "bytes sent by the busiest rank: 98,304 B; textbook 98,304 B (equal)",
    "pipeline": "bubble 24/88 = 3/11 = 27.3% idle",
    "context": "ring           12,582,912 B      46,137,344 B",
    "run": "max abs error",
    "run matmul": "allreduce over ('k',) (group of 4): sent 9,216 B",
    "run linear": "allreduce over ('mp',) (group of 8): sent 32,256 B",
    "run embedding": "allreduce over ('mp',) (group of 8): sent 13,440 B",
    "run mlp": "allreduce over ('mp',) (group of 8): sent 16,128 B",
    "run redistribute": "lower bound 64 B (meets it on every rank)",
    "launch": "allreduce over ('mp',) (group of 4): sent 13,824 B",
    "plan": "lower bound 458,752 B (meets it on every rank)",
    "convert": "PartitionSpec('mp', None)",
    "estimate": "predicted step time:",
    "autoshard": "total 0 B/rank",
    "calibrate": "CostModel(",
    "mpirun": "4\n4\n4\n4\n",
    "lab": " 1  Ping-pong between ranks 0 and 1",
}
#: Examples launched by mpiexec: run as a shell runs them, under `timeout -k`.
LAUNCHED = ("launch", "calibrate")


def _commands(parser, words=()):
    """The words of every command and subcommand under `parser`."""
    for name, sub in subcommands(parser).items():
        yield (*words, name)
        if words + (name,) != ("lab",):  # lab's commands (list, start, check, grade) share its example
            yield from _commands(sub, (*words, name))


def _help(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_help_lists_every_command_once_under_its_task_in_100_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the list does not lean on argparse's folding
    text = _help([], capsys)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, [line for line in lines if len(line) > 100]
    listed = [line.split()[0] for line in lines if line.startswith("  ") and not line.lstrip().startswith("-")]
    assert listed == [name for _, names in GROUPS for name in names]
    assert sorted(listed) == sorted(SUBCOMMANDS)
    titles = [f"{title}:" for title, _ in GROUPS]
    assert [line for line in lines if line in titles] == titles
    # each command's line is its one-line help, whole
    helps = one_liners(build_parser())
    for name in SUBCOMMANDS:
        assert f"  {name:<12}{helps[name]}" in lines


def test_the_groups_name_the_tasks_a_user_has():
    assert [title for title, _ in GROUPS] == [
        "learn how layouts, collectives and pipelines work", "run and check a sharded program",
        "plan moves between layouts", "size a cluster", "emulate MPI",
        "teach with exercises graded on simulated ranks"]
    grouped = dict(GROUPS)
    assert grouped["emulate MPI"] == ("mpirun",) and "estimate" in grouped["size a cluster"]


def test_every_command_has_one_example_and_no_example_is_stale():
    assert set(EXAMPLES) == {" ".join(words) for words in _commands(build_parser())}
    for command, line in EXAMPLES.items():
        words = shlex.split(line)
        at = words.index("spmdsim")
        assert words[at + 1:at + 1 + len(command.split())] == command.split(), line
        assert len(line) <= 98, line  # "  " + the line in a 100-column terminal


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_each_help_shows_its_example_right_after_the_usage(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = _help(command.split(), capsys)
    usage, example = text.split("\n\n")[:2]
    assert usage.startswith(f"usage: spmdsim {command} ")
    assert example == f"{EXAMPLE_HEAD}\n  {EXAMPLES[command]}"  # whole: not folded at the width


def test_the_example_is_shown_whole_in_a_narrow_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    assert f"{EXAMPLE_HEAD}\n  {EXAMPLES['estimate']}\n\n" in _help(["estimate"], capsys)


@pytest.mark.parametrize("command", sorted(set(EXAMPLES) - set(LAUNCHED)))
def test_each_example_runs_and_prints_its_result(command, capsys):
    words = shlex.split(EXAMPLES[command])
    assert words[0] == "spmdsim"
    assert main(words[1:]) == 0
    out = capsys.readouterr().out
    if command == "mpirun":  # four ranks print at once: their lines in any order
        out = "".join(sorted(out.splitlines(keepends=True)))
    assert EXPECTED[command] in out, out[-2000:]


@pytest.mark.parametrize("command", LAUNCHED)
def test_each_launched_example_runs_under_mpiexec(command):
    bin_dir = os.path.dirname(sys.executable)
    if not (os.access(os.path.join(bin_dir, "mpiexec"), os.X_OK) and shutil.which("timeout")):
        pytest.skip("no mpiexec beside this Python, or no timeout(1)")
    line = EXAMPLES[command]
    if not line.startswith("timeout -k"):
        line = f"timeout -k 5 200 {line}"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert EXPECTED[command] in done.stdout, done.stdout[-2000:]
