"""Optimizers' state_dict / load_state_dict (torch.optim's checkpoint API), each rank its own shards: a run resumed
from a checkpoint steps as the uninterrupted run, bit for bit; a replayed step reads a state loaded after its
capture; anything else is refused in one line before anything changes.

Four simulated ranks, dp 2 x tp 2, four small parameters (one replicated over tp, two decaying): each case a few
hundredths of a second.
"""
from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, OperatorError
from spmdsim.models.gpt import step_check
from spmdsim.nn import ops
from spmdsim.nn.optim import SGD, Adam, AdamW, DistributedAdamW
from spmdsim.nn.optim_state import STATE_WORDS, _Checkpoints
from spmdsim.runtime.replay import ReplayError, capture

SHAPES = [(10,), (6,), (3, 4), (4, 6)]
MAPS = [("tp",), (None,), (None, "tp"), ("tp", None)]
KINDS = ["sgd", "adam", "adamw", "adamw-bf16", "zero", "zero-bf16"]


def _dtype(kind: str):
    if kind.endswith("bf16"):
        pytest.importorskip("ml_dtypes")
        from spmdsim.base.precision import bfloat16

        return bfloat16()
    return np.dtype(np.float64)


def _mesh() -> Mesh:
    return Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())


def _make(kind: str, mesh: Mesh, seed: int, lr: float = 0.05) -> tuple:
    """The parameters (drawn from `seed`) and the optimizer `kind` over them."""
    dtype = _dtype(kind)
    params = [DTensor.from_global(mesh, np.random.default_rng(seed + k).standard_normal(shape).astype(dtype),
                                  mesh.layout(*dims)).requires_grad_()
              for k, (shape, dims) in enumerate(zip(SHAPES, MAPS))]
    if kind == "sgd":
        opt = SGD(params, lr=lr, momentum=0.9)
    elif kind == "adam":
        opt = Adam(params, lr=lr)
    elif kind.startswith("adamw"):
        opt = AdamW(params, lr=lr, weight_decay=0.1)
    else:  # two buckets: the third parameter straddles the dp ranks' slices of the first
        opt = DistributedAdamW(params, mesh, lr=lr, weight_decay=0.1, bucket=20 * np.dtype(dtype).itemsize)
    return params, opt


def _inputs(mesh: Mesh, kind: str, s: int) -> tuple:
    """Step `s`'s inputs: a batch of 2 per dp rank for each parameter."""
    return tuple(DTensor.from_global(mesh, np.random.default_rng(100 * s + k).standard_normal((4,) + shape)
                                     .astype(_dtype(kind)), mesh.layout("dp", *[None] * len(shape)))
                 for k, shape in enumerate(SHAPES))


def _step(kind: str, params: list, opt, *xs) -> None:
    opt.zero_grad()
    loss = None
    for x, p in zip(xs, params):
        term = ops.sum(ops.mul(ops.mul(x, p), p))
        loss = term if loss is None else loss + term
    if kind.startswith("zero"):
        loss.backward(keep_pending=params)
    else:
        loss.backward()
    opt.step()


def _train(kind: str, mesh: Mesh, params: list, opt, steps) -> None:
    for s in steps:
        _step(kind, params, opt, *_inputs(mesh, kind, s))


def _values(params: list) -> list:
    return [p.local.tobytes() for p in params]


