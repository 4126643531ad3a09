"""Pending sums are reduced on blocks already cut over the axes the source replicates.

An axis replicated in the source and split or partial in the target costs
nothing to slice first; every Allreduce or Reduce_scatter after it moves 1/g
of the bytes. The audited case: (R,P) -> (P,R) on (dp=2, tp=4), 64x64 float64,
used to Allreduce the whole tensor (49,152 B per rank), now half (24,576 B).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.programs.plan import (
    Allgather,
    Allreduce,
    LocalSlice,
    LocalZero,
    ReduceScatter,
    emulate,
    partial_addends,
    plan_redistribution,
    shards_of,
    sum_partials,
)

DM = Layout((2, 4), ("dp", "tp"))
CUBE = Layout((2, 2, 2), ("dp", "sp", "tp"))
SHAPE = (64, 64)


def _checked(source, target):
    """The plan, after proving in the emulator that it gives the target's value."""
    plan = plan_redistribution(source, target, SHAPE, "float64")
    full = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    out = sum_partials(target, emulate(plan, partial_addends(source, full)))
    for r, block in shards_of(target.with_partial(()), full).items():
        assert np.array_equal(out[r], block), (str(source), str(target), r)
    assert all(got >= low for got, low in zip(plan.bytes_received, plan.lower_bound))
    return plan


def test_replicated_then_partial_axis_is_sliced_before_the_allreduce():
    plan = _checked(DM(None, None, partial=("tp",)), DM(None, None, partial=("dp",)))
    assert [type(s) for s in plan.steps] == [LocalSlice, Allreduce, LocalZero]
    assert [str(s) for s in plan.steps] == [
        "B->S(0) via local slice on ('dp',)",
        "P->B via Allreduce on ('tp',)",
        "S(0)->P via local zeroing on ('dp',)",
    ]
    # Half the tensor (32x64 float64 = 16,384 B), ring Allreduce over 4: 2*3/4 of it.
    assert plan.bytes_received == (24_576,) * 8  # was 49,152: the whole tensor


def test_cli_plan_of_the_audited_command(capsys):
    assert main(["plan", "--device-matrix", "2,4", "--alias", "dp,tp", "--from-placements", "R,P",
                 "--to-placements", "P,R", "--shape", "64,64", "--dtype", "float64", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [s["op"] for s in record["steps"]] == ["local_slice", "allreduce", "local_zero"]
    assert record["bytes_received_per_rank"] == 24_576


@pytest.mark.parametrize(
    "source, target, kinds, received, before",
    [
        # (R,P) -> (P,S(1)): the Reduce_scatter over tp runs on the dp-half.
        (DM(None, None, partial=("tp",)), DM(None, "tp", partial=("dp",)),
         [LocalSlice, ReduceScatter, LocalZero], 12_288, 24_576),
        # (R,P) -> (S(1) on dp, S(0) on tp): slice dp first, then Reduce_scatter.
        (DM(None, None, partial=("tp",)), DM("tp", "dp"), [LocalSlice, ReduceScatter], 12_288, 24_576),
        # 3-axis mesh: two replicated axes become partial, both sliced first (reaches the bound).
        (CUBE(None, None, partial=("tp",)), CUBE(None, None, partial=("dp", "sp")),
         [LocalSlice, Allreduce, LocalZero], 8_192, 32_768),
        # A pending sum over two axes; the replicated third becomes partial.
        (CUBE(None, None, partial=("sp", "tp")), CUBE(None, None, partial=("dp",)),
         [LocalSlice, Allreduce, LocalZero], 24_576, 49_152),
        # No sum to resolve: a free slice still shrinks the Allgather (reaches the bound).
        (DM("dp", None), DM(None, None, partial=("tp",)), [LocalSlice, Allgather, LocalZero], 4_096, 16_384),
    ],
)
def test_related_moves_reduce_sliced_blocks(source, target, kinds, received, before):
    plan = _checked(source, target)
    assert [type(s) for s in plan.steps] == kinds, str(plan)
    assert isinstance(plan.steps[0], LocalSlice)
    assert plan.max_bytes_received == received < before  # `before`: the plan this change replaced
