"""A rank count a program does not run on: the error carries its numbers (RankCountError's `needed`, `size`,
`divides`, `ways`), and its ways to those ranks are the launcher's that started the world (spmdsim.base.context),
not patched into its text afterwards."""
from __future__ import annotations

import pickle
import traceback
from types import SimpleNamespace

import pytest

import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.base.context import MPIEXEC, MPIRUN, ONE_PROCESS, SIMULATE
from spmdsim.errors import (DialectError, MeshSizeError, RankCountError, RuntimeMismatchError, SpmdsimError,
                            StrategySizeError)
from spmdsim.layouts.dialects import strategy_to_layout
from spmdsim.runtime.engines import advised, launcher, ways_out

SIMULATED_WAYS = (" (simulate 8 ranks with `--ranks 8` / spmdsim.simulate(8, main), or launch them with "
                  "`mpiexec -n 8 ...`)")


def _mesh_2x4(color_of=None):
    comm = spmdsim.world()
    if color_of is not None:
        comm = comm.Split(color_of(comm.Get_rank()))
    Mesh(Layout((2, 4), ("dp", "mp")), comm)


def test_a_mesh_of_another_size_carries_its_numbers_and_its_worlds_ways():
    with pytest.raises(MeshSizeError) as raised:
        spmdsim.simulate(4, _mesh_2x4)
    got = raised.value
    assert isinstance(got, RuntimeMismatchError) and isinstance(got, RankCountError)
    assert (got.needed, got.size, got.divides, got.ways) == (8, 4, False, SIMULATED_WAYS)
    assert str(got) == f"device matrix (2, 4) needs 8 ranks but the communicator has 4{SIMULATED_WAYS}"
    copy = pickle.loads(pickle.dumps(got))  # (an error sent between processes keeps its numbers)
    assert (type(copy), str(copy), copy.needed, copy.size, copy.ways) == (MeshSizeError, str(got), 8, 4, got.ways)


