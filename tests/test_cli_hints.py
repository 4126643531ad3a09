"""A new user's slips answered with the way out: a mistyped command, choice or flag names the close ones ("did
you mean"), a layout in another dialect's syntax names the flag (or function) that reads it, two forms mixed
say which flag goes with which, and an empty case file says it is empty. Each answer is one line (usage first
for the parser's own), asserted whole."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from spmdsim import Layout
from spmdsim.base.once_parser import OnceParser
from spmdsim.base.suggest import close_matches, did_you_mean
from spmdsim.errors import LayoutError
from spmdsim.tools.cli.main import build_parser, main
from docs_commands import run_example
from testkit import unfold

#: The lab's MPI programs (docs/howto/mpi4py-lab.md).
LAB = Path(__file__).resolve().parent / "data" / "lab"


def _parser_error(capsys, argv: list[str]) -> list[str]:
    """An argparse refusal of `argv`: exit 2, nothing on stdout; its lines, the error's unfolded."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "", (out, err)
    return unfold(err).splitlines()


COMMANDS = ("'slices', 'explain', 'show', 'demo', 'collective', 'pipeline', 'context', 'run', 'launch', 'plan', "
            "'convert', 'estimate', 'autoshard', 'calibrate', 'mpirun', 'lab'")


@pytest.mark.parametrize("argv, meant", [(["estmate"], "estimate"), (["mpiexec", "-n", "4", "hello.py"], "mpirun")])
def test_a_mistyped_command_names_the_command_meant(capsys, argv, meant):
    assert _parser_error(capsys, argv) == [
        f"spmdsim: error: argument COMMAND: invalid choice: {argv[0]!r}; did you mean {meant!r}? "
        f"(choose from {COMMANDS})"]


def test_a_mistyped_subcommand_and_choice_name_the_one_meant(capsys):
    assert _parser_error(capsys, ["lab", "strat", "5", "work"])[-1] == (
        "spmdsim lab: error: argument {list,start,check,grade}: invalid choice: 'strat'; did you mean 'start'? "
        "(choose from 'list', 'start', 'check', 'grade')")
    # nothing close: argparse's line as it was
    assert _parser_error(capsys, ["lab", "zzz"])[-1] == (
        "spmdsim lab: error: argument {list,start,check,grade}: invalid choice: 'zzz' (choose from 'list', "
        "'start', 'check', 'grade')")


@pytest.mark.parametrize("network, said", [
    ("llama", "Llama's architecture is the GPT's options: spmdsim estimate gpt --ffn N --kv-heads N --norm rms "
              "--mlp swiglu --untied --rope --no-bias"),
    ("mixtral", "Mixtral's experts are the GPT's options: spmdsim estimate gpt --experts N --top-k 2 (with "
                "Llama's: --ffn N --kv-heads N --norm rms --mlp swiglu --untied --rope --no-bias)")])
def test_estimate_of_a_llama_names_the_gpts_options_that_make_one(capsys, network, said):
    """`spmdsim estimate llama` (a network docs/explanation/estimate-h100.md prices) said only "(choose from
    'gpt')": Llama's and Mixtral's architectures are flags of the GPT."""
    assert _parser_error(capsys, ["estimate", network])[-1] == (
        f"spmdsim estimate: error: argument network: invalid choice: {network!r}; {said} (choose from 'gpt')")


@pytest.mark.parametrize("network, said", [
    ("llama", "Llama's architecture is the GPT's options: --network gpt --ffn N --kv-heads N --norm rms --mlp swiglu "
              "--untied --rope --no-bias"),
    ("mixtral", "Mixtral's experts are the GPT's options: --network gpt --gpt experts=N,top_k=2 (with Llama's: --ffn "
                "N --kv-heads N --norm rms --mlp swiglu --untied --rope --no-bias)")])
