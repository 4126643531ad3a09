"""A training whose values outgrow their dtype (a huge learning rate or router-loss weight) says where one numpy
process's step first overflowed in one line of the check's, and prints none of numpy's RuntimeWarnings (their
source file paths and code lines); the run ends as it did (the verdict and the exit code), the run's own steps saying
it where nothing is checked. An optimizer state past float range stops the run in one line. A sample drawn from
parameters that diverged is refused in one line, greedy too."""
from __future__ import annotations

import subprocess
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import spmdsim
from docs_commands import run_here
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt.data import next_id
from spmdsim.models.gpt.step_check import UNCHECKED, step_errors
from spmdsim.models.gpt.train import StepResult
from spmdsim.models.nets import seeds
from spmdsim.models.nets.train import NetworkTrainer

SMALL = ["--d-model", "16", "--seq", "8"]
#: What a fresh `python` prints no warning of (its default filters, but __main__'s DeprecationWarning): the
#: others are shown, here as there.
UNSHOWN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def _example(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python examples/NAME ARGS` (simulated ranks) run in this process as docs_commands.run_here runs it, each
    warning a fresh python would print (numpy's RuntimeWarnings) written to its stderr as Python writes it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kind in UNSHOWN:
            warnings.simplefilter("ignore", kind)
        warnings.filterwarnings("always", category=DeprecationWarning, module="__main__")
        code, out, err = run_here(f"examples/{name}", list(args))
    err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    return subprocess.CompletedProcess([name, *args], code, out, err)


@pytest.mark.parametrize("example, args, said, code", [
    ("train_gpt", ["--ranks", "8", "--dp", "2", "--tp", "4", "--lr", "1e6", "--precision", "fp32", "--steps", "3",
                   "--sample", "0", "--layers", "1"],
     "overflow: step 1's forward and backward at float32 overflowed in one numpy process", 1)])
def test_an_overflow_is_one_line_not_numpys_warnings(example: str, args: list, said: str, code: int) -> None:
    """`train_gpt.py --lr 1e6 --precision fp32` and `train_moe_gpt.py --z-loss-coeff 1e300` printed numpy's
    "RuntimeWarning: overflow encountered in multiply" with spmdsim's source lines above the verdict."""
    out = _example(f"{example}.py", *args, *SMALL)
    assert out.returncode == code, out.stderr
    assert "Warning" not in out.stderr and "encountered" not in out.stderr, out.stderr
    assert out.stdout.count("overflow:") == 1 and said in out.stdout, out.stdout
    assert "check:" in out.stdout and "nan" not in out.stdout


GPT_FP32 = ["--lr", "1e6", "--precision", "fp32", "--steps", "3", "--sample", "0", "--no-check", "--layers", "2"]


@pytest.mark.parametrize("mesh", [["--dp", "2", "--tp", "4"], ["--pp", "2", "--dp", "2", "--tp", "2"]])
def test_an_unchecked_run_says_its_own_steps_overflowed_in_one_line(mesh: list) -> None:
    """Without the check the line came from nowhere (the reference says it): the run's own steps watch for an
    overflow (np.errstate's call mode), and rank 0 says the first step any rank met one, ending as the checked run
    does (NOT falling, exit 1)."""
    out = _example("train_gpt.py", "--ranks", "8", *mesh, *GPT_FP32, *SMALL)
    assert out.returncode == 1 and "Warning" not in out.stderr, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith("overflow:")]
    assert said == ["overflow: step 1 overflowed (fp32) on 8 of 8 ranks; unchecked, its loss and parameters are not "
                    "to be trusted"], out.stdout
    assert "(NOT falling)" in out.stdout


def test_a_healthy_unchecked_run_says_no_overflow() -> None:
    args = ["--ranks", "4", "--steps", "2", "--sample", "0", "--no-check", "--layers", "1"]
    out = _example("train_gpt.py", *args, *SMALL)
    assert out.returncode == 0 and "overflow" not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("more", [[], ["--no-check"], ["--pp", "2"]])
def test_an_optimizer_state_past_float_range_stops_the_run_in_one_line(more: list) -> None:
    """`--z-loss-coeff 1e300` ended "falling", exit 0, with AdamW's second moments infinite from step 0 (its
    parameters stopped moving; the check agreed): the run stops at that step, checked or not, in one line."""
    args = ["--ranks", "4", "--z-loss-coeff", "1e300", "--steps", "2", "--layers", "2", *more]
    out = _example("train_moe_gpt.py", *args, *SMALL)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in error and "Warning" not in error, out.stderr
    assert error.startswith("spmdsim: error: step 0: AdamW's second moment of 'wte' is not finite after the update "
                            "(loss "), error
    assert error.endswith("): training diverged, the parameters stop moving; expected a finite optimizer state: a "
                          "lower learning rate than 0.003, or clipping, or lower router-loss weights (aux 0.01, z "
                          "1e+300)"), error


@pytest.mark.parametrize("mesh", [["--tp", "2", "--layers", "1"], ["--pp", "2", "--layers", "2"]])
def test_a_reference_step_past_float_range_stops_the_run_not_a_pass_on_nan(mesh: list) -> None:
    """`--lr 1e20`: at step 5 one numpy process's gradients went past float range where the run's (summed in
    another order) did not; the check's differences came out NaN, its rows printed "nan  nan" and the verdict was
    "check: 6 steps ...: PASS". It stops at that step in one line, exit 2, as a diverged run of its own does."""
    args = ["--ranks", "4", "--lr", "1e20", "--steps", "6", "--every", "1", "--sample", "0", *mesh]
    out = _example("train_gpt.py", *args, *SMALL)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in error and "Warning" not in error, out.stderr
    assert "PASS" not in out.stdout and "nan" not in out.stdout, out.stdout
    assert error.startswith("spmdsim: error: step 5: the check's step in one numpy process went past float range "
                            "(its gradient 'wte' is not finite) where the run's did not (loss "), error
    assert error.endswith("): training diverged, the step cannot be checked; expected a finite loss and parameters: "
                          "a lower learning rate than 1e+20, or clipping"), error


def test_a_nan_difference_is_never_within_the_tolerance() -> None:
    """A checked step's NaN difference (a gradient the run made NaN) was left out of the verdict, as the NaN of a
    step not checked is: a PASS on NaN. It is a difference past every tolerance."""
    grad = np.array([1.0, np.nan, 1.0])
    held = SimpleNamespace(local=np.ones(3), grad=SimpleNamespace(local=grad), slices=(slice(None),),
                           dtype=np.dtype(np.float64))
    errors = step_errors(1.0, 1.0, {"w": np.ones(3)}, {"w": np.ones(3)}, {"w": held})
    assert errors[:3].tolist() == [0.0, float("inf"), 0.0]
    assert not StepResult(0, 1.0, tuple(errors[:3]), 0, 0).passed
    assert StepResult(0, 1.0, UNCHECKED[:3], 0, 0).passed  # a step not checked: nothing failed


def test_a_sample_from_diverged_parameters_is_one_line_not_a_traceback() -> None:
    """After `--lr 1e6 --precision fp32` the sample's draw raised numpy's "ValueError: Probabilities contain NaN"
    with its traceback on every simulated rank, after numpy's overflow warnings from the replayed forward."""
    args = ["--ranks", "8", "--lr", "1e6", "--precision", "fp32", "--steps", "3", "--layers", "1", "--sample", "5"]
    out = _example("train_gpt.py", *args, *SMALL)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in error and "Warning" not in error, out.stderr
    assert error == "spmdsim: error: generate: the next token's logits are not finite (the parameters diverged in " \
                    "training)", error
    assert "(NOT falling)" in out.stdout


def test_a_greedy_sample_from_diverged_parameters_is_one_line_not_question_marks() -> None:
    """At temperature 0 the argmax runs in the replayed graph, never seeing the logits: the sample printed
    `def ?????` as if meaningful. Each rank notes whether its logits were finite; one Allreduce a sample agrees."""
    args = ["--ranks", "8", "--dp", "2", "--tp", "4", "--lr", "1e6", "--precision", "fp32", "--steps", "3",
            "--layers", "1", "--sample", "5", "--temperature", "0"]
    out = _example("train_gpt.py", *args, *SMALL)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "?????" not in out.stdout, out.stdout + out.stderr
    assert error == "spmdsim: error: generate: the next token's logits are not finite (the parameters diverged in " \
                    "training)", error


def test_a_temperature_that_takes_the_logits_past_float_range_is_refused_in_one_line() -> None:
    with pytest.raises(SpmdsimError) as info:
        next_id(np.random.default_rng(0), np.array([1.0, -2.5]), 1e-310)
    assert str(info.value) == ("generate: temperature 1e-310 takes the logits (up to 2.5) past float range; expected "
                               "a larger one")
    assert next_id(np.random.default_rng(0), np.array([1.0, -2.5]), 0.0) == 0


def _seed_network_error(optimizer: str, lr: float, momentum: float = 0.0) -> str:
    """The one line a seed network (Paddle's, 4 simulated ranks) trained 4 steps by NetworkTrainer stops with."""

    def body():
        comm = spmdsim.world()
        net = seeds.paddle_tp(comm.size, dtype="float64")
        x = net.source.full()
        labels = np.random.default_rng(1).integers(0, net.out_shape[-1], int(np.prod(net.out_shape[:-1])))
        trainer = NetworkTrainer(net, comm, optimizer=optimizer, lr=lr, momentum=momentum)
        try:
            for _ in range(4):
                trainer.step(x, labels)
        finally:
            trainer.close()

    with pytest.raises(SpmdsimError) as caught:
        spmdsim.simulate(4, body)
    return str(caught.value)


def test_a_seed_networks_optimizer_state_past_float_range_stops_the_run() -> None:
    """NetworkTrainer (the seed networks' and the MindSpore tutorial's trainer) asked the loss and the parameters
    after each step, not the optimizer's state as the GPT trainers do: Adam's second moment went inf at step 1
    (a gradient's square past float64), the parameters stopped moving, and the run went on to its check."""
    error = _seed_network_error("adam", 1e100)
    assert error.startswith("Paddle split: Embedding -> column Linear -> row Linear: step 1: Adam's second moment of "
                            "'Embedding.w' is not finite after the update (loss "), error
    assert error.endswith("): training diverged, the parameters stop moving; expected a finite optimizer state: a "
                          "lower learning rate than 1e+100"), error


def test_sgds_momentum_past_float_range_is_its_parameters_too() -> None:
    """SGD's momentum cannot overflow alone: the step that makes it inf or NaN moves the parameter by lr x it
    (0 x inf is NaN too), so the parameter's line (or the next loss's) comes first, naming the learning rate."""
    error = _seed_network_error("sgd", 1e300, momentum=0.9)
    assert error == ("Paddle split: Embedding -> column Linear -> row Linear: step 1: the loss is nan (not finite): "
                     "training diverged; expected a finite loss and parameters: a lower learning rate than 1e+300")


def test_the_mindspore_tutorials_adam_past_float_range_is_one_line() -> None:
    """`train_mindspore_tutorial.py --optimizer adam --lr 1e100` ran on past Adam's infinite second moment: numpy's
    RuntimeWarnings from the reference, then "FAILED (16 of 35)", exit 1. It stops at that step in one line."""
    args = ["--ranks", "8", "--synthetic", "--optimizer", "adam", "--lr", "1e100", "--steps", "3"]
    out = _example("train_mindspore_tutorial.py", *args)
    error = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Warning" not in error and error.count("spmdsim: error:") == 1, out.stderr
    assert error.startswith("spmdsim: error: MindSpore operator-parallel tutorial network: step 1: Adam's second "
                            "moment of 'MatMul1.w' is not finite after the update (loss "), error
    assert "check:" not in out.stdout, out.stdout
