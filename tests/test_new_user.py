"""What a new user met from outside (tracebacks, unbounded work, a PASS on NaN, long
lines, an unproven choice, "1e+03 KiB"), each as the one-line answer or the bound it should be."""
from __future__ import annotations

import importlib.abc
import os
import pathlib
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from docs_commands import run_example, run_here
from shellkit import as_a_shell_starts_it, interrupt
from testkit import unfold

from spmdsim import DTensor, Layout, Mesh, SeededTensor, ops, print_ranked, simulate
from spmdsim.base.sizes import format_size
from spmdsim.programs.algorithms import NAMES, build, elements_for, parse_name
from spmdsim.programs.algorithms.formulas import round_count
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt.options import default_split
from spmdsim.runtime import rank_ordered
from spmdsim.runtime.debug import MAX_WATCHDOG_S, watchdog_setting
from spmdsim.tools.cli.console import console
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate.configs import _divisors

ROOT = pathlib.Path(__file__).resolve().parent.parent

KIB, MIB = 1024, 1024 ** 2


@pytest.mark.parametrize("n, shown", [(1000 * KIB, "0.977 MiB"), (1023 * KIB, "0.999 MiB"), (MIB - 1, "1 MiB"),
                                      (999 * KIB, "999 KiB"), (1536 * MIB, "1.5 GiB"),
                                      (5000 * 1024 ** 8, "5,000 YiB")])
def test_format_size_rounds_into_the_next_unit(n: int, shown: str) -> None:
    """1000-1023 KiB read "1e+03 KiB" (the 1T model's gradients in `spmdsim estimate`): never an exponent."""
    assert format_size(n) == shown
    assert "e+" not in format_size(n)


