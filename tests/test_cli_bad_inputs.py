"""Bad command lines and settings: one `spmdsim: error: ...` line and exit 2, never a traceback.

Pure tests call the CLI in-process (`main([...])`) or the helpers the MPI
commands run inside their guard (so no MPI starts here); the few cases that
need ranks launch ``timeout -k 5 60 mpiexec -n 2`` (skipped without mpiexec).
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import time
import types

import pytest

from spmdsim.tools.cli import calibrate, paths
from spmdsim.tools.cli import run_ops as run_cli
from spmdsim.tools.cli.cases import MAX_CASE_TEXT, case_from_args
from spmdsim.tools.cli.main import build_parser, main
from spmdsim.errors import SpmdsimError
import docs_commands
from testkit import MPIEXEC, mpi_batch_streams, unfold

CASE = ["--device-matrix", "8", "--alias", "x", "--tensor-map", "x,None", "--shape", "8,8"]
PLAN = ["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
        "--shape", "8,8"]


def _fails(capsys, argv: list[str], needle: str) -> str:
    """Run the CLI; expect exit 2, nothing on stdout, one error containing `needle`
    (folded within 100 columns: its continuation lines joined back)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.replace("\n  ", " ").splitlines()
    assert out == "" and len(lines) == 1, (out, err)
    assert lines[0].startswith("spmdsim: error: ") and needle in lines[0], lines[0]
    return lines[0]


def _args(argv: list[str]):
    return build_parser().parse_args(argv)


# -- 1, 2: calibrate's arguments and output paths (checked inside its guard) ----------------------
def test_calibrate_arguments_are_spmdsim_errors():
    with pytest.raises(SpmdsimError, match=r"--sizes 'abc': size 'abc' is not a byte count"):
        calibrate._sizes("abc")
    with pytest.raises(SpmdsimError, match=r"--sizes '1M,100G': 107,374,182,400 bytes per rank is above"):
        calibrate._sizes("1M,100G")
    assert calibrate._sizes("64K,1G") == [65536, 1 << 30]
    with pytest.raises(SpmdsimError, match=r"--group-sizes '2,1': group size 1 must be >= 2 \(the ranks of one "
                                           r"collective\) and divide the world size$"):
        calibrate._group_sizes("2,1", 8)
    with pytest.raises(SpmdsimError, match=r"--group-sizes '3': group size 3 must be >= 2 and divide the world "
                                           "size 8"):
        calibrate._group_sizes("3", 8)
    with pytest.raises(SpmdsimError, match=r"--group-sizes 'x' must be comma-separated integers"):
        calibrate._group_sizes("x", 8)
    with pytest.raises(SpmdsimError, match=r"--repeats 0 must be at least 1"):
        calibrate._check_counts(_args(["calibrate", "--repeats", "0"]))
    with pytest.raises(SpmdsimError, match=r"--warmup -1 must be at least 0"):
        calibrate._check_counts(_args(["calibrate", "--warmup", "-1"]))
    with pytest.raises(SpmdsimError, match=r"--output 'c.json' has no effect with --dry-run"):
        calibrate._check_counts(_args(["calibrate", "--dry-run", "--output", "c.json"]))


@pytest.mark.parametrize("argv, needle", [
    (["--sizes", "abc"], "--sizes 'abc': size 'abc' is not a byte count like 64K or 4M"),
    (["--ops", "allreduce,foo"], "--ops 'allreduce,foo': unknown collective 'foo'; expected one of"),
    # timed and fitted twice
    (["--ops", "allreduce,bcast,all_reduce"], "--ops 'allreduce,bcast,all_reduce' names allreduce twice; expected "
                                              "each collective once"),
    (["--group-sizes", "2,x"], "--group-sizes '2,x' must be comma-separated integers such as 2,4"),
    (["--group-sizes", "0"], "--group-sizes '0': group size 0 must be >= 2"),  # said "needs at least 2 ranks"
    # read as not given: the default group sizes timed without a word (`--group-sizes "$GROUPS"`, unset)
    (["--group-sizes", ""], "--group-sizes '' must be comma-separated integers such as 2,4"),
    (["--repeats", "0"], "--repeats 0 must be at least 1"),
    (["--sizes", "-1K,4K"], "--sizes '-1K,4K': size '-1K' must be >= 0"),
    (["--sizes", "1.5,4K"], "--sizes '1.5,4K': size '1.5' is not a whole number of bytes"),
])
def test_calibrate_checks_its_flags_before_mpi(capsys, monkeypatch, argv, needle):
    # Outside MPI it said "run it under MPI" (as "spmdsim calibrate: error:", unlike every other refusal) before
    # looking at --sizes: a user who then launched it under mpiexec met the bad flag only there. No MPI here: an
    # import of mpi4py fails, so the flags must be refused before it.
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    _fails(capsys, ["calibrate", *argv], needle)


def test_calibrate_on_one_process_names_a_bad_output_before_the_rank_count(capsys, monkeypatch, tmp_path):
    # It said "calibrate needs at least 2 ranks"; the user, launching 8, then met the bad --output. One process
    # is rank 0, whose verdict on the paths counts: its refusal comes first (a good path: the rank count).
    import spmdsim.runtime.mpi_library as mpi_library

    one = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(Get_size=lambda: 1))
    monkeypatch.setattr(mpi_library, "load_mpi", lambda why: one)
    bad = str(tmp_path / "nonexistent" / "c.json")
    _fails(capsys, ["calibrate", "--output", bad], f"--output {bad!r} cannot be written: directory")
    _fails(capsys, ["calibrate", "--output", str(tmp_path / "c.json")], "calibrate needs at least 2 ranks")


def test_calibrate_checks_its_output_paths_before_measuring(tmp_path):
    blocker = tmp_path / "in.json"
    blocker.write_text("{}")
    bad = str(blocker / "cost.json")
    problem = calibrate._output_problem(_args(["calibrate", "--output", bad]))
    assert problem == f"--output {bad!r} cannot be written: {str(blocker)!r} is a file, not a directory"
    problem = calibrate._output_problem(_args(["calibrate", "--dry-run", "--measurements", bad]))
    assert problem.startswith(f"--measurements {bad!r} cannot be written")
    assert calibrate._output_problem(_args(["calibrate", "--dry-run"])) is None
    good = tmp_path / "cost.json"
    assert calibrate._output_problem(_args(["calibrate", "--output", str(good)])) is None
    assert not good.exists()  # checking makes nothing
    missing = tmp_path / "new" / "cost.json"  # a typo in a folder is refused, not made
    assert calibrate._output_problem(_args(["calibrate", "--output", str(missing)])) == (
        f"--output {str(missing)!r} cannot be written: directory {str(missing.parent)!r} does not exist; "
        "expected a path in an existing directory")
    assert not missing.parent.exists()
    assert calibrate._output_problem(_args(["calibrate", "--output", ""])).endswith("is empty; expected a file path")


