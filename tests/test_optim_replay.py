"""Optimizers in a captured step (spmdsim.runtime.replay): replayed steps give the eager steps' parameters bit for bit.

Gradient clipping replays (ZeRO-1's `clip_grad` and `clip_grad_norm_` before AdamW): the squares, the norm and
the scaling are kernels, so each replayed step takes its own norm, as the eager step does. Hyperparameters
set between steps (a learning-rate schedule) are read by each replayed update; set inside a captured step
(a replay would keep the capture's value) they are refused in one line.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, OperatorError
from spmdsim.nn import ops
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.optim import AdamW, DistributedAdamW, clip_grad_norm_
from spmdsim.runtime.replay import ReplayError, Scalar, capture

SHAPES = [(10,), (6,), (3, 4)]
MAPS = [("tp",), (None,), (None, "tp")]  # the second replicated over tp: its squares counted on one tp rank
SCALES = [0.01, 1.0, 0.01, 1.0]  # the inputs' scale each step: the norm below the bound, then above it
BOUND = 0.5


def _dtype(name: str):
    if name == "bfloat16":
        pytest.importorskip("ml_dtypes")
        from spmdsim.base.precision import bfloat16

        return bfloat16()
    return np.dtype(name)


def _run(kind: str, dtype, replay: bool, settings=None, bound=BOUND, capture_clip=None) -> tuple:
    """Four steps on dp 2 x tp 2: ZeRO-1 ("zero", clip_grad) or clip_grad_norm_ then AdamW ("plain"); the
    first captured and the rest replayed when `replay`. `settings`: per step, attributes set on the optimizer
    before it (between the graph's calls). Returns (each step's norm before clipping, the parameters' bytes,
    the optimizer's step count)."""
    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
    first = bound[0] if isinstance(bound, list) else bound
    params = []
    for k, (shape, dims) in enumerate(zip(SHAPES, MAPS)):
        values = np.random.default_rng(k).standard_normal(shape).astype(dtype)
        params.append(DTensor.from_global(mesh, values, mesh.layout(*dims)).requires_grad_())
    if kind == "zero":
        opt = DistributedAdamW(params, mesh, lr=0.05, weight_decay=0.1, bucket=9 * np.dtype(dtype).itemsize,
                               clip_grad=first if capture_clip is None else capture_clip)
    else:
        opt = AdamW(params, lr=0.05, weight_decay=0.1)

    def step(limit, *xs):
        opt.zero_grad()
        loss = None
        for x, p in zip(xs, params):
            term = ops.sum(ops.mul(ops.mul(x, p), p))
            loss = term if loss is None else loss + term
        norm = None
        if kind == "zero":
            loss.backward(keep_pending=params)
        else:
            loss.backward()
            norm = clip_grad_norm_(params, limit)
        opt.step()
        return loss, norm

    norms, graph = [], None
    for s, scale in enumerate(SCALES):
        xs = tuple(DTensor.from_global(mesh, (np.random.default_rng(10 * s + k).standard_normal((4,) + shape)
                                              * scale).astype(dtype), mesh.layout("dp", *[None] * len(shape)))
                   for k, shape in enumerate(SHAPES))
        for name, value in (settings[s] if settings else {}).items():
            setattr(opt, name, value)
        limit = bound[s] if isinstance(bound, list) else bound
        if not replay:
            norm = step(limit, *xs)[1]
        elif graph is None:
            # A bound that changes between steps is a Scalar (read by the kernels), a constant one a number.
            graph = capture(step, Scalar(limit) if isinstance(bound, list) else limit, *xs, state=params)
            norm = graph.result[1]
        else:
            norm = graph(limit, *xs)[1]
        norms.append(opt.last_norm if kind == "zero" else float(norm))
    return norms, [p.local.tobytes() for p in params], opt.steps


def _both(*args, **kwargs) -> list:
    return spmdsim.simulate(4, lambda: (_run(*args, False, **kwargs), _run(*args, True, **kwargs)))


@pytest.mark.parametrize("kind", ["zero", "plain"])
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_clipped_steps_replay_bit_for_bit(kind, dtype):
    """Clipping active at steps 1 and 3 (the norm above the bound), not at 0 and 2: every replayed step takes
    its own norm and gives the eager step's parameters, bit for bit (was refused: the norm, read into Python
    at capture, was a guard each replay failed)."""
    for eager, replayed in _both(kind, _dtype(dtype)):
        assert replayed == eager
        norms = eager[0]
        assert [n > BOUND for n in norms] == [False, True, False, True], norms
        assert eager[2] == len(SCALES)


@pytest.mark.parametrize("kind", ["zero", "plain"])
def test_hyperparameters_set_between_steps_are_read_by_each_replay(kind):
    """A schedule of lr, weight decay and the clipping bound (ZeRO-1's clip_grad, clip_grad_norm_'s max_norm
    a Scalar), set before each step: the replayed steps equal the eager ones, and `steps` counts each replay
    (it stayed 1: a schedule reading it would have stayed at its first value)."""
    settings = [{"lr": 0.05 / (s + 1), "weight_decay": 0.1 * s} for s in range(len(SCALES))]
    bounds = [0.5, 40.0, 0.001, 0.5]
    if kind == "zero":
        for s, b in enumerate(bounds):
            settings[s]["clip_grad"] = b
    for eager, replayed in _both(kind, np.dtype(np.float64), settings=settings, bound=bounds):
        assert replayed == eager
        assert replayed[2] == len(SCALES)
        assert [n > b for n, b in zip(eager[0], bounds)] == [False, False, True, True], eager[0]


def test_a_hyperparameter_set_inside_a_captured_step_is_refused_in_one_line():
    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        p = DTensor.from_global(mesh, np.ones(4), mesh.layout(None)).requires_grad_()
        opt = AdamW([p], lr=0.1)

        def step(lr):
            opt.lr = lr
            ops.sum(ops.mul(p, p)).backward()
            opt.step()

        with pytest.raises(ReplayError, match=r"^replay: AdamW.lr set to 0.2 inside a captured step: a replay does "
                                              r"not run the step's Python"):
            capture(step, 0.2)
        with pytest.raises(OperatorError, match=r"^lr -1 must be a finite number >= 0$"):
            opt.lr = -1
        with pytest.raises(OperatorError, match=r"^weight_decay nan must be a finite number >= 0$"):
            opt.weight_decay = float("nan")
        return True

    assert spmdsim.simulate(2, body) == [True, True]


def test_one_learning_rate_rule_everywhere_zero_allowed_as_torch_optim():
    """`--lr -1` said "must be a finite number >= 0" and `--lr 0` "must be positive" (the examples' optimizers),
    while GPTConfig refused 0 as "a finite number > 0". One rule now, torch.optim's: lr a finite number >= 0
    (0 updates nothing: a warm-up's first step), said alike by SGD, Adam, AdamW, DistributedAdamW, a setting
    between steps, GPTConfig and the reference AdamW; eps stays > 0, also in one wording."""
    from spmdsim.models.gpt.reference import AdamW as ReferenceAdamW
    from spmdsim.nn.optim import SGD, Adam
    from spmdsim.errors import SpmdsimError

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        p = DTensor.from_global(mesh, np.ones(4), mesh.layout(None)).requires_grad_()
        made = [SGD([p], lr=0), Adam([p], lr=0), AdamW([p], lr=0)]
        assert DistributedAdamW([p], mesh, ("dp",), lr=0).lr == 0.0
        ops.sum(ops.mul(p, p)).backward()
        for opt in made:
            opt.step()
        assert np.array_equal(p.local, np.ones(4))  # lr 0 (no weight decay applies at 0): nothing moved
        for bad in (-1, float("nan"), float("inf")):
            for make in (lambda: SGD([p], lr=bad), lambda: AdamW([p], lr=bad),
                         lambda: DistributedAdamW([p], mesh, ("dp",), lr=bad), lambda: setattr(made[1], "lr", bad)):
                with pytest.raises(OperatorError, match=rf"^lr {bad!r} must be a finite number >= 0$"):
                    make()
        for bad in (0, -1):
            with pytest.raises(OperatorError, match=rf"^eps {bad!r} must be a finite number > 0$"):
                Adam([p], lr=0.1, eps=bad)
        return True

    assert spmdsim.simulate(2, body) == [True, True]
    assert GPTConfig(lr=0).lr == 0.0 and ReferenceAdamW(lr=0).lr == 0.0
    with pytest.raises(SpmdsimError, match=r"^GPTConfig lr -1 must be a finite number >= 0$"):
        GPTConfig(lr=-1)
    with pytest.raises(SpmdsimError, match=r"^AdamW lr -1 must be a finite number >= 0$"):
        ReferenceAdamW(lr=-1)


def test_zero1_clip_set_after_a_capture_without_it_and_last_norm_in_the_step_are_refused():
    """Captured with clip_grad 0, the step takes no norm: clip_grad set before a replay stops it in one line
    (a replay would not clip); last_norm read inside a captured step would be the capture's: refused."""
    def body():
        with pytest.raises(ReplayError, match=r"^replay: DistributedAdamW.clip_grad is 0.5 now but was 0 when "
                                              r"the step was captured"):
            _run("zero", np.dtype(np.float64), True, settings=[{}, {"clip_grad": 0.5}, {}, {}], capture_clip=0.0)
        mesh = Mesh(Layout((4,), ("dp",)), spmdsim.world())
        p = DTensor.from_global(mesh, np.ones(4), mesh.layout(None)).requires_grad_()
        opt = DistributedAdamW([p], mesh, clip_grad=1.0)
        with pytest.raises(ReplayError, match=r"^replay: DistributedAdamW.last_norm read inside a captured step"):
            capture(lambda: opt.last_norm)
        return True

    assert spmdsim.simulate(4, body) == [True] * 4


@pytest.mark.parametrize("zero, pp", [(0, 1), (1, 1), (1, 2)])
def test_the_gpt_trains_clipped_with_replay_as_it_does_eagerly(zero, pp):
    """`train(replay=True)` with `cfg.clip` (was refused in one line), and a pipeline's (pp 2 x tp 2, the norm
    summed over the stages): every step clipped (the norm above the bound), the replayed steps' losses and
    norms the eager steps', each checked against one numpy process."""
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.2, clip=0.5)
    text = encode(load_text(20_000))

    def run(replay):
        if pp == 1:
            return train(cfg, spmdsim.world(), 2, 2, 3, text, sp=True, zero=zero, check=replay, replay=replay)[1]
        pipeline, results = train_pipelined(cfg, spmdsim.world(), pp, 1, 2, 3, text, sp=True, microbatches=2,
                                            zero=zero, check=replay, replay=replay)
        pipeline.close()
        return results

    def both():
        return run(False), run(True)

    for eager, replayed in spmdsim.simulate(4, both):
        assert [(r.loss, r.norm) for r in replayed] == [(r.loss, r.norm) for r in eager]
        assert all(type(r.norm) is float and r.norm > cfg.clip for r in replayed)
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in replayed), replayed
