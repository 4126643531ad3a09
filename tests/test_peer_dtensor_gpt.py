"""scripts/peer_dtensor_gpt.py, bench_gpt's PyTorch peer: one line without torch, the same GPT with it.

Pure (plain pytest, one process): without torch (hidden from the script) it says
how to install it in one line; with torch, its model's first losses equal
spmdsim.models.gpt.reference's (float64, same parameters and dropout masks).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
from spmdsim.models.gpt.reference import Trainer
from testkit import load_script

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "peer_dtensor_gpt.py"
# The script ends in sys.exit(main()) when run as __main__.
_HIDE_TORCH = "import sys, runpy; sys.modules['torch'] = None; sys.argv = {argv!r}; " \
              "runpy.run_path({path!r}, run_name='__main__')"


def _run_without_torch(*args: str) -> subprocess.CompletedProcess:
    code = _HIDE_TORCH.format(argv=[str(_SCRIPT), *args], path=str(_SCRIPT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def peer():
    return load_script(_SCRIPT, "spmdsim_script_peer_dtensor_gpt")


def test_without_torch_the_peer_says_how_to_install_it_in_one_line(peer):
    done = _run_without_torch("--dp", "1", "--tp", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [peer.MISSING]
    assert "pip install -e '.[bench]'" in peer.MISSING
    assert "Traceback" not in done.stderr


def test_without_torch_bench_gpt_reads_the_same_line():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, {d!r}); "
            "import peer_dtensor_gpt as p; print(p.missing())").format(d=str(_SCRIPT.parent))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("PyTorch DTensor: not installed (pip install")


@pytest.mark.parametrize("argv, expected", [
    (["--dp", "2"], "--dp 2 x --tp 4 is 8 ranks; mpiexec started 1"),
    (["--tp", "1", "--dp", "1", "--seq", "0"], "--seq 0 must be at least 1"),
])
def test_a_mesh_that_cannot_run_is_one_line_before_torch(argv, expected):
    done = _run_without_torch(*argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].endswith(expected), done.stderr
    assert "Traceback" not in done.stderr


def test_the_names_map_onto_the_torch_model(peer):
    assert peer._torch_name("h3.attn.wq") == "h.3.attn.wq.weight"
    assert peer._torch_name("h0.attn.bo") == "h.0.attn.wo.bias"
    assert peer._torch_name("h1.mlp.b1") == "h.1.mlp.w1.bias"
    assert peer._torch_name("h2.ln2.b") == "h.2.ln2.bias"
    assert peer._torch_name("lnf.w") == "lnf.weight"
    assert peer._torch_name("wpe") == "wpe"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (pip install -e '.[bench]')")
def test_the_torch_gpt_loses_what_the_reference_loses(peer):
    """Steps 0 and 1 (step 1 after the backward and AdamW) equal the numpy reference's, to 1e-10."""
    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=4)
    trainer = Trainer(cfg, encode(load_text()))
    expected = [trainer.step()[0] for _ in range(2)]
    got = peer.single_process_losses(cfg, 2)
    assert got == pytest.approx(expected, abs=1e-10, rel=0)
    assert got[1] < got[0]  # it trained: the update changed the loss, as the reference's did


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (pip install -e '.[bench]')")
def test_the_torch_gpt_holds_spmdsims_initial_parameters(peer):
    import torch

    from spmdsim.models.gpt.reference import init_params

    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=2)
    params = init_params(cfg)
    model = peer.build(cfg, params)
    assert model.head.weight is model.wte.weight  # tied
    assert torch.equal(model.h[0].attn.wq.weight, torch.from_numpy(params["h0.attn.wq"].T))
    assert model.h[0].attn.wk.bias is None  # no key bias
    assert sum(p.numel() for p in model.parameters()) == sum(a.size for a in params.values())
    x, _ = batch(encode(load_text()), cfg, 0)
    assert x.shape == (2, 16)