def test_output_path_checks(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    (tmp_path / "d.png").mkdir()
    assert paths.check_output_file(tmp_path / "b.png", "--png") == str(tmp_path / "b.png")
    with pytest.raises(SpmdsimError, match=r"^--png '.*/a/b\.png' cannot be written: directory '.*/a' does not "
                                           r"exist; expected a path in an existing directory$"):
        paths.check_output_file(tmp_path / "a" / "b.png", "--png")
    assert paths.check_output_file(tmp_path / "a" / "b.png", "--png", make_parents=True)
    assert not (tmp_path / "a").exists()
    assert paths.check_output_dir(tmp_path / "pics", "--png") == str(tmp_path / "pics")
    with pytest.raises(SpmdsimError, match=r"directory '.*/new' does not exist"):
        paths.check_output_dir(tmp_path / "new" / "pics", "--png")
    with pytest.raises(SpmdsimError, match=r"--png '.*d\.png' is a directory; expected a file path"):
        paths.check_output_file(tmp_path / "d.png", "--png")
    with pytest.raises(SpmdsimError, match=r"--png '.*f' is a file; expected a directory"):
        paths.check_output_dir(blocker, "--png")
    with pytest.raises(SpmdsimError, match=r"is a file, not a directory"):
        paths.check_output_dir(blocker / "sub", "--png")
    with pytest.raises(SpmdsimError, match=r"is empty"):
        paths.check_output_file("", "--output")


#: (calibrate's extra arguments, what its one error line says), "{blocker}" a file where a folder is expected.
CALIBRATE_UNDER_MPI = [
    (["--output", "{blocker}/cost.json"], "--output '{blocker}/cost.json' cannot be written"),
    (["--dry-run", "--measurements", "{blocker}/m.json"], "--measurements '{blocker}/m.json'"),
    (["--dry-run", "--sizes", "abc"], "--sizes 'abc'"),
    (["--dry-run", "--group-sizes", "3"], "group size 3 must be >= 2"),
    (["--dry-run", "--repeats", "0"], "--repeats 0 must be at least 1"),
    # timed 100,000,000 times each, unbounded: refused before the first
    (["--dry-run", "--repeats", "100000000", "--warmup", "0"],
     "--warmup 0 and --repeats 100000000 time 800,000,000 collectives (100,000,000 runs of 8 cases"),
    (["--dry-run", "--warmup", "100000000"], "expected at most 100,000 (each is two barriers"),
]


@pytest.fixture(scope="module")
def calibrated_under_mpi(tmp_path_factory) -> tuple:
    """(each case's exit codes on the 2 ranks, the error lines the job printed, the blocker) of `spmdsim calibrate`
    with each CALIBRATE_UNDER_MPI case, run in turn by ONE `mpiexec -n 2` job under a 60 s timeout (testkit.
    mpi_batch_streams: each as `spmdsim calibrate ...` runs, its exit code its SystemExit's on every rank). Five
    launches cost 5 x 0.4 CPU-s for 0.4 together; a case that hangs (a bad --output hung rank 1 in a barrier until
    the timeout) ends the job by the timeout, which fails every case."""
    if not MPIEXEC:
        pytest.skip("no mpiexec")
    blocker = tmp_path_factory.mktemp("calibrate") / "in.json"
    blocker.write_text("{}")
    spmdsim = os.path.join(os.path.dirname(sys.executable), "spmdsim")
    programs = []
    for i, (extra, _) in enumerate(CALIBRATE_UNDER_MPI):
        extra = [a.format(blocker=blocker) for a in extra]
        given = {flag for flag in extra if flag.startswith("--")}  # a flag given twice is refused: once each
        base = [word for flag, value in (("--sizes", "1K,64K"), ("--ops", "allreduce"), ("--repeats", "1"))
                if flag not in given for word in (flag, value)]
        programs.append((f"case {i}", spmdsim, ["calibrate", *base, *extra]))
    found, stderr = mpi_batch_streams(programs, 2, timeout=60)
    assert "Traceback" not in stderr + "".join(text for _, text in found.values()), stderr
    errors = [line for line in unfold(stderr).splitlines() if line.startswith("spmdsim: error")]
    return [found[name][0] for name, _, _ in programs], errors, blocker


@pytest.mark.parametrize("case", range(len(CALIBRATE_UNDER_MPI)))
def test_calibrate_under_mpi_fails_once_and_fast(calibrated_under_mpi, case):
    # Before: a bad --output hung rank 1 in a barrier until the timeout.
    codes, errors, blocker = calibrated_under_mpi
    assert codes[case] == [2, 2], codes
    assert len(errors) == len(CALIBRATE_UNDER_MPI), errors  # one line each case, in the cases' order
    assert CALIBRATE_UNDER_MPI[case][1].format(blocker=blocker) in errors[case], errors


# -- 3, 4, 11: `run` flags that were ignored, shapes, output maps (checked inside the guard) -------
MATMUL_MAPS = ["run", "matmul", "--device-matrix", "2", "--alias", "x", "--x-map", "None,x",
               "--w-map", "x,None", "--shape", "8,8,8"]


@pytest.mark.parametrize("argv, needle", [
    (MATMUL_MAPS + ["--out-strategy", "((2,1),)"], "--out-strategy goes with --strategy"),
    (MATMUL_MAPS + ["--strategy", "((1,2),(2,1))"],
     "--strategy and --device-matrix/--alias-name/--x-map/--w-map both give the layouts"),
    (["run", "matmul", "--strategy", "((1,2),(2,1))", "--out-map", "x", "--shape", "8,8,8"],
     "--strategy and --out-map both give the layouts"),
    # an empty value is given: beside --strategy it was dropped without a word and the run passed
    (["run", "matmul", "--strategy", "((1,2),(2,1))", "--device-matrix", "", "--shape", "8,8,8"],
     "--strategy and --device-matrix both give the layouts"),
    (["run", "matmul", "--strategy", "((1,2),(2,1))", "--x-sbp", "", "--shape", "8,8,8"],
     "--strategy and --x-sbp both give the layouts"),
    (MATMUL_MAPS + ["--out-strategy", ""], "--out-strategy goes with --strategy"),
    (["run", "linear", "--parallel", "row", "--gather-out", "--shape", "4,8,8"],
     "--gather-out applies to --parallel column only"),
    (["run", "embedding", "--mode", "dim", "--front", "paddle", "--shape", "4,8,8"],
     "--front paddle has no --mode dim"),
])
def test_run_refuses_flags_it_would_ignore(argv, needle):
    with pytest.raises(SpmdsimError, match="^" + needle.replace("(", r"\(").replace(")", r"\)")):
        run_cli._check_flags(_args(argv))


def test_run_honours_or_refuses_every_out_strategy_entry():
    assert run_cli._out_strategy("((8,1),)") == (8, 1)
    with pytest.raises(SpmdsimError, match=r"--out-strategy '\(\(8,1\),\(1,1\)\)' gives 2 tensors"):
        run_cli._out_strategy("((8,1),(1,1))")
    # a value that is no strategy was said as --strategy's ("strategy 'x' is not ..."), the flag unnamed
    for text in ("x", ""):
        with pytest.raises(SpmdsimError, match=rf"^--out-strategy {text!r}: strategy {text!r} is not a tuple"):
            run_cli._out_strategy(text)


@pytest.mark.parametrize("argv, needle", [
    (["matmul", "--shape", "16,16"], "--shape '16,16' has 2 sizes; expected M,K,N (or B,...,M,K,N)"),
    (["matmul", "--shape", "16,-16,16"], "--shape '16,-16,16' has a negative size"),
    (["matmul", "--shape", "-16,16,16"], "--shape '-16,16,16' has a negative size"),  # argparse: "expected one"
    (["linear", "--shape", "4,8,8,3"], "--shape '4,8,8,3' has 4 sizes; expected M,K,N"),
    (["mlp", "--shape", "4,8"], "--shape '4,8' has 2 sizes; expected M,H,F"),
    (["embedding", "--shape", "4,0,8"], "--shape '4,0,8' gives a vocabulary of 0 rows; expected VOCAB >= 1"),
    (["embedding", "--shape", "8,4"], "--shape '8,4' has 2 sizes; expected ID_DIMS...,VOCAB,DIM"),
])
def test_run_names_the_shape_flag(argv, needle):
    with pytest.raises(SpmdsimError) as info:
        run_cli._shape(_args(["run", *argv]))
    assert str(info.value).startswith(needle), str(info.value)


@pytest.mark.parametrize("argv, needle", [
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "16", "--ranks", "8"],
     "--shape '16' has 1 size; expected M,K,N"),
    (["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,y", "--to-device-matrix", "1",
      "--to-alias", "y", "--shape", "8,8"], "--to-device-matrix '1' has 1 device but --device-matrix '8' has 8"),
    (["slices", "--device-matrix", "1", "--alias", "x", "--tensor-map", "x,None", "--shape", "8,8", "--world-size",
      "2"], "--device-matrix '1' (case key 'device_matrix'), which has 1 device; expected 1"),
    # "makes none of the 1 blocks an MoE layer"
    (["estimate", "gpt", "--layers", "1", "--experts", "2", "--moe-every", "2"],
     "--moe-every 2 makes no MoE layer of the only block (the first would be block 1"),
    (["autoshard", "--network", "gpt", "--gpt", "layers=1,experts=2,moe_every=2", "--machine", "a100-dgx"],
     "--gpt moe_every 2 makes no MoE layer of the only block; expected at most --gpt layers 1"),
])
def test_one_is_counted_in_the_singular(capsys, argv, needle):
    # "has 1 sizes", "has 1 devices"
    _fails(capsys, argv, needle)


TINY_GPT = "layers=1,heads=1,d_model=16,seq=8,vocab=32,batch=1"


@pytest.mark.parametrize("argv, needle", [
    # "GPT 1 layers, hidden 16, 1 heads", "1 devices on a100-dgx"
    (["estimate", "gpt", "--layers", "1", "--heads", "1", "--hidden", "16", "--seq", "8", "--vocab", "32",
      "--global-batch", "1"], "GPT 1 layer, hidden 16, 1 head, seq 8,"),
    (["autoshard", "--network", "gpt", "--gpt", TINY_GPT, "--machine", "a100-dgx", "--devices", "1"],
     "GPT 1 layer, hidden 16, 1 head, seq 8, vocab 32, global batch 1\n1 device on a100-dgx,"),
    # "on 1 devices, in six dialects"
    (["convert", "--device-matrix", "1", "--tensor-map", "axis_0", "--shape", "4"], "on 1 device, in six dialects:"),
    # "each rank sends each of the 1 others in its group" (--explain folded past 64 ranks)
    (["plan", "--device-matrix", "2,64", "--alias", "a,b", "--from", "a,b", "--to", "None,b", "--shape", "128,128",
      "--explain"], "64 groups of 2 ranks; each rank sends the other rank in its group 512 B"),
])
def test_reports_count_one_in_the_singular(capsys, argv, needle):
    assert main(argv) == 0
    out = capsys.readouterr().out.replace("\n    ", " ")  # --explain folds its lines at 100 columns
    assert needle in out, out[:600]


@pytest.mark.parametrize("argv, needle", [
    # "give exactly one of --to, --to-sbp, ... got []"
    (["plan", "--device-matrix", "4", "--alias", "x", "--from", "x,None", "--shape", "8,8"],
     "no target layout given; expected one of --to, --to-sbp, --to-placements, --to-partition-spec and "
     "--to-strategy"),
    # "shape (8, -8) must not have negative sizes, got -8 in dim 1": no flag named
    (["plan", "--device-matrix", "4", "--alias", "x", "--from", "x,None", "--to", "None,x", "--shape", "8,-8"],
     "--shape '8,-8' must be sizes of at least 0, such as 2,4"),
    # "..., got None"
    (["show", "--device-matrix", "2,4", "--alias", "a,b", "--tensor-map", "a,None", "--shape", "8,8", "--matmul"],
     "--matmul needs a MatMul --strategy of two tensors such as \"((1,2),(2,1))\", and none was given"),
    # "GPTConfig layers -1 must be an integer >= 1": a name the user did not type
    (["autoshard", "--network", "gpt", "--gpt", "layers=-1"], "--gpt layers '-1' must be an integer >= 1"),
    # "GPTConfig d_model 100 must be divisible by heads 3", "GPTConfig positions 'rope' needs ...": field names
    (["estimate", "gpt", "--hidden", "100", "--heads", "3"],
     "--hidden 100 must be divisible by --heads 3 (each head takes --hidden / --heads features)"),
    (["estimate", "gpt", "--hidden", "12", "--heads", "4", "--rope"],
     "--rope needs an even head_dim, got --hidden 12 / --heads 4 = 3"),
    (["autoshard", "--network", "gpt", "--gpt", "d_model=100,heads=3"],
     "--gpt d_model 100 must be divisible by --gpt heads 3"),
    (["autoshard", "--network", "gpt", "--gpt", "d_model=12,heads=4", "--rope", "--machine", "a100-dgx"],
     "--rope needs an even head_dim, got --gpt d_model 12 / --gpt heads 4 = 3"),
    # "ColumnParallelLinear output_size 0 must be an integer >= 1", "ParallelMLP hidden_size 0 ...", "...
    # embedding_dim 0"
    (["run", "linear", "--shape", "8,8,0"], "--shape '8,8,0' gives N = 0; expected M,K,N with K and N >= 1"),
    (["run", "mlp", "--shape", "8,0,8"], "--shape '8,0,8' gives H = 0; expected M,H,F with H and F >= 1"),
    (["run", "embedding", "--shape", "4,8,0"],
     "--shape '4,8,0' gives DIM = 0; expected ID_DIMS...,VOCAB,DIM with DIM >= 1"),
])
def test_refusals_name_the_flag_given(capsys, argv, needle):
    _fails(capsys, argv, needle)


