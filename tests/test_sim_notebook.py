"""examples/notebook.ipynb runs in a real Jupyter kernel (nbclient, ipykernel: the `test` extra)."""
from __future__ import annotations

import ast
import json
import pathlib

import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "examples" / "notebook.ipynb"


def test_notebook_runs_every_cell_without_error():
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[test]')")
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()  # raises on a cell error
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.outputs)
    assert "rank 7: block (8, 8), check PASS, {'allreduce': 1}" in text
    assert "S(0)->S(1) via Alltoall on ('x',)" in text
    assert "ranks 0-7 " in text and "allreduce x1" in text
    assert "forward collectives {'allreduce': 1}, backward {'allreduce': 1}" in text
    assert "allreduce(mp)                896 B  <- leaf (4, 16)" in text
    assert " " * 41 + "(read by ParallelMLP)" in text  # the forward step the sum answers
    assert "every gradient on every rank matches the single-process step" in text
    widest = max(text.splitlines(), key=len)
    assert len(widest) <= 100, widest  # a notebook cell's output fits 100 columns too
    first = "".join(nb.cells[0].source)
    assert 'pip install -e ".[notebook]"' in first  # how to open it, where a notebook user reads


def test_notebook_imports_only_what_it_uses():
    """The first cell imported io and layout_picture, which no cell used (pure: the cells' code read, not run)."""
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    tree = ast.parse("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"))
    imported = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported - used == set()