def test_autoshard_of_a_llama_names_the_gpts_options_that_make_one(capsys, network, said):
    """`spmdsim autoshard --network llama` listed ten networks, none of them Llama's: its architecture is the
    GPT's flags (--ffn, --kv-heads, ...)."""
    line = _parser_error(capsys, ["autoshard", "--network", network, "--devices", "8"])[-1]
    assert line.startswith(f"spmdsim autoshard: error: argument --network: invalid choice: {network!r}; {said} "
                           "(choose from 'net_mindspore_tutorial'"), line


SHOW = ["--alias", "dp,mp", "--tensor-map", "mp,None", "--shape", "8,6"]


@pytest.mark.parametrize("argv, line", [
    (["show", "--device-matirx", "2,4", *SHOW],
     "spmdsim show: error: unrecognized arguments: --device-matirx; did you mean --device-matrix?"),
    # the flag's underscore spelling: the hyphenated flag alone
    (["show", "--device_matrix", "2,4", "--alias", "dp,mp", "--tensor_map", "mp,None", "--shape", "8,6"],
     "spmdsim show: error: unrecognized arguments: --device_matrix --tensor_map mp,None; did you mean "
     "--device-matrix for --device_matrix; --tensor-map for --tensor_map?"),
    # matched against estimate's own flags (the top parser, which reported it, knows none of them)
    (["estimate", "gpt", "--hiden", "4096"], "spmdsim estimate: error: unrecognized arguments: --hiden 4096; did "
                                             "you mean --hidden?"),
    (["estimate", "gpt", "--hiden=4096"], "spmdsim estimate: error: unrecognized arguments: --hiden=4096; did you "
                                          "mean --hidden?"),
    # examples/train_gpt.py's names of the sizes: --batch is a step's sequences (it named --micro-batch)
    (["estimate", "gpt", "--d-model", "512", "--batch", "64"], "spmdsim estimate: error: unrecognized arguments: "
                                                               "--d-model 512 --batch 64; did you mean --hidden for "
                                                               "--d-model; --global-batch for --batch?"),
    (["lab", "start", "5", "--exercisez", "x"], "spmdsim lab start: error: unrecognized arguments: --exercisez x; "
                                                "did you mean --exercises?"),
    (["show", "--bogus", *SHOW], "spmdsim show: error: unrecognized arguments: --bogus; see: spmdsim show --help"),
])
def test_an_unknown_flag_names_the_flags_of_its_own_command_close_to_it(capsys, argv, line):
    assert _parser_error(capsys, argv) == [line]


@pytest.mark.parametrize("argv, line", [
    (["run", "linear", "--mode", "column", "--shape", "8,64,16"],
     "spmdsim run linear: error: unrecognized arguments: --mode column; did you mean --parallel?"),
    (["run", "embedding", "--parallel", "vocab", "--shape", "8,64,16"],
     "spmdsim run embedding: error: unrecognized arguments: --parallel vocab; did you mean --mode?"),
])
def test_run_names_its_flag_that_picks_how_an_operator_is_split(capsys, argv, line):
    """`run embedding --mode vocab` and `run linear --parallel column` choose the same thing, each by its own
    flag: the other's name said only "see: spmdsim run linear --help"."""
    assert _parser_error(capsys, argv)[-1] == line


