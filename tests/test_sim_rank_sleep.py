"""A simulated rank that sleeps (``time.sleep``) gives its run slot away: 8 ranks sleeping 1 s each sleep side
by side, as 8 MPI processes do, where at most `World.slots` ranks (the cores, at least 2) compute at once."""
from __future__ import annotations

import _thread
import contextlib
import inspect
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from spmdsim import world as spmdsim_world
from spmdsim.runtime.sim import simulate
from spmdsim.runtime.sim import rank_sleep
from spmdsim.runtime.sim.engine import run_slots
from spmdsim.tools.cli.main import main
from testkit import MPICH

# Each rank's (start, end) of its sleep, by its own clock readings; then a collective: every rank takes a
# slot back. One write per rank: MPICH may join two ranks' print() lines.
_PROGRAM = """
    import sys, time
    from time import sleep
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    start = time.time()
    (sleep if comm.rank % 2 else time.sleep)(1.0)
    end = time.time()
    total = comm.allreduce(comm.rank)
    sys.stdout.write(f"sleep {comm.rank} {start!r} {end!r} {total}\\n")
    """


def _overlap(spans: list) -> bool:
    """Whether every sleep began before any ended: they all ran at once."""
    return max(start for start, _ in spans) < min(end for _, end in spans)


def _spans(out: str, n: int) -> list:
    found = [line.split() for line in out.split("sleep ")[1:]]
    assert sorted(int(f[0]) for f in found) == list(range(n)), out
    assert {int(f[3]) for f in found} == {n * (n - 1) // 2}, out
    return [(float(f[1]), float(f[2])) for f in found]


def test_sleeping_ranks_sleep_side_by_side():
    # At most run_slots(8) ranks (2 on 2 cores) ran at once, each holding its slot while it slept: the sleeps
    # ran two by two (8 x 1 s took 4 s). Now each sleep began before any ended.
    assert run_slots(8) < 8 or pytest.skip("as many cores as ranks: every rank has a slot anyway")

    def rank():
        start = time.monotonic()
        time.sleep(1.0)
        end = time.monotonic()
        return start, end

    spans = simulate(8, rank)
    assert _overlap(spans), spans
    assert time.sleep.__module__ == "time"  # Python's own again once the simulation ended


def test_a_sleep_outside_a_rank_and_in_a_ranks_thread_is_pythons():
    # The caller's thread and a thread a rank starts hold no slot: their sleeps are plain, and the ranks go on.
    def rank():
        helper = threading.Thread(target=time.sleep, args=(0.05,))
        helper.start()
        helper.join()
        time.sleep(0)
        return "done"

    assert simulate(3, rank) == ["done"] * 3


def test_mpirun_ranks_sleep_side_by_side_as_under_mpich(tmp_path, capsys):
    script = tmp_path / "sleepers.py"
    script.write_text(textwrap.dedent(_PROGRAM))
    assert main(["mpirun", "-n", "8", str(script)]) == 0  # `spmdsim mpirun`, in this process
    spans = _spans(capsys.readouterr().out, 8)
    assert _overlap(spans), spans
    if MPICH:
        mpich = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", "8", sys.executable, str(script)],
                               capture_output=True, text=True)
        assert mpich.returncode == 0, mpich.stderr[-2000:]
        assert _overlap(_spans(mpich.stdout, 8))


def _rank_threads() -> list:
    return [t.name for t in threading.enumerate() if t.name.startswith("spmdsim rank")]


def test_a_failure_on_another_rank_ends_a_ranks_sleep():
    # Rank 1 raised while rank 0 slept 30 s: simulate() waited out the sleep, and rank 0 went on after it.
    woke = []

    def rank():
        if spmdsim_world().Get_rank() == 1:
            raise ValueError("rank 1 fails")
        time.sleep(30)
        woke.append("went on after its sleep")

    with pytest.raises(ValueError, match="rank 1 fails"):
        simulate(2, rank)
    assert woke == [] and _rank_threads() == []


def test_ctrl_c_in_the_caller_ends_the_ranks_sleeps():
    # A notebook's interrupted cell: the ranks slept on in threads of the kernel after KeyboardInterrupt.
    def rank():
        time.sleep(30)

    with interrupted_after(0.5), pytest.raises(KeyboardInterrupt):
        simulate(4, rank)
    assert _rank_threads() == []


@contextlib.contextmanager
def interrupted_after(seconds: float, deliver=_thread.interrupt_main):
    """Ctrl-C in the main thread after `seconds` (`deliver`: how it comes), with Python's own SIGINT handler
    meanwhile: a background job (`pytest ... &`) starts with SIGINT ignored, and `_thread.interrupt_main` does
    nothing then."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, deliver)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_the_caller_keeps_the_ranks_in_line_from_beginning():
    # More ranks than run slots, each computing 1 s in Python: those still in line for a slot when Ctrl-C came
    # began their program afterwards, one slot's worth at a time, computing on in the background for seconds.
    n = run_slots(64) + 2
    began = []

    def rank():
        began.append(spmdsim_world().Get_rank())
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        spmdsim_world().Barrier()

    with interrupted_after(0.3), pytest.raises(KeyboardInterrupt):
        simulate(n, rank)
    for thread in threading.enumerate():
        if thread.name.startswith("spmdsim rank"):
            thread.join(30)
    assert len(began) <= run_slots(n) < n, began  # those holding a slot at the Ctrl-C, at most


def test_the_modules_docstring_is_filled_to_its_width():
    """rank_sleep's docstring broke lines at 78, 114 and 47 columns mid-paragraph: each line now takes as many
    words as fit within the paragraph's longest line (the next line's first word would not fit)."""
    paragraphs = inspect.getdoc(rank_sleep).split("\n\n")
    for lines in (p.splitlines() for p in paragraphs):
        width = max(map(len, lines))
        roomy = [line for line, after in zip(lines, lines[1:]) if len(line) + 1 + len(after.split()[0]) <= width]
        assert not roomy and width <= 110, (width, roomy)
