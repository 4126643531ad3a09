"""The same MPI test bodies on both engines: MPI ranks under mpiexec, simulated ranks in the pure pass.

Under ``mpiexec ... pytest --only-mpi`` every test of tests/mpi/ runs on the
MPI world as before. In the plain ``pytest`` pass, the files in SIMULATED run
each test body once per simulated world size (ids ``[sim8]``, ``[sim4]``):
the body runs on every simulated rank (spmdsim.simulate), so `world()` is that
rank's communicator. A fixture that builds something per rank (a mesh) is
written with `per_rank`; under simulation each rank builds its own.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import pytest

__all__ = ["world", "per_rank", "rank_output", "SIMULATED", "SIM_SIZES"]

# The operator, layer, redistribution, network and gradient tests (tests/mpi/), run on both engines.
SIMULATED = frozenset({"test_ops_matmul.py", "test_ops_layers.py", "test_ops_local.py",
                       "test_redistribute.py", "test_networks.py", "test_train_grads.py",
                       "test_train_layers.py", "test_train_network.py", "test_uneven_mpi.py"})
SIM_SIZES = (8, 4)


def world() -> Any:
    """The running rank's communicator: MPI.COMM_WORLD, or a simulated rank's."""
    import spmdsim

    return spmdsim.world()


def rank_output(capsys: Any) -> str:
    """What this rank printed to stdout; under simulation the ranks share one stream, so rank 0 gets it all.

    Collective under simulation (two barriers), so every rank calls it.
    """
    from spmdsim.runtime.sim import current_rank

    if current_rank() is None:
        return capsys.readouterr().out
    comm = world()
    comm.Barrier()  # every rank has printed
    out = capsys.readouterr().out if comm.rank == 0 else ""
    comm.Barrier()
    return out


class _PerRank:
    """A fixture value that each simulated rank builds for itself (see `per_rank`)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory


def per_rank(factory: Callable[[], Any]) -> Any:
    """A fixture from a generator function that builds its value on each rank (a mesh, say)."""

    def fixture(engine: str) -> Any:
        if engine == "mpi":
            yield from factory()
        else:
            yield _PerRank(factory)

    fixture.__doc__ = factory.__doc__
    return pytest.fixture(name=factory.__name__)(fixture)


def mpi_requested(config: pytest.Config) -> bool:
    """Whether pytest runs under MPI (--with-mpi or --only-mpi); tests/conftest.py asks it too."""
    for flag in ("--with-mpi", "--only-mpi"):
        try:
            if config.getoption(flag):
                return True
        except ValueError:
            pass
    return False


def _simulated_file(path: Any) -> bool:
    return Path(str(path)).name in SIMULATED


def parametrize(metafunc: pytest.Metafunc) -> None:
    """In the pure pass, run each test of a SIMULATED file on every simulated world size."""
    if ("engine" in metafunc.fixturenames and not mpi_requested(metafunc.config)
            and _simulated_file(metafunc.definition.path)):
        metafunc.parametrize("engine", [f"sim{n}" for n in SIM_SIZES], indirect=True,
                             ids=[f"sim{n}" for n in SIM_SIZES])


def unskip(config: pytest.Config, items: list) -> None:
    """Keep pytest-mpi from skipping the simulated runs in the pure pass (they need no mpiexec)."""
    if mpi_requested(config):
        return
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if str(params.get("engine", "")).startswith("sim"):
            item.own_markers[:] = [m for m in item.own_markers
                                   if not (m.name == "skip" and "with-mpi" in str(m.kwargs.get("reason")))]


def call(item: pytest.Function) -> Any:
    """Run a simulated item's body on every simulated rank; None lets pytest call it as usual."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    engine = str(params.get("engine", "mpi"))
    if not engine.startswith("sim"):
        return None
    from spmdsim import simulate

    names = item._fixtureinfo.argnames
    shared = {name: item.funcargs[name] for name in names}
    simulate(int(engine[3:]), _on_rank, item.obj, shared)
    return True


def _on_rank(test: Callable, shared: dict) -> None:
    args, opened = {}, []
    for name, value in shared.items():
        if isinstance(value, _PerRank):
            gen = value.factory()
            args[name] = next(gen) if inspect.isgenerator(gen) else gen
            opened.append(gen)
        else:
            args[name] = value
    test(**args)
    for gen in opened:  # teardown on success only, as pytest's fixtures of a failed rank never close
        if inspect.isgenerator(gen):
            next(gen, None)
