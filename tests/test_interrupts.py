"""A Ctrl-C that lands in a weak reference's callback still interrupts the program (spmdsim.base.interrupts).

Python raises the KeyboardInterrupt of a SIGINT at the main thread's next bytecode boundary; inside a weakref
callback it cannot propagate and was printed as "Exception ignored" and dropped (which fits test_sim_cli's Ctrl-C
test failing twice in full suite runs, its simulated ranks training on). Each case runs in a Python of its own
(the hook is the process's)."""
from __future__ import annotations

import subprocess
import sys

# The callback raises what a SIGINT landing in it raises; then the main thread sleeps in small steps, as a
# waiting program does. `install` puts the hook in place (or not). SIGINT gets Python's own handler first, as in
# a program started from a terminal: a child of a shell's background job (`pytest ... &`) starts with SIGINT
# ignored, and `_thread.interrupt_main` does nothing for an ignored signal (the suite failed so, in the background).
_PROGRAM = """
import signal, sys, time, weakref
signal.signal(signal.SIGINT, signal.default_int_handler)
{install}
class Held:
    pass
def dropped(ref):
    raise {error}
held = Held()
ref = weakref.ref(held, dropped)
try:
    del held  # the callback runs here, in the main thread
    for _ in range(200):
        time.sleep(0.01)
    print("went on")
except KeyboardInterrupt:
    print("interrupted")
"""


def _run(install: str, error: str = "KeyboardInterrupt") -> subprocess.CompletedProcess:
    code = _PROGRAM.format(install=install, error=error)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_without_the_hook_python_drops_the_interrupt():
    """What the hook mends: Python's own behaviour (so the cases below can fail)."""
    out = _run("")
    assert out.stdout == "went on\n"
    assert "Exception ignored" in out.stderr and "KeyboardInterrupt" in out.stderr


def test_the_hook_gives_the_interrupt_back_to_the_main_thread_and_prints_nothing():
    out = _run("from spmdsim.base.interrupts import keep_ctrl_c; assert keep_ctrl_c() and keep_ctrl_c()")
    assert (out.stdout, out.stderr) == ("interrupted\n", "")


def test_another_error_in_a_callback_is_still_reported_as_python_reports_it():
    out = _run("from spmdsim.base.interrupts import keep_ctrl_c; keep_ctrl_c()", "ValueError('lost')")
    assert out.stdout == "went on\n"
    assert "Exception ignored" in out.stderr and "ValueError: lost" in out.stderr


def test_a_run_on_simulated_ranks_keeps_the_interrupt():
    """The CLI's and the examples' --ranks runs (spmdsim.runtime.sim.launch.run_on_ranks) install the hook."""
    install = ("import spmdsim; from spmdsim.runtime.sim.launch import run_on_ranks\n"
               "assert run_on_ranks(2, lambda: spmdsim.world().barrier()) == 0")
    out = _run(install)
    assert out.stdout.splitlines()[-1] == "interrupted" and out.stderr == "", out.stdout + out.stderr


def test_a_termination_raises_once_inside_and_the_default_is_back_after():
    """spmdsim.base.interrupts.terminations_raise: SIGTERM raises Terminated once (a second one while the first is
    handled, as coreutils `timeout` sends one to the process and one to its group, is ignored), and the default
    action is back once it is left."""
    code = """
import os, signal
from spmdsim.base.interrupts import Terminated, terminations_raise
with terminations_raise():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        print("not raised")
    except Terminated as exc:
        os.kill(os.getpid(), signal.SIGTERM)  # while the first is handled
        os.kill(os.getpid(), signal.SIGHUP)
        print("raised", exc.signum == signal.SIGTERM)
print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGHUP) is signal.SIG_DFL)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["raised", "True", "True", "True"], done.stderr