def _same(a, b) -> bool:
    """Two state_dicts equal, arrays by their bytes and dtype."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_steps_as_the_uninterrupted_one_bit_for_bit(kind):
    """Four steps uninterrupted; against: two steps, the state saved (parameters' blocks and state_dict), then
    (a) the same optimizer goes one step astray and loads the state back (into its live state: AdamW's flat
    buffers, ZeRO-1's slices), (b) a new optimizer (other values, another lr) loads it: both then take steps 2
    and 3 and end on the uninterrupted run's parameters and state, bit for bit. The saved dict is never
    written by the steps after it, and state_dict() returns copies."""
    def body():
        mesh = _mesh()
        params, opt = _make(kind, mesh, 0)
        _train(kind, mesh, params, opt, range(4))
        want, want_state = _values(params), opt.state_dict()

        params, opt = _make(kind, mesh, 0)
        _train(kind, mesh, params, opt, range(2))
        saved, sd = [p.local.copy() for p in params], opt.state_dict()
        kept = copy.deepcopy(sd)
        _train(kind, mesh, params, opt, [7])  # astray
        for p, block in zip(params, saved):
            p.local[...] = block
        opt.load_state_dict(sd)
        _train(kind, mesh, params, opt, [2, 3])
        live, live_state = _values(params), opt.state_dict()
        flat = getattr(opt, "_flat", ((), None))[1] is not None

        fresh_params, fresh = _make(kind, mesh, 50, lr=0.5)
        for p, block in zip(fresh_params, saved):
            p.local[...] = block
        fresh.load_state_dict(sd)
        assert fresh.lr == 0.05 and fresh.steps == 2
        _train(kind, mesh, fresh_params, fresh, [2, 3])
        return (live == want, _values(fresh_params) == want, _same(live_state, want_state),
                _same(fresh.state_dict(), want_state), _same(sd, kept), flat)

    for live, fresh, live_state, fresh_state, untouched, flat in spmdsim.simulate(4, body):
        assert live and fresh and live_state and fresh_state
        assert untouched
        if kind == "adamw":  # the flat path was taken (every parameter at one step, one dtype)
            assert flat


def test_the_returned_dict_does_not_alias_the_live_state_and_a_load_copies():
    """A step after state_dict() writes nothing into the dict; a step after load_state_dict(sd) writes nothing
    into sd (AdamW's moments are views of its flat buffers; ZeRO-1's slices are written in place)."""
    def body():
        mesh = _mesh()
        out = []
        for kind in ("adamw", "zero"):
            params, opt = _make(kind, mesh, 0)
            _train(kind, mesh, params, opt, range(2))
            sd = opt.state_dict()
            kept = copy.deepcopy(sd)
            _train(kind, mesh, params, opt, [2])
            out.append(_same(sd, kept))
            opt.load_state_dict(sd)
            _train(kind, mesh, params, opt, [3])
            out.append(_same(sd, kept) and not _same(opt.state_dict()["state"], sd["state"]))
        return out

    assert spmdsim.simulate(4, body) == [[True] * 4] * 4


@pytest.mark.parametrize("kind", ["sgd", "adamw", "zero"])
def test_a_state_saved_before_the_first_step_starts_over(kind):
    """The state of a new optimizer (no parameter has stepped) loaded into one that has taken two steps (AdamW's
    moments in its flat buffers): the next two steps are the first two again, bit for bit."""
    def body():
        mesh = _mesh()
        params, opt = _make(kind, mesh, 0)
        start, sd = [p.local.copy() for p in params], opt.state_dict()
        _train(kind, mesh, params, opt, range(2))
        want = _values(params)
        for p, block in zip(params, start):
            p.local[...] = block
        opt.load_state_dict(sd)
        assert opt.steps == 0
        _train(kind, mesh, params, opt, range(2))
        return _values(params) == want

    assert spmdsim.simulate(4, body) == [True] * 4


@pytest.mark.parametrize("kind", ["sgd", "adamw", "zero"])
def test_a_state_loaded_after_a_capture_is_what_the_replay_steps(kind):
    """A step captured (spmdsim.runtime.replay, state=params), then the parameters and a state_dict loaded: the
    replayed steps equal the eager steps from that state, bit for bit (the updates read the optimizer's state
    when they run, ZeRO-1's slices are loaded in place). AdamW's case has the loaded parameters at different
    steps (a checkpoint where one had no gradient once): the captured flat update takes them one by one, as
    the eager step then does."""
    def body():
        mesh = _mesh()
        params, opt = _make(kind, mesh, 0)
        _train(kind, mesh, params, opt, range(2))
        saved, sd = [p.local.copy() for p in params], opt.state_dict()
        if kind == "adamw":
            sd["state"][1]["step"] = 1
        params, opt = _make(kind, mesh, 0)
        for p, block in zip(params, saved):
            p.local[...] = block
        opt.load_state_dict(sd)
        _train(kind, mesh, params, opt, [2, 3])
        want = _values(params)

        params, opt = _make(kind, mesh, 9)
        graph = capture(lambda *xs: _step(kind, params, opt, *xs), *_inputs(mesh, kind, 5), state=params)
        graph(*_inputs(mesh, kind, 6))
        for p, block in zip(params, saved):
            p.local[...] = block
        opt.load_state_dict(sd)
        for s in (2, 3):
            graph(*_inputs(mesh, kind, s))
        return _values(params) == want, opt.steps

    assert spmdsim.simulate(4, body) == [(True, 4)] * 4


def test_load_state_dict_refuses_in_one_line_before_anything_changes():
    """Another type, another number of parameters, another rank's blocks (ZeRO-1: another dp rank's slice),
    moments of another shape or dtype, unknown or missing keys, a bad hyperparameter or step: one line each,
    and the optimizer is as it was. Inside a captured step and in a dry run: refused."""
    def body():
        mesh = _mesh()
        rank = mesh.rank
        params, opt = _make("adamw", mesh, 0)
        _train("adamw", mesh, params, opt, range(1))
        sd = opt.state_dict()
        before = copy.deepcopy(sd)
        name = "AdamW.load_state_dict: "

        def refused(message, change):
            bad = copy.deepcopy(sd)
            change(bad)
            with pytest.raises(OperatorError, match="^" + name + message):
                opt.load_state_dict(bad)
            assert _same(opt.state_dict(), before)

        refused(r"the state_dict is of optimizer 'SGD', this optimizer is AdamW; load a state an optimizer of this "
                r"type saved$", lambda d: d.update(optimizer="SGD"))
        refused(r"the state_dict has 3 parameter\(s\), this optimizer 4$",
                lambda d: d["param_groups"][0].update(params=[0, 1, 2]))
        refused(r"state\[2\]\['exp_avg'\] is float64 of shape \(3, 4\), expected float64 of shape \(3, 2\) \(this "
                r"rank's block of parameter 2\)$", lambda d: d["state"][2].update(exp_avg=np.zeros((3, 4))))
        refused(r"state\[0\]\['exp_avg_sq'\] is float32 of shape \(5,\), expected float64",
                lambda d: d["state"][0].update(exp_avg_sq=np.zeros(5, np.float32)))
        refused(r"state\[0\] has an unknown key 'momentum_buffer'; expected the keys 'step', 'exp_avg', "
                r"'exp_avg_sq'$", lambda d: d["state"][0].update(momentum_buffer=np.zeros(5)))
        refused(r"the state_dict has an unknown key 'extra'", lambda d: d.update(extra=1))
        refused(r"param_groups\[0\] lacks the key 'eps'$", lambda d: d["param_groups"][0].pop("eps"))
        refused(r"param_groups\[0\]: lr -1 must be a finite number >= 0$",
                lambda d: d["param_groups"][0].update(lr=-1))
        refused(r"state\[1\]\['step'\] 1.5 must be an integer >= 0", lambda d: d["state"][1].update(step=1.5))
        refused(r"state key 4 is not a parameter index \(0 to 3\)$", lambda d: d["state"].update({4: {}}))
        refused(r"parameter 3 \(global shape and block\) is \(\(4, 6\), .* on this rank, \(\(6, 4\), .* in the "
                r"state_dict: a state of other parameters$",
                lambda d: d.update(blocks=d["blocks"][:3] + (((6, 4), d["blocks"][3][1]),)))
        with pytest.raises(OperatorError, match=r"^AdamW.load_state_dict: expected the dict an optimizer's "
                                                r"state_dict\(\) returns, got list"):
            opt.load_state_dict([])
        # Another tp rank's state (blocks of the same shapes elsewhere in the tensors): refused.
        other = spmdsim.world().allgather(sd)[rank ^ 1]
        with pytest.raises(OperatorError, match=r"^AdamW.load_state_dict: parameter 0's block on this rank is "
                                                r"\[(0:5|5:10)\] of \(10,\), the state_dict's \[(5:10|0:5)\]: a "
                                                r"state_dict holds one rank's shards; load into each rank the state "
                                                r"it saved"):
            opt.load_state_dict(other)
        opt.load_state_dict(spmdsim.world().allgather(sd)[rank ^ 2])  # the other dp rank's: the same blocks
        # ZeRO-1: another dp rank's slices refused; a state of AdamW's refused by type.
        zparams, zero = _make("zero", mesh, 0)
        _train("zero", mesh, zparams, zero, range(1))
        zsd = spmdsim.world().allgather(zero.state_dict())[rank ^ 2]
        with pytest.raises(OperatorError, match=r"^DistributedAdamW.load_state_dict: bucket 0's slice on this rank "
                                                r"is \[(0:9|9:18)\], the state_dict's \[(9:18|0:9)\] \(another dp "
                                                r"rank's\): a state_dict holds one rank's shards"):
            zero.load_state_dict(zsd)
        with pytest.raises(OperatorError, match=r"^DistributedAdamW.load_state_dict: the state_dict is of optimizer "
                                                r"'AdamW', this optimizer is DistributedAdamW"):
            zero.load_state_dict(sd)
        with pytest.raises(ReplayError, match=r"^replay: AdamW.load_state_dict\(\) called inside a captured step"):
            capture(lambda: opt.load_state_dict(sd))
        return True

    assert spmdsim.simulate(4, body) == [True] * 4


def test_state_dict_in_a_dry_run_is_refused_in_one_line():
    def body():
        mesh = _mesh()
        params, opt = _make("sgd", mesh, 0)
        with pytest.raises(OperatorError, match=r"^SGD.state_dict\(\) in a dry run: a dry run holds shapes, no "
                                                r"values"):
            opt.state_dict()
        return True

    assert spmdsim.simulate(4, body, dry_run=True) == [True] * 4


def test_the_docs_checkpoint_example_runs():
    """docs/howto/checkpoints.md, "In a program": its example (a run resumed at step 2 against the whole run, on 4
    simulated ranks) runs and its assert holds; its quoted refusals are the ones the code says."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs/howto/checkpoints.md").read_text()
    section = doc.split("## In a program: state_dict and load_state_dict\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    exec(compile(code, "docs/howto/checkpoints.md", "exec"), {})
    quoted = re.search(r"^```text\n(.*?)^```", section, re.S | re.M).group(1).splitlines()
    assert quoted[0] == ("AdamW.load_state_dict: state[2]['exp_avg'] is float64 of shape (3, 4), expected float64 of "
                         "shape (3, 2) (this rank's block of parameter 2)")
    assert quoted[1].startswith("AdamW.load_state_dict: the state_dict is of optimizer 'SGD', this optimizer is AdamW")
    assert re.fullmatch(r"AdamW.load_state_dict: parameter 0's block on this rank is \[0:5\] of \(10,\), the "
                        r"state_dict's \[5:10\]: a state_dict holds one rank's shards; load into each rank the state "
                        r"it saved, on ranks laid out alike", quoted[2])


@pytest.mark.parametrize("kind", ["sgd", "adamw", "zero"])
def test_nonfinite_state_names_a_second_moment_past_float_range(kind):
    """A gradient whose square overflows made AdamW's second moment inf with every parameter finite (the
    parameters then stopped moving: `train_moe_gpt.py --z-loss-coeff 1e300` said its loss was falling);
    nonfinite_state finds it, naming the parameter where the state is per parameter (a bucket's: None)."""

    def body():
        mesh = _mesh()
        params, opt = _make(kind, mesh, 0)
        _train(kind, mesh, params, opt, range(2))
        before = opt.nonfinite_state()
        for p in params:  # the next gradients' squares past float64's range (SGD's momentum stays finite)
            p.local[...] *= 1e160
        with np.errstate(over="ignore", invalid="ignore"):  # (the loss's sum of squares: inf - inf)
            _train(kind, mesh, params, opt, [2])
        after = opt.nonfinite_state()
        if after is not None and after[1] is not None:
            after = (after[0], [i for i, p in enumerate(params) if p is after[1]])
        return before, after, all(np.isfinite(p.local).all() for p in params)

    for before, after, finite in spmdsim.simulate(4, body):
        assert before is None and finite
        assert after == {"sgd": None, "adamw": ("exp_avg_sq", [0]), "zero": ("exp_avg_sq", None)}[kind], after


def test_the_state_nonfinite_state_looks_at_and_its_words_have_one_owner():
    """The fields nonfinite_state looks at and the words stop_if_diverged names them by were two lists, one in
    spmdsim.nn.optim_state and one in spmdsim.models.gpt.step_check: one owner now, the optimizer state's module."""
    fields = inspect.signature(_Checkpoints.nonfinite_state).parameters["fields"].default
    assert fields == tuple(STATE_WORDS) == ("exp_avg_sq", "momentum_buffer")
    assert STATE_WORDS == {"exp_avg_sq": "second moment", "momentum_buffer": "momentum"}
    assert not hasattr(step_check, "_FIELDS") and step_check.STATE_WORDS is STATE_WORDS
