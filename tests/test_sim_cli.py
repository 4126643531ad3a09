"""`--ranks N`: the demo, `spmdsim run` and every example on simulated ranks in this process."""
from __future__ import annotations

import os
import pathlib
import re
import runpy
import sys

import pytest

import spmdsim
from docs_commands import run_here
from spmdsim.tools.cli.main import main
from spmdsim.tools.cli.common import ONE_PROCESS
from shellkit import as_a_shell_starts_it, interrupt
from testkit import EXAMPLE_ARGS, unfold

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_demo_on_simulated_ranks_says_so_and_passes(capsys):
    assert main(["demo", "--ranks", "8", "--only", "matmul_2x4_4x1,net_paddle_tp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "spmdsim: running on 8 simulated ranks in one process (--ranks 8), no mpiexec"
    assert lines[1] == "spmdsim demo: 8 ranks, float32"
    assert "allreduce x1" in lines[3] and " 49,152 B " in lines[3] and lines[3].endswith("PASS")
    assert lines[-1] == "2 passed, 0 failed, 0 skipped"


@pytest.mark.parametrize("ranks", ["1024", "2048"])
def test_a_dry_demo_says_when_too_few_scenarios_ran_at_any_rank_count(capsys, ranks):
    """At 1024 ranks a dry demo said that fewer than half its scenarios ran, at 2048 (to 32768) nothing: a dry
    run's check past 1365 ranks came back failed (its verdict table is too large for the dry communicator to fill;
    nothing is compared in a dry run), and the demo stopped at "a scenario failed" before its word on coverage,
    the exit code a dry run does not pass on. A dry run's verdicts say nothing: the coverage line comes alike, and
    its exit code 3 as without --dry-run (a dry run must not exit 0 when every scenario was skipped)."""
    assert main(["demo", "--ranks", ranks, "--dry-run", "--only", "matmul_2x1_1x4", "linear_row", "mlp"]) == 3
    err = unfold(capsys.readouterr().err)
    assert err == (f"spmdsim demo: fewer than half the scenarios ran (1 of 3 ran on {ranks} ranks); 8 run them all "
                   "(mpiexec -n 8, or --ranks 8)\n")


def test_run_and_redistribute_on_simulated_ranks(capsys):
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8", "--ranks", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("spmdsim: running on 8 simulated ranks") and "PASS" in out
    assert "allreduce over ('k',) (group of 4)" in out
    assert main(["run", "redistribute", "--device-matrix", "4", "--alias", "x", "--from", "x,None",
                 "--to", "None,x", "--shape", "8,8", "--ranks", "4"]) == 0
    assert "S(0)->S(1) via Alltoall on ('x',)" in capsys.readouterr().out


def test_a_verdict_of_one_element_says_element(capsys):
    """A scalar's check read "(1 elements)" (and one NaN "1 non-finite values"): one is singular now, in a passed,
    failed or dry run's verdict alike."""
    import numpy as np

    assert main(["run", "redistribute", "--device-matrix", "2,2", "--alias", "x,y", "--from", "", "--to", "",
                 "--shape", "", "--ranks", "4"]) == 0
    assert "x |ref| (1 element)\n" in capsys.readouterr().out

    def body():
        mesh = spmdsim.Mesh(spmdsim.Layout((2,), ("x",)))
        x = spmdsim.DTensor.from_global(mesh, np.float64(2.0))
        return str(x.check(np.float64(2.0))), str(x.check(np.float64(np.nan)))

    passed, failed = spmdsim.simulate(2, body)[0]
    assert passed.startswith("check passed: every element within atol ") and "(1 element)\n" in passed
    assert failed.startswith("check FAILED on ranks [0, 1]: 1 non-finite value (NaN/Inf; 1 in the reference)")
    assert failed.endswith("; 1 element)")
    assert str(spmdsim.simulate(2, body, dry_run=True)[0][0]) == "check not made: a dry run has no values (1 element)"


def test_a_closed_pipe_stops_quietly(capsys):
    # `spmdsim demo --ranks 8 | head -1`: the print after head left failed on every rank with a traceback.
    from spmdsim.runtime.sim.launch import run_on_ranks

    def body():
        raise BrokenPipeError(32, "Broken pipe")

    assert run_on_ranks(2, body) == 141  # 128 + SIGPIPE, as a shell tool ends
    assert capsys.readouterr().err == ""


def test_a_keyboard_interrupt_a_rank_raises_names_the_rank(capsys):
    """`raise KeyboardInterrupt` in rank 1's program was reported as the user's Ctrl-C ('interrupted (Ctrl-C): the
    simulated ranks were stopped'), no rank named, where mpiexec and spmdsim mpirun name rank 1: now as mpirun."""
    from spmdsim.runtime.sim.launch import run_on_ranks

    def body():
        if spmdsim.world().rank == 1:
            raise KeyboardInterrupt
        spmdsim.world().allreduce(1)

    assert run_on_ranks(4, body) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "spmdsim: error on simulated rank 1: KeyboardInterrupt" and err[-2:] == [
        "KeyboardInterrupt", "raised on simulated rank 1 of 4"]


def test_os_exit_on_one_rank_ends_that_rank_and_is_named(capsys):
    """os._exit(1) on rank 1 of `--ranks 4` ended the whole process at once, exit 1 and no line after the banner,
    where under mpiexec it ends rank 1 alone: it now ends that rank, and the ranks waiting for it name it."""
    from spmdsim.runtime.sim.launch import run_on_ranks

    def body():
        if spmdsim.world().rank == 1:
            os._exit(1)
        spmdsim.world().allreduce(1)

    assert run_on_ranks(4, body) == 1
    err = unfold(capsys.readouterr().err)
    assert err.startswith("spmdsim: error: simulated ranks deadlock"), err  # as spmdsim mpirun says it
    assert "ranks 0,2,3 wait in it; rank 1 exited (os._exit(1))" in err
    assert run_on_ranks(2, lambda: os._exit(0)) == 0  # every rank: each ends, the run with them


@pytest.mark.parametrize("argv, code", [(["pipeline", "--stages", "2", "--microbatches", "2"], 0),
                                         (["collective", "ring-allreduce", "--ranks", "2", "--size", "8"], 141)])
def test_a_reader_gone_ends_a_command_with_the_code_the_exit_codes_page_gives(argv, code):
    # The page said 0 for every command under `| head`; a run on simulated ranks ends with 141.
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "spmdsim", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the first line: as `| true` leaves, and no race with the output's end
    assert (proc.wait(timeout=120), proc.stderr.read()) == (code, b"")
    page = " ".join((pathlib.Path(__file__).parents[1] / "docs/reference/exit-codes.md").read_text().split())
    assert "0 when the reader of a pipe went away (`| head`), 141 from simulated ranks (`--ranks N`, `mpirun`)" in page


def test_ranks_under_a_launched_job_is_refused_once(monkeypatch, capsys):
    # mpiexec -n 2 spmdsim demo --ranks 8: each process ran all 8 simulated ranks, every line printed twice.
    from spmdsim.runtime.sim.launch import run_on_ranks

    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    assert run_on_ranks(8, lambda: 0) == 2
    out = capsys.readouterr()
    assert out.out == "" and unfold(out.err) == (
        "spmdsim: error: --ranks 8 simulates the ranks in one process, but mpiexec started 2; leave out --ranks "
        "under mpiexec (mpiexec -n 8 ...), or run without mpiexec\n")
    monkeypatch.setenv("PMI_RANK", "1")  # the other processes refuse too, silently
    assert run_on_ranks(8, lambda: 0) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("PMI_SIZE", "1")  # mpiexec -n 1: one process, as without a launcher
    assert run_on_ranks(2, lambda: 0) == 0


def test_ranks_under_a_launched_job_is_refused_before_an_examples_own_checks(monkeypatch, capsys):
    """`mpiexec -n 4 python examples/train_gpt.py --ranks 64` said "the GPT cannot run on 64 ranks: ..." (its
    checks of 64 ranks came first), and fixing that led to the refusal of --ranks under mpiexec: said first now."""
    from types import SimpleNamespace

    from spmdsim.models.nets.train import run_main

    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(SystemExit) as exc:
        run_main(lambda args: 0, SimpleNamespace(steps=1), 64, needs=lambda size: f"no split of {size} ranks runs it")
    assert exc.value.code == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: --ranks 64 simulates the ranks in one process, but mpiexec started 4; leave out --ranks "
        "under mpiexec (mpiexec -n 64 ...), or run without mpiexec\n")


def test_script_quotes_a_bad_ranks_count_as_the_training_examples_do(capsys):
    """`spmdsim.script()` (every example but the training ones) said `--ranks '-1'` but `--ranks 0`, and `--ranks ²`
    (a digit to str.isdigit, not to int) was a ValueError traceback. It reads the count as argparse's type=int
    reads the training examples' (spmdsim.models.nets.train.run_main): a number unquoted, anything else quoted."""
    from spmdsim.runtime.sim.launch import ranks_problem, script

    for value, said in (("-1", "-1"), ("0", "0"), ("5000", "5000"), ("x", "'x'"), ("1.5", "'1.5'"),
                        ("\u00b2", "'\u00b2'")):
        with pytest.raises(SystemExit) as exc:
            script("unused.py", ["--ranks", value])
        assert exc.value.code == 2
        err = unfold(capsys.readouterr().err)
        assert err.startswith(f"spmdsim: error: --ranks {said} must be a number of ranks from 1 to 4096"), err
        if said == value:  # a number: as run_main says it (argparse gave it an int)
            assert err == f"spmdsim: error: {ranks_problem(int(value))}\n"


def test_script_refuses_two_ranks_counts_as_the_examples_parsers_do(capsys):
    """`python my_matmul.py --ranks 8 --ranks 4` (the README's program, no parser of its own) ran on 8 ranks and
    left `--ranks 4` unread; the examples' parsers refuse a flag given twice with two values."""
    from spmdsim.runtime.sim.launch import script

    for argv, said in ((["--ranks", "8", "--ranks", "4"], "8 then 4"), (["--ranks=8", "--rank", "x"], "8 then 'x'")):
        with pytest.raises(SystemExit) as exc:
            script("unused.py", argv)
        assert exc.value.code == 2
        assert unfold(capsys.readouterr().err) == f"spmdsim: error: --ranks given twice, {said}; expected it once\n"


def test_an_examples_refusal_is_printed_by_the_first_launched_rank_alone(monkeypatch, capsys):
    # mpiexec -n 4 python examples/train_gpt.py --steps 0: refuse() printed the line on every rank (run_main).
    import argparse

    from spmdsim.models.nets.train import run_main

    monkeypatch.setenv("PMI_SIZE", "2")
    for rank, err in (("0", "spmdsim: error: --steps 0 must be at least 1\n"), ("1", "")):
        monkeypatch.setenv("PMI_RANK", rank)
        with pytest.raises(SystemExit) as exc:
            run_main(lambda args: 0, argparse.Namespace(steps=0), None)
        assert exc.value.code == 2 and capsys.readouterr().err == err  # every rank exits 2; one says why


@pytest.mark.parametrize("given, line", [
    (dict(steps=10 ** 11, dry_run=True), "--steps 100,000,000,000 with --dry-run is too many; expected at most 1,000 "
                                         "(a dry run prints nothing until its last step; --steps 1 gives one step's "
                                         "bytes)"),
    (dict(steps=1, sample=10 ** 8), "--sample 100,000,000 must be an integer from 0 to 2,000 (characters to "
                                    "generate, each a forward pass of the model; 0: none)"),
    (dict(steps=1, sample=-1), "--sample -1 must be an integer from 0 to 2,000 (characters to generate, each a "
                               "forward pass of the model; 0: none)"),
])
def test_an_examples_unbounded_work_is_refused_before_it_starts(capsys, given, line):
    # `train_gpt.py --ranks 4 --dry-run --steps 100000000000` ran without a word until a timeout (a dry run reports
    # after its last step), and `--sample 100000000` drew characters for hours after the training's last line.
    import argparse

    from spmdsim.models.nets.train import run_main

    with pytest.raises(SystemExit) as exc:
        run_main(lambda args: pytest.fail("ran"), argparse.Namespace(**given), 4)
    assert exc.value.code == 2 and unfold(capsys.readouterr().err) == f"spmdsim: error: {line}\n"


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_examples_checks_run_before_the_banner_and_see_a_dry_run(capsys, dry_run):
    """run_main's `checks(world size)` (the GPT examples' checked_run): its SpmdsimError is the one line, exit 2,
    before "spmdsim: running on 4 simulated ranks" (the examples raised it on every rank, after the banner); a dry
    run's checks ask dry_run_active() as its ranks will (a checkpoint refuses a dry run by it)."""
    import argparse

    from spmdsim import SpmdsimError
    from spmdsim.models.nets.train import run_main
    from spmdsim.runtime.sim import dry_run_active

    def checks(size):
        raise SpmdsimError(f"--tp 3 must divide the world size {size} (dry run: {dry_run_active()})")

    with pytest.raises(SystemExit) as exc:
        run_main(lambda args: pytest.fail("ran"), argparse.Namespace(steps=1, dry_run=dry_run), 4, checks=checks)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "", out
    assert unfold(err) == f"spmdsim: error: --tp 3 must divide the world size 4 (dry run: {dry_run})\n"
    assert not dry_run_active()  # (the check's context left)
    ran = []
    run_main(lambda args: ran.append(dry_run_active()), argparse.Namespace(steps=1, dry_run=dry_run), 4,
             checks=lambda size: None)
    assert ran and set(ran) == {dry_run}  # checks that pass: the ranks run (a dry run's representative alone)


@pytest.mark.parametrize("exits, code", [("sys.exit(-1)", 255), ("raise SystemExit(-3)", 253),
                                         ("sys.exit(300)", 44), ("sys.exit('bye')", 1)])
def test_a_scripts_exit_code_on_simulated_ranks_is_its_status_as_mpiexec_reports_it(exits, code):
    """`python prog.py --ranks 2` (spmdsim.script): the largest of the ranks' exit statuses, each the code's low 8
    bits as the OS reports a process's (spmdsim.runtime.sim.run.exit_status, as spmdsim mpirun's): sys.exit(-1) on one
    rank, the other exiting 0, exited 0 (the largest of -1 and 0), where mpiexec gives 255."""
    from spmdsim.runtime.sim.launch import run_on_ranks

    def rank():
        import spmdsim

        if spmdsim.world().rank == 1:
            exec(exits)

    assert run_on_ranks(2, rank) == code


def test_an_examples_long_refusal_fits_100_columns(monkeypatch, capsys):
    """refuse() (spmdsim.models.nets.train) printed its line at any length; the CLI's refusals fold at 100 columns."""
    from spmdsim.models.nets.train import refuse

    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):  # not launched: this process says it
        monkeypatch.delenv(name, raising=False)
    text = "--layers 3 with --pp 2: " + "each stage needs whole blocks of the model, " * 4
    with pytest.raises(SystemExit) as exc:
        refuse(text)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and max(map(len, err.splitlines())) <= 100
    assert unfold(err) == f"spmdsim: error: {text.strip()}\n"


