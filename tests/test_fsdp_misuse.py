"""fully_shard in a user's program, used as a PyTorch FSDP2 user would misuse it: each mistake one line."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, ops
from spmdsim.errors import SpmdsimError
from spmdsim.nn.autograd.engine import backward
from spmdsim.nn.fsdp import fully_shard
from spmdsim.nn.optim import SGD, AdamW


def _model():
    mesh = Mesh(Layout((2,), ("dp",)), roles={"data": "dp"})
    rng = np.random.default_rng(0)
    params = {name: DTensor.from_global(mesh, rng.standard_normal(shape) / 4, mesh.layout(None, None))
              .requires_grad_() for name, shape in (("w1", (4, 6)), ("w2", (6, 2)))}
    x = DTensor.from_global(mesh, rng.standard_normal((4, 4)), mesh.layout("dp", None))
    return mesh, params, x


def _said(fn) -> list:
    def body():
        with pytest.raises(SpmdsimError) as caught:
            fn()
        return str(caught.value)

    return spmdsim.simulate(2, body)


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_optimizer_of_the_parameters_fully_shard_replaced_is_refused(when):
    """Its parameters never get a gradient (the units read the shards): each step stepped nothing, silently."""
    def step():
        mesh, params, x = _model()
        optimizer = AdamW(list(params.values()), lr=0.01) if when == "before" else None
        fs = fully_shard(params, mesh)
        if optimizer is None:
            optimizer = SGD(list(params.values()), lr=0.01)
        y = fs.unit(["w2"], lambda h, used: h @ used["w2"], fs.unit(["w1"], lambda h, used: h @ used["w1"], x))
        backward(ops.sum(y * y))
        optimizer.step()

    said = _said(step)
    assert said == [said[0]] * 2
    assert said[0] == ("optimizer parameter 0 (a DTensor of global shape (4, 6), layout (None, None), a leaf) is "
                       "parameter 'w1' as it was before fully_shard: the units read its shards, so it never gets a "
                       "gradient; give the optimizer the shards, list(fs.params.values()), made by fully_shard first")


def test_the_shards_train_and_the_unsharded_optimizer_still_steps_its_own_parameters():
    """The check refuses only the replaced leaves: the shards step, and an optimizer of other leaves is untouched."""
    def body():
        mesh, params, x = _model()
        fs = fully_shard(params, mesh)
        shards = AdamW(list(fs.params.values()), lr=0.1)
        before = fs.params["w1"].local.copy()
        y = fs.unit(["w2"], lambda h, used: h @ used["w2"], fs.unit(["w1"], lambda h, used: h @ used["w1"], x))
        backward(ops.sum(y * y))
        shards.step()
        return not np.array_equal(before, fs.params["w1"].local)

    assert spmdsim.simulate(2, body) == [True, True]


@pytest.mark.parametrize("names, fn, message", [
    (["w3"], lambda h, used: h @ used["w1"],
     "fully_shard unit: 'w3' is not a parameter fully_shard sharded; its parameters are 'w1', 'w2'"),
    ("w1", lambda h, used: h @ used["w1"],
     "fully_shard unit: 'w1' is one name; expected a list of names, ['w1']; its parameters are 'w1', 'w2'"),
    (["w1"], lambda h, used: (h @ used["w1"]) @ used["w2"],
     "fully_shard unit: fn read parameter 'w2', which this unit did not gather (it gathered 'w1'); list every "
     "parameter the unit's fn reads in its names"),
    (["w1"], lambda h, used: (h @ used["w1"], h),
     "fully_shard unit ['w1']: fn returned a tuple; expected one DTensor (a unit's output is one tensor: run a "
     "second unit for a second output)"),
])
def test_a_unit_called_wrong_is_refused_in_one_line(names, fn, message):
    """Each was a KeyError or an AttributeError from inside spmdsim (a str's letters taken as names)."""
    def unit():
        mesh, params, x = _model()
        fully_shard(params, mesh).unit(names, fn, x)

    assert _said(unit) == [message] * 2


def test_fsdp2s_keywords_pass_at_their_defaults_and_another_value_is_one_line():
    """``fully_shard(params, mesh, mp_policy=None)`` was Python's bare TypeError: FSDP2's defaults ask for what
    fully_shard does; another value is refused saying what it does instead."""
    def body():
        mesh, params, x = _model()
        fs = fully_shard(params, mesh, mp_policy=None, offload_policy=None, shard_placement_fn=None,
                         ignored_params=None)
        plain = fully_shard(_model()[1], mesh)
        return [t.local.tobytes() for t in fs.params.values()] == [t.local.tobytes() for t in plain.params.values()]

    assert spmdsim.simulate(2, body) == [True, True]
    said = _said(lambda: fully_shard(_model()[1], _model()[0], mp_policy="bf16"))
    assert said == ["fully_shard(mp_policy='bf16'): spmdsim does not do this; the units gather each parameter in its "
                    "own dtype, which the model's precision policy chose (the GPT's train(precision='bf16-mixed'): "
                    "bf16 parameters); mp_policy may be None or left out"] * 2