def test_the_trainer_takes_the_estimates_names_of_the_sizes_as_its_own(capsys):
    """`spmdsim estimate gpt`'s --hidden and --global-batch given to examples/train_gpt.py's parser (an OnceParser
    with its flags): it named nothing for --hidden."""
    parser = OnceParser(prog="train_gpt.py")
    for flag in ("--d-model", "--batch", "--microbatches"):
        parser.add_argument(flag, type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--hidden", "512", "--global-batch", "64"])
    err = capsys.readouterr().err
    assert " ".join(err[err.index("train_gpt.py: error:"):].split()) == (
        "train_gpt.py: error: unrecognized arguments: --hidden 512 --global-batch 64; did you mean --d-model for "
        "--hidden; --batch for --global-batch?")


def test_a_script_parser_suggests_alike(capsys):
    """Every OnceParser does it (the scripts', the examples'), not the CLI's main() alone."""
    parser = OnceParser(prog="script.py")
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--dry-run", action="store_true")
    with pytest.raises(SystemExit):
        parser.parse_args(["--dry_run", "--rank", "4", "--lr", "0.1"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "script.py: error: unrecognized arguments: --dry_run --lr 0.1; did you mean --dry-run for --dry_run?")
    # parse_known_args leaves no record of the parse on the namespace
    args, extra = parser.parse_known_args(["--dry_run"])
    assert extra == ["--dry_run"] and vars(args) == {"ranks": None, "dry_run": False}


@pytest.mark.parametrize("flag, meant", [("--hsdp", "--shard-group"), ("--fsdp", "--zero"),
                                         ("--sequence-parallel", "--sp"), ("--tensor-model-parallel-size", "--tp"),
                                         ("--pipeline-model-parallel-size", "--pp"), ("--num-layers", "--layers"),
                                         ("--hidden-size", "--d-model"), ("--num-attention-heads", "--heads"),
                                         ("--global-batch-size", "--batch"), ("--seq-length", "--seq")])
def test_the_gpt_examples_name_their_flag_for_pytorchs_and_megatrons(flag, meant):
    """`train_gpt.py --zero 3 --hsdp 2` said "did you mean --sp or --dp?" (difflib's), `--sequence-parallel`
    nothing: the flag that does the work is named."""
    out = run_example("examples/train_gpt.py", "--ranks", "8", flag, "2")
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == (f"train_gpt.py: error: unrecognized arguments: {flag} 2; did "
                                           f"you mean {meant}?")


def test_the_estimate_names_its_flags_for_megatrons_and_micro_batch_size_is_explained_in_the_examples(capsys):
    """`spmdsim estimate gpt --hidden-size 64` named --hidden (train_gpt.py's is --d-model: the first a command
    has); `train_gpt.py --micro-batch-size 2` said "did you mean --microbatches?", a count, not a size."""
    assert _parser_error(capsys, ["estimate", "gpt", "--hidden-size", "64", "--micro-batch-size", "2",
                                  "--global-batch-size", "8"])[-1].endswith(
        "did you mean --hidden for --hidden-size; --micro-batch for --micro-batch-size; --global-batch for "
        "--global-batch-size?")
    out = run_example("examples/train_gpt.py", "--ranks", "8", "--micro-batch-size", "2")
    assert out.returncode == 2
    assert unfold(out.stderr).splitlines()[-1] == (
        "train_gpt.py: error: unrecognized arguments: --micro-batch-size 2; --micro-batch-size is Megatron-LM's "
        "sequences per microbatch on each data-parallel rank; here --batch N is a step's sequences on all ranks "
        "together and --microbatches M cuts each rank's share into M")


@pytest.mark.parametrize("example, argv, line", [
    ("train_gpt.py", ["--ep", "2"], "--ep 2; --ep is examples/train_moe_gpt.py's (the mixture-of-experts GPT: "
                                    "docs/howto/experts.md)"),  # was "did you mean --kept or --help?"
    ("train_moe_gpt.py", ["--sample", "0"], "--sample 0; --sample is examples/train_gpt.py's (the dense GPT's)"),
    ("train_moe_gpt.py", ["--clip", "1", "--stepz", "1"], "--clip 1 --stepz 1; --clip is examples/train_gpt.py's "
                                                          "(the dense GPT's); did you mean --steps?"),
])
def test_a_gpt_examples_flag_given_to_the_other_names_the_example_that_takes_it(example, argv, line):
    """`train_moe_gpt.py --sample 0` (copied from a train_gpt.py command) said "did you mean --save?"."""
    out = run_example(f"examples/{example}", "--ranks", "8", *argv)
    assert out.returncode == 2
    assert unfold(out.stderr).splitlines()[-1] == f"{example}: error: unrecognized arguments: {line}"


def test_close_matches_take_another_spelling_alone_then_prefixes_then_typos():
    names = ["ring-allreduce", "ring-allgather", "bruck-alltoall"]
    assert close_matches("ring_allreduce", names) == ["ring-allreduce"]
    assert close_matches("RING-ALLREDUCE", names) == ["ring-allreduce"]
    assert close_matches("--device_matrix", ["--device-matrix", "--alias"]) == ["--device-matrix"]
    scenarios = ["mlp", "matmul_2x4_4x1", "matmul_1x8_8x1"]
    assert close_matches("matmul_2x4", scenarios) == ["matmul_2x4_4x1", "matmul_1x8_8x1"]
    assert did_you_mean("mpiexec", ["run", "mpirun"]) == "did you mean 'mpirun'?"
    assert did_you_mean("zzz", names) == ""


def test_an_unknown_collective_algorithm_names_the_close_ones(capsys):
    assert main(["collective", "ring_allreduce", "--ranks", "4"]) == 2
    assert unfold(capsys.readouterr().err).startswith(
        "spmdsim: error: unknown collective algorithm 'ring_allreduce' (did you mean 'ring-allreduce'?); expected "
        "one of ring-allreduce, recursive-doubling-allreduce, ")


def test_an_unknown_demo_scenario_names_the_ones_it_begins_first(capsys):
    known = ("['embedding_vocab', 'linear_column', 'linear_row', 'matmul_1x8_8x1', 'matmul_2x1_1x4', "
             "'matmul_2x4_4x1', 'matmul_layout_tuple', 'matmul_out_strategy', 'mlp', 'net_mindspore_layout', "
             "'net_mindspore_tutorial', 'net_oneflow_2d_sbp', 'net_oneflow_2d_signature', 'net_paddle_tp', "
             "'train_gpt', 'train_mindspore_tutorial', 'train_oneflow_2d_sbp', 'train_paddle_tp']")
    assert main(["demo", "--only", "matmul_2x4"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: unknown scenario(s) ['matmul_2x4'] (did you mean 'matmul_2x4_4x1', 'matmul_2x1_1x4' or "
        f"'matmul_1x8_8x1'?); expected some of {known}\n")
    assert main(["demo", "--only", "matmul_2x4,mpl,nope"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: unknown scenario(s) ['matmul_2x4', 'mpl', 'nope'] (did you mean 'matmul_2x4_4x1', "
        "'matmul_2x1_1x4' or 'matmul_1x8_8x1' for 'matmul_2x4'; 'mlp' for 'mpl'?); expected some of "
        f"{known}\n")


# -- a layout written in another dialect's syntax -------------------------------------------------------------
def _one_line(capsys, argv: list[str]) -> str:
    """The CLI's one refusal line of `argv` (exit 2, nothing on stdout), unfolded."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(unfold(err).splitlines()) == 1, (out, err)
    return unfold(err).rstrip("\n")


MESH = ["--device-matrix", "2,4", "--alias", "dp,mp"]


@pytest.mark.parametrize("argv, hint", [
    (["show", *MESH, "--tensor-map", "S(0),R", "--shape", "8,6"],
     "tensor map 'S(0),R' has a malformed entry 'S(0)'; 'S(0)' is DTensor placement syntax: give the layout with "
     "--placements"),
    (["show", *MESH, "--tensor-map", "S(0),B", "--shape", "8,6"],
     "tensor map 'S(0),B' has a malformed entry 'S(0)'; 'S(0)' is OneFlow SBP syntax: give the layout with --sbp"),
    (["slices", *MESH, "--tensor-map", "Shard(0)", "--shape", "8,6"],
     "tensor map 'Shard(0)' has a malformed entry 'Shard(0)'; 'Shard(0)' is DTensor placement syntax: give the "
     "layout with --placements"),
    (["show", *MESH, "--tensor-map", "P('mp', None)", "--shape", "8,6"],
     "tensor map \"P('mp', None)\" has a malformed entry \"P('mp', None)\"; \"P('mp', None)\" is a JAX "
     "PartitionSpec: give the layout with --partition-spec"),
    (["plan", *MESH, "--from", "S(0)", "--to", "None,None", "--shape", "8,6"],
     "--from 'S(0)': tensor map has a malformed entry 'S(0)'; 'S(0)' is DTensor placement (or OneFlow SBP) syntax: "
     "give the layout with --from-placements or --from-sbp"),
    (["plan", *MESH, "--from", "None,None", "--to", "S(0),R", "--shape", "8,6"],
     "--to 'S(0),R': tensor map has a malformed entry 'S(0)'; 'S(0)' is DTensor placement syntax: give the layout "
     "with --to-placements"),
    (["run", "matmul", "--device-matrix", "2,4", "--alias-name", "dp,mp", "--x-map", "S(0),B", "--w-map", "dp,mp",
      "--shape", "256,128,192", "--ranks", "8"],
     "tensor map 'S(0),B' has a malformed entry 'S(0)'; 'S(0)' is OneFlow SBP syntax: give the layout with "
     "--x-sbp (over --placement)"),
    # a malformed entry of no dialect: as it was
    (["show", *MESH, "--tensor-map", "m p,None", "--shape", "8,6"],
     "tensor map 'm p,None' has a malformed entry 'm p'"),
])
def test_a_tensor_map_in_another_dialect_names_the_flag_that_takes_it(capsys, argv, hint):
    assert _one_line(capsys, argv) == f"spmdsim: error: {hint}"


def test_a_case_file_map_in_another_dialect_names_the_key_that_takes_it(capsys, monkeypatch):
    case = '{"device_matrix": [2, 4], "alias_name": ["dp", "mp"], "shape": [8, 6], "tensor_map": %s}'
    for tensor_map, line in (
            ('["S(0)", null]', "case key 'tensor_map' entry 'S(0)' is not an axis name; 'S(0)' is DTensor "
                               "placement (or OneFlow SBP) syntax: give the layout with --placements (case key "
                               "'placements') or --sbp (case key 'sbp')"),
            ('"S(0),R"', "tensor map 'S(0),R' has a malformed entry 'S(0)'; 'S(0)' is DTensor placement syntax: "
                         "give the layout with --placements (case key 'placements')")):
        monkeypatch.setattr("sys.stdin", io.StringIO(case % tensor_map))
        assert _one_line(capsys, ["show"]) == f"spmdsim: error: {line}"


@pytest.mark.parametrize("entries, hint", [
    (("S(0)", None), "'S(0)' is DTensor placement (or OneFlow SBP) syntax: build the layout with "
                     "placements_to_layout or sbp_to_layout, from spmdsim.layouts.dialects"),
    (("S(0)", "R"), "'S(0)' is DTensor placement syntax: build the layout with placements_to_layout, from "
                    "spmdsim.layouts.dialects"),
    (("P('mp', None)",), "\"P('mp', None)\" is a JAX PartitionSpec: build the layout with partition_spec_to_layout, "
                         "from spmdsim.layouts.dialects"),
])
def test_a_layout_in_another_dialect_names_the_function_that_reads_it(entries, hint):
    with pytest.raises(LayoutError) as info:
        Layout((2, 4), ("dp", "mp"))(*entries)
    assert str(info.value).endswith(f"; expected one of ('dp', 'mp'); {hint}"), str(info.value)
    assert str(info.value).startswith(f"unknown alias {entries[0]!r} in tensor map (")


# -- two forms mixed: which flag goes with which -----------------------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["--placements", "S(0),R", "--placement", "2,4"],
     "--placements takes its mesh from --device-matrix, not --placement (the mesh of --sbp; case keys "
     "'device_matrix' and 'placement'): give --device-matrix 2,4"),
    (["--partition-spec", "('x', None)", "--placement", "2,4"],
     "--partition-spec takes its mesh from --device-matrix, not --placement (the mesh of --sbp; case keys "
     "'device_matrix' and 'placement'): give --device-matrix 2,4"),
    (["--sbp", "S(0),B", "--device-matrix", "2,4"],
     "--sbp takes its mesh from --placement, not --device-matrix (the mesh of --tensor-map, --placements and "
     "--partition-spec; case keys 'placement' and 'device_matrix'): give --placement 2,4"),
    (["--sbp", "S(0),B", "--placement", "2,4", "--alias", "a,b"],
     "--alias (case key 'alias_name') gives the axis names of --tensor-map, --placements and --partition-spec, "
     "not of --sbp: leave it out"),
    (["--strategy", "((2,1),)", "--device-matrix", "2,4"],
     "--device-matrix (case key 'device_matrix') gives the mesh of --tensor-map, --placements and "
     "--partition-spec, not of --strategy (which brings its own device matrix): leave it out"),
    # two whole forms: both named, with their flags
    (["--sbp", "S(0),B", "--placement", "2,4", "--placements", "S(0),R"],
     "case mixes the sbp form (--sbp, --placement) and the dtensor form (--placements); give only one"),
])
def test_two_forms_mixed_say_which_flag_goes_with_which(capsys, argv, line):
    assert _one_line(capsys, ["show", *argv, "--shape", "8,6"]) == f"spmdsim: error: {line}"


# -- --alias-name, as run matmul spells it, on the commands of --alias -------------------------------------------
@pytest.mark.parametrize("command", [["slices"], ["explain"], ["show"], ["convert"]])
def test_alias_name_is_another_spelling_of_alias_in_every_case_command(capsys, command):
    case = ["--device-matrix", "2,4", "--tensor-map", "mp,None", "--shape", "8,6"]
    assert main([*command, "--alias", "dp,mp", *case]) == 0
    by_alias = capsys.readouterr()
    assert main([*command, "--alias-name", "dp,mp", *case]) == 0
    assert capsys.readouterr() == by_alias


def test_alias_name_is_another_spelling_of_alias_in_plan(capsys):
    plan = ["plan", "--device-matrix", "8", "--from", "x,None", "--to", "None,x", "--shape", "16,16"]
    assert main([*plan, "--alias", "x"]) == 0
    by_alias = capsys.readouterr()
    assert main([*plan, "--alias-name", "x"]) == 0
    assert capsys.readouterr() == by_alias
    assert _parser_error(capsys, [*plan, "--alias", "x", "--alias-name", "y"])[-1] == (
        "spmdsim plan: error: --alias 'x' and --alias-name 'y' name one option; expected one of them")


# -- run matmul given a form in part: the flags it lacks ---------------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["--device-matrix", "2,4", "--alias", "dp,mp", "--x-map", "dp,mp"],
     "--w-map is missing: the Layout form of matmul needs --device-matrix, --alias-name, --x-map and --w-map "
     "(and optionally --out-map)"),
    (["--device-matrix", "2,4"],
     "--alias-name, --x-map and --w-map are missing: the Layout form of matmul needs --device-matrix, "
     "--alias-name, --x-map and --w-map (and optionally --out-map)"),
    (["--placement", "2,4", "--x-sbp", "B,S(0)"],
     "--w-sbp is missing: the SBP form of matmul needs --placement, --x-sbp and --w-sbp (and optionally "
     "--out-sbp)"),
    # no form at all: the forms it takes
    ([], "matmul needs --strategy, or --device-matrix, --alias-name, --x-map and --w-map, or --placement, --x-sbp "
         "and --w-sbp"),
])
def test_run_matmul_names_the_flags_its_form_lacks(capsys, argv, line):
    assert _one_line(capsys, ["run", "matmul", *argv, "--shape", "256,128,192", "--ranks", "8"]) == \
        f"spmdsim: error: {line}"


# -- --eager-limit takes a size as --size does -------------------------------------------------------------------
def test_eager_limit_takes_a_size_as_collective_size_does(capsys):
    parser = build_parser(("mpirun",))
    for text, limit in (("8K", 8192), ("8KiB", 8192), ("8192", 8192), ("1M", 1 << 20), ("0", 0)):
        assert parser.parse_args(["mpirun", "-n", "2", "--eager-limit", text, "prog.py"]).eager_limit == limit
    assert _parser_error(capsys, ["mpirun", "-n", "2", "--eager-limit", "8X", "prog.py"])[-1] == (
        "spmdsim mpirun: error: argument --eager-limit: size '8X' is not a byte count like 64K or 4M")
    # headtohead.py 100: two 800-byte Sends each way, buffered under 1K, waiting (a deadlock) under 0.5K
    program = ["python", str(LAB / "headtohead.py"), "100"]
    assert main(["mpirun", "-n", "2", "--eager-limit", "1K", *program]) == 0
    assert capsys.readouterr().err == ""
    assert main(["mpirun", "-n", "2", "--eager-limit", "0.5K", *program]) == 1
    assert "a standard Send of 512 bytes or more waits for its receive" in " ".join(capsys.readouterr().err.split())


# -- an empty case file or stdin: said empty, not json's "Expecting value" ---------------------------------------
def test_an_empty_case_file_or_stdin_is_said_to_be_empty(capsys, monkeypatch, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert _one_line(capsys, ["show", str(empty)]) == \
        f"spmdsim: error: case file {str(empty)!r} is empty; expected a JSON case"
    for text, line in (("", "stdin is empty; expected a JSON case"),
                       (" \n", "stdin is empty (only white space); expected a JSON case")):
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
        assert _one_line(capsys, ["slices"]) == f"spmdsim: error: {line}"
    assert _one_line(capsys, ["estimate", "gpt", "--machine", str(empty)]) == \
        f"spmdsim: error: machine file {str(empty)!r}: is empty; expected a JSON machine file"


# -- a case written as Python writes it, or with a key misspelled: the way to JSON's, the key meant ---------------
@pytest.mark.parametrize("text, hint", [
    ('{"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x", None], "shape": [4, 2]}',
     "JSON writes null where Python writes None"),
    ('{"device_matrix": [2], "alias_name": [\'x\'], "tensor_map": ["x"], "shape": [4]}',
     "JSON strings take double quotes"),
    ('{"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"], "shape": [4], "comment": True}',
     "JSON writes true and false where Python writes True and False"),
])
def test_a_case_in_python_syntax_says_how_json_writes_it(capsys, tmp_path, text, hint):
    case = tmp_path / "case.json"
    case.write_text(text)
    line = _one_line(capsys, ["show", str(case)])
    assert line.startswith(f"spmdsim: error: case file {str(case)!r} is not valid JSON: Expecting value: line 1")
    assert line.endswith(f"({hint})"), line


def test_a_misspelled_case_key_names_the_key_meant(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"device_matrix": [2, 4], "alias": ["dp", "mp"], '
                                                 '"tensor_map": ["mp", null], "shape": [8, 6]}'))
    line = _one_line(capsys, ["slices"])
    assert line.startswith("spmdsim: error: case has unknown key 'alias'; did you mean 'alias_name'? expected keys "
                           "among ('device_matrix', 'alias_name', "), line


PRICED = "(choose from 'fp64', 'bf16-mixed', 'fp16-mixed', 'fp8')"


@pytest.mark.parametrize("argv", [["estimate", "gpt"], ["autoshard", "--network", "gpt", "--gpt", "layers=2",
                                                         "--devices", "2", "--machine", "a100-dgx"]])
@pytest.mark.parametrize("precision, said", [
    ("fp32", "fp32 trains (examples/train_gpt.py --precision fp32) but is not priced: fp64 prices 8-byte values, "
             "bf16-mixed Megatron's recipe"),
    ("fp8-current", "fp8-current trains (examples/train_gpt.py --precision fp8-current) but is not priced: fp8 "
                    "prices TransformerEngine's FP8 linear layers under delayed scaling"),
    ("bf16", "did you mean 'bf16-mixed'?")])
def test_a_precision_the_trainer_takes_is_said_to_be_the_trainers_not_a_typo(capsys, argv, precision, said):
    """fp32 is one character from fp64: a close match would have pointed the estimate's user at another width."""
    last = _parser_error(capsys, [*argv, "--precision", precision])[-1]
    assert last == f"spmdsim {argv[0]}: error: argument --precision: invalid choice: {precision!r}; {said} {PRICED}"
