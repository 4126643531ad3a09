"""The optimizers' dry path (spmdsim.nn.optim, spmdsim.runtime.sim.dry): a dry run's step allocates no state and
computes nothing, and the bytes the states would hold are counted on the run's meter, so the report's peak includes
them; the real path is untouched (tests/test_optim_fused.py)."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.base.context import current
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import train
from spmdsim.nn.optim import SGD, Adam, AdamW
from testkit import run_train_gpt


def _gpt_bytes_per_rank(cfg: GPTConfig, tp: int, sp: bool) -> int:
    """One rank's parameter bytes (float64) under Megatron's splits, from the shapes (spmdsim.models.gpt.params):
    wte split by rows over tp, wpe too with sp; wq, wk, wv, wo, w1, w2 split over tp, and the biases bq, bv,
    b1 with them; bo, b2 and the four layer norms' vectors whole; the final layer norm whole."""
    V, D, T, L = cfg.vocab, cfg.d_model, cfg.seq, cfg.layers
    per_layer = (4 * D * D + 2 * D * 4 * D) // tp + (2 * D + 4 * D) // tp + 6 * D
    return 8 * (V * D // tp + (T * D // tp if sp else T * D) + L * per_layer + 2 * D)


def test_a_gpt_dry_run_counts_adamws_states_and_allocates_none(monkeypatch):
    """The GPT's AdamW in a dry run: no moments or flat buffers made (nothing parameter-sized allocated while
    it steps), and the meter holds two flat buffers the size of this rank's parameters more (both moments)
    and the update's scratch and the buffer a group of gradients is gathered into (512 KiB each: one group of
    adamw_flat._GROUP_ELEMENTS float64s; the scratch was the parameters' size, which Megatron's fused Adam never
    holds), which the report's peak includes."""
    cfg = GPTConfig(vocab=2048, layers=2, d_model=128, heads=4, seq=32, batch=8)
    dp, tp = 4, 2
    states = 2 * _gpt_bytes_per_rank(cfg, tp, sp=True) + 2 * (512 << 10)
    seen: dict = {}
    real_step = AdamW.step

    def step(self):
        meter = current().meter
        seen.update(held=meter.held, peak=meter.peak, blocks=[p.local for p in self.params])
        tracemalloc.start()
        try:
            real_step(self)
            seen["allocated"] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        seen.update(after=meter.held, state=dict(self.state), flat=self._flat,
                    same=all(p.local is b for p, b in zip(self.params, seen["blocks"])))

    monkeypatch.setattr(AdamW, "step", step)
    ids = encode(load_text(20_000))
    results = spmdsim.simulate(dp * tp, lambda: len(train(cfg, spmdsim.world(), dp, tp, 1, ids, sp=True,
                                                          check=False)[1]), dry_run=True)
    assert list(results) == [1] * (dp * tp)
    assert seen["state"] == {} and seen["flat"] == ((), None) and seen["same"]
    largest = max(b.nbytes for b in seen["blocks"])
    assert largest == 8 * cfg.vocab * cfg.d_model // tp  # wte's block: 1 MiB
    assert seen["allocated"] < 64 << 10  # nothing near a parameter's size, let alone all of them
    assert seen["after"] - seen["held"] == states
    peaks = {r.peak_bytes_held for r in results.report.ranks}
    assert peaks == {max(seen["peak"], seen["held"] + states)} and peaks.pop() >= states


def _held(opt) -> int:
    """The bytes a real optimizer's states hold: every array its state views, each owning buffer once."""
    if isinstance(opt, AdamW):
        arrays = [a for _, m, v in opt.state.values() for a in (m, v)] + list((opt._flat[1] or ())[:4])
    elif isinstance(opt, Adam):
        arrays = [a for m, v, _ in opt.moments.values() for a in (m, v)]
    else:
        arrays = list(opt.buffers.values())
    owners = {}
    for a in arrays:
        while isinstance(a.base, np.ndarray):
            a = a.base
        owners[id(a)] = a.nbytes
    return sum(owners.values())


SHAPES = [(8, 4), (4,), (4, 8), (8,)]
MAPS = [("dp", "tp"), (None,), (None, "tp"), ("tp",)]


def _steps(make, skips: dict) -> list:
    """Four steps of `make(params)` on four parameters, `skips[step]` without a gradient; after each step what
    the states hold: a real run's arrays, a dry run's count (the meter's growth over the step)."""
    from spmdsim import DTensor, Mesh

    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
    params = [DTensor.from_global(mesh, np.ones(s), mesh.layout(*m)).requires_grad_() for s, m in zip(SHAPES, MAPS)]
    opt = make(params)
    meter = current().meter
    counted, out = 0, []
    for step in range(4):
        opt.zero_grad()
        for i, p in enumerate(params):
            if i not in skips.get(step, ()):
                p._ag.grad = DTensor.from_global(mesh, np.full(p.global_shape, 0.5), p.layout)
        before = meter.held if meter is not None else 0
        opt.step()
        if meter is None:
            out.append(_held(opt))
        else:
            counted += meter.held - before
            out.append(counted)
    return out


@pytest.mark.parametrize("make", [lambda ps: AdamW(ps, lr=0.01), lambda ps: Adam(ps, lr=0.01),
                                  lambda ps: SGD(ps, lr=0.01, momentum=0.9), lambda ps: SGD(ps, lr=0.01)],
                         ids=["AdamW", "Adam", "SGD momentum", "SGD"])
@pytest.mark.parametrize("skips", [{}, {1: (1,)}, {1: (0, 2, 3), 2: (1,)}],
                         ids=["all together", "one behind", "apart then together"])
def test_a_dry_step_counts_what_the_real_step_holds(make, skips):
    """Step by step, the dry count is the bytes the real states hold: AdamW's flat buffers made when the
    parameters go together (the old ones still viewed by a parameter's moments kept), its own pairs when
    one goes alone; Adam's pair per parameter; SGD's buffer per parameter with momentum, none without."""
    real = spmdsim.simulate(4, lambda: _steps(make, skips))
    dry = spmdsim.simulate(4, lambda: _steps(make, skips), dry_run=True)
    assert list(dry) == list(real) and real[0][-1] >= 0
    assert len(set(map(tuple, real))) == 1


def test_a_dry_steps_count_goes_with_its_optimizer():
    """The meter counts the states while the optimizer lives: freed, its bytes are no longer held."""
    from spmdsim import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        p = DTensor.from_global(mesh, np.ones((64, 32)), mesh.layout(None, "dp")).requires_grad_()
        opt = Adam([p], lr=0.01)
        p._ag.grad = DTensor.from_global(mesh, np.ones((64, 32)), p.layout)
        meter = current().meter
        before = meter.held
        opt.step()
        during = meter.held - before
        del opt
        return during, meter.held - before

    assert list(spmdsim.simulate(2, body, dry_run=True)) == [(2 * 64 * 16 * 8, 0)] * 2


GPT2_MEDIUM = ["--ranks", "16384", "--dry-run", "--steps", "1", "--tp", "8", "--sp", "--vocab", "50304",
               "--layers", "24", "--d-model", "1024", "--heads", "16", "--seq", "1024", "--batch", "2048"]


def test_the_gpt2_medium_dry_run_at_16384_ranks_stays_under_1_gib():
    """GPT-2 medium's shape (24 layers, d_model 1024, 16 heads, seq 1024, Megatron's padded vocabulary)
    on 16,384 ranks, tp 8 with sequence parallelism: one rank's step, under 1 GiB of peak RSS (3.4 GiB when
    AdamW stepped on float64 zeros the size of the parameters), and its peak held counts the parameters and
    AdamW's two flat moments."""
    out = run_train_gpt(GPT2_MEDIUM,
                        after="from spmdsim.programs.memory import peak_rss\nprint('peak', peak_rss(), code)\n")
    lines = out.stdout.splitlines()
    peak = [line.split() for line in lines if line.startswith("peak ")]
    assert peak and peak[0][2] == "0", out.stdout[-2000:] + out.stderr[-2000:]
    assert lines[1] == "dry run on 16384 simulated ranks (no data; bytes from the trace)"
    row = lines[3].split()
    assert row[:2] == ["ranks", "0-16383"], lines[3]
    quoted = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "simulate.md").read_text()
    assert "\n" + lines[3] + "\n" in quoted, lines[3]  # docs/howto/simulate.md quotes this run's row as it is
    cfg = GPTConfig(vocab=50304, layers=24, d_model=1024, heads=16, seq=1024, batch=2048)
    params = _gpt_bytes_per_rank(cfg, 8, sp=True)
    assert int(row[5].replace(",", "")) >= 3 * params  # the parameters and AdamW's two flat moments
    # VmHWM, this program's own peak: ru_maxrss would carry the test worker's peak across vfork + exec.
    assert int(peak[0][1]) < 1 << 30, f"peak RSS {int(peak[0][1]) >> 20} MiB"