@pytest.mark.parametrize("argv, line", [
    # "--gpt d_model 128 must be divisible by --gpt heads 3": a key the user never typed, as if typed
    (["--gpt", "heads=3"], "the default d_model 128 must be divisible by --gpt heads 3 (each head takes d_model / "
                           "--gpt heads features)"),
    (["--gpt", "d_model=30"], "--gpt d_model 30 must be divisible by the default heads 4 (each head takes "
                              "--gpt d_model / heads features)"),
    (["--gpt", "d_model=12", "--rope", "--machine", "a100-dgx"],
     "--rope needs an even head_dim, got --gpt d_model 12 / the default heads 4 = 3 (rotary embeddings turn pairs "
     "of features)"),
    (["--rope", "--kv-heads", "3", "--machine", "a100-dgx"],  # no --gpt at all (the search read 'layers=4')
     "--kv-heads 3 must divide the default heads 4 (each key/value head serves heads / kv-heads query heads)"),
    (["--gpt", "experts=4,moe_every=8", "--machine", "a100-dgx"],
     "--gpt moe_every 8 makes none of the 4 blocks an MoE layer; expected at most the default layers 4"),
])
def test_autoshard_says_a_gpt_size_left_at_its_default_is_the_default(capsys, argv, line):
    assert _fails(capsys, ["autoshard", "--network", "gpt", *argv], line) == f"spmdsim: error: {line}"


@pytest.mark.parametrize("argv, line", [
    (["--heads", "3"], "the default d_model 128 must be divisible by --heads 3 (each head takes d_model / --heads "
                       "features)"),
    (["--hidden", "100", "--heads", "3"], "--hidden 100 must be divisible by --heads 3 (each head takes --hidden / "
                                          "--heads features)"),
    (["--kv-heads", "3"], "--kv-heads 3 must divide the default heads 4 (each key/value head serves heads / "
                          "kv-heads query heads)"),
    (["--kv-heads", "3", "--heads", "4"], "--kv-heads 3 must divide --heads 4 (each key/value head serves heads / "
                                          "kv-heads query heads)"),
])
def test_estimate_says_a_size_left_at_its_default_is_the_default(capsys, argv, line):
    assert _fails(capsys, ["estimate", "gpt", *argv], line) == f"spmdsim: error: {line}"


@pytest.mark.parametrize("argv, line", [
    # it said "--prefetch with --pp 1 or several microbatches a step: a pipeline's chunks do not prefetch"
    (["--dp", "2"], "--prefetch with 4 microbatches a step: a prefetching step runs one; give --global-batch 2 "
                    "(--micro-batch x --dp) or leave out --prefetch"),
    (["--experts", "2", "--ep", "2", "--micro-batch", "2"],
     "--prefetch with 2 microbatches a step: a prefetching step runs one; give --global-batch 4 (--micro-batch x "
     "--dp x --ep) or leave out --prefetch"),
    (["--pp", "2"], "--prefetch with --pp 2: a pipeline's chunks do not prefetch; leave out --prefetch"),
])
def test_estimate_says_why_zero3_does_not_prefetch(capsys, argv, line):
    assert _fails(capsys, ["estimate", "gpt", "--zero", "3", "--prefetch", *argv], line) == f"spmdsim: error: {line}"


@pytest.mark.parametrize("argv, line", [
    (["--dp", "2", "--zero", "3"], "--reshard-after-forward false with 4 microbatches a step: a step that keeps its "
                                   "layers gathered runs one; give --global-batch 2 (--micro-batch x --dp) or leave "
                                   "out --reshard-after-forward false"),
    (["--pp", "2", "--zero", "3"], "--reshard-after-forward false with --pp 2: a pipeline's chunks reshard after "
                                   "forward; leave out --reshard-after-forward false"),
    (["--zero", "1"], "--reshard-after-forward false is for ZeRO-3's gathered parameters: give --zero 3 with it"),
])
def test_estimate_says_where_layers_cannot_stay_gathered(capsys, argv, line):
    assert _fails(capsys, ["estimate", "gpt", "--reshard-after-forward", "false", *argv], line) == \
        f"spmdsim: error: {line}"


@pytest.mark.parametrize("argv, expected", [
    (["--d-model", "100", "--heads", "3"],
     "--d-model 100 must be divisible by --heads 3 (each head takes --d-model / --heads features)"),
    (["--d-model", "12", "--heads", "4", "--rope"], "--rope needs an even head_dim, got --d-model 12 / --heads 4 = 3 "
                                                    "(rotary embeddings turn pairs of features)"),
    (["--pad-vocab-to", "0"], "--pad-vocab-to 0 must be an integer >= 1"),
    (["--dropout", "1.5"], "--dropout 1.5 must be a finite number in [0, 1)"),
    (["--seed", "-1"], "--seed -1 must be an integer >= 0"),
    (["--clip", "-1"], "--clip -1 must be a finite number >= 0 (0: no clipping)"),
    (["--lr", "-1"], "--lr -1 must be a finite number >= 0"),  # was "-1.0", a value never typed
    (["--lr", "1e400"], "--lr 1e400 (read as inf) must be a finite number >= 0"),
    # 100,000 layers were built on every rank for minutes before the step's memory refused them
    (["--layers", "100000"], "--layers 100,000 is too many; expected at most 1,024 (every layer's parameters are "
                             "made on each rank)"),
    # a size the user left alone is said as the default, not as a flag typed ("--d-model 128 must be ...")
    (["--heads", "3"], "the default d_model 128 must be divisible by --heads 3 (each head takes d_model / --heads "
                       "features)"),
    (["--d-model", "12", "--rope"], "--rope needs an even head_dim, got --d-model 12 / the default heads 4 = 3 "
                                    "(rotary embeddings turn pairs of features)"),
    (["--kv-heads", "3"], "--kv-heads 3 must divide the default heads 4 (each key/value head serves heads / "
                          "kv-heads query heads)"),
])
def test_training_examples_refusals_name_the_flag(argv, expected):
    # The examples' GPTConfig (spmdsim.models.gpt.options.model_config) said "GPTConfig d_model 100 ...", "GPTConfig
    # vocab_pad_to 0 ...": fields, where the user typed flags. GPTConfig itself still names its fields.
    import argparse

    from spmdsim.models.gpt import GPTConfig
    from spmdsim.base.typed_numbers import flag_float
    from spmdsim.models.gpt.options import model_arguments, model_config

    parser = argparse.ArgumentParser()
    model_arguments(parser)
    parser.add_argument("--clip", type=flag_float, default=0.0)  # as examples/train_gpt.py's
    args = parser.parse_args(argv)
    with pytest.raises(SpmdsimError) as info:
        model_config(args, clip=args.clip)
    assert str(info.value) == expected
    with pytest.raises(SpmdsimError, match=r"^GPTConfig d_model 100 must be divisible by heads 3 \(each head takes "
                                           r"d_model / heads features\)$"):
        GPTConfig(d_model=100, heads=3)
    with pytest.raises(SpmdsimError, match=r"^GPTConfig lr -1.0 must be a finite number >= 0$"):
        GPTConfig(lr=-1.0)  # a library call: the value's repr


@pytest.mark.parametrize("argv, needle", [
    # type=float kept only the number: "-1.0", "-1000000000.0", "0", "inf" for what was typed
    (["launch", "-n", "1", "--timeout", "-1", "--", "true"], "--timeout -1 must be a positive, finite number"),
    (["autoshard", "--network", "mlp", "--flops", "-1e9"], "--flops -1e9 must be a finite number > 0"),
    (["autoshard", "--network", "mlp", "--flops", "1e400"], "--flops 1e400 (read as inf) must be a finite number > 0"),
    (["estimate", "gpt", "--dropout", "0.99999999999999999999"], "--dropout 0.99999999999999999999 (read as 1.0) "
                                                                 "must be in [0, 1)"),
    (["estimate", "gpt", "--experts", "2", "--capacity-factor", "1e-400"],
     "--capacity-factor 1e-400 (read as 0.0) must be a finite number > 0"),
])
def test_float_flags_are_named_as_typed(capsys, argv, needle):
    _fails(capsys, argv, needle)


@pytest.mark.parametrize("argv, line", [
    # "simulate: rank count 100000 must be an integer from 1 to 65536": no flag named
    (["--tp", "100000"], "--pp 1 x --dp 1 x --cp 1 x --tp 100000 is a mesh of 100,000 ranks; expected at most "
                         "65,536 (the largest mesh a dry run steps)"),
    (["--pp", "256", "--cp", "2", "--tp", "256"], "--pp 256 x --dp 1 x --cp 2 x --tp 256 is a mesh of 131,072 ranks; "
                                                  "expected at most 65,536 (the largest mesh a dry run steps)"),
    (["--experts", "8", "--ep", "8", "--dp", "16384", "--global-batch", "131072"],
     "--pp 1 x --dp 16384 x --ep 8 x --cp 1 x --tp 1 is a mesh of 131,072 ranks; expected at most 65,536"),
])
def test_estimate_names_the_flags_of_a_mesh_too_large(capsys, argv, line):
    assert _fails(capsys, ["estimate", "gpt", *argv], line).startswith(f"spmdsim: error: {line}")


@pytest.mark.parametrize("argv, line", [
    # each exited 0, the second flag dropped: --explain under the JSON record, --show under it, --operand beside
    # the three tensors --matmul draws (as `collective --show --json` and `run --dry-run --explain` are refused)
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "16,16,16", "--ranks", "8", "--json", "--explain"],
     "--explain adds each rank's blocks and collectives to the text report, which --json replaces (its record has "
     "neither): give one of them"),
    (["plan", "--device-matrix", "2", "--alias", "x", "--from", "x,None", "--to", "None,x", "--shape", "4,4",
      "--json", "--show"], "--show draws the layout before and after each step, which --json replaces (its record "
                           "lists each step): give one of them"),
    (["show", "--matmul", "--strategy", "((1,2),(2,1))", "--shape", "2,4,2", "--operand", "w"],
     "--operand w picks one tensor of the MatMul to draw; --matmul draws x, w and out: give one of them"),
])
def test_a_flag_the_other_replaces_is_refused(capsys, argv, line):
    assert _fails(capsys, argv, line) == f"spmdsim: error: {line}"


