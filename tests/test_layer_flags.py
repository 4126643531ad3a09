"""The layer classes' switches take True or False (numpy's bools too) and refuse anything else in one line.

`bool()` of a switch made ``gather_output="false"`` and ``sequence_parallel="no"`` true, and the layer ran
another program than the one asked for, without a word.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.errors import OperatorError
from spmdsim.nn.ops import ColumnParallelLinear, ParallelEmbedding, ParallelMLP, RowParallelLinear

CASES = [
    (ColumnParallelLinear, {"gather_output": "false"},
     "ColumnParallelLinear: gather_output 'false' must be True or False"),
    (ColumnParallelLinear, {"sequence_parallel": 1}, "ColumnParallelLinear: sequence_parallel 1 must be True or False"),
    (ColumnParallelLinear, {"bias": "no"}, "ColumnParallelLinear: bias 'no' must be True or False"),
    (RowParallelLinear, {"input_is_parallel": "no"}, "RowParallelLinear: input_is_parallel 'no' must be True or False"),
    (RowParallelLinear, {"input_is_parallel": True, "sequence_parallel": None},
     "RowParallelLinear: sequence_parallel None must be True or False"),
    (ParallelMLP, {"sequence_parallel": "yes"}, "ParallelMLP: sequence_parallel 'yes' must be True or False"),
    (ParallelMLP, {"bias": 0}, "ParallelMLP: bias 0 must be True or False"),
    (ParallelEmbedding, {"gather_output": "false"}, "ParallelEmbedding: gather_output 'false' must be True or False"),
]


def _made(layer, kwargs):
    """On 2 simulated ranks: the layer of 8 x 8 (an embedding of 8 ids by 8) with `kwargs`, or its error."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)), spmdsim.world())
        try:
            return layer(mesh, 8, 8, **kwargs)
        except OperatorError as exc:
            return exc
    return spmdsim.simulate(2, body)


@pytest.mark.parametrize("layer, kwargs, message", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_a_switch_that_is_no_bool_is_refused_naming_it(layer, kwargs, message):
    made = _made(layer, kwargs)
    assert [type(m) for m in made] == [OperatorError, OperatorError]
    assert [str(m) for m in made] == [message, message]


def test_numpys_bools_are_switches_and_kept_as_pythons():
    column = _made(ColumnParallelLinear, {"gather_output": np.bool_(True), "bias": np.bool_(False)})[0]
    assert column.gather_output is True and column.bias is None
    row = _made(RowParallelLinear, {"input_is_parallel": np.True_, "sequence_parallel": np.True_})[0]
    assert row.input_is_parallel is True and row.sequence_parallel is True
