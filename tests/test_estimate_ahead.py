"""`spmdsim autoshard --jobs N` (spmdsim.tools.estimate.ahead): worker processes run the search's next dry runs;
the search chooses and prints what it does alone, a worker's failure or death changes nothing but the time,
and Ctrl-C or SIGTERM leaves no process behind."""
from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from shellkit import as_a_shell_starts_it

import spmdsim.tools.estimate.ledger as ledger
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig
from spmdsim.models.moe import MoEConfig
from spmdsim.tools.cli import autoshard_common
from spmdsim.tools.cli.autoshard_machine import CORES
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate.ahead import LookAhead, _born_ignoring_ctrl_c
from spmdsim.tools.estimate.ledger import dry_key, known_ledgers
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.search import search
from testkit import unfold

#: A search of a few dry runs of the step and 12 layer cells (48 small dry runs), two seconds alone.
SMALL = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=256,batch=4", "--devices", "2",
         "--machine", "a100-dgx", "--memory-limit", "6M", "--fix", "recompute=none"]


@pytest.fixture
def in_process(monkeypatch) -> list:
    """The dry runs this process runs itself (each one's key), none kept from an earlier test."""
    ran: list = []
    real = ledger._dry_ledger
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    monkeypatch.setattr(ledger, "_dry_ledger", lambda *key: ran.append(key) or real(*key))
    return ran


def test_the_workers_run_every_dry_run_and_the_table_is_the_same(capsys, in_process, monkeypatch):
    monkeypatch.setattr(autoshard_common, "PATIENCE_S", 0.05)  # its lines, the first with how to wait less
    assert main(SMALL) == 0
    alone, err = capsys.readouterr()
    assert "48 small dry runs of layer cells" in unfold(alone) and len(in_process) > 48
    hint = f"; --jobs {CORES} runs it on {CORES} cores"
    assert err.count(hint) == (CORES > 1) and err.splitlines()[0].endswith(hint if CORES > 1 else " s"), err
    assert max(map(len, err.splitlines())) <= 100, err
    in_process.clear()
    ledger._LEDGERS.clear()
    assert main(SMALL + ["--jobs", "2"]) == 0
    ahead, err = capsys.readouterr()
    assert in_process == [] and "--jobs" not in err  # every dry run the search asked for, a worker's
    # the same lines but the search's seconds ("51 configurations in 3.2 s: ...")
    assert re.sub(r" in [0-9.]+ s:", "", alone) == re.sub(r" in [0-9.]+ s:", "", ahead)


def test_a_search_of_experts_is_the_same_with_workers(in_process):
    """An MoE GPT's search with its layer cells (six small dry runs a cell: dense and MoE layers) over ep:
    the same candidates, each with the same figures, and no dry run in this process."""
    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=64, batch=4, vocab=128, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, every=2))
    machine, fixed = load_machine("a100-dgx"), {"recompute": "none", "pp": 1, "zero": 1, "cp": 1, "tp": 1}
    alone = search(cfg, 4, machine, 1 << 40, max_dry_runs=3, moe_cells=True, fixed=fixed)
    assert alone.cell_runs == 18 and alone.dry_runs == 3 and {c.config.ep for c in alone.candidates} == {1, 2, 4}
    in_process.clear()
    ledger._LEDGERS.clear()
    assert search(cfg, 4, machine, 1 << 40, max_dry_runs=3, moe_cells=True, fixed=fixed, jobs=3) == alone
    assert in_process == []