def test_run_shapes_that_were_valid_still_are():
    assert run_cli._shape(_args(["run", "matmul", "--shape", "2,0,16,16"])) == (2, 0, 16, 16)
    assert run_cli._shape(_args(["run", "embedding", "--shape", "10,4,1000,48"])) == (10, 4, 1000, 48)


def test_run_out_map_of_the_wrong_length_says_so():
    args = _args(MATMUL_MAPS + ["--out-map", "x"])
    # No job is built: the check comes before any communicator is touched.
    with pytest.raises(SpmdsimError, match=r"--out-map 'x' gives 1 dim but the output of --shape "
                                           r"'8,8,8' has 2; expected 2 entries"):
        run_cli._build(args, comm=None)


def test_sbp_case_checks_world_size(tmp_path, capsys):
    _fails(capsys, ["slices", "--sbp", "S(0)", "--placement", "8", "--world-size", "4", "--shape", "8"],
           "--world-size 4 (case key 'world_size') does not match --placement '8' (case key 'placement'), "
           "which has 8 devices; expected 8 (or leave --world-size out)")
    case = tmp_path / "case.json"
    case.write_text(json.dumps({"sbp": "S(0)", "placement": [8], "world_size": 4, "shape": [8]}))
    _fails(capsys, ["slices", str(case)], "--world-size 4 (case key 'world_size') does not match --placement '8'")
    case.write_text(json.dumps({"sbp": "S(0)", "placement": [8], "world_size": 8, "shape": [8]}))
    assert main(["slices", str(case)]) == 0


def test_layout_case_names_the_world_size_and_device_matrix_flags(capsys):
    # It said "case key 'world_size' is 4 but device_matrix (8,) has 8 devices": a key and a field the user of
    # the flags never wrote.
    line = _fails(capsys, ["slices", "--world-size", "4", "--device-matrix", "8", "--alias", "a", "--tensor-map",
                           "a", "--shape", "8"],
                  "--world-size 4 (case key 'world_size') does not match --device-matrix '8' (case key "
                  "'device_matrix'), which has 8 devices; expected 8 (or leave --world-size out)")
    assert "device_matrix (8,)" not in line


@pytest.mark.parametrize("argv, needle", [
    (["--alias", "", "--tensor-map", "a,b"], "--alias '' (case key 'alias_name') gives 0 names for the 2 axes of "
                                             "--device-matrix '2,2'; expected one name per axis, such as a,b"),
    (["--alias", "a", "--placements", "S(0),R"], "--alias 'a' (case key 'alias_name') gives 1 name for the 2 axes"),
    (["--alias", "a", "--partition-spec", "a,None"], "--alias 'a' (case key 'alias_name') gives 1 name"),
    (["--alias", "a,a", "--tensor-map", "a,None"], "--alias 'a,a' (case key 'alias_name') names axis 'a' twice; "
                                                   "expected one distinct name per axis of --device-matrix '2,2'"),
    (["--alias", "a,None", "--tensor-map", "a,None"], "names an axis 'None', which a tensor map reads as a dim"),
])
def test_convert_names_the_alias_flag_and_what_it_expects(capsys, argv, needle):
    # `convert --alias ""` said "alias_name () has 0 names but device_matrix (2, 2) has 2 axes" (the Layout's
    # fields), the DTensor and JAX forms "mesh_axis_names ('a',) must give one name per mesh axis".
    line = _fails(capsys, ["convert", "--device-matrix", "2,2", "--shape", "4,4", *argv], needle)
    assert "alias_name (" not in line and "device_matrix (" not in line and "mesh_axis_names" not in line


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--alias", "", "--from", "a,None"], "--alias '' gives 0 names for the 2 axes of --device-matrix '2,2'"),
    (["plan", "--alias", "a", "--from", "a,None"], "--alias 'a' gives 1 name for the 2 axes"),
    (["plan", "--alias", "a,a", "--from", "a,None"], "--alias 'a,a' names axis 'a' twice"),
    (["plan", "--to-alias", "", "--from", "axis_0,None"], "--to-alias '' gives 0 names for the 2 axes of "
                                                          "--device-matrix '2,2'"),
    (["run", "matmul", "--alias", "", "--x-map", "None,a", "--w-map", "a,None"],
     "--alias-name '' gives 0 names for the 2 axes of --device-matrix '2,2'"),
])
def test_an_empty_or_short_alias_is_refused_naming_the_flag(capsys, argv, needle):
    # plan took --alias "" as not given (the default names axis_0, ...: then "unknown alias 'a'"), run matmul as
    # missing ("matmul needs --strategy, or ..."), and a short one met Layout's "alias_name ... device_matrix".
    shape = ["--shape", "4,4"] if argv[0] == "plan" else ["--shape", "4,4,4"]
    tail = ["--to", "None,None"] if argv[0] == "plan" else []
    line = _fails(capsys, [*argv[:1 + (argv[0] == "run")], "--device-matrix", "2,2", *argv[1 + (argv[0] == "run"):],
                           *tail, *shape], needle)
    assert "alias_name" not in line and "unknown alias" not in line


def test_strategy_of_the_wrong_length_names_the_strategy(capsys):
    # It named the layout's inner axes: 'tensor map ("axis_0", "axis_1") has 2 entries ...'.
    line = _fails(capsys, ["explain", "--strategy", "((2,1,1,2,1),)", "--world-size", "8", "--shape", "2,1,1,2"],
                  "--strategy '((2,1,1,2,1),)' (case key 'strategy'): strategy has 5 slice counts but shape "
                  "(2, 1, 1, 2) has 4 dims; expected one slice count per tensor dim")
    assert "axis_0" not in line


def test_a_negative_size_flag_is_named_as_the_flag(capsys):
    # It said "case key 'shape' must be a list of non-negative integers", a JSON key the user never wrote.
    _fails(capsys, ["show", "--device-matrix", "2,4", "--alias", "dp,mp", "--tensor-map", "mp,None",
                    "--shape", "8,-6"], "--shape '8,-6' must be sizes of at least 0, such as 2,4")
    _fails(capsys,
           ["slices", "--device-matrix", "0,4", "--alias", "dp,mp", "--tensor-map", "mp,None", "--shape", "8,8"],
           "--device-matrix '0,4' must be positive sizes, such as 2,4")
    _fails(capsys, ["slices", "--sbp", "S(0),B", "--placement", "2,0", "--shape", "8,6"],
           "--placement '2,0' must be positive sizes, such as 2,4")
    for command, n in (("slices", "0"), ("explain", "-3"), ("show", "0")):
        _fails(capsys, [command, "--strategy", "((2,),)", "--world-size", n, "--shape", "8"],
               f"--world-size {n} must be a positive number of ranks, such as 8")


def test_a_malformed_partition_spec_is_called_one(capsys):
    # It was called a "tensor map", a word of another dialect than the flag the user gave.
    _fails(capsys, ["show", "--partition-spec", "('x', None", "--device-matrix", "2,4", "--alias", "x,y",
                    "--shape", "8,8"], "--partition-spec \"('x', None\" (case key 'partition_spec'): partition spec "
                                       "has unbalanced brackets")
    _fails(capsys, ["plan", "--device-matrix", "2,4", "--alias", "x,y", "--from-partition-spec", "('x',,None)",
                    "--to", "None,x", "--shape", "8,8"], "--from-partition-spec \"('x',,None)\": partition spec has an "
                                                         "empty entry")


