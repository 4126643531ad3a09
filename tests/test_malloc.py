"""Freed result buffers stay in the heap for ranks started by an MPI launcher (spmdsim/base/malloc.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spmdsim.base import malloc as _malloc, threads as _threads

# Touch a fresh 16 MiB array twice over (allocate, fill, free) and print the
# minor page faults of the second round: a reused heap block faults no pages.
# Transparent huge pages are off in that process (prctl PR_SET_THP_DISABLE): with them a
# fresh 16 MiB map faults ~8 huge pages, not 4096, when the kernel has them to give.
FAULTS = """
import ctypes, resource, numpy as np
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.empty(4 << 20, np.float32).fill(1)
before = faults()
np.empty(4 << 20, np.float32).fill(1)
print(faults() - before)
"""


def _plain_env() -> dict:
    """This process's environment without an MPI launcher's local-size variables or glibc's malloc ones."""
    return {k: v for k, v in os.environ.items() if k not in _threads.LOCAL_SIZE_VARS + _malloc.GLIBC_VARS}


@pytest.fixture
def calls(monkeypatch):
    for var in _threads.LOCAL_SIZE_VARS + _malloc.GLIBC_VARS:
        monkeypatch.delenv(var, raising=False)
    made: list = []
    monkeypatch.setattr(_malloc, "keep_freed_buffers", lambda: made.append(1) or True)
    return made


def test_only_under_a_launcher_and_not_against_the_users_choice(calls, monkeypatch):
    assert _malloc.keep_freed_buffers_under_launcher() is False and calls == []
    monkeypatch.setenv("PMI_LOCAL_SIZE", "8")
    assert _malloc.keep_freed_buffers_under_launcher() is True and calls == [1]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert _malloc.keep_freed_buffers_under_launcher() is False and calls == [1]


def test_launch_sets_glibcs_variables_unless_the_user_did():
    env = _malloc.glibc_env({"PATH": "/bin"})
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20) and env["MALLOC_TRIM_THRESHOLD_"] == str(64 << 20)
    assert env["MALLOC_TOP_PAD_"] == str(64 << 20)
    assert _malloc.glibc_env({"GLIBC_TUNABLES": "x"}) == {"GLIBC_TUNABLES": "x"}


def _second_round_faults(env_update: dict) -> tuple[bool, int]:
    """(whether the thresholds were set, page faults of the second round) in a fresh process."""
    env = {**_plain_env(), **env_update}
    code = ("import spmdsim\nfrom spmdsim.base import malloc as _malloc\n"
            "print(_malloc.keep_freed_buffers_under_launcher())\n" + FAULTS)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_a_rank_reuses_a_freed_16_mib_buffer_without_page_faults():
    applied, under_launcher = _second_round_faults({"PMI_LOCAL_SIZE": "8"})
    if not applied:
        pytest.skip("the C library has no mallopt")
    # Any glibc malloc variable opts out (here glibc's own default trim threshold).
    applied_anyway, opted_out = _second_round_faults({"PMI_LOCAL_SIZE": "8",
                                                      "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert applied_anyway is False
    # 16 MiB is 4096 pages; a reused block faults (almost) none of them.
    assert under_launcher < 200 < opted_out, (under_launcher, opted_out)


# A simulated rank is a thread: its blocks come from a glibc arena of its own, which grows in heaps of
# 64 MiB. A step holding 160 MiB (40 blocks of 4 MiB) spans several; `step()` returns the page faults of a
# round in the calling thread.
STEP = """
import ctypes, resource, numpy as np
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
def step():
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    blocks = [np.empty(1 << 19) for _ in range(40)]
    for block in blocks:
        block.fill(1)
    del blocks
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
"""

# The second round's faults in a thread of a plain process.
ARENA = STEP + """
import sys, threading
from spmdsim.base import malloc as _malloc
print(_malloc.keep_freed_buffers() if sys.argv[1] == "pad" else bool(
    _malloc._mallopt()(-3, _malloc.MMAP_THRESHOLD) and _malloc._mallopt()(-1, _malloc.TRIM_THRESHOLD)))
seen = []
def rank():
    step()
    seen.append(step())
thread = threading.Thread(target=rank)
thread.start()
thread.join()
print(seen[0])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(__import__("resource"), "RUSAGE_THREAD"),
                    reason="glibc mallopt, per-thread page faults")
def test_a_simulated_ranks_arena_keeps_its_freed_heaps():
    """With the thresholds alone glibc unmaps a thread arena's heap once its last block is freed, and the next
    step faults it in again (40 blocks of 4 MiB: ~10,000 faults of 40,960 pages); the top pad keeps it."""
    env = _plain_env()
    faults = {}
    for how in ("pad", "thresholds"):
        out = subprocess.run([sys.executable, "-c", ARENA, how], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        applied, faults[how] = out.stdout.split()
        if applied != "True":
            pytest.skip("the C library has no mallopt")
    assert int(faults["pad"]) < 200 < 4096 < int(faults["thresholds"]), faults


def test_a_ranks_run_keeps_freed_buffers_as_an_mpi_rank_does_unless_the_user_chose(calls, monkeypatch):
    """A --ranks N run of a program (the CLI, the examples: run_on_ranks) asks glibc to keep its freed buffers, as
    an MPI rank of the same program does (an eager step's freed heap top was faulted in again every step:
    docs/explanation/performance.md); a dry run allocates no blocks and does not; a glibc variable the user set wins."""
    from spmdsim.runtime.sim.launch import run_on_ranks

    assert run_on_ranks(2, lambda: None, dry_run=True) == 0 and calls == []
    assert run_on_ranks(2, lambda: None) == 0 and calls == [1]
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072")
    assert run_on_ranks(2, lambda: None) == 0 and calls == [1]


# A program under `spmdsim mpirun` (its ranks are threads of one process): the same step in its rank's thread.
MPIRUN_STEP = STEP + """
step()
print(step())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(__import__("resource"), "RUSAGE_THREAD"),
                    reason="glibc mallopt, per-thread page faults")
def test_spmdsim_mpirun_keeps_freed_heaps_unless_the_user_opted_out(tmp_path):
    """`spmdsim mpirun` sets the thresholds and the pad for the program's ranks, as a --ranks run does (each
    message's copies otherwise fault their pages in again); a glibc variable of the user's turns that off."""
    prog = tmp_path / "step.py"
    prog.write_text(MPIRUN_STEP)
    env = _plain_env()
    faults = {}
    for how, extra in (("kept", {}), ("opted out", {"MALLOC_TRIM_THRESHOLD_": "131072"})):
        out = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "1", str(prog)],
                             env={**env, **extra}, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        faults[how] = int(out.stdout.split()[-1])
    if _malloc._mallopt() is None:
        pytest.skip("the C library has no mallopt")
    assert faults["kept"] < 200 < 4096 < faults["opted out"], faults
