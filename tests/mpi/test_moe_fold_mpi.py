"""Megatron-Core's parallel folding under MPI (spmdsim.models.moe.fold): experts of etp 1 spread over ep x tp
ranks, each step equal to one numpy process's, eager and replayed; etp 2 beside tp 4
(docs/howto/experts-folding.md)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.mpi(min_size=4)


@pytest.mark.parametrize("dropless, replay, sp", [(False, False, False), (True, False, False), (False, True, False),
                                                  (True, False, True)])
def test_folded_moe_gpt_steps_match_one_numpy_process(dropless, replay, sp):
    """tp 2 in attention, the experts whole (etp 1) over ep = comm.size / dp ranks: each tp rank routes its own
    share of the batch (dropless: of each sequence's tokens, with sp as sequence parallelism leaves them); a
    replayed run's steps equal the eager ones bit for bit."""
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import TOLERANCE, train
    from spmdsim.models.moe import MoEConfig

    comm = MPI.COMM_WORLD
    tp, dp = 2, 2 if comm.size % 8 == 0 else 1
    ep = comm.size // (dp * tp)  # the mesh's "ep" axis: the experts' ep is ep x tp
    moe = MoEConfig(experts=8, top_k=2, capacity_factor=1.0, dropless=dropless, etp=1)
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=comm.size, dropout=0.1, moe=moe)
    text = encode(load_text(20_000))
    runs = [train(cfg, comm, dp, tp, 2, text, ep=ep, replay=r, sp=sp) for r in ((False, True) if replay else (False,))]
    for model, results in runs:
        assert [r.step for r in results] == [0, 1]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
        assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
        assert len(results[0].dispatch[0].group) == ep * tp
    if replay:
        (_, eager), (_, replayed) = runs
        assert [(r.loss, r.calls, r.bytes_sent) for r in replayed] == [(r.loss, r.calls, r.bytes_sent) for r in eager]
    for model, _ in runs:
        model.mesh.close()


@pytest.mark.parametrize("dropless, sp", [(False, False), (True, True)])
def test_moe_gpt_steps_with_etp_2_beside_tp_4_match_one_numpy_process(dropless, sp):
    """tp 4 in attention over the mesh axes ("tp" 2, "etp" 2), the experts over ("ep", "tp") and each split over
    "etp": the experts' ep is the mesh's ep x 2 (docs/howto/experts-folding.md); every step as one numpy process's,
    the dispatch's group the ranks 2 apart (etp fastest)."""
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import TOLERANCE, train
    from spmdsim.models.moe import MoEConfig

    comm = MPI.COMM_WORLD
    ep = comm.size // 4  # the mesh's "ep" axis beside tp 4
    moe = MoEConfig(experts=8, top_k=2, capacity_factor=1.0, dropless=dropless, etp=2)
    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=comm.size, dropout=0.1, moe=moe)
    model, results = train(cfg, comm, 1, 4, 2, encode(load_text(20_000)), ep=ep, sp=sp, zero=1)
    assert [r.step for r in results] == [0, 1]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
    assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
    me = comm.rank
    assert results[0].dispatch[0].group == tuple(range(me % 2, comm.size, 2))
    assert model.mesh.layout.alias_name == ("dp", "ep", "tp", "etp")
    model.mesh.close()