def test_a_partition_spec_reads_as_jax_prints_it(capsys):
    # print(sharding.spec) shows PartitionSpec('x', None) (newer JAX: P('x', None)): it was "a malformed entry".
    want = None
    for spec in ("('x', None)", "PartitionSpec('x', None)", "P('x',)", "jax.sharding.PartitionSpec('x', None)"):
        assert main(["slices", "--partition-spec", spec, "--device-matrix", "2,4", "--alias", "x,y",
                     "--shape", "8,8"]) == 0, spec
        out = capsys.readouterr().out
        assert want in (None, out), spec
        want = out
    # Each argument of the call is one entry: P(('x', 'y')) splits dim 0 over both axes (x major).
    assert main(["slices", "--partition-spec", "P(('x', 'y'))", "--device-matrix", "2,4", "--alias", "x,y",
                 "--shape", "8,8"]) == 0
    assert json.loads(capsys.readouterr().out)["rank_slices"]["5"] == [[5, 6], [0, 8]]
    assert main(["plan", "--device-matrix", "2,4", "--alias", "x,y", "--from-partition-spec", "P('x', None)",
                 "--to-partition-spec", "P(None, 'y')", "--shape", "8,8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]
    _fails(capsys, ["slices", "--partition-spec", "P('x',,None)", "--device-matrix", "2,4", "--alias", "x,y",
                    "--shape", "8,8"], ": partition spec has an empty entry for tensor dim 1")
    _fails(capsys, ["slices", "--partition-spec", "P(,)", "--device-matrix", "2,4", "--alias", "x,y",
                    "--shape", "8,8"], "--partition-spec 'P(,)' (case key 'partition_spec'): partition spec has an "
                                       "empty entry for tensor dim 0")


def test_an_empty_flag_is_named_as_given(capsys):
    # An empty mesh was "mesh shape () must be ..." or "device_matrix must have at least one axis" (no flag named);
    # plan's --from-placements "" was "give exactly one of ... got []" although it was given.
    for argv, flag in ((["slices", "--placements", "R", "--device-matrix", "", "--shape", ""], "--device-matrix"),
                       (["slices", "--sbp", "S(0)", "--placement", "", "--shape", "4"], "--placement"),
                       (["plan", "--device-matrix", "", "--from", "", "--to", "", "--shape", ""], "--device-matrix"),
                       (["plan", "--device-matrix", "2", "--to-device-matrix", "", "--from", "None", "--to", "None",
                         "--shape", "4"], "--to-device-matrix")):
        _fails(capsys, argv, f"{flag} '' gives no axis; expected at least one size")
    _fails(capsys, ["plan", "--device-matrix", "2", "--from-placements", "", "--to", "None", "--shape", "4"],
           "placements '' have an empty entry")
    _fails(capsys, ["plan", "--device-matrix", "2", "--from-sbp", "", "--to", "None", "--shape", "4"],
           "sbp '' has an empty entry")
    # An empty tensor map is a 0-d tensor's, as in slices.
    assert main(["plan", "--device-matrix", "2", "--from", "", "--to", "", "--shape", ""]) == 0
    assert "no steps" in capsys.readouterr().out


# -- 5, 6, 7: pictures, width, case file encoding --------------------------------------------------
def test_show_png_path_is_checked_before_drawing(tmp_path, capsys):
    blocker = tmp_path / "in.json"
    blocker.write_text("{}")
    (tmp_path / "d.png").mkdir()
    _fails(capsys, ["show", *CASE, "--png", str(blocker / "x.png")], "is a file, not a directory")
    _fails(capsys, ["show", *CASE, "--png", str(tmp_path / "d.png")], "is a directory; expected a file")
    if os.path.isdir("/proc/self"):
        _fails(capsys, ["show", *CASE, "--png", "/proc/x.png"], "'/proc' refuses new files")
    _fails(capsys, ["show", *CASE, "--png", str(tmp_path / "x.txt")], "must end in one of")


def test_plan_png_directory_is_checked_before_the_report(tmp_path, capsys):
    blocker = tmp_path / "in.json"
    blocker.write_text("{}")
    _fails(capsys, PLAN + ["--png", str(blocker)], f"--png {str(blocker)!r} is a file; expected a directory")
    _fails(capsys, PLAN + ["--png", str(blocker / "sub")], "is a file, not a directory")


def test_pictures_of_more_ranks_than_they_can_show_are_refused_before_the_report(tmp_path, capsys):
    """show --png and plan --png of 65,536 ranks drew for more than 5 minutes (1,024: 25 s), after printing
    the ASCII picture or the report; refused first now, at 256 ranks drawn as before."""
    big = ["--device-matrix", "512", "--alias", "x", "--tensor-map", "x", "--shape", "512"]
    _fails(capsys, ["show", *big, "--png", str(tmp_path / "x.png")],
           "--png draws up to 256 ranks, one cell each; this layout has 512: leave it out (the ASCII picture")
    _fails(capsys, ["show", "--matmul", "--strategy", "((32,1),(1,16))", "--shape", "32,4,16", "--png",
                    str(tmp_path / "m.png")], "--png draws up to 256 ranks, one cell each; this layout has 512")
    _fails(capsys, ["plan", "--device-matrix", "512", "--alias", "x", "--from", "x,None", "--to", "None,x",
                    "--shape", "512,512", "--png", str(tmp_path / "d")],
           "--png draws up to 256 ranks, one cell each; this layout has 512: leave it out (--show draws")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name, odd", [('x"y', '\'"\''), ("x y", "' '"), ("x\ny", "'\\n'"), ("x'y", '"\'"'),
                                       ("x\ty", "'\\t'"), ("x\u200by", "'\\u200b'")])
