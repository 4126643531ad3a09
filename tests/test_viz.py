"""Layout pictures: the picture model's content, exact ASCII for the seed cases, headless PNG/SVG."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from spmdsim import Layout, SpmdsimError
from spmdsim.programs.viz import layout_picture, render_layout_ascii
from spmdsim.programs.viz.model import compact_ranks

ABCDE = ("a", "b", "c", "d", "e")


def _seed(n):
    return {
        1: (Layout((2, 1, 2, 2, 1), ABCDE)("b", "d", "e", "c", "a"), (1, 2, 1, 2, 2)),
        2: (Layout((4, 1, 1, 2, 1), ABCDE)("b", "d", "e", "a"), (1, 2, 1, 4)),
        3: (Layout((2, 1, 2, 2, 1), ABCDE)("b", "e", "c", "a"), (1, 1, 2, 2)),
    }[n]


def test_seed1_model_blocks_labels_colours():
    pic = layout_picture(*_seed(1))
    assert pic.num_shards == 8
    # Block k is the shard the seed numbers k; its label names the one rank holding it.
    holders = {b.shard_number: b.ranks for b in pic.blocks}
    assert holders == {0: (0,), 1: (4,), 2: (2,), 3: (6,), 4: (1,), 5: (5,), 6: (3,), 7: (7,)}
    assert [b.label for b in pic.blocks] == ["r0", "r4", "r2", "r6", "r1", "r5", "r3", "r7"]
    assert not any(b.partial for b in pic.blocks)
    # Two panels side by side over dim 1, each 2x2 blocks over dims 3 and 4.
    assert pic.panel_grid == (1, 2)
    assert [p.title for p in pic.panels] == ["x[:, 0:1, :, :, :]", "x[:, 1:2, :, :, :]"]
    assert {(p.row_dim, p.col_dim) for p in pic.panels} == {(3, 4)}
    # Device view: each rank coloured by the shard it holds.
    cells = {c.rank: c for p in pic.device_panels for row in p.cells for c in row}
    assert [cells[r].shard_number for r in range(8)] == [0, 4, 2, 6, 1, 5, 3, 7]
    assert [p.title for p in pic.device_panels] == ["a=0", "a=1"]
    assert pic.device_panels[0].row_labels == ("c=0", "c=1")
    assert pic.device_panels[0].col_labels == ("d=0", "d=1")


def test_seed3_replicas_share_a_block_and_a_colour():
    pic = layout_picture(*_seed(3))
    assert pic.num_shards == 4
    assert [b.label for b in pic.blocks] == ["r0,1", "r4,5", "r2,3", "r6,7"]
    cells = {c.rank: c.shard_number for p in pic.device_panels for row in p.cells for c in row}
    assert cells == {0: 0, 1: 0, 2: 2, 3: 2, 4: 1, 5: 1, 6: 3, 7: 3}
    assert any("replicated over d" in n for n in pic.notes)


def test_partial_blocks_are_hatched_and_list_terms():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("dp", None, partial=("mp",))
    pic = layout_picture(tl, (4, 6))
    assert all(b.partial for b in pic.blocks)
    # sp replicates, mp holds addends: each block is (replicas) + (replicas).
    assert [b.terms for b in pic.blocks] == [((0, 2), (1, 3)), ((4, 6), (5, 7))]
    assert [b.label for b in pic.blocks] == ["r(0,2)+(1,3)", "r(4,6)+(5,7)"]
    assert all(c.partial for p in pic.device_panels for row in p.cells for c in row)
    note = "partial over mp: ranks differing only there hold addends, not copies; the value is their sum"
    assert note in pic.notes
    text = render_layout_ascii(pic)
    assert "r(0,2)+(1,3)" in text and "partial over mp" in text


def test_multi_axis_entry_blocks():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    pic = layout_picture(tl, (32, 784))
    (panel,) = pic.panels
    assert panel.row_edges == (0, 16, 32) and panel.col_edges == (0, 196, 392, 588, 784)
    assert [[b.label for b in row] for row in panel.blocks] == [
        ["r0", "r4", "r2", "r6"],
        ["r1", "r5", "r3", "r7"],
    ]


def test_one_to_four_dims_fold():
    mesh = Layout((2, 2, 2), ("dp", "sp", "mp"))
    pic1 = layout_picture(Layout((4,), ("x",))("x"), (16,))
    assert pic1.panels[0].row_dim is None and len(pic1.panels[0].blocks[0]) == 4
    pic3 = layout_picture(mesh("dp", "sp", "mp"), (2, 4, 6))
    assert pic3.panel_grid == (1, 2) and pic3.panels[0].row_dim == 1
    pic4 = layout_picture(mesh("dp", "sp", "mp", None), (2, 4, 6, 8))
    assert pic4.panel_grid == (1, 2)  # dims 1, 2 inside panels; dim 0 across; dim 3 whole
    pic4b = layout_picture(Layout((2, 2, 2, 2), ("a", "b", "c", "d"))("a", "b", "c", "d"), (2, 2, 2, 2))
    assert pic4b.panel_grid == (2, 2) and pic4b.device_grid == (2, 2)
    for pic in (pic1, pic3, pic4, pic4b):
        text = render_layout_ascii(pic)
        assert max(len(line) for line in text.splitlines()) <= 80
        numbers = sorted(b.shard_number for p in pic.panels for row in p.blocks for b in row)
        assert numbers == list(range(pic.num_shards))


def test_wide_panels_wrap_their_columns():
    tl = Layout((4, 4), ("dp", "mp"))(None, ("mp", "dp"))
    text = render_layout_ascii(tl, (2, 160))
    assert "r15" in text and "150:160" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_long_labels_fall_back_to_shard_numbers_with_a_legend():
    tl = Layout((32, 2), ("r", "x"))("x")
    text = render_layout_ascii(tl, (2,))
    assert "|  #0 |  #1 |" in text
    assert "#0: r0, 2, 4, 6," in text and " 62" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_compact_ranks():
    assert compact_ranks([1, 0]) == "0,1"
    assert compact_ranks([0, 1, 2, 3, 8]) == "0-3,8"
    assert compact_ranks([0, 2, 4]) == "0,2,4"


@pytest.mark.parametrize("n, expected", [(1, "SEED1_ASCII"), (2, "SEED2_ASCII"), (3, "SEED3_ASCII")])
def test_seed_ascii_exact(n, expected):
    assert render_layout_ascii(*_seed(n)) == globals()[expected]


def test_png_and_svg_headless(tmp_path):
    pytest.importorskip("matplotlib")
    from spmdsim.programs.viz import render_layout_png

    tl, shape = _seed(1)
    png = render_layout_png(tl, tmp_path / "seed.png", shape)
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    pic = layout_picture(Layout((2, 4), ("dp", "mp"))("dp", None, partial=("mp",)), (4, 6))
    svg = render_layout_png(pic, tmp_path / "sub" / "partial.svg")
    text = open(svg, encoding="utf-8").read()
    assert "<svg" in text and "r0+1+2+3" in text


def test_png_with_the_shape_before_the_path_says_the_order(tmp_path):
    """render_layout_ascii(tl, shape) takes the shape second, render_layout_png(tl, path, shape) the path:
    the ascii order raised os.fspath's "expected str, bytes or os.PathLike object, not tuple"."""
    from spmdsim.programs.viz import render_layout_png

    tl = Layout((2, 4), ("a", "b"))("a", "b")
    path = str(tmp_path / "x.png")
    with pytest.raises(TypeError) as info:
        render_layout_png(tl, (8, 8), path)
    assert str(info.value) == (f"render_layout_png(layout, path, shape) takes the path before the shape; got path "
                               f"(8, 8) and shape {path!r}: expected render_layout_png(layout, {path!r}, (8, 8))")
    with pytest.raises(TypeError, match=r"^picture path 8 is not a file path; expected a str or os.PathLike"):
        render_layout_png(tl, 8, (8, 8))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc: a HOME no folder can be made in")
