"""spmdsim.script typed at an interactive prompt (the plain REPL, ``python -i``'s) with ``--ranks N`` in sys.argv:
the ranks run and the session goes on at its prompt, as ``python -i script.py --ranks N`` opens it; a refused
--ranks says its one line, and the session goes on too."""
from __future__ import annotations

import os
import pathlib
import select
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TYPED = ("import sys, spmdsim\n"
         "sys.argv = ['', '--ranks', '2']\n"
         f"spmdsim.script({str(ROOT / 'examples' / 'mlp.py')!r})\n"
         "sys.argv = ['', '--ranks', 'x']\n"
         f"spmdsim.script({str(ROOT / 'examples' / 'mlp.py')!r})\n"
         "print('still', 'here')\n"
         "import os; sys.stdout.flush(); os._exit(7)\n")  # (3.13.0's new REPL exits 1 on a SystemExit(7))


def _environment() -> dict:
    """This process's environment without a launcher's rank (a test run under mpiexec) or a startup file."""
    drop = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _through_a_terminal(typed: str) -> tuple[int, str]:
    """(exit status, what it showed) of a plain ``python`` REPL (no -i) on a pseudo-terminal, `typed` typed."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-q"], stdin=slave, stdout=slave, stderr=slave, env=_environment(),
                            close_fds=True)
    os.close(slave)
    os.write(master, typed.encode())
    shown, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the REPL ended, the terminal closed
                break
            if not data:
                break
            shown += data
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=60), shown.decode(errors="replace").replace("\r", "")


@pytest.mark.parametrize("how", ["terminal", "python -i"])
def test_script_at_a_prompt_runs_the_ranks_and_the_session_goes_on(how: str) -> None:
    """`spmdsim.script(path)` at the plain REPL's prompt (or python -i's) ended the session with the ranks' exit
    status: a SystemExit there is the REPL's end (the typed lines after it never ran)."""
    if how == "terminal":
        pytest.importorskip("pty", reason="no pseudo-terminals here (POSIX only)")
        code, shown = _through_a_terminal(TYPED)
    else:
        done = subprocess.run([sys.executable, "-i", "-q"], input=TYPED, env=_environment(), capture_output=True,
                              text=True, timeout=120)
        code, shown = done.returncode, done.stdout + done.stderr
    assert code == 7 and "still here" in shown, shown
    assert "running on 2 simulated ranks" in shown and shown.count("PASS") == 1, shown
    assert "spmdsim: error: --ranks 'x' must be a number of ranks from 1 to 4096" in shown, shown
    assert "Traceback" not in shown and "SystemExit:" not in shown and "RanksEnded" not in shown, shown
