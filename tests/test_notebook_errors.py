"""In IPython (a notebook, the ipython shell) an spmdsim error shows the program's frames and its message:
IPython's `_render_traceback_` hook on SpmdsimError leaves spmdsim's own frames out."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import traceback

import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from test_sim_rank_sleep import interrupted_after

PACKAGE = os.path.dirname(os.path.abspath(spmdsim.__file__)) + os.sep
ROOT = pathlib.Path(__file__).resolve().parent.parent

_CELLS = [
    "import spmdsim",
    "def main():\n    comm = spmdsim.world()\n    if comm.Get_rank() != 3:\n        comm.allreduce(1)",
    "spmdsim.simulate(4, main)",
    # an interrupted cell (the kernel's interrupt is a SIGINT: KeyboardInterrupt in the main thread)
    "import _thread, signal, threading\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "threading.Timer(0.5, _thread.interrupt_main).start()\n"
    "spmdsim.simulate(2, lambda: [spmdsim.world().allreduce(1) for _ in iter(int, 1)])",
    # a program run from a cell: its output, and the cell goes on (IPython showed 'SystemExit: 0' and 'To exit:
    # use 'exit', 'quit', or Ctrl-D.'); a path that is no file is one line (a FileNotFoundError on every rank)
    f"spmdsim.script({str(ROOT / 'examples' / 'mlp.py')!r}, ['--ranks', '2'])\nprint('after the script')",
    "spmdsim.script('no_such_program.py', ['--ranks', '2'])",
    # no --ranks in a kernel's own arguments (-f kernel.json): it returned having run nothing, without a word
    "import sys\nsys.argv = ['ipykernel_launcher.py', '-f', 'kernel.json']\nspmdsim.script('prog.py')",
    "print('next', spmdsim.simulate(2, lambda: spmdsim.world().allreduce(1)))",
]

_RUN = """
import sys
import traceback
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="nocolor")
for cell in {cells!r}:
    shell.run_cell(cell)