def test_an_axis_name_the_printed_layouts_cannot_hold_is_refused(name, odd, capsys):
    """An axis name with a quote, space, bracket or control character printed layouts that broke on it
    (convert's `Layout((2,), ("x"y",))` and a check line no shell reads; plan's heading over two lines);
    refused by every command that takes names, naming the character. Other letters are names (é)."""
    said = f"names an axis {name!r}, with {odd} in it; expected other names, such as dp or mp_2"
    _fails(capsys, ["convert", "--device-matrix", "2", "--alias", name, "--tensor-map", "None", "--shape", "4"], said)
    _fails(capsys, ["plan", "--device-matrix", "2", "--alias", name, "--from", "None", "--to", "None", "--shape", "4"],
           said)
    _fails(capsys, ["run", "matmul", "--device-matrix", "2", "--alias", name, "--x-map", "None,None", "--w-map",
                    "None,None", "--shape", "4,4,4", "--ranks", "2"], said)
    assert main(["slices", "--device-matrix", "2", "--alias", "é", "--tensor-map", "é", "--shape", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["rank_slices"]["1"] == [[2, 4]]


def test_show_width_has_a_minimum(capsys):
    for width in ("0", "-5", "19"):
        _fails(capsys, ["show", *CASE, "--width", width], f"--width {width} is too narrow; expected at least 20")
    assert main(["show", *CASE, "--width", "20"]) == 0


def test_case_file_that_is_not_utf8(tmp_path, capsys):
    case = tmp_path / "case.json"
    case.write_bytes(b"\xff\xfe{")
    for command in ("slices", "explain", "show"):
        _fails(capsys, [command, str(case)], f"case file {str(case)!r} is not UTF-8 text")
    # stdin as Python opens it under the C and C.UTF-8 locales (errors="surrogateescape"): the same bytes were
    # "stdin is not valid JSON: Expecting value: line 1 column 1 (char 0)"
    stdin = io.TextIOWrapper(io.BytesIO(b'{"shape": [4, 4]\xff}'), encoding="utf-8", errors="surrogateescape")
    with pytest.raises(SpmdsimError, match=r"^stdin is not UTF-8 text \(a JSON case expected\): invalid start "
                                           r"byte at byte 16$"):
        case_from_args(_args(["slices", "-"]), stdin)


def test_case_text_is_read_to_a_bound(tmp_path, capsys):
    # `spmdsim slices /dev/zero` and `yes | spmdsim slices` read until memory ran out.
    case = tmp_path / "big.json"
    case.write_text(" " * MAX_CASE_TEXT + "{}")
    for command in ("slices", "explain", "show", "convert"):
        _fails(capsys, [command, str(case)], f"case file {str(case)!r} is longer than 4,000,000 characters; "
                                             "expected a JSON case")
    with pytest.raises(SpmdsimError, match=r"^stdin is longer than 4,000,000 characters; expected a JSON case$"):
        case_from_args(_args(["slices"]), io.StringIO("y\n" * MAX_CASE_TEXT))
    case.write_text(" " * (MAX_CASE_TEXT - 2) + "{}")  # at the bound: read, then refused for what it holds
    _fails(capsys, ["slices", str(case)], "no layout")
    case.write_text(json.dumps(list(range(1000))))
    _fails(capsys, ["slices", str(case)], "must hold a JSON object, got list [0, 1, 2")


# -- 8: launch ---------------------------------------------------------------------------------------
def test_launch_bad_rank_counts(capsys):
    # -n 99999 ran mpiexec, which forked processes until "Too many open files" (exit 255, hydra's traceback).
    for n in ("0", "-1", "99999"):
        _fails(capsys, ["launch", "-n", n, "--", "true"],
               f"-n {n} must be a number of ranks from 1 to 4,096 (each one a process of this machine)")


def test_launch_bad_mpiexec_and_timeout(capsys):
    _fails(capsys, ["launch", "-n", "2", "--mpiexec", "/nonexistent/mpiexec", "--", "true"],
           "--mpiexec '/nonexistent/mpiexec' is not an executable program")
    # --mpiexec "" was taken as no --mpiexec given: the default mpiexec ran
    _fails(capsys, ["launch", "-n", "1", "--mpiexec", "", "--", "true"],
           "--mpiexec '' is not an executable program (a path, or a name on PATH); expected an MPI launcher")
    for value in ("nan", "inf", "0"):
        _fails(capsys, ["launch", "-n", "1", "--timeout", value, "--", "true"],
               f"--timeout {value} must be a positive, finite number of seconds")
    true = shutil.which("true")
    if true:  # coreutils' true answers --version with its own name: no MPI there
        _fails(capsys, ["launch", "-n", "2", "--mpiexec", true, "--", "true"], "is not an MPI launcher")


def test_launch_takes_mpiexecs_np_spelling():
    """`spmdsim launch -np 2` (mpiexec's and `spmdsim mpirun`'s spelling) was read as `-n p`: "invalid int value:
    'p'"."""
    for flag in ("-n", "-np", "--np"):
        assert build_parser().parse_args(["launch", flag, "2", "--", "python", "prog.py"]).ranks == 2


@pytest.mark.parametrize("argv, said", [
    (["--", "python", "prog.py", "-n", "2"], "launch's -n goes before the command, which takes what follows it as "
     "its own: spmdsim launch -n 2 -- python prog.py"),
    (["python", "prog.py", "-np", "4", "x"], "launch's -n goes before the command, which takes what follows it as "
     "its own: spmdsim launch -np 4 -- python prog.py x"),
    (["--", "python", "prog.py"], "launch needs -n N, the number of ranks: spmdsim launch -n 8 -- python prog.py")])
def test_launch_without_its_n_says_where_it_goes(argv, said, capsys):
    """`spmdsim launch -- python prog.py -n 2` (launch's flag after the command) said only "the following
    arguments are required: -n/-np/--np" under its usage."""
    assert main(["launch", *argv]) == 2
    assert unfold(capsys.readouterr().err) == f"spmdsim: error: {said}\n"


def test_launch_under_mpiexec_is_refused_once(capsys, monkeypatch):
    """`mpiexec -n 2 spmdsim launch -n 2 -- python prog.py`: rank 1 raised a TypeError (launch's command words read
    as the subcommand's name), rank 0 started a job of its own. Each process would start one: rank 0 says so."""
    from spmdsim.base import threads

    for name in threads.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_SIZE", "2")
    for rank, lines in (("1", []), ("0", ["spmdsim: error: launch starts its own mpiexec job, but mpiexec started 2 "
                                          "processes, each of which would start one: run spmdsim launch -n 2 "
                                          "without mpiexec"])):
        monkeypatch.setenv("PMI_RANK", rank)
        assert main(["launch", "-n", "2", "--", "python", "prog.py"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and unfold(err).splitlines() == lines


@pytest.mark.parametrize("flag, value", [("-f", "hosts"), ("--hostfile", "/no/such/hosts"), ("-host", "node1"),
                                         ("-ppn", "4"), ("-f", "")])  # "" named as a shell takes it: ''
def test_launch_refuses_mpiexecs_placement_options_saying_what_to_run(flag, value, capsys):
    """`spmdsim launch -n 8 -f hosts -- ...` said "unrecognized arguments: -f" (`-host node1`: "-h: ignored explicit
    argument 'ost'"), whether or not the file existed: launch starts every rank on this machine."""
    with pytest.raises(SystemExit) as info:
        main(["launch", "-n", "8", flag, value, "--", "python", "prog.py"])
    assert info.value.code == 2
    value = value or "''"
    assert unfold(capsys.readouterr().err).splitlines()[-1] == (
        f"spmdsim launch: error: {flag} {value} places ranks on other hosts; spmdsim launch starts every rank on "
        f"this machine: run your site's launcher, e.g. timeout -k 5 600 mpiexec {flag} {value} -n 8 python prog.py "
        "(each rank tunes itself: docs/howto/cluster-mpi.md)")


# -- 10, 11, 12: plan's cost column, device counts, size limits --------------------------------------
def test_plan_says_why_predictions_are_missing(tmp_path, monkeypatch, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text("not json")
    monkeypatch.setenv("SPMDSIM_COST_FILE", str(cost))
    assert main(PLAN) == 0
    # The last line, its continuation lines (wrapped at 100 columns) joined back.
    last = "predicted:" + capsys.readouterr().out.split("\npredicted:")[-1].replace("\n  ", " ")
    assert last.startswith(f"predicted: unavailable, cost model {str(cost)!r} is not JSON"), last


def test_plan_reports_a_device_count_mismatch_first(capsys):
    _fails(capsys, PLAN + ["--to-device-matrix", "4"],
           "--to-device-matrix '4' has 4 devices but --device-matrix '8' has 8; expected the same count")


def test_a_target_over_its_own_mesh_naming_the_source_axes_is_told_of_to_alias(capsys):
    # Was "unknown alias 'x' in tensor map (None, "x"); expected one of ('axis_0', 'axis_1')": neither why (the
    # target mesh is another one) nor the way out (--to-alias).
    _fails(capsys, PLAN + ["--to-device-matrix", "2,4"],
           "--to 'None,x' names 'x', an axis of --alias 'x', but --to-device-matrix '2,4' gives the target a mesh "
           "of its own, whose axis names are axis_0, axis_1 unless --to-alias gives others; expected --to-alias "
           "with 2 names, one per axis of --to-device-matrix")
    assert main(PLAN + ["--to-device-matrix", "2,4", "--to-alias", "y,x"]) == 0
    capsys.readouterr()


def test_device_matrices_above_the_limit_are_refused(capsys):
    start = time.perf_counter()
    _fails(capsys, ["slices", "--device-matrix", "4096,4096", "--alias", "a,b", "--tensor-map", "a,b",
                    "--shape", "8,8"], "--device-matrix '4096,4096' (case key 'device_matrix') has 16,777,216 devices; "
                                       "expected at most 65,536")
    _fails(capsys, ["slices", "--strategy", "((4096,4096),)", "--shape", "8,8"], "has 16,777,216 devices")
    _fails(capsys, ["slices", "--sbp", "S(0),B", "--placement", "4096,4096", "--shape", "8,8"],
           "--placement '4096,4096' (case key 'placement') has 16,777,216 devices")
    _fails(capsys, ["plan", "--device-matrix", "4096,4096", "--from", "axis_0,None", "--to", "None,axis_0",
                    "--shape", "8,8"], "--device-matrix '4096,4096' has 16,777,216 devices; expected at most 65,536")
    assert time.perf_counter() - start < 10


def test_plan_to_strategy_refuses_target_mesh_flags(capsys):
    base = ["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to-strategy", "((1,8),)",
            "--shape", "8,8"]
    for extra in (["--to-alias", "y"], ["--to-device-matrix", "2,4"]):
        _fails(capsys, base + extra, "--to-strategy gives the target's device matrix itself")
    assert main(base) == 0


def test_plan_refuses_an_alias_no_side_uses(capsys):
    # Both sides bring their own axes: --alias would be dropped without a word.
    strategies = ["plan", "--device-matrix", "8", "--from-strategy", "((8,1),)", "--shape", "8,8"]
    for target in (["--to-strategy", "((1,8),)"], ["--to-device-matrix", "2,4", "--to", "None,axis_1"],
                   ["--to-alias", "y", "--to", "None,y"]):
        _fails(capsys, strategies + ["--alias", "x"] + target, "--alias 'x' names no axis used here")
        assert main(strategies + target) == 0
        capsys.readouterr()
    # Used by either side: accepted.
    assert main(strategies + ["--alias", "x", "--to", "None,x"]) == 0
    assert main(["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None",
                 "--to-strategy", "((1,8),)", "--shape", "8,8"]) == 0


@pytest.mark.parametrize("side", ["from", "to"])
def test_plan_names_the_strategy_flag_that_holds_an_operators_strategy(side, capsys):
    """`plan --from-strategy "((2,1),(1,4))"` (a MatMul's .shard, copied whole) said "strategy ... has 2 inputs;
    expected one tensor's slice counts", naming no flag of the two."""
    two, one = "((2,1),(1,4))", "((1,8),)"
    argv = ["plan", "--from-strategy", two if side == "from" else one, "--to-strategy", one if side == "from" else
            "((1,8),(8,1))", "--shape", "64,64"]
    assert main(argv) == 2
    given = argv[argv.index(f"--{side}-strategy") + 1]
    first = "((2,1),)" if side == "from" else "((1,8),)"
    assert unfold(capsys.readouterr().err) == (f"spmdsim: error: --{side}-strategy {given!r} has 2 tensors' slice "
                                               f"counts (an operator's .shard); expected one tensor's, such as "
                                               f"{first}\n")


def test_plan_takes_two_strategies_device_count_without_device_matrix(capsys):
    # `plan --from-strategy --to-strategy` said "the following arguments are required: --device-matrix", whose
    # sizes it then dropped (only their count was used), where `slices --strategy` refuses --device-matrix.
    pair = ["plan", "--from-strategy", "((2,1),)", "--to-strategy", "((1,8),)", "--shape", "64,64"]
    assert main(pair) == 0
    inferred = capsys.readouterr().out
    assert main(pair + ["--device-matrix", "8"]) == 0
    assert inferred == capsys.readouterr().out and "Layout(axis_0=2, axis_1=1, rep=4)" in inferred
    _fails(capsys, ["plan", "--from-strategy", "((4,1),)", "--to-strategy", "((1,6),)", "--shape", "48,48"],
           "--from-strategy '((4,1),)' uses 4 devices and --to-strategy '((1,6),)' 6, and neither count divides "
           "the other; expected --device-matrix N with N a multiple of both, such as 12")
    # Any other form lies over --device-matrix's mesh: its flag named (argparse's line named none of them).
    _fails(capsys, ["plan", "--from", "x,None", "--to", "None,x", "--shape", "8,8"],
           "--device-matrix is missing, the mesh --from 'x,None' lies over; expected its sizes, such as "
           "--device-matrix 2,4 (only two .shard strategies need none")
    _fails(capsys, ["plan", "--from-strategy", "((8,1),)", "--to-placements", "R,S(1)", "--shape", "8,8"],
           "--device-matrix is missing, the mesh --to-placements 'R,S(1)' lies over")
    _fails(capsys, ["plan", "--from-strategy", "((8,1),)", "--shape", "8,8"], "no target layout given")
    # A strategy beside a target over its own mesh takes that mesh's count.
    assert main(["plan", "--from-strategy", "((8,1),)", "--to-device-matrix", "2,4", "--to", "None,axis_1",
                 "--shape", "8,8"]) == 0
    assert "Layout(axis_0=8, axis_1=1) ->\n  Layout(axis_0=2, axis_1=4)" in capsys.readouterr().out
    _fails(capsys, ["run", "redistribute", "--from-strategy", "((8,1),)", "--to-strategy", "((1,8),)",
                    "--shape", "8,8", "--ranks", "4"],
           "--from-strategy '((8,1),)' with --to-strategy '((1,8),)' has 8 devices but --ranks is 4; expected "
           "--ranks 8")


@pytest.mark.parametrize("value", ["dp,mp", "('x',None)"])
def test_names_in_device_matrix_say_where_names_go(value, capsys):
    """`--device-matrix dp,mp` (the axes' names) or a JAX spec's "('x',None)" said only "must be comma-separated
    integers such as 2,4"."""
    assert main(["slices", "--device-matrix", value, "--alias", "dp,mp", "--tensor-map", "dp,None",
                 "--shape", "8,8"]) == 2
    assert unfold(capsys.readouterr().err) == (
        f"spmdsim: error: --device-matrix {value!r} must be comma-separated integers such as 2,4 (the mesh's sizes; "
        "its axes' names go in --alias, a tensor's split over them in --tensor-map)\n")


def test_a_sharding_in_a_mesh_flag_names_the_flag_typed_and_the_one_that_reads_it(capsys):
    # --placement (OneFlow's mesh) for --placements (DTensor's sharding): plan said "--to-device-matrix 'R,S(1)'
    # is not a mesh; expected sizes such as 2,4", naming a flag not typed and none that reads 'R,S(1)'.
    plan = ["plan", "--shape", "64,64"]
    _fails(capsys, plan + ["--device-matrix", "2,4", "--from-placements", "S(0),P", "--to-placement", "R,S(1)"],
           "--to-placement 'R,S(1)' is a sharding, not a mesh: 'S(1)' is DTensor placement syntax: give the layout "
           "with --to-placements; expected the mesh's sizes, such as --to-placement 2,4")
    _fails(capsys, plan + ["--placement", "S(0),R", "--to-placements", "R,S(1)"],
           "--placement 'S(0),R' is a sharding, not a mesh: 'S(0)' is DTensor placement syntax: give the layout with "
           "--from-placements; expected")
    _fails(capsys, plan + ["--placement", "2,4", "--from-sbp", "S(0),P", "--to-placement", "4", "--to", "axis_0,None"],
           "--to-placement '4' has 4 devices but --placement '2,4' has 8; expected the same count")
    _fails(capsys, ["slices", "--placement", "B,S(0)", "--shape", "8,8"],
           "--placement 'B,S(0)' is a sharding, not a mesh: 'S(0)' is OneFlow SBP syntax: give the layout with --sbp; "
           "expected the mesh's sizes, such as --placement 2,4")
    _fails(capsys, ["slices", "--device-matrix", "S(0),R", "--shape", "8,8"],
           "--device-matrix 'S(0),R' is a sharding, not a mesh: 'S(0)' is DTensor placement syntax: give the layout "
           "with --placements;")


@pytest.mark.parametrize("argv", [["collective", "ring-allreduce", "-n", "4"], ["demo", "-np", "4"],
                                  ["run", "mlp", "--shape", "24,96,360", "--np", "4"]])
def test_mpiexec_s_rank_flag_given_to_a_command_says_whose_it_is(capsys, argv):
    # `spmdsim collective ring-allreduce -n 4` said only "unrecognized arguments: -n 4".
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2
    flag = argv[-2]
    assert out == "" and unfold(err).splitlines()[-1].endswith(
        f"error: unrecognized arguments: {flag} 4; {flag} is mpiexec's (mpiexec -n N spmdsim ...); here --ranks N "
        "simulates N ranks in this process")


@pytest.mark.parametrize("argv, gives", [
    (["explain", "--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "a,b", "--shape", "4,4", "--ranks", "4"],
     "explain runs none: --device-matrix (--placement for --sbp, --world-size for --strategy) gives its ranks"),
    (["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x", "--shape", "8,8",
      "--ranks", "8"], "plan runs none: --device-matrix (or two .shard strategies) gives its ranks"),
    (["pipeline", "--stages", "4", "--microbatches", "8", "--ranks", "4"], "pipeline runs none: --stages gives its"),
    (["context", "--cp", "4", "--seq", "4096", "--ranks", "4"], "context runs none: --cp gives its ranks")])
def test_ranks_given_to_a_command_that_runs_none_says_what_gives_its_ranks(capsys, argv, gives):
    # `spmdsim explain ... --ranks 4` said "unrecognized arguments: --ranks" (its 4 read as a case file).
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert (info.value.code, out) == (2, "")
    assert "; --ranks is for the commands that run ranks (run, collective, demo); " + gives in unfold(err)


def test_the_redistribution_page_names_the_target_axes_plan_prints(capsys):
    # The page said a target strategy's axes are named `t0, t1, ...`; plan prints to_0, to_1.
    assert main(["plan", "--from-strategy", "((8,1),)", "--to-strategy", "((1,8),)", "--shape", "8,8"]) == 0
    assert '-> ("to_0", "to_1") on' in capsys.readouterr().out
    page = " ".join((docs_commands.ROOT / "docs/explanation/redistribution.md").read_text().split())
    assert "the target's axes are then named `to_0, to_1, ...`" in page


def test_a_byte_count_is_echoed_as_typed_and_infinity_is_refused():
    import argparse

    from spmdsim.tools.cli.calibrate import parse_size

    for text in ("inf", "1e400", "abc", "1P"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^size '{text}' is not a byte count"):
            parse_size(text)
    # T too (`--memory-limit 1.5T`, a node's memory, was "not a byte count like 64K or 4M")
    assert [parse_size(t) for t in ("1.5T", "2TiB", "80G")] == [3 << 39, 2 << 40, 80 << 30]


def test_main_builds_each_parser_once_and_answers_every_call_alike(capsys, monkeypatch):
    """main() keeps the parsers it built (spmdsim.tools.cli.main._PARSERS): a command's second call builds none, and
    every call answers as the first did (the output, an error's one line, an unknown flag's usage, --help, and
    autoshard's --fix, whose default list a parse must leave empty)."""
    import spmdsim.tools.cli.main as cli_main

    built = []
    monkeypatch.setattr(cli_main, "_PARSERS", {})
    monkeypatch.setattr(cli_main, "build_parser", lambda commands, real=build_parser: built.append(commands)
                        or real(commands))
    mlp = ["autoshard", "--network", "mlp", "--devices", "2"]
    calls = (["slices", *CASE], ["slices", *CASE[:-1], "8,-8"], ["slices", *CASE, "--nope"], ["plan", "--help"],
             mlp, [*mlp, "--fix", "*=hand"], mlp, [])
    answers = []
    for argv in calls * 2:
        try:
            code = main(argv)
        except SystemExit as exc:  # --help and argparse's own errors
            code = exc.code
        out, err = capsys.readouterr()
        # autoshard's modelled time comes from a GEMM rate measured at the call: the one line that may differ
        answers.append((code, re.sub(r"(?m)^modelled time .*$", "modelled time", out), err))
    assert answers[:len(calls)] == answers[len(calls):]
    assert [a[0] for a in answers[:len(calls)]] == [0, 2, 2, 0, 0, 2, 0, 2]
    assert "--shape '8,-8' must be sizes of at least 0" in answers[1][2]
    assert answers[2][2] == "spmdsim slices: error: unrecognized arguments: --nope; see: spmdsim slices --help\n"
    assert answers[4] == answers[6] and "mlp has no hand-written strategies" in answers[5][2]
    assert built == [("slices",), ("plan",), ("autoshard",), cli_main.SUBCOMMANDS]


# -- a single-valued option given twice ---------------------------------------------------------------
def _subparsers(parser, prog=""):
    """(prog, parser) of every command and subcommand under `parser`."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prog} {name}".strip(), sub
                yield from _subparsers(sub, f"{prog} {name}")


def _two_values(action) -> tuple[str, str] | None:
    """Two different values `action` accepts (None when its type takes no simple text)."""
    if action.choices:
        choices = [str(c) for c in action.choices]
        return (choices[0], choices[1]) if len(choices) > 1 else None
    return ("1", "2") if action.type in (None, int, float) else None


def test_every_command_refuses_a_single_valued_option_given_twice(capsys):
    """`--from "x,None" --from "None,x"` kept the last without a word, in every command. Now each (sub)command
    refuses a value-taking option given two values (one line naming the flag and both values)."""
    import argparse

    checked = []
    for prog, sub in _subparsers(build_parser()):
        for action in sub._actions:
            values = _two_values(action)
            if not action.option_strings or action.nargs == 0 or values is None \
                    or isinstance(action, argparse._AppendAction) or action.dest == "device_matrix":
                continue
            flag = action.option_strings[0]
            with pytest.raises(SystemExit) as info:
                sub.parse_args([flag, values[0], flag, values[1]])
            assert info.value.code == 2
            err = unfold(capsys.readouterr().err)
            first, again = (repr((action.type or str)(v)) for v in values)
            assert err == (f"spmdsim {prog}: error: {flag} given twice, {first} then {again}; "
                           "expected it once\n"), err
            checked.append(prog)
            break
    every = {prog for prog, _ in _subparsers(build_parser())} - {"run"}  # `run` itself has only its OP
    assert set(checked) == every, every - set(checked)


def test_every_commands_usage_error_is_one_line_naming_the_value(capsys):
    """argparse printed its usage above an error: `spmdsim pipeline --stages x` was 3 lines of flags, then
    "argument --stages: invalid int value: 'x'", Python's name for the type. Every (sub)command's own errors are
    one line: a value that is not an integer names the flag, the value and what it must be; words it does not
    know, or one it lacks, end with where --help lists the flags."""
    import argparse

    checked = []
    for prog, sub in _subparsers(build_parser()):
        with pytest.raises(SystemExit) as info:
            sub.parse_args(["--xyzzy-qux"])
        err = unfold(capsys.readouterr().err)
        assert info.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"spmdsim {prog}: error: ") and err.endswith(f"; see: spmdsim {prog} --help\n"), err
        ints = [a for a in sub._actions if a.option_strings and a.type is int and a.choices is None
                and not isinstance(a, argparse._AppendAction)]
        if ints:
            with pytest.raises(SystemExit):
                sub.parse_args([ints[0].option_strings[0], "1.5"])
            assert capsys.readouterr().err == (f"spmdsim {prog}: error: {ints[0].option_strings[0]} '1.5' must be "
                                               "an integer\n")
            checked.append(prog)
    assert {"pipeline", "context", "estimate", "launch", "run matmul", "lab check"} <= set(checked), checked
    with pytest.raises(SystemExit):
        main(["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--precision", "fp4"])
    assert unfold(capsys.readouterr().err) == (
        "spmdsim estimate: error: argument --precision: invalid choice: 'fp4'; did you mean 'fp64' or 'fp8'? "
        "(choose from 'fp64', 'bf16-mixed', 'fp16-mixed', 'fp8')\n")
    with pytest.raises(SystemExit):
        main(["launch", "--timeout", "soon", "-n", "2", "--", "true"])
    assert capsys.readouterr().err == "spmdsim launch: error: --timeout 'soon' must be a number\n"


@pytest.mark.parametrize("argv, line", [
    (["pipeline", "--stages", "-inf"], "spmdsim pipeline: error: --stages '-inf' must be an integer"),
    (["launch", "-n", "2", "--timeout", "-inf", "--", "true"],
     "spmdsim: error: --timeout -inf must be a positive, finite number of seconds"),
    (["estimate", "gpt", "--dropout", "-NaN"], "spmdsim: error: --dropout -NaN must be in [0, 1) (0: no dropout, "
                                               "as Llama trains)"),
    (["slices", "--shape", "-inf"], "spmdsim: error: --shape '-inf' must be comma-separated integers such as 2,4")])
def test_minus_inf_and_nan_are_values_refused_by_name(capsys, argv, line):
    """argparse took `-inf` for an unknown flag: "argument --timeout: expected one argument", the value unnamed (a
    minus and a digit was a value already: --flops -1e9). Each is now its flag's value, refused by its check."""
    with pytest.raises(SystemExit) as info:
        sys.exit(main(argv))
    assert info.value.code == 2 and unfold(capsys.readouterr().err) == line + "\n"


def test_a_repeated_option_in_full(capsys):
    base = ["run", "redistribute", "--device-matrix", "4", "--alias", "x", "--to", "None,x", "--ranks", "4"]
    with pytest.raises(SystemExit) as info:
        main([*base, "--from", "x,None", "--from", "None,x", "--shape", "8,8"])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and unfold(err) == (
        "spmdsim run redistribute: error: --from given twice, 'x,None' then 'None,x'; expected it once\n")
    # Two names of one option: both named.
    with pytest.raises(SystemExit):
        main(["run", "matmul", "--alias", "x", "--alias-name", "y", "--shape", "8,8,8"])
    assert unfold(capsys.readouterr().err) == (
        "spmdsim run matmul: error: --alias 'x' and --alias-name 'y' name one option; expected one of them\n")
    # The same value twice loses nothing: accepted, as is a switch given twice.
    assert main(["collective", "ring-allreduce", "--size", "4K", "--size", "4K", "--ranks", "2", "--repeat", "1",
                 "--json", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_rank"] == 4096
    # Options meant to repeat still do (autoshard --fix, action="append").
    args = _args(["autoshard", "--network", "mlp", "--fix", "a=hand", "--fix", "b=hand"])
    assert args.fix == ["a=hand", "b=hand"] and not hasattr(args, "_once_given")


# -- --ranks: a bad value is refused before the banner (the only line), as under mpiexec -------------------
REDISTRIBUTE = ["run", "redistribute", "--alias", "x", "--from", "x,None", "--to", "None,x", "--ranks", "4"]
HUGE_SEED = str(2 ** 63 - 1)


@pytest.mark.parametrize("argv, needle", [
    (["collective", "binomial-bcast", "--root", "9", "--ranks", "4"], "--root 9 must be a rank (0 <= root < 4)"),
    (["collective", "ring-allgather", "--size", "3", "--ranks", "4"], "--size '3': 3 bytes are not a whole"),
    (["run", "matmul", "--shape", "16,16", "--ranks", "4"], "--shape '16,16' has 2 sizes; expected M,K,N"),
    # the way out named, as --device-matrix's is ("expected --ranks 8"): a new user's --ranks 4 said none
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "16,16,16", "--ranks", "4"],
     "matmul strategy ((2, 1), (1, 4)) needs 8 devices but the world size is 4; the product of the slice counts "
     "must not exceed the number of ranks; expected --ranks 8"),
    (["run", "matmul", "--strategy", "((3,1),(1,1))", "--shape", "6,16,16", "--ranks", "4"],
     "matmul strategy ((3, 1), (1, 1)) uses 3 devices, which does not divide the world size 4; the product of the "
     "slice counts must divide the number of ranks; expected --ranks 3 or a multiple of it"),
    # "has 1 batch dims" (and "has 0 batch dims" for the other way round), with no word of the shape expected
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "4,16,32,64", "--ranks", "8"],
     "matmul shape (4, 16, 32, 64) has 1 batch dim but strategy ((2, 1), (1, 4)) gives x 2 dims (no batch dim); "
     "expected 3 sizes, M,K,N"),
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--out-strategy", "((8,1),)", "--shape", "16,32,64",
      "--ranks", "8"], "expected (2, 4): the contraction is not split, so no pending sum is left to reduce-scatter "
     "into a finer cut"),  # was "or one dim cut 1 times more (the contraction's ())"
    (["run", "matmul", "--strategy", "((1,2,1,1),(1,4))", "--shape", "16,32,64", "--ranks", "8"],
     "has no batch dim but strategy ((1, 2, 1, 1), (1, 4)) gives x 4 dims (2 batch dims); expected 5 sizes, "
     "B1,B2,M,K,N"),
    (["run", "matmul", "--device-matrix", "2,4", "--alias", "a,b", "--x-map", "a,b", "--w-map", "b,None",
      "--shape", "8,8,8", "--ranks", "4"], "--device-matrix '2,4' has 8 devices but --ranks is 4; expected --ranks 8"),
    (["run", "matmul", "--placement", "2,4", "--x-sbp", "S(0),B", "--w-sbp", "B,B", "--shape", "8,8,8",
      "--ranks", "4"], "--placement '2,4' has 8 devices but --ranks is 4"),
    (["run", "mlp", "--shape", "8,8,8", "--ranks", "4", "--trace-out", "/nonexistent/t.json"],
     "--trace-out '/nonexistent/t.json' cannot be written"),
    (["run", "mlp", "--shape", "8,8,8", "--ranks", "4", "--watchdog", "abc"], "--watchdog 'abc' is not a number"),
    (["run", "mlp", "--shape", "8,8,8", "--ranks", "2", "--seed", HUGE_SEED],
     f"--seed {HUGE_SEED} must be an integer in [0, 2**62)"),
    (["run", "linear", "--shape", "8,8,8", "--ranks", "2", "--seed", "-1"], "--seed -1 must be an integer"),
    ([*REDISTRIBUTE, "--device-matrix", "8", "--shape", "8,8"], "--device-matrix '8' has 8 devices but --ranks is 4"),
    ([*REDISTRIBUTE, "--device-matrix", "4", "--shape", "8"], "tensor map (\"x\", None) has 2 entries but shape"),
    ([*REDISTRIBUTE, "--device-matrix", "4", "--shape", "8,8", "--seed", HUGE_SEED], f"--seed {HUGE_SEED} must"),
    (["demo", "--ranks", "4", "--watchdog", "x"], "--watchdog 'x' is not a number of seconds"),
    (["demo", "--ranks", "4", "--only", "mlp", "--seed", HUGE_SEED], f"--seed {HUGE_SEED} must be"),
    (["autoshard", "--network", "mlp", "--run", "--ranks", "4", "--devices", "8"],
     "--run uses the 4 ranks of the launch; --devices 8 differs (launch with --ranks 8)"),
])
def test_simulated_ranks_refuse_bad_values_before_the_banner(capsys, argv, needle):
    """`collective --root 9 --ranks 4` (and the other --ranks commands' checks) printed the banner "spmdsim:
    running on 4 simulated ranks ..." first; a huge --seed was refused naming seed + 1, a value never typed."""
    _fails(capsys, argv, needle)


def test_an_error_before_mpi_is_printed_once_per_job(capsys, monkeypatch):
    """Under `mpiexec -n 4`, an error every process raised before MPI (a bad --shape beside --ranks, --ranks 0, a
    bad slices flag) was printed by each of the 4: rank 0 says it and the job exits 2 (mpiexec gives the largest
    code); slices needs no MPI, so the other ranks do not run it at all (exit 0, spmdsim.tools.cli.main's
    PURE_COMMANDS)."""
    argv = ["slices", "--device-matrix", "0,4", "--alias", "a,b", "--tensor-map", "a,None", "--shape", "8,8"]
    monkeypatch.setenv("PMI_SIZE", "4")
    for rank, lines, code in (("1", 0, 0), ("0", 1, 2)):
        monkeypatch.setenv("PMI_RANK", rank)
        assert main(argv) == code
        out, err = capsys.readouterr()
        assert out == "" and len(unfold(err).splitlines()) == lines, err
    assert "--device-matrix '0,4' must be positive sizes" in err


@pytest.mark.parametrize("variable, rank, waits",
                         [("OMPI_COMM_WORLD_RANK", "1", True), ("OMPI_COMM_WORLD_RANK", "0", False),
                          ("PMI_RANK", "1", False)], ids=["open-mpi-1", "open-mpi-0", "mpich-1"])
def test_an_error_every_rank_met_waits_for_rank_0_to_say_it_under_open_mpi(capsys, monkeypatch, variable, rank, waits):
    """Open MPI's launcher ends the job as soon as a process exits non-zero: under `mpiexec -n 2` rank 1 refused a
    bad flag and exited 2 first, and rank 0's line was cut (bench.py's: no line in 4 runs of 6, only prterun's
    banner). There a rank other than 0 waits (till the launcher ends it, rank 0 having said it and exited);
    under MPICH's, which waits for every process, and on rank 0, nothing waits."""
    from spmdsim.base import threads

    slept = []
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(sleep=slept.append))
    for name in threads.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, rank)
    with pytest.raises(SystemExit) as ended:
        main(["demo", "--bogus"])
    assert ended.value.code == 2 and slept == ([threads.SAY_WAIT_S] if waits else [])
    assert len(unfold(capsys.readouterr().err).splitlines()) == (1 if rank == "0" else 0)
    assert threads.after_rank0_says(0) == 0 and slept == ([threads.SAY_WAIT_S] if waits else [])


def test_autoshard_progress_counts_one_device():
    # "mlp on 1 devices" in the "still choosing" line
    from spmdsim.tools.cli.autoshard_common import still_working

    args = _args(["autoshard", "--network", "mlp", "--devices", "1"])
    assert still_working(args, 1).what == "mlp on 1 device"
    assert still_working(args, 8).what == "mlp on 8 devices"


class _MpiWorld:
    """A communicator of `size` MPI ranks as run_op reads one before its job (no spmdsim engine: MPI's)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def Get_size(self) -> int:
        return self.size


@pytest.mark.parametrize("size, said, way", [
    (4, "matmul strategy ((2, 4), (4, 1)) needs 8 devices but the world size is 4", "launch 8 ranks with "
     "`mpiexec -n 8 ...`, or simulate them in one process with `--ranks 8` / spmdsim.simulate(8, main)"),
    (9, "matmul strategy ((2, 4), (4, 1)) uses 8 devices, which does not divide the world size 9", "launch 8 "
     "ranks with `mpiexec -n 8 ...`, or simulate them in one process with `--ranks 8` / spmdsim.simulate(8, main)"),
    (1, "matmul strategy ((2, 4), (4, 1)) needs 8 devices but the world size is 1", "one process: launch 8 ranks "
     "with `mpiexec -n 8 ...`, or simulate them in this process with `--ranks 8` / spmdsim.simulate(8, main)")])
def test_a_strategy_for_other_ranks_under_mpiexec_says_how_to_get_them(size, said, way):
    """`mpiexec -n 4 spmdsim run matmul --strategy "((2,4),(4,1))"` said the strategy needs 8 devices with no way
    out (one process got one, and a --device-matrix's Mesh says it under mpiexec too); -n 9 likewise. The error
    keeps its class and its numbers."""
    from spmdsim.errors import DialectError, RankCountError

    args = _args(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,16,16"])
    with pytest.raises(DialectError) as raised:
        run_cli.run_op(args, _MpiWorld(size))
    got = raised.value
    tail = "must not exceed" if size < 8 else "must divide"
    assert str(got) == f"{said}; the product of the slice counts {tail} the number of ranks ({way})"
    assert isinstance(got, RankCountError) and (got.needed, got.size, got.divides) == (8, size, size > 8)