def test_errors_on_simulated_ranks_exit_like_mpi(capsys):
    # An SpmdsimError every rank raises: one line, exit 2 (as the MPI guard does).
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8", "--ranks", "6"]) == 2
    err = unfold(capsys.readouterr().err)
    assert err.startswith("spmdsim: error: ") and "8" in err and err.count("\n") == 1
    assert main(["demo", "--dry-run"]) == 2
    assert "--dry-run needs --ranks N" in capsys.readouterr().err
    assert main(["demo", "--ranks", "8", "--only", "nosuch"]) == 2
    out = capsys.readouterr()  # the error alone: no "running on 8 simulated ranks" banner first
    assert out.out == "" and out.err.startswith("spmdsim: error: unknown scenario(s) ['nosuch']")


@pytest.mark.parametrize("argv, error", [
    (["mlp", "--shape", "16,32,60"], "ColumnParallelLinear weight W (32, 60): dim 1 of size 60 is not divisible by 8 "
                                     "shards over ('mp',)"),
    (["matmul", "--shape", "255,128,192", "--strategy", "((2,4),(4,1))"],
     "tensor (255, 128): dim 0 of size 255 is not divisible by 2 shards over ('m',)"),
    (["matmul", "--shape", "16,30,64", "--device-matrix", "2,4", "--alias", "a,b", "--x-map", "None,b",
      "--w-map", "b,a"], "tensor (16, 30): dim 1 of size 30 is not divisible by 4 shards over ('b',)"),
    (["matmul", "--shape", "12,32,64", "--strategy", "((2,1),(1,4))", "--out-strategy", "((8,1),)"],
     "out_strategy (8, 1) does not follow"),
    (["linear", "--parallel", "row", "--shape", "16,30,64"],
     "tensor (16, 30): dim 1 of size 30 is not divisible by 8 shards"),
    (["linear", "--front", "paddle", "--shape", "16,32,60"], "size[1]=60, the columns (out features) of the linear"),
    (["embedding", "--shape", "4,1001,48"], "VocabParallelEmbedding table (1001, 48): dim 0 of size 1001"),
    (["embedding", "--mode", "dim", "--shape", "4,1000,50"], "ParallelEmbedding table (1000, 50): dim 1 of size 50"),
])
def test_a_size_the_layout_cannot_cut_is_refused_before_the_banner(capsys, argv, error):
    """Such a size was refused by the job on every simulated rank, after "spmdsim: running on 8 simulated ranks":
    two lines where under mpiexec there is one."""
    assert main(["run", *argv, "--ranks", "8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and unfold(err).startswith(f"spmdsim: error: {error}") and unfold(err).count("\n") == 1, (out, err)


def test_an_spmdsim_error_on_every_rank_is_exit_2_whatever_each_says(monkeypatch, capsys):
    """As under MPI, where each rank's hook exits 2 and rank 0 prints its own line: an SpmdsimError (or a
    MemoryError) on every rank is one line and exit 2 though the texts or classes differ by rank. Only texts
    alike used to count: a shard's size in from_local's message, or a ShapeError on rank 1 among
    SpmdsimErrors, was exit 1 with 'error on simulated rank 0' (and 'ranks 0,2,3', leaving rank 1 out)."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, ShapeError, SpmdsimError
    from spmdsim.runtime.sim.launch import run_on_ranks

    monkeypatch.delenv("SPMDSIM_MEMORY", raising=False)

    def on_every_rank(error):
        def body():
            comm = spmdsim.world()
            comm.Barrier()  # every rank raises its own, none stopped by another's first
            raise error(comm.rank)
        return body

    def shard():
        mesh = Mesh(Layout((4,), ("mp",)))
        DTensor.from_local(mesh, np.zeros((mesh.rank + 5, 4)), mesh.layout("mp", None), (16, 4))

    def said(n, fn):
        code = run_on_ranks(n, fn)
        return code, unfold(capsys.readouterr().err)

    text = 'local shard shape ({}, 4) does not match (4, 4), the shard of global shape (16, 4) under ("mp", None)'
    assert said(4, shard) == (2, f"spmdsim: error: {text.format(5)} (rank 0; ranks differ: rank 1: {text.format(6)}; "
                                 "2 more texts on ranks 2,3)\n")
    assert said(4, on_every_rank(lambda r: (ShapeError if r == 1 else SpmdsimError)("same text"))) == (
        2, "spmdsim: error: same text\n")
    assert said(4, on_every_rank(lambda r: SpmdsimError("low" if r < 2 else "high"))) == (
        2, "spmdsim: error: low (ranks 0,1; ranks differ: ranks 2,3: high)\n")
    assert said(4, on_every_rank(lambda r: MemoryError("Unable to allocate 8 GiB") if r == 3 else ShapeError("x"))) == (
        2, "spmdsim: error: x (ranks 0-2; ranks differ: rank 3: out of memory: Unable to allocate 8 GiB; "
           "SPMDSIM_MEMORY sets what a rank may use)\n")
    assert said(4, on_every_rank(lambda r: MemoryError("Unable to allocate 8 GiB"))) == (
        2, "spmdsim: error: out of memory: Unable to allocate 8 GiB; SPMDSIM_MEMORY sets what a rank may use\n")
    # Still exit 1: another error on some rank (with its traceback when it is the one reported), or a rank
    # that did not fail.
    code, err = said(4, on_every_rank(lambda r: ValueError("not ours") if r == 0 else SpmdsimError("x")))
    assert code == 1 and err.startswith("spmdsim: error on simulated rank 0: ValueError: not ours\nTraceback")
    # (the others' errors each a line after it, as mpiexec shows every rank's: rank 2's was not said)
    assert said(4, on_every_rank(lambda r: ValueError("not ours") if r == 2 else SpmdsimError("x"))) == (
        1, "spmdsim: error on simulated ranks 0,1,3: x\nspmdsim: also failed: simulated rank 2: ValueError: not ours\n")

    def three_of_four():
        comm = spmdsim.world()
        comm.Barrier()
        if comm.rank != 3:
            raise SpmdsimError(f"rank {comm.rank} says no")

    assert said(4, three_of_four) == (1, "spmdsim: error on simulated rank 0: rank 0 says no\n" + "".join(
        f"spmdsim: also failed: simulated rank {r}: SpmdsimError: rank {r} says no\n" for r in (1, 2)))
    # A dry run's error is every rank's (one rank runs for all).
    assert run_on_ranks(4, shard, dry_run=True) == 2
    assert unfold(capsys.readouterr().err) == f"spmdsim: error: {text.format(5)}\n"


def test_ranks_failing_otherwise_are_named_after_the_reported_ones_traceback(capsys):
    """`--ranks N`: the lowest failing rank's error and traceback, then a line for each rank that failed otherwise
    (the first four, then how many more), as mpiexec shows every rank's; ranks stopped by another's error, waiting
    in a collective, are not among them. Rank 2's KeyError and the others' were not said."""
    import spmdsim
    from spmdsim.runtime.sim.launch import run_on_ranks

    def body():
        comm = spmdsim.world()
        if comm.rank == 1:
            raise ValueError("one")
        if comm.rank >= 2:
            raise KeyError(f"k{comm.rank}")
        comm.Barrier()  # rank 0: stopped here

    assert run_on_ranks(8, body) == 1
    err = capsys.readouterr().err
    assert err.startswith("spmdsim: error on simulated rank 1: ValueError: one\nTraceback"), err
    assert err.endswith("ValueError: one\nraised on simulated rank 1 of 8\n" + "".join(
        f"spmdsim: also failed: simulated rank {r}: KeyError: 'k{r}'\n" for r in (2, 3, 4, 5)) +
        "spmdsim: and 2 more ranks failed otherwise\n"), err


def test_one_process_names_both_ways_out(capsys):
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8"]) == 2
    err = capsys.readouterr().err
    assert "mpiexec -n 8 ..." in err and "--ranks 8" in err


def test_a_pass_on_one_process_says_nothing_was_split(capsys):
    """`spmdsim run mlp` as one plain process passes on one rank, where nothing is split or sent: after the
    PASS it says so on stderr, with both ways to more ranks (a new user took the PASS for the lesson)."""
    assert main(["run", "mlp", "--shape", "96,96,480"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("PASS") and err == ONE_PROCESS + "\n"


def _ran(path: pathlib.Path, args: list, monkeypatch, capsys) -> tuple:
    """(exit code, capsys's readouterr()) of `python EXAMPLE ARGS` run in this process (runpy as __main__)."""
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    return done.value.code, capsys.readouterr()


def test_train_gpt_refuses_a_model_size_like_a_mesh_size(monkeypatch, capsys):
    # --d-model 30 with 4 heads printed "train_gpt: ..." with exit 1, once per MPI rank.
    path = next(p for p in EXAMPLES if p.stem == "train_gpt")
    code, said = _ran(path, ["--ranks", "8", "--d-model", "30", "--steps", "1"], monkeypatch, capsys)
    assert code == 2
    # the heads the user left alone said as the default, not as a flag typed
    assert unfold(said.err) == ("spmdsim: error: --d-model 30 must be divisible by the default heads "
                                               "4 (each head takes --d-model / heads features)\n")


_RAN: dict = {}  # (example, its arguments) -> (exit code, what it printed) of its run in this process


def _example_run(path: pathlib.Path, args: list, monkeypatch, capsys) -> tuple:
    """(exit code, stdout) of `_ran`, once per test process (with pytest-xdist, per file): the tests that run an
    example with the same arguments read one run."""
    key = (path, tuple(args))
    if key not in _RAN:
        code, said = _ran(path, args, monkeypatch, capsys)
        _RAN[key] = code, said.out
    return _RAN[key]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_on_8_simulated_ranks(path, monkeypatch, capsys):
    code, out = _example_run(path, ["--ranks", "8"] + EXAMPLE_ARGS.get(path.stem, []), monkeypatch, capsys)
    assert code == 0, out
    assert out.startswith("spmdsim: running on 8 simulated ranks in one process")
    assert "PASS" in out or "passed" in out
    assert PASS_LINES.get(path.stem, "") in out
    assert max(len(line) for line in out.splitlines()) <= 100  # (test_classroom_docs leaves these runs to here)


@pytest.mark.parametrize("stem, small, row", [
    ("llama_block", "8", ("6", "23,296", "23,296", ["allreduce", "x6"])),
    ("causal_attention", "4", ("4", "4,608", "4,608", ["allreduce", "x4"])),
])
def test_the_block_examples_are_as_wide_at_64_ranks_as_at_a_few(monkeypatch, capsys, stem, small, row):
    """examples/llama_block.py and causal_attention.py drew their width from the ranks (a key/value head or a head
    a rank: weights of O(p^2) elements, central differences of every one over a program of O(p^2); > 300 s at 64
    ranks, 23 GB at 256); tp is 8 (4) at most now, the other ranks dp replicas. A dry run at 64 ranks sends the
    bytes of one at 8 (4), and makes no reference (no values to check)."""
    from spmdsim.references import backward as reference_grad

    def refused(*args, **kwargs):
        raise AssertionError("a dry run computed central differences")

    monkeypatch.setattr(reference_grad, "numeric_grads", refused)
    path = next(p for p in EXAMPLES if p.stem == stem)
    rows = {ranks: _dry_row(monkeypatch, capsys, path, ranks) for ranks in (small, "64")}
    assert rows["64"] == rows[small] == row  # (the peak held, left out, counts the check's table, 56 B a rank)


def _dry_row(monkeypatch, capsys, path, ranks: str) -> tuple:
    """(calls, sent, received, collectives) of the dry run's "ranks 0-..." row of `path --ranks RANKS --dry-run`."""
    code, said = _ran(path, ["--ranks", ranks, "--dry-run"], monkeypatch, capsys)
    out = said.out
    assert code == 0, out
    calls, sent, received, _, *collectives = next(line for line in out.splitlines()
                                                  if line.startswith("ranks 0-")).split()[2:]
    return calls, sent, received, collectives


@pytest.mark.parametrize("stem, row", [
    # One Allreduce of y, (8, 16) float64 = 1,024 B, by the ring: 2 x 63/64 x 1,024 = 2,016 B each way.
    ("attention", ("1", "2,016", "2,016", ["allreduce", "x1"])),
    ("mlp_layernorm", ("7", "65,016", "65,016", ["allgather", "x1,", "allreduce", "x5,", "reduce_scatter", "x1"])),
    ("padded_batch", ("3", "74,008", "74,008", ["allreduce", "x3"])),
])
def test_the_width_examples_make_no_global_reference_in_a_dry_run(monkeypatch, capsys, stem, row):
    """examples/attention.py's heads and mlp_layernorm.py's and padded_batch.py's widths grow with the ranks; their
    references were made in a dry run too, the global weights in one process (attention: 401 MB of peak RSS at
    65,536 ranks where the ranks' own blocks are a few KB; the other two: O(p^2) weights and their central
    differences, past 120 s and 1 GB at 1,024 ranks). A dry run makes no reference; a real run checks against it."""
    from spmdsim import SeededTensor

    def refused(*args, **kwargs):
        raise AssertionError("a dry run materialized a global tensor")

    monkeypatch.setattr(SeededTensor, "full", refused)
    path = next(p for p in EXAMPLES if p.stem == stem)
    assert _dry_row(monkeypatch, capsys, path, "64") == row


#: The check line an example must print where "PASS" alone would also match a partial result.
PASS_LINES = {"llama_block": "forward and 10 gradients vs numpy: PASS",
              "causal_attention": "forward and 5 gradients vs numpy: PASS"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_answers_help_and_refuses_an_unknown_argument(path, monkeypatch, capsys):
    """`--help` ran the whole example and printed no help (or failed at 1 rank); `--ranks 8 --bogus` ran it with
    --bogus ignored. Now --help prints the docstring's first line and the flags; an unknown flag is exit 2. The two
    port_*_mlp.py examples were exempt (their own line "unexpected argument '--help'", exit 2): they parse too now."""
    code, out = _ran(path, ["--help"], monkeypatch, capsys)
    doc = path.read_text().split('"""')[1].splitlines()[0]  # the docstring's first line
    assert code == 0 and out.out.startswith(f"usage: {path.name} [-h]") and "--ranks N" in out.out, out
    assert " ".join(doc.split()[:6]) in " ".join(out.out.split()), out.out
    code, out = _ran(path, ["--ranks", "8", "--bogus"], monkeypatch, capsys)
    assert code == 2 and out.out == "" and "Traceback" not in out.err
    assert "error: unrecognized arguments: --bogus" in unfold(out.err), out.err


@pytest.mark.parametrize("stem, ranks", [
    ("mlp", "1"),                # expected one Allreduce where one rank has nothing to sum: check passed, exit 1
    ("causal_attention", "12"),  # central differences of a loss of 3e4 held to atol 1e-6: FAILED (7.9e-06)
])
def test_examples_pass_at_rank_counts_the_docs_do_not_show(stem, ranks, monkeypatch, capsys):
    path = next(p for p in EXAMPLES if p.stem == stem)
    code, said = _ran(path, ["--ranks", ranks], monkeypatch, capsys)
    assert code == 0 and "PASS" in said.out and "FAIL" not in said.out, said.out


TRAINING = [p for p in EXAMPLES if p.stem.startswith("train_")]


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.stem)
def test_training_examples_dry_run_to_the_bytes_of_a_real_step(path, monkeypatch, capsys):
    """--ranks 8 --dry-run prints the report, whose calls and bytes are the real run's per step (train_moe_gpt's
    --dispatch left out of both: it prints what a dry run does not show, and is refused beside --dry-run). The real
    run is test_every_example_runs_on_8_simulated_ranks's where its arguments are these (_example_run)."""
    args = [a for a in EXAMPLE_ARGS.get(path.stem, []) if a != "--dispatch"]
    args = ["--ranks", "8"] + ([] if "--steps" in args and args[args.index("--steps") + 1] == "2" else
                               ["--steps", "2"]) + args
    code, said = _ran(path, [*args, "--dry-run"], monkeypatch, capsys)
    out = said.out
    assert code == 0 and out.startswith("spmdsim: a dry run (shapes only) on 8 simulated ranks"), out
    row = next(line for line in out.splitlines() if line.startswith("ranks 0-7"))
    calls, sent = int(row.split()[2]), int(row.split()[3].replace(",", ""))
    code, out = _example_run(path, args, monkeypatch, capsys)
    assert code == 0, out
    # The check is anchored at each step (docs/howto/train.md); it said "one process from the run's start".
    assert path.stem != "train_mindspore_tutorial" or "\nfrom the run's parameters at its start (rtol" in out
    real = {k: v for k, v in re.findall(r"(collectives|bytes sent) per step \(busiest rank\): (.*)", out)}
    per_step = lambda text: sum(float(v.replace(",", "")) for v in re.findall(r"[a-z]+ ([\d,.]+)", text))  # noqa: E731
    assert real or path.stem != "train_mindspore_tutorial"
    if real:  # the seed-003 example prints both per-step lines
        assert calls == 2 * per_step(real["collectives"]) and sent == 2 * per_step(real["bytes sent"]), (row, real)
    assert calls > 0 and sent > 0


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.stem)
def test_one_training_step_passes_without_a_trend(path, monkeypatch, capsys):
    """--steps 1 shows a step's collectives and checks it: one loss is no failed training."""
    args = EXAMPLE_ARGS[path.stem]  # its --steps 2 made 1 (a flag given twice is refused)
    steps = args.index("--steps")
    monkeypatch.setattr(sys, "argv", [str(path), "--ranks", "8", *args[:steps], "--steps", "1", *args[steps + 2:]])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0 and "(1 step: no trend to judge)" in out and "FAIL" not in out, out


@pytest.mark.parametrize("path", [p for p in TRAINING if p.stem in ("train_megatron_block", "train_seed_networks")],
                         ids=lambda p: p.stem)
def test_a_training_at_learning_rate_0_is_checked_but_not_judged_by_its_trend(path, monkeypatch, capsys):
    """`--lr 0` (the flags allow it, as torch does) left the loss where it was, and the seed networks and the
    Megatron block then failed "NOT falling" with every step checked PASS."""
    monkeypatch.setattr(sys, "argv", [str(path), "--ranks", "8", *EXAMPLE_ARGS[path.stem], "--lr", "0"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0 and "(--lr 0: no trend to judge)" in out and "FAIL" not in out, out


def test_a_dry_run_without_simulated_ranks_is_refused(monkeypatch, capsys):
    path = next(p for p in TRAINING if p.stem == "train_megatron_block")
    code, said = _ran(path, ["--dry-run"], monkeypatch, capsys)
    assert code == 2
    assert said.err == ("spmdsim: error: --dry-run needs --ranks N (a dry run simulates the "
                                       "ranks in this process)\n")


def test_an_example_in_one_process_names_both_ways_out(monkeypatch):
    """The example's Mesh says it (its own "this example needs 8 ranks" check is gone), with its numbers."""
    from spmdsim.errors import MeshSizeError

    path = next(p for p in EXAMPLES if p.stem == "matmul_2x4_4x1")
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    with pytest.raises(MeshSizeError) as raised:
        runpy.run_path(str(path), run_name="__main__")
    assert (raised.value.needed, raised.value.size) == (8, 1)
    assert str(raised.value) == ("device matrix (2, 4, 1) needs 8 ranks but the communicator has 1 (one process: "
                                 "launch 8 ranks with `mpiexec -n 8 ...`, or simulate them in this process with "
                                 "`--ranks 8` / spmdsim.simulate(8, main))")


@pytest.mark.parametrize("name", ["matmul_2x4_4x1", "matmul_layout_tuple"])
def test_an_example_on_other_ranks_of_mpirun_says_mpiruns_ways_in_one_line(name, capsys):
    """Under `spmdsim mpirun -n 4` the example's own check said "use --ranks 8 or mpiexec -n 8" (neither is mpirun's
    -n) with a traceback; its Mesh says mpirun's way, in one line, and exit 2, as its excepthook ends an mpiexec
    job with it (was 'spmdsim mpirun: error: ...', exit 1)."""
    path = next(p for p in EXAMPLES if p.stem == name)
    assert main(["mpirun", "-n", "4", "python", str(path)]) == 2
    matrix = "(2, 4, 1)" if name == "matmul_2x4_4x1" else "(2, 2, 2)"
    assert unfold(capsys.readouterr().err) == (f"spmdsim: error: device matrix {matrix} needs 8 ranks but the "
                                               "communicator has 4 (run 8 ranks: spmdsim mpirun -n 8 ..., or "
                                               "mpiexec -n 8 ...)\n")


def test_a_training_example_on_other_ranks_of_mpirun_says_mpiruns_ways(capsys):
    """run_main's refusal of a world its networks need not ("the MindSpore tutorial's strategies need exactly 8 ranks,
    not 2") ended "use --ranks 8 or mpiexec -n 8" under any launcher: under `spmdsim mpirun` it names mpirun's -n."""
    path = next(p for p in TRAINING if p.stem == "train_mindspore_tutorial")
    assert main(["mpirun", "-n", "2", "python", str(path)]) != 0
    assert ("the MindSpore tutorial's strategies need exactly 8 ranks, not 2 (run 8 ranks: spmdsim mpirun -n 8 ..., "
            "or mpiexec -n 8 ...)") in unfold(capsys.readouterr().err)


@pytest.mark.parametrize("name, said", [
    ("net_mindspore_layout", "Layout((2,2,2)) and Layout((8,)) need 8 ranks, not 7"),
    ("net_mindspore_tutorial", "the tutorial's strategies need 8 ranks, not 7"),
    ("port_dtensor_mlp", "dp 2 x tp N/2 needs an even number of ranks, not 7"),
    ("port_jax_mlp", "dp 2 x tp N/2 needs an even number of ranks, not 7"),
    ("mlp", "the inner width 480 does not split over 7 ranks: run a number that divides it, such as 8"),
    ("embedding_vocab", "the vocabulary 960 does not split over 7 ranks: run a number that divides it, such as 8"),
    ("linear_row", "in_features 240 does not split over 7 ranks: run a number that divides it, such as 8"),
    ("linear_column", "out_features 240 does not split over 7 ranks: run a number that divides it, such as 8"),
    ("mlp_sequence_parallel", "sequence 48 and inner width 480 do not split over 7 ranks: run a number that "
                              "divides both, such as 8"),
    ("net_paddle_tp", "vocabulary 960 and ffn width 240 do not split over 7 ranks: run a number that divides "
                      "both, such as 8")])
def test_an_examples_own_rank_count_check_says_the_launchers_ways(name, said, capsys):
    """These examples said "...: use --ranks 8 or mpiexec -n 8" (or "use --ranks 8 or another divisor") whatever
    launched them (under spmdsim mpirun -n 7 neither is its way): now mpirun's ways, in one line, exit 2 as under
    mpiexec."""
    path = next(p for p in EXAMPLES if p.stem == name)
    assert main(["mpirun", "-n", "7", "python", str(path)]) == 2
    assert unfold(capsys.readouterr().err) == (f"spmdsim: error: {said} (run 8 ranks: spmdsim mpirun -n 8 ..., or "
                                               "mpiexec -n 8 ...)\n")


@pytest.mark.parametrize("count", ["0", "5000", "x"])
@pytest.mark.parametrize("entry", ["cli", "script", "training"])
def test_a_rank_count_that_cannot_be_is_one_line_before_anything_else(entry, count, monkeypatch, capsys):
    """`spmdsim ... --ranks`, an example's `--ranks` (spmdsim.script) and a training example's
    (run_main) refuse it alike, before the one-process banner: no traceback, exit 2."""
    if entry == "cli":
        if count == "x":
            return  # argparse's own type error for the CLI's int option
        code = main(["demo", "--ranks", count])
    else:
        stem = "attention" if entry == "script" else "train_megatron_block"
        path = next(p for p in EXAMPLES if p.stem == stem)
        if entry == "training" and count == "x":
            return  # argparse's own type error for the example's int option
        monkeypatch.setattr(sys, "argv", [str(path), "--ranks", count])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(path), run_name="__main__")
        code = done.value.code
    out = capsys.readouterr()
    shown = count if count == "x" and entry == "script" else int(count)
    assert code == 2 and out.out == ""
    more = " (with --dry-run up to 65536)" if count == "5000" else ""  # a dry run runs one rank for all
    assert unfold(out.err) == (f"spmdsim: error: --ranks {shown!r} must be a number of ranks from 1 to 4096{more}, "
                               "e.g. --ranks 8\n")


def test_ctrl_c_stops_every_simulated_rank_with_one_line():
    """SIGINT while 64 simulated ranks train: one line, exit 130, no traceback, no hang. Without it within 60 s,
    every thread's stack (faulthandler, on SIGABRT) and the SIGINT state are the failure's message: the test
    failed twice in full suite runs (never alone) with the ranks training on."""
    import subprocess
    import time

    path = next(p for p in EXAMPLES if p.stem == "train_megatron_block")
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", str(path), "--ranks", "64", "--steps", "500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_a_shell_starts_it)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the ranks run (the banner is out)
            line = proc.stdout.readline()
            if "simulated ranks" in line:
                break
        time.sleep(1.0)
        _, err, state = interrupt(proc)
    finally:
        proc.kill()
    assert proc.returncode == 130, (state, err)
    assert err == "spmdsim: interrupted (Ctrl-C): the simulated ranks were stopped\n"


def test_an_example_asked_for_a_dry_run_without_simulated_ranks_refuses(monkeypatch, capsys):
    """It ran a real one-process job and ignored --dry-run."""
    path = next(p for p in EXAMPLES if p.stem == "attention")
    code, out = _ran(path, ["--dry-run"], monkeypatch, capsys)
    assert code == 2 and out.out == ""
    assert out.err == "spmdsim: error: --dry-run needs --ranks N (a dry run simulates the ranks in this process)\n"


def test_seed_networks_bucket_their_gradient_sums(monkeypatch, capsys):
    """OneFlow's 2D SBP model sums four parameters' gradients over dp: --bucket makes that one call."""
    path = next(p for p in TRAINING if p.stem == "train_seed_networks")
    code, said = _ran(path, ["--ranks", "4", "--net", "oneflow_2d_sbp", "--steps", "3", "--bucket"], monkeypatch,
                      capsys)
    out = said.out
    assert code == 0 and "every step vs one process: PASS" in out, out
    assert "  backward collectives per step: {'allreduce': 1}, 368 B sent by rank 0" in out.splitlines(), out


@pytest.mark.parametrize("args, code, said", [
    # Nothing could run: it printed "skipped at 3 ranks: oneflow_2d_sbp" and exited 1, as a failed check does.
    (["--ranks", "3", "--net", "oneflow_2d_sbp"], 2,
     "spmdsim: error: the 2 x n placement needs an even rank count, not 3 (simulate 8 ranks with `--ranks 8` / "
     "spmdsim.simulate(8, main), or launch them with `mpiexec -n 8 ...`)\n"),
    # `--net` with no name ran nothing and exited 1 without a word.
    (["--ranks", "4", "--net"], 2, "error: argument --net: expected at least one argument; see: "
                                   "train_seed_networks.py --help\n"),
    # One network skipped says why, and one rank is "1 rank" ("1 ranks", and the reason went unsaid).
    (["--ranks", "1", "--steps", "1"], 0,
     "skipped: oneflow_2d_sbp, oneflow_2d_signature (the 2 x n placement needs an even rank count, not 1)\n"),
])
def test_seed_networks_say_what_cannot_run_and_why(args, code, said, monkeypatch, capsys):
    path = next(p for p in TRAINING if p.stem == "train_seed_networks")
    exit_code, out = _ran(path, args, monkeypatch, capsys)
    assert exit_code == code and (unfold(out.err) if code else out.out).endswith(said), out
    if code == 0:
        assert "Embedding -> column Linear -> row Linear, 1 rank\n" in out.out


def test_the_banner_counts_one_rank_in_the_singular():
    """`--ranks 1` said "running on 1 simulated ranks"."""
    from spmdsim.runtime.sim.launch import banner

    assert banner(1) == "spmdsim: running on 1 simulated rank in one process (--ranks 1), no mpiexec"
    assert banner(8, dry_run=True) == ("spmdsim: a dry run (shapes only) on 8 simulated ranks in one process "
                                       "(--ranks 8), no mpiexec")


def test_script_takes_ranks_out_of_argv_before_the_files_own_parser(tmp_path):
    """README, "Using it as a library": script(__file__) before the file's argparse parser; every rank's parser
    then sees the file's own arguments only."""
    prog = tmp_path / "prog.py"
    prog.write_text("import argparse, spmdsim\nspmdsim.script(__file__)\np = argparse.ArgumentParser()\n"
                    "p.add_argument('--n', type=int)\nprint(spmdsim.world().rank, p.parse_args().n)\n")
    code, out, err = run_here(str(prog), ["--ranks", "2", "--n", "7"])  # as `python prog.py ...`, in process
    assert code == 0, err
    assert sorted(out.splitlines()) == ["0 7", "1 7", "spmdsim: running on 2 simulated ranks in one process "
                                              "(--ranks 2), no mpiexec"]


#: The examples that give script(__file__) the ranks they are written for (the rest refuse 1 rank themselves).
WRITTEN_FOR = re.compile(r"script\(__file__, ranks=(\d+)\)")


def test_an_example_alone_in_one_process_says_how_to_get_its_ranks(monkeypatch, capsys):
    # examples/attention.py without --ranks or mpiexec ran on 1 rank: "no communication", check passed, not a word
    # that it is written for 8. Now one line on stderr; it still runs (its exit code and stdout as before).
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    path = next(p for p in EXAMPLES if p.stem == "attention")
    code, out = _ran(path, [], monkeypatch, capsys)
    assert code == 0
    assert out.err == ("spmdsim: 1 rank, no mpiexec: this example is written for 8; add --ranks 8 or use "
                       "mpiexec -n 8\n")
    assert "check passed" in out.out
    from spmdsim.runtime.sim.launch import script

    script(str(path), [], ranks=8)  # mpiexec -n 1 is one rank too
    monkeypatch.setenv("PMI_SIZE", "1")
    script(str(path), [], ranks=8)
    assert capsys.readouterr().err.count("written for 8") == 2
    monkeypatch.setenv("PMI_SIZE", "8")  # launched on 8 (its rank's guard aside): nothing to say
    script(str(path), [], ranks=8)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "script(__file__" in p.read_text()], ids=lambda p: p.stem)
