"""Every file in examples/ runs and passes its own check on this world size.

The examples are run in-process (runpy) under the suite's mpiexec rather than
one launch each, which on 2 cores would cost seconds per file. An example that
needs another world size raises a SpmdsimError saying so, and is skipped; any
other error fails the test.
"""
from __future__ import annotations

import contextlib
import io
import pathlib
import runpy
import sys

import pytest
from mpi4py import MPI

from spmdsim.errors import SpmdsimError

pytestmark = pytest.mark.mpi(min_size=2)

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def test_examples_are_found():
    assert len(EXAMPLES) >= 12


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_passes(path, monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(sys, "argv", [str(path)])
    # install_excepthook replaces sys.excepthook; keep the suite's own.
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except SpmdsimError as exc:
            if f"not {comm.size}: run with" not in str(exc):
                raise
            code = str(exc)  # the world size it needs, on every rank alike
    codes = comm.allgather(code)
    if all(isinstance(c, str) for c in codes):
        pytest.skip(f"{path.name}: {codes[0]}")
    assert codes == [0] * comm.size or codes == [None] * comm.size, (codes, out.getvalue())
    if comm.rank == 0:
        assert "PASS" in out.getvalue() or "passed" in out.getvalue(), out.getvalue()
