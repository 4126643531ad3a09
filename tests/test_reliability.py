"""Pure tests of spmdsim.runtime.debug and debug_calls: fingerprints, descriptions, settings (no MPI)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.runtime import _roster, debug, debug_calls, fingerprints


@pytest.fixture(autouse=True)
def _fresh_settings():
    debug._reset()
    yield
    debug._reset()


def test_importing_debug_does_not_import_mpi4py() -> None:
    code = "import sys, spmdsim.runtime.debug, spmdsim.runtime.debug_calls; assert 'mpi4py' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_fingerprint_is_fixed_size_and_separates_every_field() -> None:
    base = dict(seq=3, op="allreduce", axes=("mp",), dtype="float32", shape=(4, 8),
                extra=(), group_size=4)
    row = fingerprints.fingerprint(**base)
    assert row.shape == (fingerprints.FINGERPRINT_FIELDS,) and row.dtype == np.int64
    assert np.array_equal(row, fingerprints.fingerprint(**base))
    for change in (dict(seq=4), dict(op="allgather"), dict(axes=("dp",)), dict(dtype="float64"),
                   dict(shape=(8, 4)), dict(shape=(4, 8, 1)), dict(extra=(1,)), dict(group_size=2)):
        assert not np.array_equal(row, fingerprints.fingerprint(**{**base, **change})), change


def test_fingerprint_of_many_dims_and_of_no_shape() -> None:
    long = fingerprints.fingerprint(1, "allgather", ("x",), "int64", tuple(range(1, 11)))
    longer = fingerprints.fingerprint(1, "allgather", ("x",), "int64", tuple(range(1, 10)) + (11,))
    assert not np.array_equal(long, longer)  # dims past the 7th are folded, not dropped
    free = fingerprints.fingerprint(1, "alltoallv", ("x",), "float32", None)
    assert free[7] == -1


def test_describe_names_the_call() -> None:
    text = fingerprints.describe(12, "allreduce", ("mp",), "float32", (4, 8))
    assert text == "allreduce on ('mp',) float32 (4, 8) (seq 12)"
    assert fingerprints.describe(2, "alltoall", ("a", "b"), "int64", (8,), (0, 0)).endswith("(0, 0) (seq 2)")


def test_settings_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SPMDSIM_CHECK", "1")
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "2.5")
    assert debug.check_enabled() is True
    assert debug.watchdog_seconds() == 2.5
    debug.configure(check=False, watchdog=0)
    assert debug.check_enabled() is False and debug.watchdog_seconds() is None


@pytest.mark.parametrize("value", ["", "0", "off", "false", "no"])
def test_switches_off(monkeypatch, value) -> None:
    monkeypatch.setenv("SPMDSIM_CHECK", value)
    monkeypatch.setenv("SPMDSIM_WATCHDOG", value if value != "false" and value != "no" else "0")
    assert debug.check_enabled() is False
    assert debug.watchdog_seconds() is None


@pytest.mark.parametrize("var,value,needle", [
    ("SPMDSIM_CHECK", "maybe", "'maybe'"),
    ("SPMDSIM_WATCHDOG", "soon", "'soon'"),
    ("SPMDSIM_WATCHDOG", "-3", "'-3'"),
    ("SPMDSIM_WATCHDOG", "inf", "'inf'"),
])
def test_bad_settings_name_the_value(monkeypatch, var, value, needle) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SpmdsimError, match=needle):
        debug.check_enabled() if var == "SPMDSIM_CHECK" else debug.watchdog_seconds()


def test_sequence_numbers_count_up() -> None:
    assert [debug.next_seq() for _ in range(3)] == [1, 2, 3]
    assert debug.current_seq() == 3


def test_hooks_quiet_follows_the_settings(monkeypatch) -> None:
    # HOOKS.quiet is what hot paths read: worked out from the environment, again after configure().
    monkeypatch.delenv("SPMDSIM_CHECK", raising=False)
    monkeypatch.delenv("SPMDSIM_WATCHDOG", raising=False)
    assert debug.HOOKS.quiet is True and debug.quiet() is True
    debug.configure(check=True)
    assert debug.HOOKS.quiet is False
    debug.configure(check=False)
    assert debug.HOOKS.quiet is True
    debug.configure(watchdog=5)
    assert debug.HOOKS.quiet is False
    debug._reset()
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "2.5")
    assert debug.HOOKS.quiet is False and debug.watchdog_seconds() == 2.5
    with pytest.raises(AttributeError):
        debug.HOOKS.nothing


class _NeverDone:
    def __init__(self) -> None:
        self.polls = 0

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        self.polls += 1
        return False


class _DoneAfter(_NeverDone):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def Test(self) -> bool:  # noqa: N802
        self.polls += 1
        return self.polls >= self.n

    def Wait(self) -> None:  # noqa: N802
        while not self.Test():
            pass


def test_watchdog_reports_the_collective_past_its_deadline(monkeypatch) -> None:
    monkeypatch.setattr(debug_calls, "_world_rank", lambda: 5)
    # No side channel, even when an earlier test in this process installed a guard.
    from spmdsim.runtime import process

    monkeypatch.setattr(process, "world_channel", lambda: None)
    monkeypatch.setattr(debug, "MIN_WATCHDOG_S", 0.01)  # a short deadline keeps this test fast
    debug.configure(watchdog=0.05)
    seen = []
    debug_calls.wait(_NeverDone(), "allreduce", ("mp",), 12, polite=True, on_timeout=seen.append)
    # No side channel here (no guard, no communicator): the two usual causes instead of names.
    assert seen == ["[rank 5] spmdsim: collective allreduce on ('mp',) (seq 12) did not complete "
                    "within 0.05 s: a rank of its group is not in it: did one skip this collective "
                    "(inside an `if` on the rank?) or call a different one (SPMDSIM_CHECK=1 names "
                    "it), or is it still computing or stuck?"]


def test_watchdog_names_a_call_on_a_whole_communicator_in_words(monkeypatch) -> None:
    """A call that names no mesh axes (DTensor.gather or check, on the mesh's communicator) was reported as
    "collective gather on () (seq 1)" under mpiexec, where the simulated ranks say "on the world"."""
    monkeypatch.setattr(debug_calls, "_world_rank", lambda: 0)
    from spmdsim.runtime import process

    monkeypatch.setattr(process, "world_channel", lambda: None)
    monkeypatch.setattr(debug, "MIN_WATCHDOG_S", 0.01)
    debug.configure(watchdog=0.05)
    seen = []
    debug_calls.wait(_NeverDone(), "gather", (), 1, polite=True, on_timeout=seen.append)
    assert seen[0].startswith("[rank 0] spmdsim: collective gather on its whole communicator (seq 1) did not "
                              "complete within 0.05 s: "), seen
    assert _roster.explain(("check", (), 2), {0: ("check", (), 2), 1: ("gather", (), 1)}, True).startswith(
        ": rank 0 waits in it; rank 1 waits in gather on its whole communicator (seq 1)")
    assert fingerprints.describe(3, "allgather", (), "float64", (4,)) == \
        "allgather on its whole communicator float64 (4,) (seq 3)"


def test_ranks_text_folds_runs() -> None:
    assert _roster.ranks_text([3]) == "rank 3"
    assert _roster.ranks_text([7, 0, 1, 2, 4, 5, 6]) == "ranks 0-2,4-7"
    assert _roster.ranks_text([1, 3]) == "ranks 1,3"


_ALLREDUCE = ("allreduce", ("mp",), 12)


def test_watchdog_names_the_rank_that_skipped_the_collective() -> None:
    answers = {0: _ALLREDUCE, 1: _ALLREDUCE, 2: _ALLREDUCE, 3: None}
    assert _roster.explain(_ALLREDUCE, answers, group_known=True) == (
        ": ranks 0-2 wait in it; rank 3 is in no collective: skipped this one (inside an `if` on "
        "the rank?), or still computing, stuck or finished")
    # Asked the whole world (group unknown): a silent rank may belong to another group.
    assert "ranks 3,7 are in no collective: skipped one (" in _roster.explain(
        _ALLREDUCE, {**answers, 7: None}, group_known=False)


def test_watchdog_names_where_other_ranks_wait() -> None:
    answers = {0: _ALLREDUCE, 1: _ALLREDUCE, 3: ("allgather", ("dp",), 12), 2: None}
    assert _roster.explain(_ALLREDUCE, answers, group_known=True) == (
        ": ranks 0-1 wait in it; rank 3 waits in allgather on ('dp',) (seq 12); rank 2 is in no "
        "collective: skipped this one (inside an `if` on the rank?), or still computing, stuck or "
        "finished (held up elsewhere, or collectives called in different orders)")
    everyone = {r: _ALLREDUCE for r in range(4)}
    assert _roster.explain(_ALLREDUCE, everyone, True).endswith(
        "ranks 0-3 wait in it; every rank of its group waits in it: do they pass different shapes "
        "or dtypes? (SPMDSIM_CHECK=1 compares the calls)")
    assert _roster.explain(_ALLREDUCE, everyone, True, check_on=True).endswith(
        "every rank of its group waits in it (an MPI problem?)")


def test_watchdog_says_check_and_gather_are_collective() -> None:
    check = ("check", (), 5)
    text = _roster.explain(check, {0: check, 1: None, 2: None, 3: None}, group_known=True)
    assert text == (
        ": rank 0 waits in it; ranks 1-3 are in no collective: skipped this one (inside an `if` on "
        "the rank?), or still computing, stuck or finished; DTensor.check is collective: call it "
        "on every rank and print on one (verdict = y.check(ref); if rank == 0: print(verdict))")
    assert _roster.explain(check, None, True).endswith("DTensor.check is collective: call it on "
                                                       "every rank and print on one (verdict = "
                                                       "y.check(ref); if rank == 0: print(verdict))")
    assert _roster.explain(("gather", (), 2), None, True).endswith(
        "; DTensor.gather is collective: call it on every rank, not only on the root")


@pytest.mark.parametrize("polite", [False, True])
@pytest.mark.parametrize("watchdog", [None, 30.0])
def test_wait_completes_before_the_deadline(polite, watchdog) -> None:
    debug.configure(watchdog=watchdog)
    request = _DoneAfter(50)
    debug_calls.wait(request, "allgather", ("x",), 1, polite=polite,
                     on_timeout=lambda text: pytest.fail(text))
    assert request.polls == 50


def test_cli_arguments_configure_the_debug_mode() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    debug.add_cli_arguments(parser)
    debug.configure_from_args(parser.parse_args(["--check", "--watchdog", "7.5"]))
    assert debug.check_enabled() is True and debug.watchdog_seconds() == 7.5
    with pytest.raises(SpmdsimError, match="--watchdog 'x'"):
        debug.configure_from_args(parser.parse_args(["--watchdog", "x"]))


@pytest.mark.parametrize("value", ["1e-9", "0.5", "-3", "inf"])
def test_a_watchdog_too_short_to_be_right_is_refused(monkeypatch, value) -> None:
    # 1e-9 s would end a correct program, naming a rank "missing" that is only on its way.
    monkeypatch.setenv("SPMDSIM_WATCHDOG", value)
    debug._reset()
    with pytest.raises(SpmdsimError, match=rf"^SPMDSIM_WATCHDOG='{value}' (is below the watchdog's minimum "
                                           r"of 1 s .*expected seconds >= 1, or 0 for off|must be a positive)"):
        debug.watchdog_seconds()
    with pytest.raises(SpmdsimError, match="minimum of 1 s|must be a positive"):
        debug.configure(watchdog=float(value))
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "1")
    debug._reset()
    assert debug.watchdog_seconds() == 1.0


def test_the_divergence_guard_brings_a_watchdog_unless_told_otherwise(monkeypatch) -> None:
    # SPMDSIM_CHECK compares calls, but a rank that skips one would leave the others
    # waiting forever: with the guard on, an unset watchdog defaults to CHECK_WATCHDOG_S.
    monkeypatch.delenv("SPMDSIM_WATCHDOG", raising=False)
    monkeypatch.setenv("SPMDSIM_CHECK", "1")
    assert debug.watchdog_seconds() == debug.CHECK_WATCHDOG_S
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "0")  # explicitly off stays off
    debug.HOOKS.watchdog_read = False
    assert debug.watchdog_seconds() is None
    monkeypatch.setenv("SPMDSIM_WATCHDOG", "7")
    debug.HOOKS.watchdog_read = False
    assert debug.watchdog_seconds() == 7.0
    # The CLI's --check after the first read: the default follows the guard.
    monkeypatch.delenv("SPMDSIM_WATCHDOG")
    monkeypatch.setenv("SPMDSIM_CHECK", "0")
    debug.HOOKS.check = None
    debug.HOOKS.watchdog_read = False
    assert debug.watchdog_seconds() is None
    debug.configure(check=True)
    assert debug.watchdog_seconds() == debug.CHECK_WATCHDOG_S and not debug.quiet()
    debug.configure(watchdog=None)  # configure's own choice wins over the default
    debug.configure(check=True)
    assert debug.watchdog_seconds() is None