def test_each_example_that_runs_quietly_on_1_rank_gives_the_ranks_its_docstring_says(path, monkeypatch):
    from spmdsim.errors import RankCountError
    from spmdsim.runtime.engines import advised

    source = path.read_text()
    launch = re.search(r"mpiexec -n (\d+)", source.split('"""')[1])
    given = WRITTEN_FOR.search(source)
    assert launch, path.name
    # An example's own "use --ranks 8 or mpiexec -n 8" guessed the launcher (wrong under spmdsim mpirun): its
    # refusal is a RankCountError whose ways the launcher's (spmdsim.runtime.engines.ways_out)
    assert not re.search(r"use --ranks \d+", source), path.name
    if given is None:  # it (or its Mesh) refuses 1 rank, naming N and both ways to it: --ranks N, mpiexec -n N
        monkeypatch.setattr(sys, "argv", [str(path)])
        monkeypatch.setattr(sys, "excepthook", sys.excepthook)
        with pytest.raises(RankCountError) as raised:
            runpy.run_path(str(path), run_name="__main__")
        n, error = int(launch.group(1)), advised(raised.value, 1)  # as the excepthook reports it
        assert error.size == 1 and (error.needed == n or error.divides and n % error.needed == 0), path.name
        assert f"`mpiexec -n {n} ...`" in error.ways and f"`--ranks {n}`" in error.ways, path.name
    else:
        assert given.group(1) == launch.group(1), path.name
