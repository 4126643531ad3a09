"""Engines (spmdsim.runtime.engines): which engine a mesh runs on, simulations side by side, the dry engine."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import importkit
import spmdsim
from docs_commands import run_here
from spmdsim.base import context
from spmdsim.runtime.engines import MPI, engine_of
from spmdsim.runtime.sim import SimulationError
from testkit import run_train_gpt, unfold

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_mesh_runs_on_its_communicators_engine():
    from spmdsim.runtime import Mesh
    from spmdsim.runtime.sim.dry import DRY
    from spmdsim.runtime.sim.thread_engine import THREADS

    def body():
        mesh = Mesh(spmdsim.Layout((2, 2), ("a", "b")))
        sub = mesh.group("b")
        return mesh.engine, engine_of(sub), sub.Get_size(), context.current().rank

    real = spmdsim.simulate(4, body)
    assert real == [(THREADS, THREADS, 2, r) for r in range(4)]
    dry = spmdsim.simulate(4, body, dry_run=True)
    assert list(dry) == [(DRY, DRY, 2, 0)] * 4  # one rank, rank 0, runs for all
    assert context.current() is context.PROCESS and context.simulated() is None  # left on return
    assert engine_of(object()) is MPI and context.PROCESS.engine is MPI


def test_two_simulations_run_side_by_side_each_with_its_own_traces():
    """Two threads each run a simulation; rank 0 of each waits for the other's rank 0, so both are
    inside their collectives at once. Every rank's trace holds its own run's calls only."""
    from spmdsim.runtime import Mesh, allgather, allreduce, collect_trace

    both_in = threading.Barrier(2, timeout=60)

    def body(size, rounds):
        mesh = Mesh(spmdsim.Layout((size,), ("x",)))
        with collect_trace() as trace:
            if mesh.rank == 0:
                both_in.wait()
            total = 0.0
            for i in range(rounds):
                total += float(allreduce(mesh, np.full(3, mesh.rank + i, np.float64), "x")[0])
            gathered = allgather(mesh, np.array([mesh.rank]), "x", 0)
        return total, gathered.tolist(), [(e.op, e.group_size) for e in trace.entries]

    out = {}
    threads = [threading.Thread(target=lambda n=n, k=k: out.__setitem__(n, spmdsim.simulate(n, body, n, k)))
               for n, k in ((4, 5), (2, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == {4, 2}
    for n, rounds in ((4, 5), (2, 3)):
        expected_total = sum(sum(r + i for r in range(n)) for i in range(rounds))
        assert out[n] == [(expected_total, list(range(n)),
                           [("allreduce", n)] * rounds + [("allgather", n)])] * n


def test_a_simulated_rank_cannot_start_another_simulation():
    def inner():
        return spmdsim.simulate(2, lambda: 1)

    with pytest.raises(SimulationError, match="already running"):
        spmdsim.simulate(2, inner)


def test_the_dry_run_of_a_gpt_step_moves_what_the_real_run_moves_on_every_rank():
    """8 ranks, dp 2 x tp 4 with sequence parallelism: the dry run's per-rank bytes and calls are the
    real simulated run's, read from each rank's own trace."""
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.train import train
    from spmdsim.runtime import collect_trace

    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=4, vocab=48)
    ids = np.arange(4000) % cfg.vocab

    def body():
        with collect_trace() as trace:
            train(cfg, spmdsim.world(), 2, 4, 1, ids, sp=True, check=False)
        totals = trace.totals()
        return totals["calls"], totals["bytes_sent"], totals["bytes_received"]

    real = spmdsim.simulate(8, body)
    dry = spmdsim.simulate(8, body, dry_run=True)
    assert [(r.calls, r.bytes_sent, r.bytes_received) for r in dry.report.ranks] == real
    assert real[0][1] > 0


def test_a_dry_run_at_16384_ranks_fits_in_2_gib():
    """The GPT example's training step, one rank for 16,384, under a 2 GiB address-space cap."""
    out = run_train_gpt(["--ranks", "16384", "--dry-run", "--steps", "1", "--tp", "4", "--batch", "4096"],
                        before="resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[1] == "dry run on 16384 simulated ranks (no data; bytes from the trace)"
    assert lines[3].startswith("ranks 0-16383 ") and "allreduce x23" in lines[3]


def _imports(path: pathlib.Path) -> set[str]:
    """Every spmdsim module a file of the package imports (top level or inside functions), as dotted names (from
    the syntax tree the tests that read the package share: importkit.tree_of)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(importkit.tree_of(path)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {n for n in found if n.startswith("spmdsim")}


@pytest.mark.parametrize("where",
                         ["spmdsim/runtime", "spmdsim/nn/ops", "spmdsim/nn/autograd", "spmdsim/layouts/datagen.py",
                          "spmdsim/layouts/counters.py"])
def test_the_runtime_ops_autograd_and_datagen_do_not_ask_which_engine_they_run_on(where):
    """They ask the mesh's engine or the running rank's context, never the simulator's internals."""
    files = [ROOT / where] if where.endswith(".py") else sorted((ROOT / where).glob("*.py"))
    for path in files:
        text = path.read_text()
        for word in ("SimComm", "_sim_local", "RUNNING"):
            assert word not in text, f"{path.relative_to(ROOT)} mentions {word}"
        asked = {n for n in _imports(path) if n.startswith(("spmdsim.runtime.sim.run", "spmdsim.emulator",
                                                              "spmdsim.runtime.sim.dry", "spmdsim.runtime.sim.engine"))}
        assert not asked, f"{path.relative_to(ROOT)} imports {sorted(asked)}"


def _package(module: str) -> str | None:
    """spmdsim.a.b -> "a" when spmdsim/a is a package; None for the top package's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (ROOT / "spmdsim" / parts[1] / "__init__.py").exists() else None


def test_no_import_cycle_between_spmdsims_packages():
    """Packages import downwards (docs/explanation/architecture.md): with every import counted, function-level ones
    too, the graph of packages has no cycle. DTensor's operators reach ops and autograd through the table
    spmdsim.nn.ops fills (ops/methods.py), not by an import from the runtime."""
    edges: dict[str, set[str]] = {}
    for path in sorted((ROOT / "spmdsim").rglob("*.py")):
        here = _package(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if here is None:
            continue
        for name in _imports(path):
            there = _package(name)
            if there is not None and there != here:
                edges.setdefault(here, set()).add(there)
    assert edges["runtime"] and "runtime" in edges["nn"]  # the scan sees imports at all

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cycles = sorted(p for p in edges if reaches(p, p, set()))
    assert not cycles, f"packages on an import cycle: {cycles}"


def test_dtensor_operators_come_with_spmdsim_ops():
    """The runtime alone gives its DTensor no operators (one line says where they are); the front door's
    DTensor has them."""
    code = ("import numpy as np\n"
            "from spmdsim.runtime.dtensor import DTensor\n"
            "from spmdsim.layouts.layout import Layout\n"
            "from spmdsim.errors import OperatorError\n"
            "try:\n"
            "    DTensor.__add__(None, 1)\n"
            "except OperatorError as e:\n"
            "    print(e)\n"
            "import spmdsim\n"
            "assert spmdsim.DTensor is DTensor\n"
            "print(DTensor.__add__.__name__, 'spmdsim.nn.ops' in __import__('sys').modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "DTensor's operators and autograd come with spmdsim.nn.ops, which is not loaded: import spmdsim.nn.ops "
        "(or take DTensor from spmdsim) before using pointwise", "__add__ True"]


def test_a_dry_run_refuses_point_to_point_in_one_line(tmp_path):
    """One rank runs for all: a message from another rank cannot be had, so the call is refused."""
    def body():
        comm = spmdsim.world()
        assert comm.allgather(comm.rank) == [0, 0, 0, 0]  # object collectives: as rank 0 sees them
        assert comm.scatter([5, 6, 7, 8]) == 5 and comm.alltoall(list('abcd')) == ['a'] * 4
        comm.send(1, dest=1)

    with pytest.raises(SimulationError, match=r"^comm\.send in a dry run: one rank runs for all"):
        spmdsim.simulate(4, body, dry_run=True)
    script = tmp_path / "split.py"
    script.write_text("import spmdsim\nspmdsim.script(__file__)\nspmdsim.world().Split(0, 0)\n")
    code, _, err = run_here(str(script), ["--ranks", "2", "--dry-run"])  # as `python split.py ...`, in process
    assert code == 2 and unfold(err).strip().splitlines() == [
        "spmdsim: error: comm.Split in a dry run: one rank runs for all, so it cannot take the other ranks' "
        "part; use the runtime's collectives on a Mesh, or run without --dry-run"]


def test_a_dry_runs_memory_check_is_one_ranks(capsys):
    """Only rank 0's blocks exist in a dry run: the memory check gives it the machine, not 1/16384 of it
    (a (4096, 4096) shard plan at 16,384 ranks was refused at 1.35 MiB a rank)."""
    from spmdsim.tools.cli.main import main

    argv = ["run", "matmul", "--strategy", "((128,128),(128,1))", "--shape", "4096,4096,4096", "--ranks", "16384",
            "--dry-run"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].split()[:4] == ["ranks", "0-16383", "1", "1,040,384"] and "allreduce x1" in lines[-1]


#: A communicator's transfer methods, mpi4py's names (docs/explanation/architecture.md, "The path of a byte").
TRANSFER_CALL = (r"\.(Allreduce|Allgather|Alltoallv?|Reduce_scatter|Bcast|Send|Recv|Isend|Irecv|Sendrecv|"
                 r"allreduce|allgather|bcast|gather|alltoall)\(")


def test_only_the_mpi_engine_and_the_emulator_call_a_communicators_transfer_methods():
    """The command docs/explanation/architecture.md shows: every call of a communicator's transfer method in the package
    is in the MPI engine's module or the mpi4py emulator's package (and one line of prose about x.gather())."""
    out = subprocess.run(["grep", "-rnE", "--include=*.py", TRANSFER_CALL, "spmdsim"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    # spmdsim's own collectives called through their kernels namespace (`KERNELS.allreduce(...)`,
    # spmdsim.runtime.replay.kernels) are no communicator's method: the doc's second grep leaves them out
    lines = [line for line in out.stdout.splitlines() if "KERNELS." not in line]
    assert len(lines) < len(out.stdout.splitlines())  # (the executor's runners call them so)
    files = {line.split(":", 1)[0] for line in lines}
    assert "spmdsim/runtime/engines/mpi.py" in files  # the scan sees calls at all
    # (the lab's exercises are students' mpi4py programs, their reference solutions run by the emulator)
    strays = sorted(f for f in files if f != "spmdsim/runtime/engines/mpi.py"
                    and not f.startswith(("spmdsim/emulator/", "spmdsim/tools/lab/exercises/")))
    assert strays == ["spmdsim/nn/ops/methods.py", "spmdsim/runtime/dtensor_build.py",
                      "spmdsim/runtime/dtensor_methods.py", "spmdsim/tools/cli/helptext.py"], strays
    prose = [line for line in lines if line.startswith("spmdsim/nn/ops/methods.py")]
    assert len(prose) == 1 and "x.gather() makes the whole array" in prose[0]
    prose = [line for line in lines if line.startswith("spmdsim/runtime/dtensor_build.py")]  # y.full()'s refusal
    assert len(prose) == 1 and "the whole tensor of x is x.gather()" in prose[0]
    prose = [line for line in lines if line.startswith("spmdsim/runtime/dtensor_methods.py")]  # full_tensor()'s line
    assert len(prose) == 1 and '"full_tensor()": ("PyTorch DTensor\'s", "x.gather(), the whole tensor' in prose[0]
    example = [line for line in lines if line.startswith("spmdsim/tools/cli/helptext.py")]  # mpirun's --help
    assert len(example) == 1 and '"mpirun": \'spmdsim mpirun -n 4 -c "from mpi4py import MPI;' in example[0]
    shown = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    assert f'$ grep -rnE "{TRANSFER_CALL}" spmdsim | grep -v "KERNELS\\."' in shown  # the docs show this command


@pytest.mark.parametrize("where",
                         ["spmdsim/runtime", "spmdsim/runtime/engines", "spmdsim/runtime/sim", "spmdsim/nn/ops",
                          "spmdsim/nn/autograd", "spmdsim/tools/cli", "spmdsim/tools/autoshard", "spmdsim/models/nets",
                          "spmdsim/models/gpt"])
def test_spmdsim_never_imports_the_mpi4py_emulator(where):
    """The emulator runs users' own mpi4py programs (spmdsim.world(), spmdsim mpirun); spmdsim's own code runs
    on the thread engine and imports it nowhere, function-level imports included. The CLI's mpirun command
    and the front door's `world` name it by string, loaded when used."""
    for path in sorted((ROOT / where).glob("*.py")):
        asked = {n for n in _imports(path) if n.startswith("spmdsim.emulator")}
        if path.relative_to(ROOT).as_posix() == "spmdsim/tools/cli/mpirun.py":
            assert asked == {"spmdsim.emulator.mpirun", "spmdsim.emulator.mpirun.add_arguments",
                             "spmdsim.emulator.mpirun.run"}
            continue
        assert not asked, f"{path.relative_to(ROOT)} imports {sorted(asked)}"


def test_the_thread_engine_runs_every_transfer_as_mpi_defines_it():
    """Each transfer of the thread engine on 4 simulated ranks (tests/enginekit.py)."""
    from enginekit import check_transfers, run_transfers

    results = spmdsim.simulate(4, lambda: run_transfers(spmdsim.world()))
    for r, out in enumerate(results):
        check_transfers(out, r, 4)
    results = spmdsim.simulate(4, lambda: run_transfers(context.current().comm))  # the runtime's world
    for r, out in enumerate(results):
        check_transfers(out, r, 4)


def test_text_moves_and_every_engine_refuses_the_same_dtypes_with_one_line():
    """The body tests/mpi/test_engine_transfers.py runs under mpiexec (tests/enginekit.py), on simulated ranks
    and in a dry run: text moves through every collective that moves data; a complex (or bool, or text) max,
    which MPI refuses, was numpy's maximum here: now the same DTypeError line as under MPI."""
    from enginekit import check_dtypes, run_dtypes

    for r, out in enumerate(spmdsim.simulate(4, lambda: run_dtypes(spmdsim.world()))):
        check_dtypes(out, r, 4)
    for r, out in enumerate(spmdsim.simulate(4, lambda: run_dtypes(spmdsim.world()), dry_run=True)):
        check_dtypes(out, r, 4, moved=False)


def test_the_dry_engine_counts_every_buffer_a_transfer_holds_and_moves_nothing():
    """One rank for all: results as if every member sent this rank's buffer; each buffer counted as held."""
    from spmdsim.runtime.sim.dry import DRY, DryComm

    def body() -> tuple:
        from spmdsim.runtime.engines import current

        comm = DryComm(4, 1, "test")
        x = np.arange(3.0)
        gathered, summed = np.empty(12), np.empty(3)
        DRY.all_gather(comm, x, gathered, None)
        DRY.all_reduce(comm, x, summed, "sum", None)
        request = DRY.isend(comm, np.ones(5), 0, 1)  # the runtime's messages (a pipeline's): counted, done
        request.Wait()
        return gathered, summed, current().meter.peak, DRY.all_gather_object(comm, "a")

    gathered, summed, peak, objects = spmdsim.simulate(4, body, dry_run=True)[0]
    assert np.array_equal(gathered, np.tile(np.arange(3.0), 4)) and np.array_equal(summed, np.arange(3.0))
    assert peak >= (3 + 12 + 3 + 5) * 8 and objects == ["a"] * 4


def _dtype_refusals(groups: tuple) -> list:
    """On a rank: what each collective says of each dtype MPI cannot take, on meshes whose groups are of
    `groups` ranks (a group of one checks alike), then the dtypes it takes."""
    from spmdsim.errors import DTypeError
    from spmdsim.runtime import Mesh, allgather, allreduce, alltoall, alltoallv, bcast, prepare_allreduce
    from spmdsim.runtime import reduce_scatter

    said = []
    for g in groups:
        mesh = Mesh(spmdsim.Layout((4 // g, g), ("dp", "mp")))
        calls = {"allreduce": lambda a: allreduce(mesh, a, "mp"),
                 "reduce_scatter": lambda a: reduce_scatter(mesh, a, "mp", 0),
                 "allgather": lambda a: allgather(mesh, a, "mp", 0),
                 "alltoall": lambda a: alltoall(mesh, a, "mp", 0, 0),
                 "bcast": lambda a: bcast(mesh, a, "mp", 0),
                 "prepared allreduce": lambda a: prepare_allreduce(mesh, a, "mp").run(),
                 "alltoallv": lambda a: alltoallv(mesh, {(mesh.rank + 1) % 4: a}, {(mesh.rank - 1) % 4: a.shape},
                                                  a.dtype)}
        for dtype in (bool, "<U1", object, ">f8"):
            for op, call in calls.items():
                for _ in range(2):  # a refused dtype is refused again (never taken into the cache)
                    try:
                        call(np.zeros(4, dtype=dtype))
                    except DTypeError as exc:
                        said.append((g, np.dtype(dtype).str, op, str(exc)))
                    else:
                        said.append((g, np.dtype(dtype).str, op, "taken"))
    mesh = Mesh(spmdsim.Layout((2, 2), ("dp", "mp")))  # bool still moves; a sum still sums
    flags = allgather(mesh, np.array([mesh.rank % 2 == 0]), "mp", 0)
    return said, flags.tolist(), allreduce(mesh, np.arange(2) + mesh.rank, "mp").tolist()


def test_every_engine_refuses_the_dtypes_mpi_refuses_with_mpis_message():
    """The thread and dry engines take any dtype: a bool allreduce returned its inputs' OR, a str "sum" its
    input, an object or big-endian allgather its blocks, where under MPI the same program exits 2 with one
    line. The door checks the dtype before any engine's transfer now (only SPMDSIM_CHECK=1 did), and alltoallv
    before its kept send buffer is viewed as the dtype (an object array's raised numpy's "TypeError: Cannot change
    data-type for array of references")."""
    sums = "cannot sum dtype '{}'; expected an integer, float or complex dtype (bool and text can be moved, not summed)"
    said = {"|b1": sums.format("bool"), "<U1": sums.format("str32"),
            "|O": "MPI cannot send dtype '|O' (object); expected a numeric dtype: bool, int8..int64, uint8..uint64, "
                  "float16..float64, complex64, complex128",
            ">f8": "dtype '>f8' is not in native byte order; convert the array with .astype('float64') first"}
    want = []
    for g in (2, 1):
        for dtype, text in said.items():
            for op in ("allreduce", "reduce_scatter", "allgather", "alltoall", "bcast", "prepared allreduce",
                       "alltoallv"):
                moves = op not in ("allreduce", "reduce_scatter", "prepared allreduce")
                refused = not (moves and dtype in ("|b1", "<U1"))
                name = "allreduce" if op == "prepared allreduce" else op
                line = text + ("; or text (numpy's S or U dtypes)" if moves and dtype == "|O" else "")
                want += [(g, dtype, op, f"{name}: {line}" if refused else "taken")] * 2
    for results in (spmdsim.simulate(4, _dtype_refusals, (2, 1)),
                    spmdsim.simulate(4, _dtype_refusals, (2, 1), dry_run=True)):
        dry = isinstance(results, spmdsim.runtime.sim.run.DryRunResults)
        for rank, (got, flags, sums_) in enumerate(results):
            assert got == want
            if not dry:
                pair = 2 * (rank // 2)  # the ranks of its "mp" group: pair, pair + 1
                assert flags == [True, False] and sums_ == [2 * pair + 1, 2 * pair + 3]


def _object_refusals() -> list[str]:
    from spmdsim.errors import DTypeError
    from spmdsim.runtime import Mesh, allgather, alltoall, reduce_scatter

    mesh = Mesh(spmdsim.Layout((2,), ("x",)))
    said = []
    for call in (lambda a: allgather(mesh, a, "x", -1), lambda a: allgather(mesh, a, "x", 1),
                 lambda a: alltoall(mesh, a, "x", 0, 1), lambda a: alltoall(mesh, a, "x", 1, 0),
                 lambda a: reduce_scatter(mesh, a, "x", 1)):
        try:
            call(np.zeros((4, 4), dtype=object))
        except DTypeError as exc:
            said.append(str(exc))
    return said


def test_an_object_array_is_refused_along_any_dim_in_one_line():
    """Along a dim other than 0 the blocks are packed in the mesh's kept buffers, viewed as the array's dtype:
    an object array's raised numpy's "TypeError: Cannot change data-type for array of references" there,
    before the door's check. The dtype is checked first now, the same line as along dim 0."""
    sends = "MPI cannot send dtype '|O' (object); expected a numeric dtype: bool, int8..int64, uint8..uint64, " \
            "float16..float64, complex64, complex128"
    want = [f"allgather: {sends}; or text (numpy's S or U dtypes)"] * 2 + [
        f"alltoall: {sends}; or text (numpy's S or U dtypes)"] * 2 + [f"reduce_scatter: {sends}"]
    for results in (spmdsim.simulate(2, _object_refusals), spmdsim.simulate(2, _object_refusals, dry_run=True)):
        assert [list(r) for r in results] == [want, want]


def _long_double_refusals(groups: tuple) -> list:
    """On a rank: what each raw collective says of numpy's long doubles, on meshes whose groups are of `groups`
    ranks (a group of one checks alike)."""
    from spmdsim.errors import DTypeError
    from spmdsim.runtime import Mesh, allgather, allreduce, alltoall, alltoallv, bcast, prepare_allreduce
    from spmdsim.runtime import reduce_scatter

    said = []
    for g in groups:
        mesh = Mesh(spmdsim.Layout((2 // g, g), ("dp", "mp")))
        for dtype in (np.longdouble, np.clongdouble):
            for call in (lambda a: allreduce(mesh, a, "mp"), lambda a: allreduce(mesh, a.real, "mp", op="max"),
                         lambda a: reduce_scatter(mesh, a, "mp", 0), lambda a: allgather(mesh, a, "mp", 1),
                         lambda a: alltoall(mesh, a, "mp", 0, 1), lambda a: bcast(mesh, a, "mp", 0),
                         lambda a: prepare_allreduce(mesh, a, "mp").run(),
                         lambda a: alltoallv(mesh, {1 - mesh.rank: a}, {1 - mesh.rank: a.shape}, a.dtype)):
                try:
                    call(np.zeros((2, 2), dtype=dtype))
                except DTypeError as exc:
                    said.append(str(exc))
                else:
                    said.append("taken")
    return said


def test_the_raw_collectives_refuse_a_long_double_as_a_tensor_does():
    """Tensors refused float128 and complex256 (spmdsim.base.validate.dtype_arg: their width and padding bytes
    differ between processes), the raw collectives took them. They say the same line now, on every engine."""
    line = ("dtype '{}' ({}) is numpy's long double, whose width and padding bytes differ between machines and "
            "processes; expected one of bool, int8..int64, uint8..uint64, float16..float64, complex64, complex128: "
            "convert it with .astype('{}')")
    real, whole = np.dtype(np.longdouble), np.dtype(np.clongdouble)
    ops = ("allreduce", "allreduce", "reduce_scatter", "allgather", "alltoall", "bcast", "allreduce", "alltoallv")
    want = [f"{op}: {line.format(real.str, real.name, 'float64')}" for op in ops]
    want += [f"{op}: {line.format(whole.str, whole.name, 'complex128')}" for op in ops]
    want[len(ops) + 1] = want[1]  # (the max of its real part)
    for results in (spmdsim.simulate(2, _long_double_refusals, (2, 1)),
                    spmdsim.simulate(2, _long_double_refusals, (2, 1), dry_run=True)):
        assert [list(r) for r in results] == [want * 2] * 2


_KEPT_GRAPH = """
import numpy as np
from mpi4py import MPI
from spmdsim import Layout, Mesh
from spmdsim.runtime.door import point_to_point
from spmdsim.runtime.replay import capture

mesh = Mesh(Layout((1,), ("pp",)), MPI.COMM_WORLD)
got, mine = np.empty(2), np.arange(2.0)
graph = capture(lambda: point_to_point(mesh, MPI.COMM_WORLD, ("pp",), [(got, 0, 3)], [(mine, 0, 3)], "self"))
mine += 1
graph()
print(got.tolist(), flush=True)
"""


def test_a_captured_groups_persistent_requests_are_freed_when_the_graph_lives_to_the_end():
    """One MPI process captures a message to itself (the door binds it: MPI's persistent requests) and keeps
    the graph to the end: the requests are freed as the interpreter shuts down, before MPI finalizes
    (MPICH prints a line per persistent request left inactive at MPI_Finalize)."""
    out = subprocess.run([sys.executable, "-c", _KEPT_GRAPH], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[1.0, 2.0]\n"
    assert "persistent request" not in out.stderr and out.stderr == "", out.stderr
