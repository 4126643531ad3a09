"""Exit codes that mean something: a demo that ran too little is not a pass."""
from __future__ import annotations

from spmdsim.tools.cli.demo import TOO_FEW_RAN, coverage
from spmdsim.tools.demo import Outcome, scenarios


def _outcomes(world_size: int) -> list:
    return [Outcome(sc.name, sc.title, "-", True, 0.0, {}, 0, skipped=sc.needs(world_size))
            for sc in scenarios()]


def test_demo_coverage_refuses_a_pass_that_ran_too_little():
    chosen = scenarios()
    for world in (1, 3):
        reason = coverage(_outcomes(world), world, chosen)
        assert reason.startswith("fewer than half the scenarios ran (")
        assert "8 run them all (mpiexec -n 8, or --ranks 8)" in reason
    assert "on 1 rank)" in coverage(_outcomes(1), 1, chosen)
    assert coverage(_outcomes(8), 8, chosen) == ""
    assert coverage(_outcomes(4), 4, chosen) == ""  # 9 of 17: half ran


def test_demo_coverage_names_an_all_skipped_run():
    skipped = [Outcome("a", "a", "-", True, 0.0, {}, 0, skipped="needs 8 ranks")]
    assert coverage(skipped, 3).startswith("every scenario was skipped (0 of 1 ran on 3 ranks)")
    assert coverage([], 3).startswith("every scenario was skipped")
    assert TOO_FEW_RAN not in (0, 1, 2)
