"""A training whose values outgrow their dtype (a huge learning rate or router-loss weight) says where one numpy
process's step first overflowed in one line of the check's, and prints none of numpy's RuntimeWarnings (their
source file paths and code lines); the run ends as it did (the verdict and the exit code). A sample drawn from
parameters that diverged is refused in one line."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt.data import next_id

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = ["--d-model", "16", "--seq", "8"]


@pytest.mark.parametrize("example, args, said, code", [
    ("train_gpt", ["--ranks", "8", "--dp", "2", "--tp", "4", "--lr", "1e6", "--precision", "fp32", "--steps", "3",
                   "--sample", "0", "--layers", "1"],
     "overflow: step 1's forward and backward at float32 overflowed in one numpy process", 1),
    ("train_moe_gpt", ["--ranks", "4", "--z-loss-coeff", "1e300", "--steps", "2", "--layers", "2"],
     "overflow: step 0's AdamW update of 'wte' at float64 overflowed in one numpy process", 0),
    ("train_moe_gpt", ["--ranks", "4", "--z-loss-coeff", "1e300", "--steps", "2", "--layers", "2", "--pp", "2"],
     "overflow: step 0's AdamW update of 'wte' at float64 overflowed in one numpy process", 0)])
def test_an_overflow_is_one_line_not_numpys_warnings(example: str, args: list, said: str, code: int) -> None:
    """`train_gpt.py --lr 1e6 --precision fp32` and `train_moe_gpt.py --z-loss-coeff 1e300` printed numpy's
    "RuntimeWarning: overflow encountered in multiply" with spmdsim's source lines above the verdict."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / f"{example}.py"), *args, *SMALL],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert "Warning" not in out.stderr and "encountered" not in out.stderr, out.stderr
    assert out.stdout.count("overflow:") == 1 and said in out.stdout, out.stdout
    assert "check:" in out.stdout and "nan" not in out.stdout


def test_a_sample_from_diverged_parameters_is_one_line_not_a_traceback() -> None:
    """After `--lr 1e6 --precision fp32` the sample's draw raised numpy's "ValueError: Probabilities contain NaN"
    with its traceback on every simulated rank, after numpy's overflow warnings from the replayed forward."""
    args = ["--ranks", "8", "--lr", "1e6", "--precision", "fp32", "--steps", "3", "--layers", "1", "--sample", "5"]
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), *args, *SMALL],
                         capture_output=True, text=True, timeout=120)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in error and "Warning" not in error, out.stderr
    assert error == "spmdsim: error: generate: the next token's logits are not finite (the parameters diverged in " \
                    "training)", error
    assert "(NOT falling)" in out.stdout


def test_a_temperature_that_takes_the_logits_past_float_range_is_refused_in_one_line() -> None:
    with pytest.raises(SpmdsimError) as info:
        next_id(np.random.default_rng(0), np.array([1.0, -2.5]), 1e-310)
    assert str(info.value) == ("generate: temperature 1e-310 takes the logits (up to 2.5) past float range; expected "
                               "a larger one")
    assert next_id(np.random.default_rng(0), np.array([1.0, -2.5]), 0.0) == 0
