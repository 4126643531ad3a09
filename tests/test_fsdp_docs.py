"""Every command docs/howto/fsdp.md shows runs, and prints what the page quotes or says.

A command quoted with its output (``$ ...``) runs as shown and its output must match (docs_commands.mismatch).
A command marked ``# long`` runs with ``--steps 2 --sample 0`` in place of its step count and must PASS; the
MPI one runs so in tests/test_train_docs_mpi.py (mpi_long). The table of bytes and the memory figures the
prose gives are the commands' own.
"""
from __future__ import annotations

import re
import shlex

import pytest

from spmdsim.errors import fold_message
from docs_commands import ROOT, mismatch, mpi_long, quotes, run_here, run_long, run_quoted

DOC = "docs/howto/fsdp.md"


def _shown() -> list:
    return quotes(DOC)


def test_the_page_shows_the_commands_this_test_runs():
    shown = _shown()
    assert [q.output is not None for q in shown] == [True] + [False] * 4 + [True] * 2 + [False] * 2 + [True] + \
        [False] + [True] * 8 + [False] * 10
    assert [i for i, q in enumerate(shown) if mpi_long(q)] == [1]  # tests/test_train_docs_mpi.py runs it
    estimates = shown[19:]  # inline: a subcommand's name in prose, the 7.5B model's estimates (Prefetching, HSDP)
    assert all(q.inline and q.command.startswith("spmdsim estimate") for q in estimates)
    assert [q.command for q in estimates if q.command != "spmdsim estimate"] == [
        _reshard_estimate().command, _prefetch_estimate().command, _hybrid_estimate().command]


#: {command: its run}: "Under FP8"'s command runs once for its quoted lines and for the figures the prose gives
#: (test_the_fp8_figures_are_the_quoted_commands; 1.3 CPU-s a run). Each test reads the run, none changes it.
_RUNS: dict = {}


def _run(command: str):
    if command not in _RUNS:
        _RUNS[command] = run_quoted(command)
    return _RUNS[command]


@pytest.mark.parametrize("index", [0, 5, 6, 9, 11, 12, 15, 16, 17, 18])
def test_a_quoted_command_prints_what_the_page_quotes(index):
    quote = _shown()[index]
    done = _run(quote.command)
    assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
    why = mismatch(quote.output, done.stdout)
    assert why is None, f"{quote.where()}: {why}\n{done.stdout}"


@pytest.mark.parametrize("index", [2, 3, 4])
def test_a_long_command_runs_two_steps_and_passes(index):
    done = run_long(_shown()[index])
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout


def test_a_hybrid_checkpoint_resumes_fully_sharded_at_the_unstopped_runs_loss(tmp_path):
    """"Hybrid sharding (HSDP)": the checkpoint saved with --shard-group 4, resumed over all 8 dp ranks, print
    what the page quotes (its directory in `tmp_path`), and the resumed run ends at the unstopped hybrid run's
    loss to the digits the trend line prints."""
    save, resume = _shown()[13:15]
    where = str(tmp_path / "hsdp")
    assert save.command.endswith(" --save hsdp") and resume.command.endswith(" --resume hsdp")
    outputs = []
    for quote in (save, resume):
        done = run_quoted(quote.command.replace(" hsdp", f" {where}"))
        assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
        lines = (line.replace(" hsdp ", f" {where} ") for line in quote.output)
        expected = tuple(part for line in lines  # (the resume line folded as the trainer folds it)
                         for part in (fold_message(line) if line.startswith("resuming") else line).split("\n"))
        assert mismatch(expected, done.stdout) is None, f"{quote.where()}: {done.stdout}"
        outputs.append(done.stdout)
    # the unstopped run, for its losses alone: unchecked (the check changes no loss; 40% of a checked run's CPU)
    whole = run_quoted(save.command.replace("--steps 3 --sample 0 --save hsdp", "--steps 5 --sample 0 --no-check"))
    assert whole.returncode == 0, whole.stderr
    last = [re.search(r"last ([0-9.]+) \(falling\)", out).group(1) for out in (outputs[1], whole.stdout)]
    assert last[0] == last[1] and f"Its last loss, {last[0]}, is the unstopped" in (ROOT / DOC).read_text()


