"""Pure tests of spmdsim.runtime.debug: fingerprints, descriptions, settings (no MPI)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.runtime import debug


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch):
    monkeypatch.setattr(debug._State, "check", None)
    monkeypatch.setattr(debug._State, "watchdog", None)
    monkeypatch.setattr(debug._State, "watchdog_read", False)
    monkeypatch.setattr(debug._State, "quiet", None)
    monkeypatch.setattr(debug._State, "seq", 0)


def test_importing_debug_does_not_import_mpi4py() -> None:
    code = "import sys, spmdsim.runtime.debug; assert 'mpi4py' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_fingerprint_is_fixed_size_and_separates_every_field() -> None:
    base = dict(seq=3, op="allreduce", axes=("mp",), dtype="float32", shape=(4, 8),
                extra=(), group_size=4)
    row = debug.fingerprint(**base)
    assert row.shape == (debug.FINGERPRINT_FIELDS,) and row.dtype == np.int64
    assert np.array_equal(row, debug.fingerprint(**base))
    for change in (dict(seq=4), dict(op="allgather"), dict(axes=("dp",)), dict(dtype="float64"),
                   dict(shape=(8, 4)), dict(shape=(4, 8, 1)), dict(extra=(1,)), dict(group_size=2)):
        assert not np.array_equal(row, debug.fingerprint(**{**base, **change})), change


def test_fingerprint_of_many_dims_and_of_no_shape() -> None:
    long = debug.fingerprint(1, "allgather", ("x",), "int64", tuple(range(1, 11)))
    longer = debug.fingerprint(1, "allgather", ("x",), "int64", tuple(range(1, 10)) + (11,))
    assert not np.array_equal(long, longer)  # dims past the 7th are folded, not dropped
    free = debug.fingerprint(1, "alltoallv", ("x",), "float32", None)
    assert free[7] == -1


def test_describe_names_the_call() -> None:
    text = debug.describe(12, "allreduce", ("mp",), "float32", (4, 8))
    assert text == "allreduce on ('mp',) float32 (4, 8) (seq 12)"
    assert debug.describe(2, "alltoall", ("a", "b"), "int64", (8,), (0, 0)).endswith("(0, 0) (seq 2)")


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
    monkeypatch.setattr(debug, "_world_rank", lambda: 5)
    debug.configure(watchdog=0.05)
    seen = []
    debug.wait(_NeverDone(), "allreduce", ("mp",), 12, polite=True, on_timeout=seen.append)
    assert seen == ["[rank 5] spmdsim: collective allreduce on ('mp',) (seq 12) did not complete "
                    "within 0.05 s"]


@pytest.mark.parametrize("polite", [False, True])
@pytest.mark.parametrize("watchdog", [None, 30.0])
def test_wait_completes_before_the_deadline(polite, watchdog) -> None:
    debug.configure(watchdog=watchdog)
    request = _DoneAfter(50)
    debug.wait(request, "allgather", ("x",), 1, polite=polite,
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
