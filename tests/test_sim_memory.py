"""The memory guard of simulated ranks (spmdsim/runtime/sim/memory.py): one clear error, not the kernel's kill.

The machine's readings are replaced here (a real shortage would take the test machine down):
the guard reads them while the ranks run and stops every rank at its next wait.
"""
from __future__ import annotations

import pytest

import spmdsim
from spmdsim.runtime.engines import memory
from spmdsim.runtime.sim.launch import run_on_ranks
from testkit import unfold

GIB = 1 << 30


def _ranks_that_wait_a_while():
    """Barriers for up to 20 s: the guard's first look (0.2 s) must stop them; without it they return."""
    import time

    comm, end = spmdsim.world(), time.monotonic() + 20
    while comm.allreduce(time.monotonic() < end, op="min"):
        pass
    return "not stopped"


def test_ranks_are_stopped_when_the_machine_is_nearly_out_of_memory(monkeypatch):
    monkeypatch.setattr(memory, "readings", lambda: (22 * GIB, GIB, 24 * GIB))
    with pytest.raises(memory.MemoryLimitError) as caught:
        spmdsim.simulate(8, _ranks_that_wait_a_while)
    assert str(caught.value) == (
        "the 8 simulated ranks were stopped before this machine ran out of memory: they hold 22.0 GiB, "
        "and 1.0 GiB of its 24.0 GiB are left; run fewer ranks or smaller shapes, or a dry run "
        "(--dry-run: shapes only, each rank's bytes)")


def test_the_command_line_prints_one_line_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(memory, "readings", lambda: (22 * GIB, GIB, 24 * GIB))
    assert run_on_ranks(4, _ranks_that_wait_a_while) == 1
    err = unfold(capsys.readouterr().err).splitlines()
    assert len(err) == 1 and err[0].startswith(
        "spmdsim: error: the 4 simulated ranks were stopped before this machine ran out of memory")


@pytest.mark.parametrize("held, left", [(GIB // 2, GIB // 8), (22 * GIB, 3 * GIB)])
def test_a_small_run_or_a_machine_with_room_is_left_alone(monkeypatch, held, left):
    """Under 1 GiB held, another process is short of memory, not this one; 3 of 24 GiB left is room."""
    looks = []
    monkeypatch.setattr(memory, "readings", lambda: looks.append(1) or (held, left, 24 * GIB))
    monkeypatch.setattr(memory, "POLL_S", 0.01)

    def body():
        import time

        comm = spmdsim.world()
        time.sleep(0.2)  # long enough for the guard to look several times
        comm.Barrier()
        return comm.Get_rank()

    assert spmdsim.simulate(4, body) == [0, 1, 2, 3] and len(looks) >= 3


def test_readings_of_this_machine_are_sane():
    got = memory.readings()
    if got is None:
        pytest.skip("no /proc here: the guard reads nothing")
    held, left, total = got
    assert 0 < held < total and 0 <= left <= total