def test_a_dry_run_under_bf16_writes_no_page_of_its_large_blocks():
    """The policy's casts and roundings of a dry run's blocks (the parameters cast to bfloat16, a product rounded,
    a collective's float32 sum and its rounding, the backward's rounding of a gradient) give the dry engine's
    zeros, mapped and never written, as the float64 run's blocks are: a 1 MiB block or more is a lazy mapping."""
    pytest.importorskip("ml_dtypes")
    from spmdsim.base.buffers import LAZY_BYTES, _Lazy
    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import train

    def lazy(a):
        while isinstance(a, np.ndarray):
            a = a.base
        return isinstance(a.obj if isinstance(a, memoryview) else a, _Lazy)

    cfg = GPTConfig(layers=1, d_model=1024, heads=8, seq=512, batch=2, dropout=0.1)

    def main():
        model, _ = train(cfg, spmdsim.world(), 1, 2, 1, encode(load_text(20_000)), sp=True, precision="bf16-mixed")
        big = [t for t in model.params.values() if t.local.nbytes >= LAZY_BYTES]
        return len(big), all(lazy(t.local) for t in big), all(lazy(t.grad.local) for t in big if t.grad is not None)

    count, params, grads = spmdsim.simulate(2, main, dry_run=True)[0]
    assert count >= 4 and params and grads
