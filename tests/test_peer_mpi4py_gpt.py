"""scripts/peer_mpi4py_gpt.py, bench_gpt's hand-written numpy + mpi4py peer: the same step as the reference.

At 8 ranks (dp 2 x tp 4, sequence parallel) on a 1-layer GPT, its losses, its
gradients and its parameters after two steps equal spmdsim.models.gpt.reference's
(float64, spmdsim's dropout masks; and with dropout 0 on blocking calls), in
spmdsim's 17 collectives; a mesh it cannot run is one line; its step imports
no spmdsim; its pieces (shards, polite wait) are checked in one process.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spmdsim.models.gpt import GPTConfig, param_specs
from spmdsim.models.gpt.reference import init_params
from testkit import MPIEXEC, load_script, mpi_batch

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SCRIPT = _SCRIPTS / "peer_mpi4py_gpt.py"
_SMALL = ["--layers", "1", "--d-model", "32", "--seq", "16"]


@pytest.fixture(scope="module")
def peer():
    """The step's module (numpy and mpi4py only)."""
    return load_script(_SCRIPTS / "_peer_mpi4py_step.py", "spmdsim_script_peer_mpi4py_step")


_AT_8 = {"polite": "0.1", "busy": "0"}  # --wait: --dropout


@pytest.fixture(scope="module")
def at_8_ranks() -> dict:
    """{wait: the RESULT rank 0 printed} of `mpiexec -n 8 python scripts/peer_mpi4py_gpt.py ... --wait WAIT` for each
    of _AT_8, both run by one mpiexec job (testkit.mpi_batch: a launch of 8 ranks is most of such a run's cost)."""
    args = [*_SMALL, "--check", "2", "--steps", "1"]
    programs = [(wait, _SCRIPT, [*args, "--wait", wait, "--dropout", dropout]) for wait, dropout in _AT_8.items()]
    found = mpi_batch(programs, 8, timeout=240)
    got = {}
    for wait, (codes, out) in found.items():
        assert codes == [0] * 8, (wait, codes, out)
        results = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
        assert len(results) == 1, out  # rank 0 only
        got[wait] = json.loads(results[0])
    return got


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
@pytest.mark.parametrize("wait", list(_AT_8))
def test_at_8_ranks_the_hand_written_step_is_the_references(wait, at_8_ranks):
    """Losses of steps 0 and 1, step 1's gradients and the parameters after it, within 1e-10."""
    got = at_8_ranks[wait]
    assert got["wait"] == wait
    assert len(got["losses"]) == len(got["reference"]) == 2
    assert got["losses"] == pytest.approx(got["reference"], abs=1e-10, rel=0)
    assert got["losses"][0] != got["losses"][1]  # two batches, and an update between them
    assert 0 <= got["grad_error"] <= 1e-10, got
    assert 0 <= got["param_error"] <= 1e-10, got
    # spmdsim's collectives for one layer: 6 forward, 3 in the loss, 6 backward, 2 gradient sums
    assert got["calls"] == 17
    assert 0 < got["collectives"] < got["step"] and 0 <= got["arrived"] <= got["collectives"]
    assert got["cpu"] > 0


def test_a_mesh_that_cannot_run_is_one_line(tmp_path):
    from testkit import run_scripts

    cases = ((["--dp", "2", "--tp", "4"], "--dp 2 x --tp 4 is 8 ranks; mpiexec started 1"),
             (["--dp", "1", "--tp", "1", "--dropout", "1.5"],
              "GPTConfig dropout 1.5 must be a finite number in [0, 1)"),
             (["--dp", "1", "--tp", "1", "--seq", "0"], "--seq 0 must be at least 1"))
    # in turn by one interpreter where they can be, each as a fresh interpreter runs it
    for (argv, expected), done in zip(cases, run_scripts([(_SCRIPT, argv) for argv, _ in cases], tmp_path)):
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines()[-1].endswith(expected), done.stderr
        assert "Traceback" not in done.stderr


def test_one_rank_runs_the_unsplit_model():
    """dp 1 x tp 1 in this process (no mpiexec): one replica holding every parameter whole."""
    done = subprocess.run([sys.executable, str(_SCRIPT), *_SMALL, "--dp", "1", "--tp", "1", "--check", "1",
                           "--steps", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1][7:])
    assert got["losses"] == pytest.approx(got["reference"], abs=1e-10, rel=0)
    assert got["grad_error"] <= 1e-10 and got["param_error"] <= 1e-10


def test_the_shards_tile_every_parameter(peer):
    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16)
    params = init_params(cfg)
    for spec in param_specs(cfg):
        blocks = [peer.shard(spec.name, params[spec.name], t, 4) for t in range(4)]
        dim = peer.split_dim(spec.name)
        whole = blocks[0] if dim is None else np.concatenate(blocks, axis=dim)
        assert np.array_equal(whole, params[spec.name]), spec.name
        if dim is not None:
            assert blocks[0].shape[dim] * 4 == spec.shape[dim] and blocks[0].flags.c_contiguous


def test_the_step_imports_no_spmdsim():
    code = ("import sys; sys.path.insert(0, {d!r}); import _peer_mpi4py_step; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'spmdsim'))").format(d=str(_SCRIPTS))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_its_polite_wait_is_spmdsims(peer):
    from spmdsim.runtime.engines import wait

    names = ("_YIELD_S", "_SLEEP_MIN_S", "_SLEEP_MAX_S", "_LONG_S", "_LONG_SLEEP_MAX_S")
    assert [getattr(peer, name) for name in names] == [getattr(wait, name) for name in names]

    class Request:  # done on the fifth poll
        polls = 0

        def Test(self) -> bool:
            self.polls += 1
            return self.polls == 5

    request = Request()
    peer._polite(request)
    assert request.polls == 5
