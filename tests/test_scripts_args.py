"""The bench scripts' command lines: every bad value refused in argparse, named in the message.

Pure (plain pytest): each script is loaded from its path and only its parser
runs (bench_gpt's refusals through its main(), in this process). Launches under
``mpiexec -n`` check the whole path (exit code 2, one message, no traceback),
bench_front's rows, and one run of every bench_gpt row (its MPI launches as
programs of one mpiexec job).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs_commands import run_here
from spmdsim.errors import RuntimeMismatchError
from testkit import MPIEXEC, bench_launches, load_script, unfold

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):
    return load_script(_SCRIPTS / f"{name}.py", f"spmdsim_script_{name}")


@pytest.fixture(scope="module")
def args_mod():
    return _script("_bench_args")


# -- the shared argument types ---------------------------------------------------------
@pytest.mark.parametrize("text, value", [("4096", 4096), ("64K", 65536), ("4M", 4 << 20),
                                         ("1.5K", 1536), ("64KiB", 65536), (" 1G ", 1 << 30)])
def test_byte_size_reads_what_calibrate_reads(args_mod, text, value):
    assert args_mod.byte_size(text) == value


@pytest.mark.parametrize("text, expected", [
    ("1Q", "not a byte count"), ("abc", "not a byte count"), ("", "not a byte count"),
    ("nan", "not a byte count"), ("inf", "not a byte count"), ("-inf", "not a byte count"),
    ("1e400", "not a byte count"), ("-4", "expected at least 1"), ("0", "expected at least 1"),
    ("0.5", "not a whole number of bytes"), ("1e30", "expected at most"), ("2048G", "expected at most"),
])
def test_byte_size_refuses_with_the_value_named(args_mod, text, expected):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        args_mod.byte_size(text)
    assert f"size {text!r}" in str(info.value) and expected in str(info.value)


def test_byte_sizes_names_the_bad_item_and_its_minimum(args_mod):
    assert args_mod.byte_sizes(8)("8,1K") == [8, 1024]
    with pytest.raises(argparse.ArgumentTypeError, match=r"size '4' is 4 bytes; expected at least 8"):
        args_mod.byte_sizes(8)("1K,4")
    with pytest.raises(argparse.ArgumentTypeError, match=r"size ''"):
        args_mod.byte_sizes()("1K,,2K")


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "x", ""])
def test_int_at_least(args_mod, text):
    assert args_mod.int_at_least(1)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected a whole number >= 1, got {text!r}"):
        args_mod.int_at_least(1)(text)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf", "x"])
def test_positive_float(args_mod, text):
    assert args_mod.positive_float("0.01") == 0.01
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected a finite number > 0, got {text!r}"):
        args_mod.positive_float(text)


def test_existing_file_and_output_path(args_mod, tmp_path):
    there = tmp_path / "cost.json"
    there.write_text("{}")
    assert args_mod.existing_file(str(there)) == str(there)
    with pytest.raises(argparse.ArgumentTypeError, match=r"'/nonexistent/c.json' does not exist"):
        args_mod.existing_file("/nonexistent/c.json")
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        args_mod.existing_file(str(tmp_path))
    assert args_mod.output_path(str(tmp_path / "b.json")) == str(tmp_path / "b.json")
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"cannot write '/nonexistent_dir/b.json': '/nonexistent_dir' is not"):
        args_mod.output_path("/nonexistent_dir/b.json")
    with pytest.raises(argparse.ArgumentTypeError, match="is not an existing folder"):
        args_mod.output_path(str(there / "b.json"))  # its "folder" is a file
    for bad in (str(tmp_path), ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a file to write"):
            args_mod.output_path(bad)


def test_only_rank_0_prints_a_parse_error(args_mod, monkeypatch, capsys):
    parser = args_mod.ArgumentParser(prog="x")
    parser.add_argument("--n", type=args_mod.int_at_least(1))
    for rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("PMI_RANK", rank)
        with pytest.raises(SystemExit) as info:
            parser.parse_args(["--n", "0"])
        assert info.value.code == 2  # every rank exits alike
        assert ("got '0'" in capsys.readouterr().err) == printed


# -- each script's parser --------------------------------------------------------------
BAD = [  # (script, argv, text the error line must contain)
    ("bench", ["--suite", "nosuch"], "unknown suite 'nosuch'"),
    ("bench", ["--suite", ""], "'' names no suite"),
    ("bench", ["--suite", "ops,,x"], "unknown suite 'x'"),
    ("bench", ["--sizes", "1Q"], "size '1Q'"),
    ("bench", ["--sizes", "64K,abc"], "size 'abc'"),
    ("bench", ["--sizes", "-4"], "size '-4'"),
    ("bench", ["--sizes", "nan"], "size 'nan'"),
    ("bench", ["--sizes", "inf"], "size 'inf'"),
    ("bench", ["--sizes", "1e30"], "size '1e30'"),
    ("bench", ["--repeats", "0"], "--repeats: expected a whole number >= 1, got '0'"),
    ("bench", ["--repeats", "-3"], "got '-3'"),
    ("bench", ["--warmup", "-1"], "--warmup: expected a whole number >= 0, got '-1'"),
    ("bench", ["--loops", "0"], "--loops: expected a whole number >= 1, got '0'"),
    ("bench", ["--loops", "-1"], "got '-1'"),
    ("bench", ["--json", "/nonexistent_dir/b.json"], "'/nonexistent_dir' is not an existing folder"),
    ("bench", ["--cost-file", "/nonexistent/cost.json"], "'/nonexistent/cost.json' does not exist"),
    ("bench", ["--suite", "overhead", "--filter", "x"], "--filter 'x'"),
    ("bench_collectives", ["--sizes", "0"], "size '0'"),
    ("bench_collectives", ["--sizes", "4096", "-4"], "size '-4'"),
    ("bench_collectives", ["--repeats", "0"], "got '0'"),
    ("bench_collectives", ["--launches", "0", "-n", "8"], "--launches: expected a whole number >= 1, got '0'"),
    ("bench_collectives", ["--iterations", "0"], "--iterations: expected a whole number >= 1, got '0'"),
    ("bench_collectives", ["--iterations", "-1"], "got '-1'"),
    ("bench_collectives", ["-n", "3"], "expected an even rank count >= 2, got '3'"),
    ("bench_collectives", ["-n", "0"], "got '0'"),
    ("bench_collectives", ["--prepared", "--alloc"], "--prepared and --alloc conflict"),
    # each mode's options were taken by the other and ignored (`--launches 1 --json` printed the markdown table)
    ("bench_collectives", ["--launches", "1", "--json", "--aa"],
     "--json, --aa: options of the overhead table, not of the launch test (--launches 1: a fixed job); expected "
     "them without --launches"),
    ("bench_collectives", ["--launches", "2", "--sizes", "4096"], "--sizes: an option of the overhead table"),
    ("bench_collectives", ["--launches", "2", "--wait", "busy"], "--wait: an option of the overhead table"),
    ("bench_collectives", ["-n", "4"], "-n/--ranks: an option of the launch test only; expected it with "
                                       "--launches N (the overhead table runs on the ranks mpiexec started)"),
    ("bench_collectives", ["--sizes", "4096", "--iterations", "9"], "--iterations: an option of the launch test"),
    ("bench_placement", ["--sizes", "abc"], "size 'abc'"),
    ("bench_placement", ["--repeats", "0"], "got '0'"),
    ("bench_placement", ["--deltas", "0,4096"], "delta 4096 is not within a page"),
    ("bench_placement", ["--deltas", "0,-5000"], "delta -5000 is not within a page"),
    ("bench_placement", ["--deltas", "0,16,16"], "delta 16 is given twice"),
    ("bench_placement", ["--deltas", "0,-112,3984"], "delta 3984 is delta -112"),
    ("bench_placement", ["--deltas", "16,32"], "'16,32' lacks 0"),
    ("bench_placement", ["--deltas", "0,x"], "'0,x' is not a comma list"),
    ("bench_hugepages", ["--sizes", "0"], "size '0'"),
    ("bench_hugepages", ["--repeats", "-1"], "got '-1'"),
    ("bench_front", ["--size", "0"], "size '0'"),
    ("bench_front", ["--repeats", "0"], "got '0'"),
    ("bench_front", ["--spins", "0,5"], "spin 0 us is out of range"),
    ("bench_front", ["--spins", "5,20000"], "spin 20000 us is out of range"),
    ("bench_front", ["--spins", "5,5"], "'5,5' names a spin twice"),
    ("bench_front", ["--spins", "1,x"], "'1,x' is not a comma list"),
    ("memory_run", ["--cols", "0"], "--cols: expected a whole number >= 1, got '0'"),
    ("memory_run", ["--rows", "-5"], "--rows: expected a whole number >= 1, got '-5'"),
    ("memory_run", ["--out", "-1"], "--out: expected a whole number >= 1, got '-1'"),
    ("memory_run", ["--check-rows", "0"], "--check-rows: expected a whole number >= 1, got '0'"),
    ("memory_run", ["--scale", "nan"], "--scale: expected a finite number > 0, got 'nan'"),
    ("memory_run", ["--scale", "inf"], "got 'inf'"),
    ("memory_run", ["--scale", "-1"], "got '-1'"),
    ("memory_run", ["--scale", "0"], "got '0'"),
    ("bench_peers", ["--json", "/nonexistent/p.json"], "'/nonexistent' is not an existing folder"),
]


@pytest.mark.parametrize("name, argv, needle", BAD, ids=[f"{n}{' '.join(a)}" for n, a, _ in BAD])
def test_a_bad_argument_is_one_error_line_naming_it(name, argv, needle, capsys, monkeypatch):
    monkeypatch.delenv("PMI_RANK", raising=False)
    with pytest.raises(SystemExit) as info:
        _script(name).parse_args(argv)
    assert info.value.code == 2
    errors = [line for line in unfold(capsys.readouterr().err).splitlines() if ": error: " in line]
    assert len(errors) == 1 and needle in errors[0], errors


LAUNCHED = [  # scripts whose parser runs in main(): launched, bad values refused before any work
    ("bench_eager", ["--ranks", "1,0"], "--ranks '1,0' must be a comma list of integers >= 1, e.g. 1,2,4,8"),
    ("bench_eager", ["--d-model", "0"], "--d-model '0' must be a comma list of integers >= 1, e.g. 32,128,256"),
    ("bench_eager", ["--ranks", "3"], "--ranks 3 makes dp 3 x tp 1: dp must divide the batch of 8"),
    ("bench_eager", ["--apart", "-1"], "--apart -1 must be at least 1 (or 0: both modes in one process)"),
    ("bench_moe", ["--seed", "-1"], "--seed -1 must be at least 0"),  # rank 0 alone raised; the rest waited
    ("bench_mpirun_start", ["--repeat", "0"], "--repeat 0 must be at least 1"),
    ("dry_scale", ["--mesh", "513,128"], "--mesh '513,128' is 65,664 ranks; expected at most 65,536"),  # traceback
    ("bench_rendezvous", ["--before", "/nonexistent"], "--before '/nonexistent' holds no spmdsim/ folder"),
    ("bench_sim", ["--repeat", "0"], "--repeat 0 must be at least 1"),
    ("calls_gpt", ["--d-model", "30"], "GPTConfig d_model 30 must be divisible by heads 4"),
    ("dry_scale", ["--mesh", "8,x"], "--mesh '8,x' must be two whole numbers >= 1, DP,MP (e.g. 8,128)"),
    ("memory_table", ["--tp", "0"], "--tp 0 must be at least 1"),
    ("memory_table", ["--heads", "0"], "GPTConfig heads 0 must be an integer >= 1"),
]


PEER_PIPELINE = [
    (["--steps", "0"], "peer_mpi4py_pipeline.py: error: --steps 0 must be at least 1"),
    (["--microbatches", "0"], "peer_mpi4py_pipeline.py: error: --microbatches 0 must be at least 1"),
    (["--microbatches", "3"], "peer_mpi4py_pipeline: --microbatches 3 must divide the batch of 8 samples"),
    (["--dropout", "1.5"], "peer_mpi4py_pipeline: GPTConfig dropout 1.5 must be a finite number in [0, 1)"),
]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """{(script, argv): `python scripts/SCRIPT.py ARGV`'s CompletedProcess} for LAUNCHED and PEER_PIPELINE, run in
    turn by one interpreter where they can be (testkit.run_scripts: each as a fresh interpreter runs it)."""
    from testkit import run_scripts

    cases = [(name, tuple(argv)) for name, argv, _ in LAUNCHED]
    cases += [("peer_mpi4py_pipeline", tuple(argv)) for argv, _ in PEER_PIPELINE]
    done = run_scripts([(_SCRIPTS / f"{name}.py", argv) for name, argv in cases], tmp_path_factory.mktemp("launched"))
    return dict(zip(cases, done))


@pytest.mark.parametrize("name, argv, needle", LAUNCHED, ids=[f"{n}{' '.join(a)}" for n, a, _ in LAUNCHED])
def test_a_launched_scripts_bad_argument_is_one_error_line(name, argv, needle, launched):
    """Each of these tracebacked (StatisticsError, ZeroDivisionError, IndexError, GPTConfig's error) or, for
    bench_moe's seed, left 7 ranks waiting for the one that raised."""
    done = launched[name, tuple(argv)]
    assert done.returncode == 2, done.stderr
    errors = [line for line in unfold(done.stderr).splitlines() if ": error: " in line]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in done.stderr, done.stderr


def test_valid_arguments_parse_as_before():
    bench = _script("bench")
    args = bench.parse_args([])
    assert args.suite == ["collectives", "redistribute", "ops"] and args.sizes is None
    args = bench.parse_args(["--suite", "collectives", "--sizes", "1M,8M", "--json", "-"])
    assert args.sizes == [1 << 20, 8 << 20] and args.json == "-"
    bc = _script("bench_collectives")
    assert bc.parse_args([]).sizes == list(bc.SIZES)
    assert bc.parse_args(["--sizes", "4096", "64K"]).sizes == [4096, 65536]
    args = bc.parse_args([])
    assert (args.ops, args.wait, args.ranks, args.iterations) == (list(bc.OPS), "busy", 8, 60)
    # docs/explanation/oversubscription.md's
    args = bc.parse_args(["--launches", "10", "-n", "8", "--iterations", "30"])
    assert (args.launches, args.ranks, args.iterations, args.sizes) == (10, 8, 30, list(bc.SIZES))
    assert bc.parse_args(["--wait", "polite", "--sizes", "4096", "65536"]).wait == "polite"
    bp = _script("bench_placement")
    args = bp.parse_args([])
    assert args.sizes == list(bp.SIZES) and args.deltas == list(bp.DELTAS)
    bh = _script("bench_hugepages")
    assert bh.parse_args(["--sizes", "1M,8M,16M"]).sizes == [1 << 20, 8 << 20, 16 << 20]
    args = _script("memory_run").parse_args(["--scale", "0.01"])
    assert (args.rows, args.cols, args.scale) == (49152, 65536, 0.01)


def test_bench_refuses_a_rank_count_a_suite_cannot_split_over():
    bench = _script("bench")
    for cfg in (bench.QUICK, bench.FULL):
        bench.check_world(["collectives", "redistribute", "ops", "overhead"], cfg, 8)
    bench.check_world(["collectives", "overhead"], bench.QUICK, 3)
    with pytest.raises(RuntimeMismatchError, match=r"redistribute suite cannot run on 3 ranks.*"
                                                   r"divides 64"):
        bench.check_world(["collectives", "redistribute"], bench.QUICK, 3)
    with pytest.raises(RuntimeMismatchError, match=r"ops suite cannot run on 16 ranks.*divides 8"):
        bench.check_world(["ops"], bench.QUICK, 16)


def test_bench_collectives_launch_test_refuses_to_run_under_an_mpi_launcher(monkeypatch, capsys):
    """`mpiexec -n 2 python scripts/bench_collectives.py --launches 1` ran the whole launch test on each rank at
    once: two tables, two copies of every timed job on the same cores."""
    bc = _script("bench_collectives")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(SystemExit) as info:
        bc.parse_args(["--launches", "1"])
    errors = [line for line in unfold(capsys.readouterr().err).splitlines() if ": error: " in line]
    assert info.value.code == 2 and len(errors) == 1, errors
    assert ("--launches 1 starts its own mpiexec runs, but this is one of 2 ranks of an MPI launcher" in errors[0]
            and errors[0].endswith("expected it run serially: python scripts/bench_collectives.py --launches N"))
    assert bc.parse_args(["--workload", "3"]).workload == 3  # the launch test's own job runs under mpiexec
    monkeypatch.setenv("PMI_SIZE", "1")
    assert bc.parse_args(["--launches", "1"]).launches == 1


def test_a_failed_launch_shows_its_stderr_and_exits_non_zero(monkeypatch, capsys):
    bc = _script("bench_collectives")

    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nValueError: boom in the job\n")
    monkeypatch.setattr(bc.subprocess, "run", failing)
    with pytest.raises(SystemExit, match=r"launch 1 \(default\) failed \(exit code 1\)"):
        bc.launches(bc.parse_args(["--launches", "2", "-n", "2"]))
    assert "boom in the job" in capsys.readouterr().err


# -- the whole path under mpiexec ------------------------------------------------------
@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
@pytest.mark.parametrize("ranks, argv, needle", [
    (2, ["--suite", "nosuch"], "bench.py: error: argument --suite: unknown suite 'nosuch'"),
    (3, ["--quick", "--suite", "collectives,ops"], "spmdsim: error: the ops suite cannot run on 3 ranks"),
])
def test_bench_under_mpiexec_exits_2_with_one_line(ranks, argv, needle):
    cmd = ["timeout", "-k", "2", "60", MPIEXEC, "-n", str(ranks), sys.executable,
           str(_SCRIPTS / "bench.py"), *argv]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1"))
    errors = [line for line in proc.stdout.splitlines() if "error" in line]
    assert "Traceback" not in proc.stdout, proc.stdout
    assert proc.returncode == 2, proc.stdout
    assert len(errors) == 1 and errors[0].startswith(needle), proc.stdout


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_bench_front_prints_one_row_per_case_with_ratios_against_raw():
    cmd = ["timeout", "-k", "2", "120", MPIEXEC, "-n", "2", sys.executable, str(_SCRIPTS / "bench_front.py"),
           "--size", "64K", "--repeats", "4", "--spins", "3,7"]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Alltoall of 65536 B per rank over 2 ranks"), proc.stdout
    rows = {line[:32].strip(): line[32:].split() for line in lines[2:-1]}
    assert list(rows) == ["raw mpi4py", "raw again (A/A)", "raw after 3 us of spin", "raw after 7 us of spin",
                          "spmdsim's body (door.issue)", "collectives.alltoall"], proc.stdout
    assert rows["raw mpi4py"][1] == "1.00"
    assert all(float(cols[0]) > 0 for cols in rows.values())
    assert len(rows["raw after 3 us of spin"]) == 3 and len(rows["collectives.alltoall"]) == 2


@pytest.mark.parametrize("flag", ["--launches", "--steps", "--layers", "--d-model", "--seq", "--microbatches"])
def test_bench_gpt_refuses_a_count_below_one(flag):
    code, _, err = run_here("scripts/bench_gpt.py", [flag, "0"])  # as `python scripts/bench_gpt.py`, in process
    assert code == 2
    assert err.strip().splitlines()[-1].endswith(f"error: {flag} 0 must be at least 1")


@pytest.mark.parametrize("argv, needle", [
    (["--microbatches", "4"], "--microbatches 4 applies to --pipeline only"),
    (["--pipeline", "--microbatches", "3"], "--microbatches 3 must divide the batch of 8 samples"),
    (["--pipeline", "--microbatches", "-2"], "--microbatches -2 must be at least 1"),
    (["--pipeline", "--layers", "3"], "--layers 3 cannot fill 4 pipeline stages: each stage needs a layer at least"),
])
def test_bench_gpt_pipeline_refuses_a_bad_value_in_one_line(argv, needle):
    code, _, err = run_here("scripts/bench_gpt.py", argv)  # its checks come before any launch: in process
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"bench_gpt.py: error: {needle}", err


@pytest.mark.parametrize("argv, needle", PEER_PIPELINE)
def test_peer_mpi4py_pipeline_refuses_a_bad_value_in_one_line(argv, needle, launched):
    done = launched["peer_mpi4py_pipeline", tuple(argv)]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == needle, done.stderr


def test_bench_gpt_times_every_row_in_one_run(monkeypatch, capsys, tmp_path):
    """One launch of each worker on a 1-layer GPT: every row, the ratios, the absent peer in one line. Each launch
    is the script's own command (its _command), its result parsed as the script parses it; the 8-rank MPI launches
    run as programs of one mpiexec job (testkit.batch_launches), the A/A controls ("ref2", "handsim2", "hand2")
    reuse the launch of the same command they repeat."""
    if not MPIEXEC:
        pytest.skip("no mpiexec")
    argv = ["--launches", "1", "--steps", "1", "--layers", "1", "--d-model", "32", "--seq", "16"]
    bench = _script("bench_gpt")
    args = argparse.Namespace(steps=1, layers=1, d_model=32, seq=16, microbatches=None)
    here = ("ref", "one", "simreplay", "sim")  # no ranks of their own: run in this process
    workers = [("hand", 1)] + [(w, 0) for w in ("mpireplay", "mpi", "busy") + here]
    if importlib.util.find_spec("torch") is not None:
        workers.append(("dtensor", 1))
    results = bench_launches(bench, args, workers, tmp_path, here)
    results["handsim"] = bench._launch(args, "handsim")  # a launch of its own, run and parsed by the script
    workers.append(("handsim", 0))
    again, first = bench._command(args, "hand", 0), bench._command(args, "hand", 1)
    at = again[0].index("--check") + 1
    assert again[0][:at] + again[0][at + 1:] == first[0][:at] + first[0][at + 1:]  # hand2: only not checked again
    launched = []
    monkeypatch.setattr(bench, "_launch", lambda args, worker, check=0: launched.append((worker, check)) or
                        results[worker])
    monkeypatch.setattr(sys, "argv", ["bench_gpt.py", *argv])
    assert bench.main() == 0
    assert sorted(set(launched)) == sorted(workers + [("hand", 0)]), launched
    printed = capsys.readouterr()
    done = argparse.Namespace(stdout=printed.out, stderr=printed.err)
    assert done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    for row in ("one numpy process ", "  again (A/A control)", "1 simulated rank on a 1 x 1 mesh",
                "8 simulated ranks (threads of one process):", "8 MPI ranks (mpiexec), polite wait:",
                "8 MPI ranks, blocking calls:", "load average at the start ", "load average at the end ",
                "PyTorch DTensor"):
        assert sum(line.startswith(row) for line in lines) == 1, (row, done.stdout)
    assert max(len(line) for line in lines) <= 100
    # each ratio against a run on the same engine, with its spread over launches
    assert sum(line.startswith("  numpy + mpi4py by hand ") for line in lines) == 3, done.stdout
    assert sum(line.startswith("  the same again (A/A control)") for line in lines) == 2, done.stdout
    assert sum(line.startswith("  spmdsim, replayed ") for line in lines) == 2, done.stdout
    assert sum(line.endswith("x by hand (" + line.rsplit("(", 1)[-1]) for line in lines) == 14, done.stdout
    assert sum(line.endswith("x replayed (" + line.rsplit("(", 1)[-1]) for line in lines) == 7, done.stdout
    assert sum(line.endswith("x polite (" + line.rsplit("(", 1)[-1]) for line in lines) == 5, done.stdout
    assert sum(line.startswith("    CPU time of its 8 ranks") for line in lines) == 9, done.stdout
    assert sum(line.startswith("    after the last member arrived") for line in lines) == 5, done.stdout
    assert sum(line.startswith("    waiting for a later member") for line in lines) == 5, done.stdout
    check = [line for line in lines if line.startswith("by hand, step 0 loss ")]
    assert len(check) == 1 and float(check[0].rsplit("|diff| ", 1)[1]) <= 1e-10, done.stdout
    within = [line for line in lines if line.startswith("by hand, after step 0: gradients within ")]
    assert len(within) == 1, within
    assert all(float(w.split()[0].rstrip(",")) <= 1e-10 for w in within[0].split("within ")[1:]), within
    if importlib.util.find_spec("torch") is None:
        assert lines[-2].startswith("PyTorch DTensor: not installed (pip install -e '.[bench]'"), done.stdout
        return
    for row in ("PyTorch DTensor (gloo, 8 MPI ranks)", "spmdsim on 8 MPI ranks / DTensor",
                "the same, replayed / DTensor"):
        assert any(line.strip().startswith(row) for line in lines), (row, done.stdout)
    check = [line for line in lines if line.startswith("DTensor step 0 loss ")]
    assert len(check) == 1, done.stdout
    assert float(check[0].rsplit("|diff| ", 1)[1]) <= 1e-10, check[0]


def test_calls_gpt_counts_both_steps_calls():
    """scripts/calls_gpt.py on a 1-layer GPT: the three kinds of call and their total, for spmdsim and by hand,
    each a count above zero, the total their sum."""
    done = subprocess.run([sys.executable, str(_SCRIPTS / "calls_gpt.py"), "--layers", "1", "--d-model", "32",
                           "--seq", "16"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    rows = {line[:24].strip(): line[24:].split() for line in lines[3:7]}
    assert list(rows) == ["Python functions", "numpy functions", "other builtins", "all"], done.stdout
    phases = {line[:24].strip(): [int(v.replace(",", "")) for v in line[24:].split()] for line in lines[8:11]}
    assert list(phases) == ["forward", "backward", "AdamW"], done.stdout
    counts = {name: (int(a.replace(",", "")), int(b.replace(",", ""))) for name, (a, b, _) in rows.items()}
    assert all(a > 0 and b > 0 for a, b in counts.values())
    for side in (0, 1):
        assert counts["all"][side] == sum(counts[k][side] for k in ("Python functions", "numpy functions",
                                                                    "other builtins"))
    assert sum(p[0] for p in phases.values()) == counts["all"][0]  # the phases make up spmdsim's step
    assert sum(p[1] for p in phases.values()) == counts["numpy functions"][0]
    # The captured step's record: its calls, and its arrays' memory less than each on its own (shared).
    captured = re.fullmatch(r"captured step: ([\d,]+) recorded calls, arrays ([\d.]+) MiB \(([\d.]+) MiB each on "
                            r"its own memory\)", lines[11])
    joined = re.fullmatch(r"gradient buckets written in place, their joins dropped: ([\d,]+) KiB", lines[12])
    assert captured and joined and len(lines) == 13, done.stdout
    assert int(captured[1].replace(",", "")) > 0 and 0 < float(captured[2]) < float(captured[3])
    assert int(joined[1].replace(",", "")) > 0  # docs/howto/replay.md, "Memory"


def test_bench_eager_prints_each_configurations_ratio():
    """scripts/bench_eager.py (docs/explanation/performance.md quotes it, also under `taskset -c 0`: one core, which its
    child keeps): one short run of the two modes in one process, and one with each mode in its own (`--apart`) timing
    Megatron's fused blocks (`--kept megatron`, which the launches it makes are given: a launch is ~1.5 CPU-s, so
    the two options share one run), on one core where taskset is here."""
    one_core = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    tiny = ["--d-model", "16", "--rounds", "2", "--layers", "1", "--seq", "16"]
    for extra, where in ((["--ranks", "1"], ""),
                         (["--ranks", "2", "--apart", "2", "--kept", "megatron"],
                          ", each mode in its own process (2 launches each)")):
        done = subprocess.run(["timeout", "-k", "5", "120", *one_core, sys.executable,
                               str(_SCRIPTS / "bench_eager.py"), *extra, *tiny],
                              capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, done.stderr
        text = unfold(done.stdout)
        rows = [re.fullmatch(r"ranks (\d) \(dp 1 x tp (\d)\), d_model 16" + re.escape(where) + r": eager ([\d.]+) "
                             r"ms, replayed ([\d.]+) ms of CPU a step; eager / replayed ([\d.]+)x "
                             r"\(([\d.]+)-([\d.]+)\)", line)
                for line in text.splitlines() if line.startswith("ranks ")]
        assert [(m.group(1), m.group(2)) for m in rows if m] == [(extra[1], extra[1])], done.stdout
        for m in rows:
            eager, replayed, ratio, low, high = map(float, m.groups()[2:])
            assert eager > 0 and replayed > 0 and low <= ratio <= high
        assert text.startswith("load average at start ") and "load average at end " in text
        assert ("Megatron's fused pieces" in text) == ("megatron" in extra), text
        assert ("2 launches of each mode, 2 steps timed in each" in text) == bool(where), done.stdout
        assert max(map(len, done.stdout.splitlines())) <= 100, done.stdout


def test_digest_training_tells_equal_results_from_different_ones():
    """scripts/digest_training.py (docs/explanation/performance.md): selective recomputation computes what the plain
    step computes, bit for bit (the same state, the same step rows), fp32 does not; an unknown name is
    one error line."""
    script = str(_SCRIPTS / "digest_training.py")
    done = subprocess.run([sys.executable, script, "--only", "dense,selective,fp32"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        m = re.fullmatch(r"(\S+) +state ([0-9a-f]{16}) \(9 files\)  steps ([0-9a-f]{16}) \(3 rows\)", line)
        assert m, done.stdout
        rows[m[1]] = m[2], m[3]
    assert list(rows) == ["dense", "selective", "fp32"]
    assert rows["selective"] == rows["dense"] and rows["fp32"][0] != rows["dense"][0], rows
    # the list and the refusal launch nothing: run in this process (docs_commands.run_here), as `python SCRIPT ...`
    code, listed, _ = run_here("scripts/digest_training.py", ["--list"])
    assert code == 0 and max(map(len, listed.splitlines())) <= 100, listed
    names = [line.split()[0] for line in listed.splitlines() if not line.startswith(" ")]
    assert len(names) == 19 and names[:3] == ["dense", "fp32", "bf16"], listed
    code, out, err = run_here("scripts/digest_training.py", ["--only", "dense,nope"])
    assert code == 2 and out == ""
    assert err.splitlines()[-1].startswith("digest_training.py: error: --only 'dense,nope': unknown "
                                           "configuration 'nope'; expected names from dense, fp32, ")


def test_every_script_ends_quietly_when_its_reader_stops_reading():
    """`python scripts/X.py ... | head` ends the script with 141, as a shell tool stopped by SIGPIPE (and as a
    --ranks run), without a BrokenPipeError traceback: each script's main runs through run_script, and
    digest_training's --list, written into a pipe whose reader is gone, shows it."""
    mains = {}
    for path in sorted(_SCRIPTS.glob("[!_]*.py")):
        text = path.read_text()
        mains[path.name] = text.split('\nif __name__ == "__main__":\n', 1)[1] if "__main__" in text else None
    assert len(mains) >= 20 and all(tail is not None and "run_script(main)" in tail for tail in mains.values()), \
        {name: tail for name, tail in mains.items() if tail is None or "run_script(main)" not in tail}
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, str(_SCRIPTS / "digest_training.py"), "--list"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, ""), done.stderr