def test_fully_sharded_over_cp_holds_zero_1s_optimizer_states():
    """"With context parallelism": ZeRO-3 on dp 2 x cp 2 shards over both, so its optimizer states are
    ZeRO-1's on that mesh (which shards them over dp x cp), a quarter of ZeRO-0's, and so are its parameters
    (ZeRO-0's count a little more beside them). The quoted ZeRO-3 run (its 3 steps) is the one
    test_a_quoted_command_prints_what_the_page_quotes[16] made; ZeRO-1's and ZeRO-0's run one step: what a rank
    holds is the same after each step (1.6 CPU-s a run less)."""
    quote = _shown()[16]
    assert "--cp 2" in quote.command and "--zero 3" in quote.command and " --steps 3 " in quote.command
    held = {}
    for zero in (3, 1, 0):
        command = quote.command if zero == 3 else quote.command.replace("--zero 3", f"--zero {zero}").replace(
            " --steps 3 ", " --steps 1 ")
        done = _run(command)
        assert done.returncode == 0 and "PASS" in done.stdout, done.stderr
        held[zero] = [int(re.search(rf"{what} ([\d,]+)", done.stdout).group(1).replace(",", ""))
                      for what in ("parameters", "optimizer states")]
    assert held[3][1] == held[1][1] and held[0][1] == 4 * held[3][1] and held[3][0] < held[0][0] / 4


