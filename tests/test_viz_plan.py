"""Plan pictures: each step's collective, axis group and bytes, with the layout after it."""
from __future__ import annotations

import sys

import pytest

from spmdsim import Layout
from spmdsim.errors import SpmdsimError
from spmdsim.programs.plan import plan_redistribution
from spmdsim.programs.viz import render_plan_ascii, render_plan_png
from spmdsim.programs.viz.plan import format_bytes


def test_alltoall_plan_ascii():
    mesh = Layout((8,), ("x",))
    plan = plan_redistribution(mesh("x", None), mesh(None, "x"), (1024, 1024))
    text = render_plan_ascii(plan)
    assert 'Step 1. S(0)->S(1) via Alltoall on (\'x\',) (groups of 8 ranks)' in text
    # Exact bytes as `spmdsim plan` prints them, the binary unit beside them.
    assert "per rank: sends 458,752 B (448 KiB), receives 458,752 B (448 KiB)" in text
    assert "per rank received: 458,752 B (448 KiB); lower bound 458,752 B (448 KiB)" in text
    assert '896:1024 |   r7   |' in text  # before: row blocks
    assert 'After step 1: (None, "x") on Layout(x=8)' in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_partial_plan_ascii_shows_each_stage():
    mesh = Layout((2, 4), ("dp", "mp"))
    plan = plan_redistribution(mesh("dp", None, partial=("mp",)), mesh(None, "mp"), (8, 8))
    text = render_plan_ascii(plan)
    assert [line for line in text.splitlines() if line.startswith("Step")] == [
        "Step 1. P->S(1) via Reduce_scatter on ('mp',) (groups of 4 ranks)",
        "Step 2. S(0)->B via Allgather on ('dp',) (groups of 2 ranks)",
    ]
    assert "r0+1+2+3" in text  # the partial source
    assert "| r0,4 | r1,5 | r2,6 | r3,7 |" in text  # the replicated target


def test_empty_plan():
    mesh = Layout((2,), ("x",))
    plan = plan_redistribution(mesh("x"), mesh("x"), (4,))
    assert "No step" in render_plan_ascii(plan)


def test_plan_png(tmp_path):
    pytest.importorskip("matplotlib")
    mesh = Layout((2, 4), ("dp", "mp"))
    plan = plan_redistribution(mesh("dp", None, partial=("mp",)), mesh(None, "mp"), (8, 8))
    paths = render_plan_png(plan, tmp_path / "plan")
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "step_00_source.png", "step_01_reduce_scatter.png", "step_02_allgather.png",
    ]
    for path in paths:
        with open(path, "rb") as fh:
            assert fh.read(4) == b"\x89PNG"


def test_plan_png_without_matplotlib_makes_no_folder(tmp_path, monkeypatch):
    # It made the folder, then refused: an empty folder left behind by a call that did nothing.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    mesh = Layout((2,), ("x",))
    plan = plan_redistribution(mesh("x", None), mesh(None, "x"), (4, 4))
    with pytest.raises(SpmdsimError, match="^pictures need matplotlib"):
        render_plan_png(plan, tmp_path / "plan")
    assert not (tmp_path / "plan").exists()


def test_format_bytes():
    assert format_bytes(96) == "96 B"
    assert format_bytes(1023) == "1,023 B"
    assert format_bytes(1792) == "1,792 B (1.75 KiB)"
    assert format_bytes(458752) == "458,752 B (448 KiB)"
    assert format_bytes(3 << 20) == "3,145,728 B (3 MiB)"


def test_plan_picture_bytes_match_spmdsim_plan(capsys):
    """docs/tutorials/lab.md exercise 8: the Python one-liner and `spmdsim plan` print the same byte counts."""
    from spmdsim.tools.cli.main import main

    mesh = Layout((8,), ("x",))
    text = render_plan_ascii(plan_redistribution(mesh("x", None), mesh(None, "x"), (64, 64)))
    assert "per rank received: 1,792 B (1.75 KiB); lower bound 1,792 B (1.75 KiB)" in text
    assert main(["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
                 "--shape", "64,64"]) == 0
    assert "total received per rank (max): 1,792 B; lower bound 1,792 B" in capsys.readouterr().out