"""


def _deadlock() -> SpmdsimError:
    def main():
        comm = spmdsim.world()
        if comm.Get_rank() != 1:
            comm.allreduce(1)

    with pytest.raises(SpmdsimError) as info:
        spmdsim.simulate(2, main)
    return info.value


def test_an_errors_display_in_ipython_leaves_spmdsims_frames_out():
    shown = _deadlock()._render_traceback_()
    assert shown[0] == "Traceback (most recent call last):"
    assert not [line for line in shown if PACKAGE in line or "threading.py" in line], shown
    assert "in main" in "\n".join(shown) and "comm.allreduce(1)" in "\n".join(shown)
    assert shown[-4:] == ["DeadlockError: simulated ranks deadlock (every live rank waits, none can go on):",
                          shown[-3], shown[-2], "raised on simulated rank 0 of 2"]


def test_a_notebook_cells_deadlock_shows_the_message_and_the_session_goes_on():
    # A deadlock in a cell showed some 20 frames of the simulator's waits (door, bodies, groups, engine).
    pytest.importorskip("IPython", reason="IPython is not installed")
    run = subprocess.run([sys.executable, "-c", _RUN.format(cells=_CELLS)], capture_output=True, text=True,
                         timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "next [2, 2]" in out, out
    assert "DeadlockError: simulated ranks deadlock" in out and "raised on simulated ranks 0-2 of 4" in out, out
    assert PACKAGE not in out and "interactiveshell.py" not in out and "threading.py" not in out, out
    assert "spmdsim.simulate(2, lambda: [spmdsim.world()" in out and "\nKeyboardInterrupt\n" in out, out
    assert "  PASS\nafter the script\n" in out and "SystemExit" not in out and "To exit" not in out, out
    assert "spmdsim: error: script: 'no_such_program.py' is no file: expected the path of the program" in out, out
    assert "FileNotFoundError" not in out, out
    assert ("spmdsim: script('prog.py') runs nothing: no --ranks N in this session's arguments; give them: "
            "spmdsim.script('prog.py', ['--ranks', '8'])") in " ".join(out.split()), out


def _raises_on(rank):
    if spmdsim.world().Get_rank() == rank:
        raise ValueError("the program's own")
    spmdsim.world().barrier()


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_programs_own_error_comes_with_one_frame_of_simulate(dry_run):
    # A rank's ValueError in a notebook cell showed four of spmdsim's frames with their code (simulate, _run,
    # _raise_failure, the rank's body) between the cell and the program's function.
    with pytest.raises(ValueError, match="the program's own") as info:
        spmdsim.simulate(2, _raises_on, 0 if dry_run else 1, dry_run=dry_run)  # (a dry run: rank 0 for all)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.name for f in frames if f.filename.startswith(PACKAGE)] == ["simulate"], frames
    assert frames[-1].name == "_raises_on" and frames[-1].line == "raise ValueError(\"the program's own\")"


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_programs_own_error_in_ipython_shows_the_cell_then_the_program(dry_run):
    # Between the cell's call and the rank's function IPython showed simulate's re-raise with its code
    # ("raise exc.with_traceback(_programs_frames(exc.__traceback__))"); simulate's frame is hidden as IPython
    # hides its own (__tracebackhide__), in its default modes.
    pytest.importorskip("IPython", reason="IPython is not installed")
    cells = ["import spmdsim", "def f():\n    if spmdsim.world().Get_rank() == 0:\n        raise ValueError('rank 0')"
             "\n    spmdsim.world().barrier()", f"spmdsim.simulate(4, f, dry_run={dry_run})", "print('next')"]
    run = subprocess.run([sys.executable, "-c", _RUN.format(cells=cells)], capture_output=True, text=True,
                         timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and out.rstrip().endswith("next"), out
    assert PACKAGE not in out and "_programs_frames" not in out, out
    call, raised = out.index(f"spmdsim.simulate(4, f, dry_run={dry_run})"), out.index("raise ValueError('rank 0')")
    assert call < raised < out.index("ValueError: rank 0"), out


def _loops():
    while True:
        spmdsim.world().allreduce(1)


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_interrupted_cell_shows_its_line_not_the_simulators_waits(dry_run):
    # An interrupted cell showed five frames of spmdsim's and threading's waits with their code (simulate, _run,
    # _run_threads, Event.wait, Condition.wait) under the cell's line, as if the error were spmdsim's.
    with interrupted_after(0.3), pytest.raises(KeyboardInterrupt) as info:
        spmdsim.simulate(2, _loops, dry_run=dry_run)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert {f.name for f in frames if f.filename.startswith(PACKAGE)} <= {"simulate"}, frames  # (3.11: none)
    assert [f.name for f in frames if not f.filename.startswith(PACKAGE)] == [
        "test_an_interrupted_cell_shows_its_line_not_the_simulators_waits"], frames


def test_a_collective_on_a_communicator_simulate_returned_names_the_mistake():
    # A cell used a DTensor (or communicator) a simulation returned: `y.gather()` said "simulated ranks deadlock
    # ...: rank 0 waits in it; rank 1 finished", and each later call repeated that first call's report.
    layout = spmdsim.Layout((2,), ("x",))

    def rank():
        seeded = spmdsim.SeededTensor((4, 4), seed=0)
        return spmdsim.DTensor.from_seeded(spmdsim.Mesh(layout), layout("x", None), seeded), spmdsim.world()

    y, comm = spmdsim.simulate(2, rank)[1]
    assert y.local.shape == (2, 4)  # its own block is still there to read
    for call, text in [(y.gather, "allgather on the world (call 2)"),
                       (comm.Barrier, "barrier on the world (call 3)")]:
        with pytest.raises(SpmdsimError) as info:
            call()
        assert str(info.value).startswith(f"{text}: a collective on simulated rank 1's communicator after its "
                                          "simulation ended (simulate returned it, in a DTensor"), info.value