def test_the_table_of_bytes_is_what_the_commands_send():
    text = (ROOT / DOC).read_text()
    rows = {m.group(1): (int(m.group(2)), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^\| `([^`]+)`[^|]*\| +(\d+) \| +([\d,]+) \|$", text, re.M)}
    shown = _shown()
    for flags, index in (("--zero 3 --reshard-after-forward false", 8), ("--zero 3", 7)):
        done = run_quoted(shown[index].command)
        assert done.returncode == 0, done.stderr
        calls, sent = re.search(r"^ +0 +[\d.]+ +(\d+) +([\d,]+)", done.stdout, re.M).groups()
        assert rows[flags] == (int(calls), int(sent.replace(",", "")))
    zero = run_quoted(shown[7].command.replace("--zero 3", "--zero 0"))
    calls, sent = re.search(r"^ +0 +[\d.]+ +(\d+) +([\d,]+)", zero.stdout, re.M).groups()
    assert rows["--zero 0"] == (int(calls), int(sent.replace(",", "")))


def test_keeping_the_gathered_layers_holds_what_the_page_says():
    done = run_quoted(_shown()[10].command)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stderr
    assert "gathered parameters at most 4,111,360, 3,315,712 of them kept for backward" in done.stdout
    text = " ".join((ROOT / DOC).read_text().split())
    assert "without it 4,111,360, 3,315,712 of them kept for backward" in text


def _reshard_estimate():
    """The estimate of the 7.5B model without resharding after forward that "When to reshard after forward" names."""
    (quote,) = [q for q in _shown() if q.inline and "--reshard-after-forward" in q.command]
    return quote


def test_the_reshard_figures_are_the_estimates():
    """"When to reshard after forward": the 7.5B model's Allgather bytes, step time and peak with its layers kept
    gathered and resharded (the page's command without its last two words), and the gathered bytes kept."""
    argv = shlex.split(_reshard_estimate().command)[1:]
    assert argv[:2] == ["estimate", "gpt"] and argv[-4:] == ["--zero", "3", "--reshard-after-forward", "false"], argv
    said = []
    for args in (argv, argv[:-2]):
        code, out, err = run_here("main", args)
        assert code == 0, err
        out = " ".join(out.split())
        ms = float(re.search(r"predicted step time: ([\d.]+) ms", out).group(1))
        said.append((re.search(r"allgather \(cluster\) ([\d.]+ GiB)", out).group(1), f"{ms:.1f}",
                     re.search(r"peak \(transient included\) ([\d.]+) GiB", out).group(1),
                     re.search(r"gathered parameters at most [\d.]+ GiB at once, ([\d.]+) GiB of them kept", out)))
    (sent, ms, peak, kept), (sent_r, ms_r, peak_r, _) = said
    text = " ".join((ROOT / DOC).read_text().split())
    assert (f"sends {sent} by Allgather where resharding sends {sent_r} and predicts {ms} ms a step against {ms_r} "
            f"ms, but its peak is {peak} GiB against {peak_r} GiB: {kept.group(1)} GiB of gathered layers wait for "
            "their backward") in text


def _prefetch_estimate():
    """The estimate of the 7.5B model with --prefetch that "Prefetching" names, as the page spells it."""
    (quote,) = [q for q in _shown() if q.inline and "--prefetch" in q.command]
    return quote


def _hybrid_estimate():
    """The estimate of the 7.5B model with --shard-group that "Hybrid sharding (HSDP)" names."""
    (quote,) = [q for q in _shown() if q.inline and "--shard-group" in q.command]
    return quote


def test_the_hybrid_sharding_figures_are_the_estimates():
    """"Hybrid sharding (HSDP)": the step time and peak of the 7.5B model on 64 ranks in groups of 8, and over all
    64, as the page's command prints them (the second without --shard-group)."""
    argv = shlex.split(_hybrid_estimate().command)[1:]
    assert argv[-2:] == ["--shard-group", "8"], argv
    said = []
    for args in (argv, argv[:-2]):
        code, out, err = run_here("main", args)
        assert code == 0, err
        said += [re.search(r"predicted step time: ([\d.]+) ms", out).group(1),
                 re.search(r"peak \(transient included\) ([\d.]+) GiB", out).group(1)]
    text = " ".join((ROOT / DOC).read_text().split())
    ms = [f"{float(s):.1f}" for s in said[::2]]
    assert (f"Allreduce a unit: {ms[0]} ms a step and {said[1]} GiB at its peak, against {ms[1]} ms "
            f"and {said[3]} GiB sharded over all 64 ranks") in text


def test_the_prefetch_figures_are_the_estimates():
    """The page's 0.75 and 1.13 GiB: the estimate's gathered layers beside the memory line, without and with
    --prefetch, for the 7.5B model (a layer and a layer's gathered buffer, and with prefetch a layer more), by
    the command the page names (it named none: a reader could not get the figures)."""
    argv = shlex.split(_prefetch_estimate().command)[1:]
    assert argv[:2] == ["estimate", "gpt"] and argv[-3:] == ["--zero", "3", "--prefetch"], argv
    for extra, gib in (([], "0.75"), (["--prefetch"], "1.13")):
        code, out, err = run_here("main", argv[:-1] + extra)
        assert code == 0, err
        assert f"{gib} GiB of the layers' gathered parameters" in " ".join(out.split())
    # the step time: the gathers' phase, and with --prefetch the part the compute hides
    assert re.search(r"^ +parameters phase +173\.8\d+ ", out, re.M)
    assert re.search(r"^ +parameters phase +-173\.8\d+ ", out, re.M)  # all of them, under the layers' compute
    assert re.search(r"^ +gradients phase +-88\.1\d+ ", out, re.M)
    text = " ".join((ROOT / DOC).read_text().split())
    assert "1.13 GiB of gathered layers instead of 0.75 GiB for the 7.5B model" in text
    assert "the gathers take 174 ms a step" in text and "prefetching hides all of them" in text


def test_the_fp8_figures_are_the_quoted_commands():
    """"Under FP8": the e4m3 copies' bytes (the quoted line's two fp8 kinds), of them the four layers' weights whole
    (a byte each: QKV, the projection, fc1, fc2 at d_model 128), and the bf16 parameter shards rank 0 holds."""
    quote = _shown()[18]
    assert "--precision fp8" in quote.command and "--zero 3" in quote.command
    done = _run(quote.command)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stderr
    fp8 = sum(int(n.replace(",", "")) for n in re.findall(r"(?:mlp|attention) fp8 ([\d,]+)", done.stdout))
    params = int(re.search(r"parameters ([\d,]+), gradients", done.stdout).group(1).replace(",", ""))
    d = 128
    weights = 4 * (4 * d * d + 2 * d * 4 * d)
    text = " ".join((ROOT / DOC).read_text().split())
    assert f"Of the {fp8:,} bytes of e4m3 copies, {weights:,} are the four layers' weights whole" in text
    assert f"almost twice the {params:,} bytes of bfloat16 parameter shards" in text and 1.8 < weights / params < 2
