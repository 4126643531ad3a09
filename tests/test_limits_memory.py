"""Memory before allocation (pure side): budgets, estimates and the one-line refusal."""
from __future__ import annotations

import gc
import weakref

import pytest

from spmdsim import Layout
from spmdsim.layouts.dialects.strategy import matmul_layouts
from spmdsim.base.sizes import format_size
from spmdsim.errors import ResourceError, SpmdsimError
from spmdsim.programs.memory import (
    Budget, Need, budget_per_rank, check_need, largest_fitting_shape, matmul_job_need, matmul_need,
    seeded_need,
)

GIB = 1 << 30


def _meminfo(tmp_path, kib: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       99999999 kB\nMemFree:         1 kB\nMemAvailable:   {kib} kB\n")
    return str(path)


def test_budget_is_memavailable_over_the_ranks_of_the_node(tmp_path):
    info, nowhere = _meminfo(tmp_path, 16 * 1024 * 1024), str(tmp_path / "no-cgroup")
    got = budget_per_rank(8, env={}, meminfo=info, cgroup_root=nowhere)
    assert got == Budget(2 * GIB, "MemAvailable 16 GiB over 8 ranks on this node")
    assert budget_per_rank(1, env={}, meminfo=info, cgroup_root=nowhere).bytes == 16 * GIB
    assert budget_per_rank(8, env={}, meminfo=str(tmp_path / "missing"), cgroup_root=nowhere) is None


def test_budget_follows_spmdsim_memory(tmp_path):
    info = _meminfo(tmp_path, 1024)
    assert budget_per_rank(8, env={"SPMDSIM_MEMORY": "512M"}, meminfo=info).bytes == 512 << 20
    assert budget_per_rank(8, env={"SPMDSIM_MEMORY": "1.5GiB"}, meminfo=info).bytes == 3 * GIB // 2
    assert budget_per_rank(8, env={"SPMDSIM_MEMORY": "1e9"}, meminfo=info).bytes == 10 ** 9
    assert budget_per_rank(8, env={"SPMDSIM_MEMORY": "off"}, meminfo=info) is None
    for bad in ("bogus", "-1G", "12 parsecs", "inf"):
        with pytest.raises(SpmdsimError, match="SPMDSIM_MEMORY=.* is not a size"):
            budget_per_rank(8, env={"SPMDSIM_MEMORY": bad}, meminfo=info)


def test_seeded_need_counts_the_shard_and_the_generator():
    tl = Layout((2, 4), ("a", "b"))("a", "b")
    need = seeded_need(tl, (64, 1024), "float64")
    # Shard 32 x 256 float64; a row of 256 uint64 indices; one pass of 8,192 elements x 3 arrays.
    assert need.parts == (("shard", 32 * 256 * 8), ("generator", 8 * 256 + 24 * 32 * 256))
    huge = seeded_need(tl, (2 ** 40, 2 ** 40), "float32")
    assert huge.parts[0] == ("shard", 2 ** 39 * 2 ** 38 * 4)  # exact at 2**80 elements


def test_matmul_need_by_hand():
    m = matmul_layouts(((2, 4), (4, 1)), 8, False, False)
    need = matmul_need(m.x, m.w, (40, 80), (80, 16), "float32")
    # x 20 x 20, w 20 x 16; the Allreduce output 20 x 16 (and the product, same size);
    # the check's rows of x (20 x 80) and columns of w (80 x 16) and block, in 4 + 8 bytes.
    assert dict(need.parts) == {"x shard": 1600, "w shard": 1280, "output": 1280,
                                "product or check": 12 * (20 * 80 + 80 * 16 + 20 * 16)}


def test_refusal_is_one_line_with_need_memory_and_the_largest_shape_that_fits():
    m = matmul_layouts(((2, 4), (4, 1)), 8, False, False)
    need_of, dims, multiples = matmul_job_need(m.x, m.w, (400000, 400000), (400000, 400000), "float32")
    assert dims == (400000, 400000, 400000) and multiples == (2, 4, 1)
    budget = Budget(2 * GIB, "MemAvailable 16 GiB over 8 ranks on this node")
    with pytest.raises(ResourceError) as info:
        check_need(need_of(dims), budget, "MatMul", (dims, lambda d: need_of(d).total, multiples), "--shape")
    text = str(info.value)
    assert "\n" not in text and text.startswith("MatMul needs 4 TiB (x shard 74.5 GiB")
    assert "but a rank has 2 GiB (MemAvailable 16 GiB over 8 ranks on this node)" in text
    fits = tuple(int(v) for v in text.split("the largest --shape that fits is ")[1].split(";")[0].split(","))
    assert need_of(fits).total <= budget.bytes
    assert all(f % m_ == 0 for f, m_ in zip(fits, multiples))
    bigger = tuple(f + m_ for f, m_ in zip(fits, multiples))
    assert need_of(bigger).total > budget.bytes  # the next shape of the same proportions does not fit
    check_need(need_of(fits), budget, "MatMul")  # no error
    check_need(need_of(dims), None, "MatMul")  # no budget: no check


def test_largest_fitting_shape_and_sizes():
    area = lambda s: s[0] * s[1]  # noqa: E731
    assert largest_fitting_shape((1000, 100), area, 2500, (10, 1)) == (150, 15)  # (160, 16) is 2,560
    assert largest_fitting_shape((1000, 100), area, 5, (10, 1)) is None
    assert largest_fitting_shape((1000, 0), area, 0, (10, 1)) == (1000, 0)
    assert [format_size(n) for n in (0, 1023, 1536, 3 * GIB // 2, 2 ** 80)] == \
        ["0 B", "1023 B", "1.5 KiB", "1.5 GiB", "1 YiB"]
    assert str(Need((("a", 1024), ("b", 0)))) == "1 KiB (a 1 KiB)"


def test_simulated_ranks_share_the_process_memory_and_refuse_alike(monkeypatch):
    from spmdsim.layouts.datagen import SeededTensor
    from spmdsim.runtime import DTensor, Mesh
    from spmdsim.runtime.sim import simulate

    monkeypatch.delenv("SPMDSIM_MEMORY", raising=False)

    def build(rows: int):
        mesh = Mesh(Layout((4,), ("x",)))
        x = DTensor.from_seeded(mesh, mesh.layout("x", None), SeededTensor((rows, 8), "float64"))
        return x.local.shape

    assert simulate(4, build, 16) == [(4, 8)] * 4
    with pytest.raises(ResourceError, match=r"over 4 ranks on this node\); the largest shape that fits is "):
        simulate(4, build, 2 ** 40)  # 16 TiB per simulated rank: refused before any shard exists
    monkeypatch.setenv("SPMDSIM_MEMORY", "64K")
    with pytest.raises(ResourceError, match=r"SPMDSIM_MEMORY=64K"):
        simulate(4, build, 4 * 4096)


def test_ranks_agree_on_the_budget_and_its_words(monkeypatch):
    """Each rank reads MemAvailable at its own moment: the ranks agree on the least budget and on the words of
    the rank that read it, so a refusal is one line on every rank (the words were each rank's own: 'ranks
    differ: ranks 5-7: ... MemAvailable 22.6 GiB' against 22.7 GiB on the others)."""
    from spmdsim.runtime import budget
    from spmdsim.runtime.sim import simulate

    monkeypatch.delenv("SPMDSIM_MEMORY", raising=False)

    def body():
        import spmdsim

        comm = spmdsim.world()
        return budget.agreed_budget(comm)

    def read(ranks_on_node, env=None):  # rank r reads (24 - r) GiB free, r's words
        import spmdsim

        r = spmdsim.world().rank
        return Budget((24 - r) * GIB // ranks_on_node, f"MemAvailable {24 - r} GiB over {ranks_on_node} ranks")

    monkeypatch.setattr(budget, "budget_per_rank", read)
    got = simulate(4, body)
    assert got == [Budget(21 * GIB // 4, "MemAvailable 21 GiB over 4 ranks")] * 4


def test_an_agreed_budget_goes_with_its_communicator(monkeypatch):
    """The budget agreed on a communicator is kept while it lives, not beyond: a program run again and again on
    simulated ranks (a notebook's cell) leaves no rank's communicator behind (the table held each one, and
    through it its run's whole world, about 300 objects a run of 4 ranks)."""
    import spmdsim
    from spmdsim.runtime import budget
    from spmdsim.runtime.sim import simulate

    monkeypatch.delenv("SPMDSIM_MEMORY", raising=False)
    held = []

    def body():
        comm = spmdsim.world()
        agreed = budget.agreed_budget(comm)
        held.append(weakref.ref(comm))
        return agreed is budget.agreed_budget(comm)  # kept while the communicator lives

    for _ in range(5):
        assert simulate(4, body) == [True] * 4
    gc.collect()
    assert len(held) == 5 * 4 and [ref for ref in held if ref() is not None] == []


def test_a_dry_run_is_not_refused_by_this_machines_memory(monkeypatch):
    """A dry run holds no block (zeros never written): a model sized for a cluster is estimated on a laptop;
    the limit applies to real ranks only, and a bad SPMDSIM_MEMORY is still one line."""
    from spmdsim.layouts.datagen import SeededTensor
    from spmdsim.errors import SpmdsimError
    from spmdsim.runtime import DTensor, Mesh
    from spmdsim.runtime.sim import simulate

    def build(rows: int):
        mesh = Mesh(Layout((4,), ("x",)))
        x = DTensor.from_seeded(mesh, mesh.layout("x", None), SeededTensor((rows, 8), "float64"))
        return x.local.shape

    monkeypatch.delenv("SPMDSIM_MEMORY", raising=False)
    rows = 2 ** 40  # 16 TiB a rank: real ranks refuse it (above), a dry run maps it and writes no page
    assert simulate(4, build, rows, dry_run=True)[0] == (rows // 4, 8)
    monkeypatch.setenv("SPMDSIM_MEMORY", "64K")
    assert simulate(4, build, 4 * 4096, dry_run=True)[0] == (4096, 8)
    with pytest.raises(ResourceError, match=r"SPMDSIM_MEMORY=64K"):
        simulate(4, build, 4 * 4096)
    monkeypatch.setenv("SPMDSIM_MEMORY", "bogus")
    with pytest.raises(SpmdsimError, match="SPMDSIM_MEMORY='bogus' is not a size"):
        simulate(4, build, 16, dry_run=True)


def test_the_demos_refusal_names_no_flag_it_lacks(monkeypatch, capsys):
    """`SPMDSIM_MEMORY=1K spmdsim demo` said "the largest --shape that fits is 8,10,4", a flag the demo does not
    have (`spmdsim run matmul` has it): the demo's refusal now names the shape alone."""
    from spmdsim.tools.cli.main import main

    monkeypatch.setenv("SPMDSIM_MEMORY", "1K")
    assert main(["demo", "--ranks", "8"]) == 2
    err = capsys.readouterr().err
    assert "; the largest shape that fits is " in " ".join(err.split()) and "--shape" not in err, err
