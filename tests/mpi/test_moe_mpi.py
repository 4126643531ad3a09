"""The MoE GPT under MPI (spmdsim.models.moe): steps on ep x tp meshes, each equal to one numpy process's step, and
replayed steps equal to the eager ones bit for bit."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.mpi(min_size=4)


@pytest.mark.parametrize("dropless", [False, True])
def test_moe_gpt_steps_match_one_numpy_process(dropless):
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import TOLERANCE, train
    from spmdsim.models.moe import MoEConfig

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


@pytest.mark.parametrize("etp, sp, dropless", [(0, False, True), (1, True, True), (0, False, False)])
def test_experts_over_context_ranks_match_one_numpy_process(etp, sp, dropless):
    """Each sequence split over cp 2 beside ep 2 and tp (the experts split over tp, or folded into their ep with
    sp): each rank routes its own chunk's tokens over the ep sub-communicator (with a capacity, each chunk its
    own); the counts and the experts' gradients summed over cp too."""
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.context import Context
    from spmdsim.models.gpt.train import TOLERANCE, train
    from spmdsim.models.moe import MoEConfig

    comm = MPI.COMM_WORLD
    tp = comm.size // 4 if comm.size % 4 == 0 else 1
    moe = MoEConfig(experts=4, top_k=2, dropless=dropless, capacity_factor=0.5, etp=etp)
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=16, batch=4, dropout=0.1, moe=moe)
    model, results = train(cfg, comm, 1, tp, 2, encode(load_text(20_000)), ep=2, cp=2, context=Context(), sp=sp)
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), results
    assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
    model.mesh.close()


@pytest.mark.parametrize("dropless", [False, True])
def test_a_replayed_moe_gpt_step_equals_the_eager_step_bit_for_bit(dropless):
    """Step 0 captured, steps 1-2 replayed over MPI (the Alltoalls of the capacity's slots, or the counts'
    Alltoall and the rows' Alltoallv): each checked against one numpy process, and equal to the eager steps
    bit for bit."""
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import TOLERANCE, train
    from spmdsim.models.moe import MoEConfig

    comm = MPI.COMM_WORLD
    tp = 2 if comm.size % 2 == 0 else 1
    ep = 2 if comm.size % (2 * tp) == 0 else 1
    dp = comm.size // (ep * tp)
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=dp * ep * 2, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless))
    runs = [train(cfg, comm, dp, tp, 3, encode(load_text(20_000)), ep=ep, replay=replay) for replay in (False, True)]
    (eager_model, eager), (model, replayed) = runs
    assert [(r.loss, r.calls, r.bytes_sent) for r in replayed] == [(r.loss, r.calls, r.bytes_sent) for r in eager]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in replayed), replayed
    assert [r.dispatch for r in replayed] == [r.dispatch for r in eager]
    eager_blocks = {n: (t.local.tobytes(), t.grad.local.tobytes()) for n, t in eager_model.params.items()}
    assert {n: (t.local.tobytes(), t.grad.local.tobytes()) for n, t in model.params.items()} == eager_blocks
    for m in (eager_model, model):
        m.mesh.close()


@pytest.mark.parametrize("dropless", [False, True])
def test_pipelined_moe_gpt_steps_match_one_numpy_process(dropless):
    """pp 2, each stage a (dp, ep, tp) mesh of the rest; 1F1B over 4 microbatches, router losses on their
    stages."""
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.models.gpt.train import TOLERANCE
    from spmdsim.models.moe import MoEConfig

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


def test_moe_gpt_under_bf16_with_zero1_passes_over_mpi():
    """bf16-mixed MoE steps with ZeRO-1 under MPI: bfloat16 token rows through MPI's Alltoall(v) (moved as
    16-bit words), the router in float32, the dense layers' states sharded over dp x ep and the experts' over
    dp; dropless, 2 steps, each passing its check with an exact update."""
    pytest.importorskip("ml_dtypes")
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import train
    from spmdsim.models.moe import MoEConfig

    comm = MPI.COMM_WORLD
    tp = 2 if comm.size % 2 == 0 else 1
    ep = 2 if comm.size % (2 * tp) == 0 else 1
    dp = comm.size // (ep * tp)
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=dp * ep * 2, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, dropless=True, aux_loss_coeff=0.5, z_loss_coeff=0.1))
    model, results = train(cfg, comm, dp, tp, 2, encode(load_text(20_000)), ep=ep, precision="bf16-mixed", zero=1,
                           sp=tp > 1)
    assert all(r.passed and r.errors[2] == 0.0 for r in results), [r.errors for r in results]
    assert comm.allgather(results[-1].loss) == [results[-1].loss] * comm.size
    model.mesh.close()
