"""The MoE GPT under MPI (spmdsim.moe): two steps on ep x tp meshes, each equal to one numpy process's step."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.mpi(min_size=4)


@pytest.mark.parametrize("dropless", [False, True])
def test_moe_gpt_steps_match_one_numpy_process(dropless):
    from mpi4py import MPI

    from spmdsim.gpt import GPTConfig, encode, load_text
    from spmdsim.gpt.train import TOLERANCE, train
    from spmdsim.moe import MoEConfig

    comm = MPI.COMM_WORLD
    tp = 2 if comm.size % 2 == 0 else 1
    ep = 2 if comm.size % (2 * tp) == 0 else 1
    dp = comm.size // (ep * tp)
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless)
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=dp * ep * 2, dropout=0.1, moe=moe)
    model, results = train(cfg, comm, dp, tp, 2, encode(load_text(20_000)), ep=ep)
    assert [r.step for r in results] == [0, 1]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
    assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
    dropped = comm.allreduce(sum(s.dropped for s in results[0].dispatch))
    assert (dropped == 0) == dropless
    model.mesh.close()