def test_a_picture_with_an_unwritable_home_prints_no_matplotlib_warning(tmp_path):
    """HOME read-only or missing: matplotlib printed two lines of its own (mkdir -p failed ..., Matplotlib
    created a temporary cache directory ...) on stderr under a picture written. A temporary MPLCONFIGDIR is
    given where the user set none, removed at exit; a user's MPLCONFIGDIR is kept."""
    pytest.importorskip("matplotlib")
    code = ("import os, sys\nfrom spmdsim.tools.cli.main import main\n"
            "rc = main(['show', '--device-matrix', '2,4', '--alias', 'dp,mp', '--tensor-map', 'mp,None', "
            "'--shape', '8,6', '--png', sys.argv[1]])\nprint(rc, os.environ.get('MPLCONFIGDIR'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    env["HOME"] = "/proc/nonexistent"
    for mine in (None, str(tmp_path / "mine")):
        png = tmp_path / f"{mine is None}.png"
        out = subprocess.run([sys.executable, "-c", code, str(png)], capture_output=True, text=True, timeout=60,
                             env=env if mine is None else {**env, "MPLCONFIGDIR": mine})
        assert out.returncode == 0 and out.stderr == "" and png.exists(), (out.stdout, out.stderr)
        rc, used = out.stdout.splitlines()[-1].split(" ", 1)
        assert rc == "0" and (used == mine if mine else used.startswith(
            os.path.join(tempfile.gettempdir(), "spmdsim-matplotlib-")) and not os.path.exists(used)), used


def test_viz_imports_no_matplotlib_and_no_mpi4py():
    code = (
        "import sys, spmdsim.programs.viz, spmdsim.programs.viz.ascii, spmdsim.layouts.explain, "
        "spmdsim.tools.cli.cases\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'matplotlib')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SEED1_ASCII = """\
x: shape (1, 2, 1, 2, 2), tensor map ("b", "d", "e", "c", "a")
on Layout(a=2, b=1, c=2, d=2, e=1), 8 ranks
  dim 1 split over "d" into 2 shards
  dim 3 split over "c" into 2 shards
  dim 4 split over "a" into 2 shards

Tensor: ranks holding each block, #: shard number (rows dim 3, columns dim 4)
x[:, 0:1, :, :, :]   x[:, 1:2, :, :, :]
      0:1   1:2            0:1   1:2
    +-----+-----+        +-----+-----+
0:1 |  r0 |  r4 |    0:1 |  r1 |  r5 |
    |  #0 |  #1 |        |  #4 |  #5 |
    +-----+-----+        +-----+-----+
1:2 |  r2 |  r6 |    1:2 |  r3 |  r7 |
    |  #2 |  #3 |        |  #6 |  #7 |
    +-----+-----+        +-----+-----+

Device matrix (a=2, b=1, c=2, d=2, e=1): each rank and the shard number it holds
a=0                 a=1
      d=0   d=1           d=0   d=1
    +-----+-----+       +-----+-----+
c=0 |  r0 |  r1 |   c=0 |  r4 |  r5 |
    |  #0 |  #4 |       |  #1 |  #5 |
    +-----+-----+       +-----+-----+
c=1 |  r2 |  r3 |   c=1 |  r6 |  r7 |
    |  #2 |  #6 |       |  #3 |  #7 |
    +-----+-----+       +-----+-----+
"""

SEED2_ASCII = """\
x: shape (1, 2, 1, 4), tensor map ("b", "d", "e", "a")
on Layout(a=4, b=1, c=1, d=2, e=1), 8 ranks
  dim 1 split over "d" into 2 shards
  dim 3 split over "a" into 4 shards

Tensor: ranks holding each block, #: shard number (rows dim 1, columns dim 3)
x[:, :, :, :]
      0:1   1:2   2:3   3:4
    +-----+-----+-----+-----+
0:1 |  r0 |  r2 |  r4 |  r6 |
    |  #0 |  #1 |  #2 |  #3 |
    +-----+-----+-----+-----+
1:2 |  r1 |  r3 |  r5 |  r7 |
    |  #4 |  #5 |  #6 |  #7 |
    +-----+-----+-----+-----+

Device matrix (a=4, b=1, c=1, d=2, e=1): each rank and the shard number it holds
      d=0   d=1
    +-----+-----+
a=0 |  r0 |  r1 |
    |  #0 |  #4 |
    +-----+-----+
a=1 |  r2 |  r3 |
    |  #1 |  #5 |
    +-----+-----+
a=2 |  r4 |  r5 |
    |  #2 |  #6 |
    +-----+-----+
a=3 |  r6 |  r7 |
    |  #3 |  #7 |
    +-----+-----+
"""

SEED3_ASCII = """\
x: shape (1, 1, 2, 2), tensor map ("b", "e", "c", "a")
on Layout(a=2, b=1, c=2, d=2, e=1), 8 ranks
  dim 2 split over "c" into 2 shards
  dim 3 split over "a" into 2 shards
  replicated over d: ranks listed together hold copies

Tensor: ranks holding each block, #: shard number (rows dim 2, columns dim 3)
x[:, :, :, :]
      0:1    1:2
    +------+------+
0:1 | r0,1 | r4,5 |
    |  #0  |  #1  |
    +------+------+
1:2 | r2,3 | r6,7 |
    |  #2  |  #3  |
    +------+------+

Device matrix (a=2, b=1, c=2, d=2, e=1): each rank and the shard number it holds
a=0                 a=1
      d=0   d=1           d=0   d=1
    +-----+-----+       +-----+-----+
c=0 |  r0 |  r1 |   c=0 |  r4 |  r5 |
    |  #0 |  #0 |       |  #1 |  #1 |
    +-----+-----+       +-----+-----+
c=1 |  r2 |  r3 |   c=1 |  r6 |  r7 |
    |  #2 |  #2 |       |  #3 |  #3 |
    +-----+-----+       +-----+-----+
"""


def test_scalar_tensor_is_one_block():
    pic = layout_picture(Layout((2,), ("x",))(), ())
    assert [b.label for b in pic.blocks] == ["r0,1"]
    assert "scalar" in render_layout_ascii(pic)


def test_size1_axes_make_no_replica_note():
    # Seed case 2: c has size 1; nothing about copies.
    assert not any("replicated" in n for n in layout_picture(*_seed(2)).notes)
    # Only the axis of size above one is named.
    pic = layout_picture(Layout((2, 1, 2), ("a", "b", "c"))("a"), (4,))
    assert "replicated over c: ranks listed together hold copies" in pic.notes
    assert not any("over b" in n for n in pic.notes)


def test_partial_notes_match_explain_and_fit_the_width():
    from spmdsim.layouts.dialects.sbp import parse_sbp, sbp_to_layout

    tl = sbp_to_layout(parse_sbp("S(0),P"), (2, 4), 2)
    pic = layout_picture(tl, (8, 8))
    assert pic.notes == (
        'dim 0 split over "axis_0" into 2 shards',
        "partial over axis_1: ranks differing only there hold addends, not copies; the value is their sum",
        "'+' joins the ranks holding the addends of a block (hatched in PNG pictures)",
    )
    text = render_layout_ascii(pic)
    wrapped = ("  partial over axis_1: ranks differing only there hold addends, not copies; the\n    "
               "value is their sum\n")
    assert wrapped in text
    assert max(len(line) for line in text.splitlines()) <= 80
    narrow = render_layout_ascii(pic, width=40)
    assert max(len(line) for line in narrow.splitlines()[2:8]) <= 40


def test_lab_legend_explains_every_label_notation():
    """Each kind of label the ASCII picture prints is explained in docs/tutorials/lab.md's legend."""
    import os

    lab = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "tutorials", "lab.md")
    with open(lab, encoding="utf-8") as fh:
        legend = fh.read().split("## 1.")[0]
    mesh = Layout((2, 4), ("dp", "mp"))
    labels = {
        layout_picture(mesh("mp"), (4,)).blocks[0].label: "`r0,4`",
        layout_picture(mesh("dp"), (2,)).blocks[0].label: "`r0-3`",
        layout_picture(Layout((2,), ("p",))(None, partial=("p",)), (2,)).blocks[0].label: "`r0+1`",
        layout_picture(Layout((2, 2), ("p", "c"))(None, partial=("p",)), (2,)).blocks[0].label:
            "`r(0,1)+(2,3)`",
        layout_picture(mesh(None, partial=("dp",)), (2,)).blocks[0].label: "`r(0-3)+(4-7)`",
    }
    assert list(labels) == ["r0,4", "r0-3", "r0+1", "r(0,1)+(2,3)", "r(0-3)+(4-7)"]
    for notation in labels.values():
        assert notation in legend
    assert "`#0: r0, 2, 4, ...`" in legend  # the list under a picture whose labels were cut


@pytest.mark.parametrize("render", ["render_layout_ascii", "render_layout_png"])
def test_a_picture_of_the_wrong_kind_is_one_line_naming_it(render, tmp_path):
    """A device matrix passed for a tensor layout (`layout`, not `layout("dp", "mp")`) was an AttributeError from
    inside the renderer ('Layout' object has no attribute 'tensor_layout'); no shape a bare TypeError: in a notebook
    both showed the renderer's frames. Both are one line now, TypeErrors still."""
    from spmdsim.programs import viz

    layout = Layout((2, 4), ("dp", "mp"))
    path = [str(tmp_path / "x.png")] if render == "render_layout_png" else []
    call = f"{render}(tensor_layout, {'path, ' if path else ''}shape)"
    with pytest.raises(SpmdsimError) as info:
        getattr(viz, render)(layout, *path, (8, 8))
    assert isinstance(info.value, TypeError) and str(info.value) == (
        f"{call}: picture Layout(device_matrix=(2, 4), alias_name=('dp', 'mp')) is neither a TensorLayout (with a "
        "shape) nor a LayoutPicture; it is a device matrix: expected a tensor's layout over it, e.g. "
        "layout('dp', 'mp')")
    with pytest.raises(SpmdsimError) as info:
        getattr(viz, render)(layout("dp", "mp"), *path)
    assert isinstance(info.value, TypeError)
    assert str(info.value) == f"{call} needs a shape with a tensor layout: the tensor's, e.g. (8, 8)"
