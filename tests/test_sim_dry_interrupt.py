"""Ctrl-C in the caller of a dry run (``spmdsim.simulate(n, fn, dry_run=True)``) stops the dry run's thread at
its next step, as it stops the simulated ranks of a real run (spmdsim.runtime.sim.rank_sleep, engine.World)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import spmdsim
from spmdsim.runtime import Mesh, allreduce
from test_sim_rank_sleep import interrupted_after


@pytest.mark.parametrize("step", ["allreduce", "matmul", "object", "sleep"])
def test_ctrl_c_in_the_caller_ends_the_dry_run(step):
    # A notebook's interrupted cell: the dry run's thread ran the whole program on after KeyboardInterrupt.
    ended, left = [], []

    def body():
        mesh = Mesh(spmdsim.Layout((4,), ("mp",)))
        block = np.ones((8, 8), np.float32)
        end = time.monotonic() + 10
        try:
            while time.monotonic() < end:
                if step == "allreduce":
                    allreduce(mesh, block, "mp")
                elif step == "matmul":
                    spmdsim.runtime.engines.matmul(block, block)
                elif step == "sleep":  # (a dry run's sleep was Python's own: it slept on, then ran on)
                    time.sleep(3)
                else:
                    spmdsim.world().allreduce(1)
            ended.append("ran to its end")
        finally:
            left.append("left")

    with interrupted_after(0.3), pytest.raises(KeyboardInterrupt):
        spmdsim.simulate(4, body, dry_run=True)
    assert (left, ended) == (["left"], [])  # stopped before simulate raised, not after its whole program