def test_a_dry_run_that_fails_in_a_worker_is_left_to_the_search():
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=4, vocab=64)
    good, bad = dry_key(cfg, 2, 1, 1), dry_key(cfg, 3, 1, 1)  # 2 layers on 3 stages: the dry run refuses it
    with pytest.raises(SpmdsimError):
        ledger.dry_run(bad)
    with LookAhead(2) as ahead:
        ahead.before([(0.0, 1, 0, 0, None)], None, lambda entry: [good, bad])  # waits for both
        assert ahead.given == 1 and known_ledgers(good) is not None and known_ledgers(bad) is None
        ahead.before([(0.0, 1, 0, 0, None)], None, lambda entry: [bad])  # not run again: the search runs it
        assert ahead.given == 1

        def refused(entry: tuple) -> list:
            raise SpmdsimError("a candidate the search never takes")

        ahead.before([(0.0, 1, 0, 0, None)], None, refused)  # said by the search itself, if it takes the entry
        assert ahead.given == 1


def test_a_worker_that_dies_ends_the_look_ahead_and_the_search_goes_on(monkeypatch):
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=4, vocab=64)
    keys = [dry_key(cfg, 2, 1, 1, microbatches=m) for m in (1, 2)]
    with LookAhead(1) as ahead:
        ahead.before([(0.0, 1, 0, 0, None)], None, lambda entry: keys[:1])
        assert ahead.given == 1
        for worker in multiprocessing.active_children():
            worker.kill()
        ahead.before([(0.0, 1, 0, 0, None)], None, lambda entry: keys[1:])  # no wait without end
        ahead.before([(0.0, 1, 0, 0, None)], None, lambda entry: keys[1:])  # closed: nothing to wait for
    assert ahead.given == 1 and known_ledgers(keys[1]) is None


@pytest.mark.parametrize("given, message", [
    ("0", "--jobs 0 must be between 1 and "), ("-2", "--jobs -2 must be between 1 and "),
    ("100000", "--jobs 100000 must be between 1 and ")])
def test_a_bad_jobs_is_one_line(capsys, given, message):
    assert main(SMALL + ["--jobs", given]) == 2
    err = unfold(capsys.readouterr().err)
    assert message in err and "cores)" in err and len(err.strip().splitlines()) == 1


def test_jobs_belongs_to_the_search_by_predicted_time(capsys):
    assert main(["autoshard", "--network", "gpt", "--devices", "4", "--jobs", "2"]) == 2
    assert "--jobs 2 is an option of the search by predicted step time: give --machine NAME|PATH too" in \
        unfold(capsys.readouterr().err)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the processes from Linux's /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_workers_too(how):
    """Ctrl-C reaches the terminal's whole process group: the workers leave it to the search, which ends them and
    says one line; SIGTERM ends them, then the search, silently with a shell's code for it (143)."""
    gpt = "layers=24,d_model=2048,heads=16,seq=1024,vocab=50304,batch=8"  # dry runs of seconds, half a minute alone
    proc = subprocess.Popen([sys.executable, "-m", "spmdsim", "autoshard", "--network", "gpt", "--gpt", gpt,
                             "--devices", "8", "--machine", "a100-dgx", "--jobs", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_a_shell_starts_it,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
            time.sleep(0.2)
        workers = _children(proc.pid)
        assert len(workers) >= 3 and proc.poll() is None, (workers, proc.poll())
        time.sleep(1)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    said = [line for line in err.splitlines() if not line.startswith("spmdsim: still pricing")]  # (15 s apart)
    if how == "ctrl-c":
        assert proc.returncode == 130 and said == ["spmdsim: interrupted (Ctrl-C)"], err
    else:
        assert proc.returncode == 128 + signal.SIGTERM and said == [], err
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_a_ctrl_c_while_a_submit_may_start_a_worker_is_raised_after_it_not_lost():
    """The submitting thread blocks Ctrl-C while a worker may start (the worker is born with it blocked), so the
    kernel hands it to another thread of the process: ignored meanwhile (SIG_IGN), it was dropped there and the
    search ran on to its end (a loaded CI run's Ctrl-C test above exited 0 so); held, it is raised after."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Python runs signal handlers in the main thread only")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)  # blocks nothing: the kernel's choice for the signal
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with _born_ignoring_ctrl_c():
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:  # it lands meanwhile, on the other thread
                    time.sleep(0.01)
    finally:
        stop.set()
        other.join()
