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


@pytest.mark.parametrize("dropless", [False, True])
def test_pipelined_moe_gpt_steps_match_one_numpy_process(dropless):
    """pp 2, each stage a (dp, ep, tp) mesh of the rest; 1F1B over 4 microbatches, router losses on their
    stages."""
    from mpi4py import MPI

    from spmdsim.gpt import GPTConfig, encode, load_text
    from spmdsim.gpt.pipeline import train_pipelined
    from spmdsim.gpt.train import TOLERANCE
    from spmdsim.moe import MoEConfig

    comm = MPI.COMM_WORLD
    pp = 2
    rest = comm.size // pp
    tp = 2 if rest % 2 == 0 else 1
    ep = 2 if rest % (2 * tp) == 0 else 1
    dp = rest // (ep * tp)
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.1)
    cfg = GPTConfig(layers=4, d_model=16, heads=4, seq=8, batch=dp * ep * 4, dropout=0.1, moe=moe)
    run, results = train_pipelined(cfg, comm, pp, dp, tp, 2, encode(load_text(20_000)), microbatches=4, ep=ep)
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
    assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
    assert {s.layer for s in results[0].dispatch} == ({"h1"} if comm.rank < rest else {"h3"})
    run.close()
