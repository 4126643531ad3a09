"""examples/train_megatron_block.py checks each step from the run's own parameters (anchored), within the
magnitudes that entered each loss and gradient, so rounding differences cannot compound over a long run, and
a wrong update still fails.

Its reference used to run free (its own parameters, its own gradients' updates) with tolerances of 1e-10 x
|loss|, x max|grad| and x max|param|: the error/tolerance ratio grew with the steps (0.31 at 300 steps, 0.41
at 1,000 at 8 ranks), and an update off by one part in 1e11 passed it.
"""
from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from spmdsim.nn import optim

ROOT = Path(__file__).resolve().parents[1]
EPS = float(np.finfo(np.float64).eps)


def _run(monkeypatch, capsys, update):
    script = ROOT / "examples" / "train_megatron_block.py"
    monkeypatch.setattr(optim.SGD, "_update", update)
    monkeypatch.setattr(sys, "argv", [str(script), "--ranks", "2", "--steps", "3"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    return done.value.code, capsys.readouterr().out


def _rounded(self, index, param, grad):
    # Each gradient element off by 0.4 of the check's 2 k eps (k = 4p = 8 at 2 ranks) of itself, all one way:
    # another machine's rounding, within the check's bound; the run updates with it.
    grad += 0.4 * 2 * 8 * EPS * grad
    param -= np.asarray(self.lr, param.dtype) * grad


def _wrong_lr(self, index, param, grad):  # a learning rate off by one part in 1e11
    param -= np.asarray(self.lr * (1 + 1e-11), param.dtype) * grad


def test_a_run_whose_gradients_carry_other_rounding_passes_every_step(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, _rounded)
    assert code == 0 and "vs one process: PASS" in out, out


def test_an_update_off_by_one_part_in_1e11_fails(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, _wrong_lr)
    assert code == 1 and "vs one process: FAILED" in out, out


def test_a_check_that_met_non_finite_values_says_so_and_where():
    """--lr 1e308 overflows the first update: the check FAILED (7) and the next line gave the largest difference of
    the finite values (5.2e-16), never saying values were not finite. The failing line says so now, and where:
    the first tensor and step that met them, as spmdsim.runtime.check.Verdict counts them (NaN/Inf)."""
    from docs_commands import run_example
    from testkit import unfold

    out = run_example("examples/train_megatron_block.py", "--ranks", "8", "--steps", "1", "--lr", "1e308")
    assert out.returncode == 1, out.stderr
    lines = unfold(out.stdout).splitlines()
    assert lines[-2] == ("check: 21 tensors over 1 step vs one process: FAILED (7), 7 of them with non-finite values "
                         "(NaN/Inf), the first table after the update at step 0 (19 of 256 values): lower --lr")
    assert lines[-1].startswith("largest difference ") and lines[-1].endswith(" (finite values)")
    assert max(len(line) for line in out.stdout.splitlines()) <= 100


def test_a_loss_grown_huge_is_printed_in_scientific_notation():
    """At --lr 0.3 the loss reaches ~1e233 at step 5 before it turns NaN at step 6: its line says it in
    scientific notation, not as a number of 234 digits."""
    from docs_commands import run_example

    out = run_example("examples/train_megatron_block.py", "--ranks", "4", "--steps", "7", "--lr", "0.3")
    assert out.returncode == 2 and "the loss diverged at step 6" in out.stderr, out.stderr
    step5 = [line for line in out.stdout.splitlines() if line.startswith("step 5: loss ")]
    assert len(step5) == 1 and re.fullmatch(r"step 5: loss \d\.\d{7}e\+2\d\d", step5[0]), out.stdout