def test_a_mesh_over_part_of_the_world_says_no_way_to_more_ranks():
    """A sub-communicator's size is the program's own choice: the numbers, no launcher's ways."""
    with pytest.raises(MeshSizeError) as raised:
        spmdsim.simulate(4, _mesh_2x4, lambda rank: rank // 2)
    got = raised.value
    assert (got.needed, got.size, got.ways) == (8, 2, "")
    assert str(got) == "device matrix (2, 4) needs 8 ranks but the communicator has 2"


def test_a_mesh_over_one_rank_of_a_bigger_world_says_no_way_to_more_ranks():
    """A one-rank sub-communicator (world.Split(rank)) of 4 ranks was told "one process: launch 8 ranks ...";
    one plain process, whose world is that one rank, still is."""
    with pytest.raises(MeshSizeError) as raised:
        spmdsim.simulate(4, _mesh_2x4, lambda rank: rank)
    got = raised.value
    assert (got.needed, got.size, got.ways) == (8, 1, "")
    assert str(got) == "device matrix (2, 4) needs 8 ranks but the communicator has 1"
    with pytest.raises(MeshSizeError) as raised:
        _mesh_2x4()
    assert raised.value.ways == ways_out(8, 1, ONE_PROCESS) != ""
    assert str(raised.value).endswith(" (one process: launch 8 ranks with `mpiexec -n 8 ...`, or simulate them in "
                                      "this process with `--ranks 8` / spmdsim.simulate(8, main))")


def _needs_8(part: bool = False, ways: str = "") -> None:
    comm = spmdsim.world()
    if part:
        comm = comm.Split(comm.Get_rank() // 2)
    raise RankCountError(f"this program needs 8 ranks, not {comm.size}", 8, comm.size, ways=ways)


def test_a_programs_own_rank_count_error_gets_the_launchers_ways_when_reported():
    """The examples raise ``RankCountError(text, 8, comm.size)`` and the reporter (a simulated rank's end, an MPI
    rank's excepthook) adds how to get 8 ranks as this world was started: they imported
    spmdsim.runtime.engines.ways_out each to add it themselves. Not over a sub-communicator (the program's own
    split), nor where the error already says its way; the error keeps its class, numbers and traceback."""
    with pytest.raises(RankCountError) as raised:
        spmdsim.simulate(4, _needs_8)
    got = raised.value
    assert (str(got), got.ways, got.needed, got.size) == (f"this program needs 8 ranks, not 4{SIMULATED_WAYS}",
                                                          SIMULATED_WAYS, 8, 4)
    assert "_needs_8" in {frame.name for frame in traceback.extract_tb(got.__traceback__)}
    with pytest.raises(RankCountError) as raised:
        spmdsim.simulate(4, _needs_8, True)
    assert (str(raised.value), raised.value.ways) == ("this program needs 8 ranks, not 2", "")
    with pytest.raises(RankCountError) as raised:
        spmdsim.simulate(4, _needs_8, False, "; its own way")
    assert str(raised.value) == "this program needs 8 ranks, not 4"  # (`ways` notes advice its text has)
    mpi = RankCountError("needs 8 ranks, not 4", 8, 4)  # an MPI rank's (outside any simulation: mpiexec's ways)
    assert advised(mpi, 4) is mpi and str(mpi) == f"needs 8 ranks, not 4{ways_out(8, 4, MPIEXEC)}"
    assert str(advised(RankCountError("x", 8, 4), 8)) == "x"  # over part of an 8-rank world
    assert str(advised(ValueError("x"), 4)) == "x"


@pytest.mark.parametrize("strategy, world, needed, divides", [((4, 4), 8, 16, False), ((3, 1), 8, 3, True),
                                                             ((2, 3), 8, 6, True)])
def test_a_strategy_for_other_ranks_carries_its_numbers(strategy, world, needed, divides):
    with pytest.raises(StrategySizeError) as raised:
        strategy_to_layout(strategy, world)
    got = raised.value
    assert isinstance(got, DialectError) and isinstance(got, RankCountError)
    assert (got.needed, got.size, got.divides, got.ways) == (needed, world, divides, "")
    assert got.wanted() == (f"{needed} or a multiple of it" if divides else f"{needed}")


def test_ways_out_are_the_launchers_that_started_the_world():
    assert launcher(4) == MPIEXEC and launcher(1) == ONE_PROCESS  # an MPI process: its world's size says which
    assert spmdsim.simulate(2, launcher, 2) == [SIMULATE, SIMULATE]
    assert ways_out(8, 4, SIMULATE) == SIMULATED_WAYS
    assert ways_out(8, 4, MPIRUN) == ways_out(8, 1, MPIRUN) == (" (run 8 ranks: spmdsim mpirun -n 8 ..., or "
                                                                "mpiexec -n 8 ...)")
    assert ways_out(8, 4, MPIEXEC) == (" (launch 8 ranks with `mpiexec -n 8 ...`, or simulate them in one process "
                                       "with `--ranks 8` / spmdsim.simulate(8, main))")
    assert ways_out(8, 4) == ways_out(8, 4, MPIEXEC)  # by default, as the running rank's world was started


def test_a_rank_count_error_made_again_from_its_text_keeps_its_class_and_numbers():
    """`type(exc)(text)`, as the CLI's flag checks remake an error with their flag in front, still works."""
    bare = StrategySizeError("plain")
    assert (str(bare), bare.needed, bare.size, bare.ways) == ("plain", 0, 0, "")
    more = StrategySizeError("x", 3, 8, divides=True).with_ways("; y")
    assert (type(more), str(more), more.needed, more.size, more.divides, more.ways) == (
        StrategySizeError, "x; y", 3, 8, True, "; y")
    assert issubclass(RankCountError, SpmdsimError) and spmdsim.RankCountError is RankCountError


def test_spmdsim_runs_expected_ranks_come_from_the_errors_numbers():
    """`spmdsim run ... --ranks 4`: the --ranks a strategy or a --device-matrix fits, from the error's numbers."""
    from spmdsim.tools.cli import run_ops
    from spmdsim.tools.cli.main import build_parser

    args = build_parser().parse_args(["run", "matmul", "--strategy", "((3,1),(1,1))", "--shape", "6,16,16",
                                      "--ranks", "4"])
    with pytest.raises(StrategySizeError) as raised:
        run_ops.check_op(args, 4)
    got = raised.value
    assert (got.needed, got.size, got.divides, got.ways) == (3, 4, True, "; expected --ranks 3 or a multiple of it")
    assert str(got).endswith("must divide the number of ranks; expected --ranks 3 or a multiple of it")
    args = build_parser().parse_args(["run", "matmul", "--device-matrix", "2,4", "--alias", "a,b", "--x-map", "a,b",
                                      "--w-map", "b,None", "--shape", "8,8,8", "--ranks", "4"])
    with pytest.raises(RankCountError) as raised:
        run_ops.check_op(args, 4)
    got = raised.value
    assert (got.needed, got.size, got.ways) == (8, 4, "; expected --ranks 8")
    assert str(got) == "--device-matrix '2,4' has 8 devices but --ranks is 4; expected --ranks 8"


def test_autoshards_devices_other_than_the_launchs_say_how_to_launch_as_many(capsys):
    """`spmdsim mpirun -n 4 python -m spmdsim autoshard --run --devices 8` was told "launch with mpiexec -n 8" (the
    launcher guessed from --ranks' absence); --ranks' own words stay, and the error carries its numbers."""
    from spmdsim.tools.cli import autoshard
    from spmdsim.tools.cli.main import build_parser, main
    from testkit import unfold

    argv = ["autoshard", "--network", "net_paddle_tp", "--run", "--devices", "8"]
    assert main(["mpirun", "-n", "4", "python", "-m", "spmdsim", *argv]) == 2
    assert unfold(capsys.readouterr().err) == ("spmdsim: error: --run uses the 4 ranks of the launch; --devices 8 "
                                               "differs (run 8 ranks: spmdsim mpirun -n 8 ..., or mpiexec -n 8 ...)\n")
    args = build_parser().parse_args([*argv, "--ranks", "4"])
    for started, ways in ((SIMULATE, " (launch with --ranks 8)"), (MPIEXEC, ways_out(8, 4, MPIEXEC))):
        with pytest.raises(RankCountError) as raised:
            autoshard._check_devices_match(args, 4, started)
        got = raised.value
        assert (got.needed, got.size, got.ways) == (8, 4, ways)
        assert str(got) == f"--run uses the 4 ranks of the launch; --devices 8 differs{ways}"


def test_autoshards_run_on_one_rank_says_how_to_get_ranks_as_it_was_launched(capsys):
    """`spmdsim mpirun -n 1 python -m spmdsim autoshard --run` was told "launch it with mpiexec -n 8, or add --ranks
    8" (its launcher guessed from size 1 and no --ranks: mpirun reads no --ranks); one plain process keeps those
    words. Either way a RankCountError with its numbers, exit 2."""
    from spmdsim.tools.cli import autoshard
    from spmdsim.tools.cli.main import build_parser, main
    from testkit import unfold

    argv = ["autoshard", "--network", "net_paddle_tp", "--run"]
    assert main(["mpirun", "-n", "1", "python", "-m", "spmdsim", *argv, "--devices", "4"]) == 2
    assert unfold(capsys.readouterr().err) == ("spmdsim: error: --run would run on 1 rank (run 4 ranks: spmdsim "
                                               "mpirun -n 4 ..., or mpiexec -n 4 ...)\n")
    one_process = SimpleNamespace(Get_size=lambda: 1)  # (its COMM_WORLD's size: all --run asks before it refuses)
    with pytest.raises(RankCountError) as raised:  # one plain process (mpiexec -n 1 too): its ways
        autoshard._run_choice(build_parser().parse_args(argv), one_process)
    got = raised.value
    assert (got.needed, got.size, got.ways) == (8, 1, ": launch it with mpiexec -n 8, or add --ranks 8")
    assert str(got) == "--run in one process would run on 1 rank: launch it with mpiexec -n 8, or add --ranks 8"


def _paddle_mesh_3(color_of=None):
    from spmdsim.nn.ops import paddle_mesh

    comm = spmdsim.world()
    paddle_mesh(3, None if color_of is None else comm.Split(color_of(comm.Get_rank())))


def test_paddles_num_partitions_that_do_not_divide_the_ranks_carry_their_numbers():
    """"num_partitions=3 must divide the world size 8" had no numbers to read and, over the whole world, no way
    to ranks it divides (a strategy's or a Mesh's has); an OperatorError still catches it."""
    from spmdsim.errors import OperatorError, PartitionCountError
    from spmdsim.layouts.dialects.paddle import paddle_layout

    with pytest.raises(PartitionCountError) as raised:
        paddle_layout(3, 8)
    got = raised.value
    assert isinstance(got, OperatorError) and isinstance(got, RankCountError)
    assert (str(got), got.needed, got.size, got.divides, got.ways) == (
        "num_partitions=3 must divide the world size 8", 3, 8, True, "")
    with pytest.raises(PartitionCountError) as raised:
        spmdsim.simulate(8, _paddle_mesh_3)
    ways = " (simulate 3 ranks with `--ranks 3` / spmdsim.simulate(3, main), or launch them with `mpiexec -n 3 ...`)"
    assert (str(raised.value), raised.value.ways) == (f"num_partitions=3 must divide the world size 8{ways}", ways)
    with pytest.raises(PartitionCountError) as raised:  # half the world: the program's own choice, no ways
        spmdsim.simulate(8, _paddle_mesh_3, lambda rank: rank // 4)
    assert (str(raised.value), raised.value.ways) == ("num_partitions=3 must divide the world size 4", "")
