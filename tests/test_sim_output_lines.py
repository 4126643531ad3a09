"""Simulated ranks print whole lines (spmdsim.runtime.sim.simulating): a rank's partial line
(``print(..., end="")``) waits for the rest of its line, and one it leaves unended (it ends, or closes its
stdout) is a line of its own: another rank's output, and the caller's after the run, starts on a new line."""
from __future__ import annotations

import spmdsim


def test_partial_lines_of_ranks_come_out_each_on_its_own_line(capsys):
    # Each rank's unended line was written when the simulation ended, all run together on one line, the
    # caller's own print after it: "r2 more2r1 more1r0 more0the caller's".
    def body():
        rank = spmdsim.world().Get_rank()
        print(f"r{rank}", end="")
        spmdsim.world().barrier()
        print(f" more{rank}", end="", flush=True)

    spmdsim.simulate(3, body)
    print("the caller's")
    out = capsys.readouterr().out
    assert sorted(out.splitlines()[:3]) == ["r0 more0", "r1 more1", "r2 more2"], out
    assert out.endswith("\nthe caller's\n"), out


def test_partial_lines_of_ranks_that_end_one_after_another_are_lines_of_their_own(capsys):
    # More ranks than run slots, none waiting: a rank's thread id is often an ended rank's again (the lab's
    # printed output showed "r 0 of 2r 1 of 2").
    def body():
        print(f"r{spmdsim.world().Get_rank()}", end="")

    spmdsim.simulate(6, body)
    assert sorted(capsys.readouterr().out.split("\n")) == ["", "r0", "r1", "r2", "r3", "r4", "r5"]


def test_a_partial_line_waits_for_its_rank_to_end_it(capsys):
    # Rank 1's whole lines come out while rank 0's line is half written; rank 0's comes out whole.
    def body():
        comm = spmdsim.world()
        if comm.Get_rank() == 0:
            print("half", end="")
        comm.barrier()
        if comm.Get_rank() == 1:
            print("rank 1's line")
        comm.barrier()
        if comm.Get_rank() == 0:
            print(" and the rest")

    spmdsim.simulate(2, body)
    assert capsys.readouterr().out == "rank 1's line\nhalf and the rest\n"
