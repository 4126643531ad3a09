"""Collective algorithm schedules (pure): delivery by symbolic simulation, textbook bytes, cost terms."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from spmdsim.programs.algorithms import (ALGORITHMS, NAMES, FORMULAS, build, check, check_choices, parse_name,
                                schedule, sum_order)
from spmdsim.programs.algorithms.formulas import MODEL_FORMULA, busiest_bytes_sent, cost_terms, model_bytes
from spmdsim.programs.algorithms.schedule import Round, Transfer, split_counts
from spmdsim.programs.algorithms.symbolic import final_outputs, states
from spmdsim.programs.cost import CostModel
from spmdsim.errors import ShapeError, SpmdsimError
from spmdsim.tools.cli.main import main

# Divisible by every p and p2 up to 16: the formulas are exact there.
_UNIT = 720720


def _count(name: str, p: int) -> int:
    collective, _ = parse_name(name)
    return _UNIT * p if collective in ("reduce_scatter", "alltoall") else _UNIT


@pytest.mark.parametrize("name", NAMES)
def test_every_schedule_delivers_each_piece_exactly_once(name):
    for p in range(1, 17):
        for root in sorted({0, p - 1}):
            check(schedule(name, p, _count(name, p), 4, root=root))


@pytest.mark.parametrize("name", NAMES)
def test_bytes_per_rank_equal_the_textbook_formula(name):
    collective, _ = parse_name(name)
    for p in range(2, 17):
        for itemsize in (1, 8):
            s = schedule(name, p, _count(name, p), itemsize)
            n = _count(name, p) * itemsize
            assert max(s.bytes_sent()) == busiest_bytes_sent(name, p, n), (name, p)
            # Every byte sent is received by someone.
            assert sum(s.bytes_sent()) == sum(s.bytes_received())
    assert set(FORMULAS) == set(NAMES) == set(MODEL_FORMULA)


def test_textbook_figures_at_eight_ranks():
    n = 1 << 20
    got = {name: max(schedule(name, 8, n // (1 if parse_name(name)[0] != "allgather" else 8)).bytes_sent())
           for name in NAMES}
    assert got["ring-allreduce"] == 2 * 7 * n // 8
    assert got["recursive-doubling-allreduce"] == 3 * n
    assert got["rabenseifner-allreduce"] == 2 * 7 * n // 8
    assert got["ring-allgather"] == got["bruck-allgather"] == got["recursive-doubling-allgather"] == 7 * n // 8
    assert got["pairwise-alltoall"] == 7 * n // 8 and got["bruck-alltoall"] == 3 * n // 2
    assert got["binomial-bcast"] == 3 * n and got["scatter-allgather-bcast"] == 2 * 7 * n // 8
    assert got["recursive-halving-reduce-scatter"] == got["ring-reduce-scatter"] == 7 * n // 8


@pytest.mark.parametrize("name", NAMES)
def test_cost_terms_follow_the_cost_model_on_powers_of_two(name):
    collective, _ = parse_name(name)
    formula = MODEL_FORMULA[name]
    for p in (2, 4, 8, 16):
        s = schedule(name, p, _count(name, p))
        rounds, sent, reduced = cost_terms(s)
        n = model_bytes(collective, p, _count(name, p))
        if formula is None:  # Rabenseifner: 2 log2 p rounds, the ring's bytes
            assert (rounds, sent, reduced) == (2 * int(math.log2(p)), 2 * (p - 1) * n // p, (p - 1) * n // p)
            continue
        for unit, got in ((dict(alpha_s=1, beta_s_per_byte=0), rounds),
                          (dict(alpha_s=0, beta_s_per_byte=1), sent),
                          (dict(alpha_s=0, beta_s_per_byte=0, gamma_s_per_byte=1), reduced)):
            model = CostModel(algorithm=formula, **unit)
            assert model.predict(collective, p, n) == pytest.approx(got), (name, p, unit)


def test_a_broken_schedule_is_caught():
    good = schedule("ring-allreduce", 4, 16)
    dropped = dataclasses.replace(good, rounds=good.rounds[:-1])
    with pytest.raises(SpmdsimError, match="rank .* output piece"):
        check(dropped)
    first = good.rounds[0]
    twice = Round(first.phase, first.transfers + (Transfer(0, 1, (3,), (3,), True),))
    with pytest.raises(SpmdsimError, match="expected"):
        check(dataclasses.replace(good, rounds=(twice,) + good.rounds[1:]))
    empty = schedule("ring-allgather", 3, 2)
    early = Round("x", (Transfer(0, 1, (2,), (2,)),))
    with pytest.raises(SpmdsimError, match="holds nothing"):
        states(dataclasses.replace(empty, rounds=(early,)))


def test_summation_orders():
    ring = final_outputs(schedule("ring-allreduce", 4, 4))[2]
    assert [sum_order(t) for t in ring] == ["(r0+(r3+(r2+r1)))", "(r1+(r0+(r3+r2)))",
                                            "(r2+(r1+(r0+r3)))", "(r3+(r2+(r1+r0)))"]
    # Each addition is commutative in IEEE arithmetic, so ranks that add the same pairs in
    # other operand orders hold bitwise the same sum: one tree up to swapped operands.
    for name, tree in (("recursive-doubling-allreduce", "(((r0+r1)+(r2+r3))+(r4+r5))"),
                       ("rabenseifner-allreduce", "(((r0+r1)+r4)+((r2+r3)+r5))")):
        outputs = final_outputs(schedule(name, 6, 4))
        for k in range(len(outputs[0])):  # every slot, on every rank: the same tree
            assert {_canonical(out[k]) for out in outputs} == {tree}, (name, k)


def _canonical(term) -> str:
    if term[0] != "+":
        return f"r{term[0]}"
    return "(" + "+".join(sorted((_canonical(term[1]), _canonical(term[2])))) + ")"


def test_non_power_of_two_groups_fold_the_even_ranks_first():
    s = schedule("rabenseifner-allreduce", 6, 12)
    assert s.rounds[0].phase == "fold" and s.rounds[-1].phase == "unfold"
    assert [(t.src, t.dst) for t in s.rounds[0].transfers] == [(0, 1), (2, 3)]
    assert [(t.src, t.dst) for t in s.rounds[-1].transfers] == [(1, 0), (3, 2)]
    assert "fold" not in {r.phase for r in schedule("rabenseifner-allreduce", 8, 16).rounds}


def test_uneven_buffers_cut_like_array_split():
    assert split_counts(10, 4) == (3, 3, 2, 2)
    s = schedule("ring-allreduce", 4, 10, 4)
    check(s)
    assert s.slot_counts == (3, 3, 2, 2) and max(s.bytes_sent()) == (3 + 3 + 3 + 3 + 2 + 2) * 4


def test_a_name_in_another_case_is_the_name_and_a_collective_s_own_name_lists_its_algorithms(capsys):
    # "Ring-AllReduce" was refused ("did you mean 'ring-allreduce'?"), where `pipeline --schedule 1F1B` is taken;
    # "bcast" and "tree-bcast" got no hint at all.
    assert parse_name("Ring-AllReduce") == parse_name("ring-allreduce") == ("allreduce", "ring")
    for name in ("bcast", "tree-bcast"):
        with pytest.raises(SpmdsimError, match=rf"^unknown collective algorithm '{name}' \(did you mean "
                                               r"'binomial-bcast' or 'scatter-allgather-bcast'\?\); expected one of "):
            parse_name(name)
    assert main(["collective", "Binomial-Bcast", "--ranks", "2", "--size", "8", "--repeat", "1"]) == 0
    assert "binomial-bcast on 2 ranks: 8 B from each rank" in capsys.readouterr().out


def test_names_and_errors():
    assert parse_name("recursive-halving-reduce-scatter") == ("reduce_scatter", "recursive-halving")
    assert len(NAMES) == 12 and all(len(a) >= 2 for a in ALGORITHMS.values())
    with pytest.raises(SpmdsimError, match=r"^unknown collective algorithm 'ring-alltoall' \(did you mean "
                                           r"'bruck-alltoall', 'ring-allgather' or 'pairwise-alltoall'\?\); "
                                           "expected one of ring-allreduce, "):
        parse_name("ring-alltoall")
    # another spelling of one name: that name alone
    with pytest.raises(SpmdsimError, match=r"^unknown collective algorithm 'ring_allreduce' \(did you mean "
                                           r"'ring-allreduce'\?\); expected one of "):
        parse_name("ring_allreduce")
    with pytest.raises(SpmdsimError, match=r"^unknown collective algorithm 'nothing-alike'; expected one of "):
        parse_name("nothing-alike")
    with pytest.raises(ShapeError, match="10 elements per rank do not divide into 4 blocks"):
        build("alltoall", "bruck", 4, 10)
    with pytest.raises(SpmdsimError, match="group size 0 must be an integer >= 1"):
        build("allreduce", "ring", 0, 10)
    with pytest.raises(SpmdsimError, match="bcast root 4 must be an integer group rank"):
        build("bcast", "binomial", 4, 10, root=4)
    # numpy's integers are ranks (np.int64(2) was refused as "must be a group rank"); a bool is not one.
    assert build("bcast", "binomial", 4, 10, root=np.int64(2)) == build("bcast", "binomial", 4, 10, root=2)
    with pytest.raises(SpmdsimError, match=r"bcast root True must be an integer group rank \(0 <= root < 4\)"):
        build("bcast", "binomial", 4, 10, root=True)
    assert build("allreduce", "ring", 4, 10, root=2) is build("allreduce", "ring", 4, 10)  # it has none
    assert check_choices({"allreduce": "ring", "bcast": "binomial"}) == {"allreduce": "ring", "bcast": "binomial"}
    assert check_choices({}) is None and check_choices(None) is None
    with pytest.raises(SpmdsimError, match="unknown collective 'all_reduce'"):
        check_choices({"all_reduce": "ring"})
    with pytest.raises(SpmdsimError, match="'bruck' is not an algorithm for allreduce"):
        check_choices({"allreduce": "bruck"})
    with pytest.raises(SpmdsimError, match="must be a dict"):
        check_choices(["allreduce"])


def test_one_byte_or_element_is_said_in_the_singular():
    """`spmdsim collective` said '1 bytes are not a whole number' and '1 elements of 4 bytes do not divide'."""
    from spmdsim.programs.algorithms import build, elements_for

    with pytest.raises(ShapeError, match=r"^1 byte is not a whole number of 4-byte elements$"):
        elements_for("allreduce", 4, 1, 4)
    with pytest.raises(ShapeError, match=r"^1 element of 4 bytes does not divide into 4 blocks, one per rank;"):
        elements_for("alltoall", 4, 4, 4)
    with pytest.raises(ShapeError, match=r"^alltoall: 1 element per rank does not divide into 4 blocks$"):
        build("alltoall", "pairwise", 4, 1, 4)