def _spmdsim(*words: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """`python -m spmdsim WORDS` (with SPMDSIM_* settings of its own in `env`)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPMDSIM_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "spmdsim", *words], env=full, text=True, timeout=60,
                          stderr=subprocess.PIPE, **({"stdout": subprocess.PIPE} | kwargs))


def _one_error(out: subprocess.CompletedProcess, rc: int, *words: str) -> None:
    """The run ended with `rc` and one error (folded lines), holding `words`, without a traceback."""
    assert out.returncode == rc, out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if not line.startswith(("  ", "spmdsim: running"))]
    assert len(errors) == 1 and "error" in errors[0], out.stderr
    assert all(word in " ".join(out.stderr.split()) for word in words), out.stderr


def _example(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python examples/NAME.py ARGS` from the repository's root, run in this process (docs_commands.run_example):
    its exit code, stdout and stderr as a process of its own gives them, a Python start and spmdsim's imports
    (0.3 CPU-s) less."""
    return run_example(f"examples/{name}.py", *args)


def _example_warned(name: str, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`_example`'s run and every warning it issued: in a process of its own Python prints them on stderr,
    here pytest would capture them, so they are caught (each time, none filtered) and returned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = _example(name, *args)
    return done, [f"{w.category.__name__}: {w.message}" for w in caught]


def test_watchdog_above_a_week_is_refused_naming_the_range() -> None:
    with pytest.raises(SpmdsimError, match=r"'1e12' is above the watchdog's maximum of 604,800 s"):
        watchdog_setting("1e12", "SPMDSIM_WATCHDOG")
    assert watchdog_setting(str(MAX_WATCHDOG_S), "--watchdog") == MAX_WATCHDOG_S


@pytest.mark.parametrize("flag, env", [(["--watchdog", "1000000000000"], {}), ([], {"SPMDSIM_WATCHDOG": "1e12"})])
def test_huge_watchdog_is_one_line_not_an_overflow(flag: list, env: dict) -> None:
    """An OverflowError traceback from the rank's timed wait (past threading.TIMEOUT_MAX) before."""
    out = _spmdsim("demo", "--ranks", "2", "--only", "mlp", *flag, env=env)
    _one_error(out, 2, "1e12" if env else "1000000000000", "from 1 to 604,800")


@pytest.mark.parametrize("env, words", [({"SPMDSIM_CHECK": "junk"}, ("SPMDSIM_CHECK='junk'", "is not a switch")),
                                        ({"SPMDSIM_WATCHDOG": "1e12"}, ("604,800",))])
def test_mpirun_refuses_a_bad_debug_setting_in_one_line(tmp_path, env: dict, words: tuple) -> None:
    """A 24-line traceback from every simulated rank before (`spmdsim demo` said it in one line)."""
    prog = tmp_path / "prog.py"
    prog.write_text("from mpi4py import MPI\nprint(MPI.COMM_WORLD.allreduce(1))\n")
    out = _spmdsim("mpirun", "-n", "2", "python", str(prog), env=env)
    _one_error(out, 2, "spmdsim mpirun: error:", *words)
    assert out.stdout == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("json", [["--json"], []])
def test_full_disk_under_json_is_one_line(json: list) -> None:
    """--json prints its document in one write on a simulated rank: an OSError traceback of 43 lines before."""
    with open("/dev/full", "w") as full:
        out = _spmdsim("demo", "--ranks", "2", "--only", "matmul_2x1_1x4", *json, stdout=full)
    _one_error(out, 1, "cannot write the output: No space left on device")


class _InterruptingFinder(importlib.abc.MetaPathFinder):
    """A Ctrl-C that lands while `name` is imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_importing_is_one_line_and_130(monkeypatch, capsys) -> None:
    """A Ctrl-C in the first second of `spmdsim demo --ranks 8` (importing) printed a 66-line traceback."""
    monkeypatch.delitem(sys.modules, "spmdsim.tools.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_InterruptingFinder("spmdsim.tools.cli.main"), *sys.meta_path])
    assert console(["demo", "--ranks", "8"]) == 130
    assert capsys.readouterr().err == "spmdsim: interrupted (Ctrl-C)\n"


def test_console_script_and_module_enter_through_console() -> None:
    """The console script and `python -m spmdsim` both call console() (setup.cfg's entry point)."""
    setup = (ROOT / "setup.cfg").read_text()
    assert "spmdsim = spmdsim.tools.cli.console:console" in setup
    assert "console()" in (ROOT / "spmdsim" / "__main__.py").read_text()


def test_the_dry_run_commands_collect_garbage_less_often_and_the_others_as_python_does() -> None:
    """console() freezes what a dry-run command imported and raises the collector's thresholds (its gc share of
    the 1T estimate: 23% -> 4%), for `spmdsim estimate` and `spmdsim autoshard` alone: in a fresh Python (as the
    console script is), a pure command first leaves Python's own collector, then `estimate gpt` tunes it."""
    from spmdsim.base.collector import THRESHOLDS as GC_THRESHOLDS

    program = ("import contextlib, gc, io\n"
               "from spmdsim.tools.cli.console import console\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n"
               "    plain = console(['explain', '--device-matrix', '2', '--alias', 'a', '--tensor-map', 'a',"
               " '--shape', '4'])\n"
               "    before = gc.get_threshold(), gc.get_freeze_count()\n"
               "    dry = console(['estimate', 'gpt'])\n"
               "print(plain, dry, before, gc.get_threshold(), gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # A fresh interpreter's own thresholds and frozen objects (none, but 375 under Python 3.12.1)
    default = subprocess.run([sys.executable, "-c", "import gc; print((gc.get_threshold(), gc.get_freeze_count()))"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    assert done.stdout.split(" ", 2)[:2] == ["0", "0"]
    assert done.stdout.strip().split(" ", 2)[2] == f"{default} {GC_THRESHOLDS} True"


def _refused_at_once(capsys, argv: list[str], *words: str) -> None:
    """main(argv) refuses in one line, exit 2, before any work (each ran for minutes without a word before)."""
    start = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - start < 5
    out, err = capsys.readouterr()
    lines = unfold(err).splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("spmdsim: error: "), (out, err)
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.parametrize("argv, words", [
    (["estimate", "gpt", "--layers", "100000", "--hidden", "1000000", "--heads", "1000", "--seq", "1000000",
      "--vocab", "1000000"], ("--layers 100,000 is too many; expected at most 1,024",)),
    (["collective", "ring-allreduce", "--size", "1M", "--ranks", "1000"],
     ("sends up to 5,994,000 messages (1,998 rounds of up to 1,000, 3 times (--repeat)); expected at most 500,000",)),
    (["autoshard", "--network", "gpt", "--gpt", "layers=1000,d_model=100000", "--devices", "1000000000000",
      "--machine", "a100-dgx"], ("--devices 1,000,000,000,000 is too many; expected at most 65,536",)),
    (["autoshard", "--network", "gpt", "--gpt", "layers=2000", "--machine", "a100-dgx"],
     ("--gpt layers 2,000 is too many; expected at most 1,024",)),
])
def test_unbounded_work_is_refused_with_its_bound(capsys, argv: list, words: tuple) -> None:
    _refused_at_once(capsys, argv, *words)


def test_divisors_of_a_huge_device_count_come_at_once() -> None:
    """The search listed divisors by trial up to n: 10**12 devices ran for minutes in `_divisors` alone."""
    start = time.perf_counter()
    found = _divisors(10 ** 12)
    assert time.perf_counter() - start < 2
    assert len(found) == 169 and found[:4] == [1, 2, 4, 5] and found[-1] == 10 ** 12
    assert all(_divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 300))


@pytest.mark.parametrize("name", NAMES)
def test_round_count_is_the_schedules(name: str) -> None:
    """The collective's bound counts rounds before building the schedule (which takes seconds at 1,000 ranks)."""
    collective, algorithm = parse_name(name)
    for p in (2, 3, 4, 5, 7, 8, 12, 16, 17, 31, 33):
        schedule = build(collective, algorithm, p, elements_for(collective, p, 64 * p, 4), 4, 0)
        assert round_count(name, p) == len(schedule.rounds), p
        assert max(len(r.transfers) for r in schedule.rounds) <= p


def test_a_dry_demo_that_skipped_everything_exits_3(capsys) -> None:
    """`spmdsim demo --ranks 1024 --dry-run --only mlp` exited 0 with every scenario skipped (3 without --dry-run);
    a dry demo whose scenarios ran still exits 0."""
    assert main(["demo", "--ranks", "1024", "--dry-run", "--only", "mlp"]) == 3
    assert "every scenario was skipped" in unfold(capsys.readouterr().err)
    assert main(["demo", "--ranks", "4", "--dry-run", "--only", "mlp"]) == 0


@pytest.mark.parametrize("extra, said", [([], "step 1: the loss is nan (not finite): training diverged"),
                                         (["--pp", "2", "--layers", "2"], "step 1: the loss is nan"),
                                         (["--precision", "bf16-mixed", "--layers", "1"],
                                          "step 0: parameter 'wte' is not finite after the update (loss 4.82")])
def test_a_diverged_training_stops_naming_the_step(extra: list, said: str) -> None:
    """--lr 1e300 printed NaN losses, 16 lines of numpy warnings, then "check ... PASS"."""
    args = ["--ranks", "8", "--lr", "1e300", "--steps", "3", "--layers", "1", "--d-model", "16", "--seq", "8",
            "--sample", "0"]
    if extra:
        args = args[:6] + args[8:] + extra
    out, warned = _example_warned("train_gpt", *args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 2 and "Warning" not in out.stderr, out.stderr  # one folded error line
    assert warned == [], warned
    assert said in " ".join(out.stderr.split()) and "a lower learning rate than 1e+300" in " ".join(out.stderr.split())
    assert "PASS" not in out.stdout and "nan" not in out.stdout


@pytest.mark.parametrize("example, args, said", [
    ("train_mindspore_tutorial", ["--ranks", "8"],
     "MindSpore operator-parallel tutorial network: step 1: the loss is nan"),
    ("train_seed_networks", ["--ranks", "4", "--net", "oneflow_2d_sbp", "--zero", "3"],
     "OneFlow 2D SBP sample: Linear > ReLU > Linear: step 1: the loss is nan"),
    ("train_megatron_block", ["--ranks", "8"], "the loss diverged at step 1 (nan): lower --lr (now 1e+308)")])
def test_the_other_trainings_stop_a_divergence_in_one_line_without_numpys_warnings(example, args, said) -> None:
    """--lr 1e308 printed 6 to 11 numpy RuntimeWarnings with their source lines (the MindSpore tutorial's and the
    seed networks' then FAILED and nan losses for every later step); each stops at the step, in one line."""
    out, warned = _example_warned(example, *args, "--steps", "3", "--lr", "1e308")
    assert out.returncode == 2, out.stderr
    assert "Warning" not in out.stderr and out.stderr.count("spmdsim: error:") == 1, out.stderr
    assert warned == [], warned
    assert said in " ".join(out.stderr.split()), out.stderr
    assert "PASS" not in out.stdout and "nan" not in out.stdout


def test_the_tutorials_reference_step_says_no_numpy_warning_before_the_divergence() -> None:
    """At --lr 100 the run's loss turns NaN at step 8; the reference step's tolerance magnitudes overflowed a
    step earlier and printed numpy's RuntimeWarnings with their source line before the one-line stop."""
    out, warned = _example_warned("train_mindspore_tutorial", "--ranks", "8", "--steps", "9", "--lr", "100")
    assert out.returncode == 2 and out.stderr.count("spmdsim: error:") == 1, out.stderr
    assert "step 8: the loss is nan" in out.stderr and "Warning" not in out.stderr, out.stderr
    assert warned == [], warned


@pytest.mark.parametrize("extra, said", [
    (["--ranks", "6"], "the GPT cannot run on 6 ranks: no dp x tp of 6 ranks runs it (tp 3: heads 4 is not "
     "divisible by tp 3 (heads are split over tp); tp 2: batch 8 is not divisible by dp 3; tp 1: batch 8 is not "
     "divisible by dp 6); it runs on 1, 2, 4, 8, 16 or 32 ranks (or set --dp and --tp, or the model's sizes)"),
    (["--ranks", "6", "--pp", "2"], "no dp x tp of 3 ranks (world size 6 / pp 2) runs it (tp 3: heads 4"),
    # one split to try (tp 1 alone divides 5 ranks): its problem, and now the worlds that run too
    (["--ranks", "5"], "the GPT cannot run on 5 ranks: batch 8 is not divisible by dp 5; it runs on 1, 2, 4, 8, 16 or "
     "32 ranks (or set --dp and --tp, or the model's sizes)"),
    (["--ranks", "8", "--heads", "2"], None), (["--ranks", "12", "--batch", "12"], None)])
def test_the_default_split_takes_the_largest_tp_that_runs_or_says_which_worlds_do(extra, said) -> None:
    """`mpiexec -n 6 python examples/train_gpt.py` said "dp 1 x tp 4 must multiply to the world size 6" (the default
    tp, min(world, 4), not dividing it; 3 ranks: "heads 4 is not divisible by tp 3"). The default tp is now the
    largest of 4 to 1 the world and the model allow; where none does, each one's problem and the worlds that run."""
    layers = "2" if "--pp" in extra else "1"  # (a layer at least a stage)
    out = _example("train_gpt", *extra, "--steps", "1", "--sample", "0", "--layers", layers, "--d-model", "16",
                   "--seq", "8")
    if said is not None:
        assert out.returncode == 2 and said in " ".join(out.stderr.split()), out.stderr
        assert max(map(len, out.stderr.splitlines())) <= 100
    else:
        assert out.returncode == 0, out.stderr
        mesh = "dp 4 x tp 2" if "--heads" in extra else "dp 3 x tp 4"
        assert f"mesh {mesh};" in out.stdout and ": PASS" in out.stdout, out.stdout


@pytest.mark.parametrize("ranks, said", [
    ("6", "the MoE GPT cannot run on 6 ranks: no dp x ep of 6 ranks runs it (ep 6: experts 8 are not divisible by "
     "ep 6 (experts are split over ep); ep 3: experts 8 are not divisible by ep 3 (experts are split over ep); ep 2: "
     "batch 8 is not divisible by dp 3 x ep 2 = 6; ep 1: batch 8 is not divisible by dp 6); it runs on 1, 2, 4 or 8 "
     "ranks (or set --dp and --ep, or the model's sizes)"), ("4", None)])
def test_the_moe_default_split_takes_the_largest_ep_that_runs_or_says_which_worlds_do(ranks, said) -> None:
    """examples/train_moe_gpt.py's ep, left to its default, was the whole world: 6 ranks said only "experts 8 are
    not divisible by ep 6". Now the largest ep that runs (4 ranks: ep 4, as before), or each one's problem."""
    out = _example("train_moe_gpt", "--ranks", ranks, "--steps", "1", "--layers", "2", "--d-model", "16", "--seq",
                   "8")
    if said is not None:
        assert out.returncode == 2 and said in " ".join(out.stderr.split()), out.stderr
    else:
        assert out.returncode == 0 and "mesh dp 1 x ep 4 x tp 1:" in out.stdout and ": PASS" in out.stdout, out


def test_a_split_refused_at_thousands_of_ranks_says_alike_reasons_once() -> None:
    """8,192 ranks try 14 splits of the MoE GPT's 8 experts: the ten whose ep does not divide 8 said one by one
    made a message of twelve lines; alike reasons in a row are said once, with the splits they hold for."""
    def problem_of(dp: int, ep: int) -> str:
        return f"experts 8 are not divisible by ep {ep}" if 8 % ep else f"batch 8 is not divisible by dp {dp} x ep {ep}"

    _, _, said = default_split(8192, problem_of, 8192, axis="ep", most=0)
    assert said.startswith("no dp x ep of 8192 ranks runs it (ep 8192: experts 8 are not divisible by ep 8192, and "
                           "likewise ep 4096, 2048, 1024, 512, 256, 128, 64, 32 and 16; ep 8: batch 8 is not "
                           "divisible by dp 1024 x ep 8; ep 4: batch 8 is not divisible by dp 2048 x ep 4, and "
                           "likewise ep 2 and 1); "), said


@pytest.mark.parametrize("example, flags, said", [
    ("train_gpt", ["--seq", "0"], "--seq 0 must be an integer >= 1"),
    ("train_gpt", ["--dropout", "1"], "--dropout 1 must be a finite number in [0, 1)"),
    ("train_gpt", ["--tp", "3"], "the GPT cannot run on 8 ranks: --tp 3 must divide the world size 8"),
    ("train_gpt", ["--trace-out", "t.json"], "--trace-out writes a pipeline's last step; give --pp (or "
     "--microbatches) with it"),
    ("train_gpt", ["--seq", "250000"], "seq 250000 is longer than the text holds: its 200,000 tokens give "
     "sequences of at most 199,998 (each with its next-token targets); expected --seq 199998 or less"),
    ("train_gpt", ["--replay"], "--replay captures step 0 and replays it for the later steps: "
     "--steps 1 has none; give --steps 2 or more"),
    ("train_moe_gpt", ["--replay", "--dry-run"], "--replay captures step 0 and replays it for the "
     "later steps: a dry run has no values; leave out --replay or --dry-run"),
    ("train_gpt", ["--vocab", "99999999999999999999"], "--vocab 99,999,999,999,999,999,999 is too large; expected "
     "at most 16,777,216 (2**24, far past any model's size)"),
    ("train_gpt", ["--batch", "20000000"], "--batch 20,000,000 is too large; expected at most 16,777,216 (2**24, far "
     "past any model's size)"),
    ("train_moe_gpt", ["--experts", "100000000"], "--experts 100,000,000 is too large; expected at most 16,777,216 "
     "(2**24, far past any model's size)"),
    ("train_moe_gpt", ["--seq", "199999"], "seq 199999 is longer than the text holds: its 200,000 tokens give "
     "sequences of at most 199,998 (each with its next-token targets); expected --seq 199998 or less"),
    ("train_moe_gpt", ["--top-k", "9"], "--top-k 9 must be 1 or 2 (experts per token)"),
    ("train_moe_gpt", ["--seq", "0"], "--seq 0 must be an integer >= 1"),
    ("train_moe_gpt", ["--dropout", "1"], "--dropout 1 must be a finite number in [0, 1)"),
    ("train_moe_gpt", ["--tp", "3"], "the MoE GPT cannot run on 8 ranks: --tp 3 must divide the world size 8"),
    ("train_moe_gpt", ["--moe-every", "3", "--layers", "2"], "--moe-every 3 makes none of the 2 blocks an MoE layer "
     "(the first would be h2); expected at most --layers 2"),
    ("train_moe_gpt", ["--routing", "worst"], "--routing worst sets a dry run's routing (--ranks N --dry-run); a run "
     "with values routes by its router"),
    ("train_moe_gpt", ["--dry-run", "--dropless"], "--dry-run with --dropless needs --routing balanced or --routing "
     "worst: the dry run has no values to route by, and the bytes depend on it")])
def test_a_gpt_examples_bad_flag_is_refused_before_the_banner(example: str, flags: list, said: str) -> None:
    """The GPT examples checked their flags inside the run, after "spmdsim: running on 8 simulated ranks": a bad
    value (or a size the world cannot split) came after a banner that said the run had started. run_main now asks
    the example's checks at the world size --ranks gives before anything starts, as it does --lr's."""
    out = _example(example, "--ranks", "8", "--steps", "1", *flags)
    assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
    assert unfold(out.stderr) == f"spmdsim: error: {said}\n", out.stderr


@pytest.mark.parametrize("example, flags", [
    ("train_moe_gpt", ["--ranks", "64", "--dry-run", "--ep", "8", "--tp", "2", "--dropless", "--routing", "worst",
                       "--batch", "32"]),
    ("train_gpt", ["--ranks", "16", "--dry-run", "--tp", "8", "--sp", "--heads", "8"])])
def test_a_dry_runs_flags_pass_the_checks_before_the_banner(example: str, flags: list) -> None:
    """The checks before the banner read a dry run from --dry-run (the run's own context says it only once the
    ranks run): a dry run's --routing passes them, and its report follows the banner."""
    out = _example(example, *flags, "--steps", "1")
    assert (out.returncode == 0
            and out.stdout.startswith("spmdsim: a dry run (shapes only) on ")), (out.stdout, out.stderr)


@pytest.mark.parametrize("width", ["80", "100"])
def test_show_keeps_a_long_name_within_the_width(capsys, width: str) -> None:
    """A 5,000-character --name printed a 5,006-column title (and the heading over 63 lines)."""
    assert main(["show", "--strategy", "((1,2),(2,1))", "--operand", "x", "--shape", "4,4", "--width", width,
                 "--name", "n" * 5000]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= int(width)
    assert lines[0].startswith("n" * (int(width) // 2 - 3) + "...: shape (4, 4)")
    assert main(["show", "--strategy", "((1,2),(2,1))", "--operand", "x", "--shape", "4,4", "--name", "w1"]) == 0
    assert capsys.readouterr().out.startswith("w1: shape (4, 4)")  # a short name as given


#: (recomputation held: the three recomputations' layer cells tripled the search, and the claim below needs none)
SMALL_GPT = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=256,batch=4", "--devices",
             "2", "--machine", "a100-dgx", "--fix", "recompute=none"]


@pytest.mark.parametrize("cap, unproven", [(["--max-dry-runs", "1"], True), ([], False)])
def test_autoshard_says_when_its_choice_is_not_proven_best(capsys, cap: list, unproven: bool) -> None:
    """Stopped by --max-dry-runs, it listed unpriced configurations bounded below its choice without a word; its
    first column, a ranking, was headed "rank"."""
    assert main(SMALL_GPT + cap) == 0
    out = capsys.readouterr().out
    said = unfold(out)
    claim = re.search(r"not proven best: (\d+) configuration\(s\) not priced have time bounds below its ([\d.]+) ms "
                      r"\(the least ([\d.]+) ms\)", said)
    assert (claim is not None) == unproven
    if claim:  # some configurations left unpriced, each bounded below the chosen one's time
        assert int(claim[1]) >= 1 and float(claim[3]) < float(claim[2])
    assert re.search(r"^# +tp +pp +v +dp +cp +mb recompute", out, re.M) and not re.search(r"^rank +tp", out, re.M), out
    assert max(map(len, out.splitlines())) <= 100


def _plain_python(folder: pathlib.Path, *argv: str) -> subprocess.CompletedProcess:
    """`python argv...` in `folder` as one plain process: no launcher's rank variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")}
    return subprocess.run([sys.executable, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_program_run_plainly_says_how_to_get_its_ranks_in_one_line(tmp_path) -> None:
    """`python my_matmul.py` (no --ranks, no mpiexec), the README's program run the obvious way, printed a
    7-line traceback ending in RuntimeMismatchError; under --ranks 4 the same error was already one line."""
    readme = (ROOT / "README.md").read_text()
    at = readme.index("Save this as `my_matmul.py`")
    (tmp_path / "my_matmul.py").write_text(re.search(r"^```python\n(.*?)^```", readme[at:], re.S | re.M).group(1))
    done = _plain_python(tmp_path, "my_matmul.py")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert unfold(done.stderr).splitlines() == [
        "spmdsim: error: device matrix (2, 4) needs 8 ranks but the communicator has 1 (one process: launch 8 "
        "ranks with `mpiexec -n 8 ...`, or simulate them in this process with `--ranks 8` / "
        "spmdsim.simulate(8, main))"]


def test_a_plain_process_keeps_the_traceback_of_an_error_not_spmdsims(tmp_path) -> None:
    """Only spmdsim's own errors (bad input) become one line: a bug in the program keeps Python's traceback."""
    (tmp_path / "bug.py").write_text("import spmdsim\nspmdsim.script(__file__)\n{}['missing']\n")
    done = _plain_python(tmp_path, "bug.py")
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "KeyError: 'missing'"


def test_an_error_on_one_simulated_rank_shows_the_programs_frames_only(tmp_path) -> None:
    """An error of the program's own on one of --ranks 4 printed 20 lines of spmdsim's frames (run_on_ranks,
    simulate, the rank's thread, runpy) before the program's 2; under mpiexec the traceback starts at the script."""
    (tmp_path / "one_rank.py").write_text("import spmdsim\nspmdsim.script(__file__)\n\n\ndef main():\n"
                                          "    if spmdsim.world().rank == 3:\n        raise ValueError('unhappy')\n\n\n"
                                          "main()\n")
    done = _plain_python(tmp_path, "one_rank.py", "--ranks", "4")
    assert done.returncode == 1 and done.stdout.startswith("spmdsim: running on 4 simulated ranks"), done.stdout
    said = [line for line in done.stderr.splitlines() if not re.fullmatch(r"\s*[~^]+\s*", line)]  # carets
    assert said == [
        "spmdsim: error on simulated rank 3: ValueError: unhappy", "Traceback (most recent call last):",
        f'  File "{tmp_path / "one_rank.py"}", line 10, in <module>', "    main()",
        f'  File "{tmp_path / "one_rank.py"}", line 7, in main', "    raise ValueError('unhappy')",
        "ValueError: unhappy", "raised on simulated rank 3 of 4"]


def test_ranks_given_to_a_program_that_never_reads_them_says_what_reads_them(tmp_path) -> None:
    """A program without spmdsim.script(__file__) run with --ranks 8 was told to "simulate them in this process
    with `--ranks 8`": the flag it had just given. It is told what reads --ranks instead."""
    (tmp_path / "no_script.py").write_text("from spmdsim import Layout, Mesh\nMesh(Layout((2, 4), ('dp', 'mp')))\n")
    for argv, said in ((["--ranks", "8"], "(one process: --ranks is read by spmdsim.script(__file__), which this "
                                          "program does not call before its work; call it first under `if __name__ "
                                          '== "__main__":`, or launch 8 ranks with `mpiexec -n 8 ...`)'),
                       ([], "(one process: launch 8 ranks with `mpiexec -n 8 ...`, or simulate them in this process "
                            "with `--ranks 8` / spmdsim.simulate(8, main))")):
        done = _plain_python(tmp_path, "no_script.py", *argv)
        assert done.returncode == 1 and done.stderr.splitlines()[-1].endswith(
            f"device matrix (2, 4) needs 8 ranks but the communicator has 1 {said}"), done.stderr


def test_ctrl_c_of_one_plain_process_is_its_one_line_and_130(tmp_path) -> None:
    """Ctrl-C of `python examples/train_gpt.py` (one process, no mpiexec) printed spmdsim's line and then MPICH's
    "Abort(130) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 130) - process 0"."""
    pytest.importorskip("mpi4py")
    (tmp_path / "wait.py").write_text("import time\nfrom spmdsim import install_excepthook\ninstall_excepthook()\n"
                                      "print('ready', flush=True)\ntime.sleep(60)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")}
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "wait.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_a_shell_starts_it)
    try:
        assert proc.stdout.readline() == "ready\n"
        out, err, _ = interrupt(proc)  # without an exit in 60 s: its SIGINT state and every thread's stack
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "spmdsim: interrupted (Ctrl-C): every rank stopped\n")


def test_print_ranked_takes_the_mesh_for_its_communicator(capsys) -> None:
    """`print_ranked(mesh, ...)` (the mesh a program holds, not `mesh.comm`) was an AttributeError traceback:
    'Mesh' object has no attribute 'gather'. A Mesh stands for its communicator, in rank_ordered too."""
    def main() -> None:
        mesh = Mesh(Layout((2, 2), ("dp", "mp")))
        print_ranked(mesh, "same", f"rank {mesh.rank}" if mesh.rank == 3 else "alike")
        with rank_ordered(mesh) as out:
            out.print("holds", mesh.rank % 2)

    simulate(4, main)
    assert capsys.readouterr().out.splitlines() == [
        "ranks 0-2:", "  same", "  alike", "rank 3:", "  same", "  rank 3",
        "ranks 0,2: holds 0", "ranks 1,3: holds 1"]


def test_the_mpi4py_lab_page_opens_with_the_command_and_the_report_it_quotes() -> None:
    """docs/howto/mpi4py-lab.md opened on a 50-line paragraph before its first command; its lead now shows the
    command and the deadlock report, and the report it quotes is what the command prints."""
    page = (ROOT / "docs" / "howto" / "mpi4py-lab.md").read_text()
    lead = page[:page.index("In detail, ")]
    assert "spmdsim mpirun -n 4 python tests/data/lab/missing_send.py" in lead
    flat = lambda text: re.sub(r"\s+", " ", text)  # noqa: E731 - the page's lines and the report's folds alike
    quoted = re.findall(r"`([^`]+)`", flat(lead[lead.index("The second ends, exit 1, with"):]))
    with pytest.MonkeyPatch.context() as mp:  # `spmdsim mpirun ...` as the page types it, run in this process
        mp.chdir(ROOT)
        code, _, err = run_here("main", ["mpirun", "-n", "4", "python", "tests/data/lab/missing_send.py"])
    said = flat(err)
    assert code == 1 and len(quoted) == 2 and all(q in said for q in quoted), (quoted, said)


@pytest.mark.parametrize("reference, shown", [("y", "str 'y'"), (None, "None"), ([1.0, 2.0], "list [1.0, 2.0]"),
                                               (3.0, "float 3.0")])
def test_a_check_against_what_is_no_whole_tensor_is_refused_in_one_line(reference, shown) -> None:
    """`x.check("y")`, `x.check(None)`, a short list: a verdict 'check FAILED ... max abs err inf, max rel err
    inf ... shard shape differs from the reference region', where an ndarray of the wrong shape was refused
    naming its shape. Now refused alike before the check's collective; a nested list of the shape passes."""
    def main(ref):
        mesh = Mesh(Layout((2,), ("mp",)))
        x = DTensor.from_global(mesh, np.arange(4.0).reshape(2, 2), mesh.layout("mp", None))
        return bool(x.check(ref))

    assert simulate(2, main, [[0.0, 1.0], [2.0, 3.0]]) == [True, True]
    with pytest.raises(SpmdsimError) as info:
        simulate(2, main, reference)
    assert str(info.value) == (f"check: reference {shown} does not match the tensor's global shape (2, 2); expected "
                               "the whole global tensor (a SeededTensor or an ndarray of that shape), or a function "
                               "of the region's slices")


def test_a_region_reference_of_another_shape_is_refused_in_one_line() -> None:
    """y.check(reference.matmul_region(SeededTensor((128, 96)), ws)) for y of (64, 32) PASSED: the region function
    made each rank's rows of a (128, 32) product, whose first 64 rows equal y's. A region reference of spmdsim's
    now says its result's shape, and check refuses another one before its collective; the right one passes."""
    from spmdsim import reference

    xs, ws = SeededTensor((64, 96), seed=0), SeededTensor((96, 32), seed=1)

    def main(x_ref):
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "mp"), xs)
        w = DTensor.from_seeded(mesh, mesh.layout("mp", None), ws)
        return bool(ops.matmul(x, w).check(reference.matmul_region(x_ref, ws)))

    assert simulate(8, main, xs) == [True] * 8
    with pytest.raises(SpmdsimError) as info:
        simulate(8, main, SeededTensor((128, 96), seed=0))
    assert str(info.value).startswith("check: region reference of shape (128, 32) does not match the tensor's "
                                      "global shape (64, 32); expected")


def test_python_i_on_a_script_run_on_ranks_opens_its_prompt_without_a_traceback(tmp_path) -> None:
    """`python -i my_matmul.py --ranks 8` printed `Traceback ... in script ... SystemExit: 0` before the prompt:
    script ends the file with SystemExit once the ranks ran, which python -i shows. Now the prompt alone, after a
    passing run and after a failing one (its one line); without -i the exit status is as before."""
    (tmp_path / "prog.py").write_text("import sys\nimport spmdsim\nspmdsim.script(__file__)\n"
                                      "if spmdsim.world().Get_size() != 2:\n    sys.exit(3)\nprint('ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")}
    for ranks, code in (("2", 0), ("3", 3)):
        argv = [sys.executable, "-i", "-q", "prog.py", "--ranks", ranks]
        done = subprocess.run(argv, input="print('at', 'prompt')\n", cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "at prompt" in done.stdout, (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "SystemExit" not in done.stderr, done.stderr
        plain = subprocess.run(argv[:1] + argv[3:], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=120)
        assert plain.returncode == code and plain.stdout.splitlines().count("ran") == (2 if code == 0 else 0), plain


def test_a_repl_that_ran_an_example_survives_spmdsims_error(tmp_path) -> None:
    """An example exec'd in the REPL calls spmdsim.script, whose one-line hook then ended the whole session
    (exit 2) at the first SpmdsimError typed at the prompt; now that error is its one line and the REPL goes on."""
    typed = ("import spmdsim\nspmdsim.script('example.py', ranks=8)\nspmdsim.simulate(0, print)\n"
             "print('still', 'here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")}
    done = subprocess.run([sys.executable, "-i", "-q"], input=typed, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "still here" in done.stdout, (done.stdout, done.stderr)
    assert "spmdsim: error: simulate: rank count 0 must be an integer from 1 to 4096" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_simulate_given_its_arguments_the_other_way_round_says_the_count_comes_first():
    """simulate(main, 8) said "rank count <function main at 0x...> must be an integer from 1 to 4096", naming
    the function where a count belongs without saying that the count comes first."""
    def main():
        return None

    with pytest.raises(SpmdsimError) as raised:
        simulate(main, 8)
    assert str(raised.value).endswith("must be an integer from 1 to 4096, given first: simulate(n, fn)")
    with pytest.raises(SpmdsimError) as raised:
        simulate(0, main)
    assert str(raised.value) == "simulate: rank count 0 must be an integer from 1 to 4096"
