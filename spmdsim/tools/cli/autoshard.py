"""`spmdsim autoshard`: choose every operator's strategy of a network by least communication.

    spmdsim autoshard --network net_mindspore_tutorial --devices 8 --fix "MatMul1=((2,4),(4,1))"
    spmdsim autoshard --network attention --devices 8 --objective time --json
    spmdsim autoshard --network gpt --devices 8 --training --memory-limit 768K
    spmdsim autoshard --network gpt --gpt layers=2,d_model=64 --devices 4096
    timeout -k 5 120 mpiexec -n 8 spmdsim autoshard --network net_mindspore_tutorial --run
    spmdsim autoshard --network net_paddle_tp --memory-limit 100K --run --ranks 4   # no mpiexec
    spmdsim autoshard --network gpt --gpt layers=2,d_model=64 --training --run --ranks 4
    spmdsim autoshard --network gpt --gpt layers=4,d_model=64,heads=4,seq=32,batch=4 --devices 4 \
        --machine a100-dgx --memory-limit 10M   # (tp, pp, dp, microbatches, ...) by predicted time

Planning is pure (no MPI); `--run` executes the choice on the ranks of the
launch (their count is the device count) and prints predicted vs measured
bytes and times per operator (`--ranks N`: N simulated ranks in this process),
then checks every operator's output against numpy; on the GPT's graphs
`--training` runs and checks the backward too.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

from ...base.context import ONE_PROCESS, SIMULATE
from ...errors import RankCountError, SpmdsimError
from ...runtime.engines import engine_of, launcher, ways_out
from ...base.typed_numbers import byte_count, flag_float, typed
from .autoshard_common import gpt_config, still_working
from ...models.gpt.flags import LLAMA_FLAGS, MAX_SIZE, architecture_arguments, architecture_fields, architecture_flags
from ..autoshard import METHODS, NAMES, OBJECTIVES, autoshard
from ..autoshard.choose import _parse_fix
from ..autoshard.cost import measure_flops_rate
from ..autoshard.networks import gpt_network
from ..estimate.held import PRECISIONS, TRAINED_ONLY
from ...base.once_parser import Choices
from .plan import MAX_PLAN_DEVICES

__all__ = ["register", "run"]


#: Most --run forward passes: a 2-layer GPT's takes about 0.1 s on 8 simulated ranks.
MAX_REPEAT = 1_000

#: The networks a user may name that are the GPT's options (`spmdsim autoshard --network llama`).
_NETWORK_NOTES = {
    "llama": f"Llama's architecture is the GPT's options: --network gpt {LLAMA_FLAGS}",
    "mixtral": f"Mixtral's experts are the GPT's options: --network gpt --gpt experts=N,top_k=2 (with Llama's: "
               f"{LLAMA_FLAGS})"}


def memory_limit(text: str) -> int:
    """--memory-limit in bytes ('80G' -> 85899345920): a limit below 1 byte no rank can meet."""
    value = byte_count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be at least 1 byte, such as 1M or 80G")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "autoshard", help="choose every operator's strategy by least communication",
        description="Enumerate each operator's strategies, price them (own collectives + "
                    "redistribution between operators), and choose by search (exact on chains "
                    "and trees, branch and bound otherwise) or by propagation from the fixed "
                    "operators. Compares the total with the network's hand-written strategies.",
    )
    parser.add_argument("--network", required=True, choices=Choices(tuple(NAMES), _NETWORK_NOTES), metavar="NAME",
                        help=f"one of {', '.join(NAMES)}")
    parser.add_argument("--gpt", metavar="KEY=VALUE,...",
                        help="--network gpt / gpt_sp: the model's size, e.g. 'layers=2,d_model=64' "
                             "(keys vocab, d_model, heads, layers, seq, batch; with --machine also experts, "
                             "top_k, moe_every, dropless (0 or 1) for MoE layers and vocab_pad_to, the vocabulary "
                             "padded to a multiple "
                             "of it as Megatron pads to 128 x tp; default examples/"
                             "train_gpt.py's 4 layers, d_model 128, 4 heads, seq 64, batch 8, vocab 128; with "
                             f"--machine each size at most {MAX_SIZE:,})")

    # Llama's architecture, with --machine (the search by dry runs of the model; the operators' graph is the GPT's)
    architecture_arguments(parser, width="d_model")
    parser.add_argument("--devices", type=int, default=None,
                        help="device count (default 8; with --run, the ranks of the launch)")
    parser.add_argument("--fix", action="append", default=[], metavar="OP=STRATEGY",
                        help='hold an operator\'s strategy, e.g. "MatMul1=((2,4),(4,1))", '
                             '"MatMul2=((1,8),(8,1)) out ((8,1),)" or "MatMul1=hand" (repeatable); '
                             '"*=hand": every operator not named holds its hand-written strategy; with '
                             '--machine, DEGREE=VALUE holds a degree of the configuration and searches the rest '
                             '(tp, pp, v, dp, ep, etp, cp, cp-method, mb, recompute, zero, sp; e.g. tp=8)')
    parser.add_argument("--memory-limit", type=memory_limit, metavar="BYTES",
                        help="bytes per rank one operator may hold (weights, inputs, output), e.g. 1M; K, M, G "
                             "and T are powers of 1,024 (80G and 80GB: 80 GiB)")
    parser.add_argument("--objective", choices=OBJECTIVES,
                        help="minimise bytes per rank (exact) or modelled time (default bytes)")
    parser.add_argument("--training", action="store_true",
                        help="also price a training step's backward: the gradients' reverse moves "
                             "and the weight gradients' sums (bytes objective)")
    parser.add_argument("--method", choices=METHODS,
                        help="search (default) or propagate (MindSpore's sharding propagation)")
    parser.add_argument("--flops", type=flag_float, metavar="FLOP/S",
                        help="compute rate of one rank (default: measured now)")
    parser.add_argument("--node-limit", type=int,
                        help="branch and bound stops after this many nodes (default 200000); variable elimination "
                             "then finishes the search, exactly when its tables fit (else: best found, not proven)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON object (operators with name, strategy, bytes_per_rank; totals)")
    parser.add_argument("--run", action="store_true",
                        help="execute the choice under MPI, print predicted vs measured per operator and "
                             "check the values (with --training on the GPT: the backward too)")
    parser.add_argument("--repeat", type=int, help=f"--run: forward passes (median; default 3, at most {MAX_REPEAT:,})")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="--run on N simulated ranks in this process (no mpiexec; bytes are "
                             "exact, times are not a cluster's)")
    _machine_arguments(parser)
    parser.set_defaults(func=run, dry_run=False)


def _machine_arguments(parser: Any) -> None:
    """The search by a machine file's flags (--machine and those that go with it)."""
    parser.add_argument("--machine", metavar="NAME|PATH",
                        help="--network gpt: choose (tp, pp, dp, microbatches, virtual stages, recomputation, "
                             "ZeRO, sp) by the step time predicted on this machine file from each "
                             "configuration's dry run (spmdsim estimate), under --memory-limit per rank "
                             "(default and at most the machine's memory); docs/howto/choose-configuration.md")
    parser.add_argument("--precision", choices=Choices(PRECISIONS, TRAINED_ONLY),
                        help="--machine: the widths the ledger prices at (default bf16-mixed; fp8: the linear "
                             "layers' products in FP8, as spmdsim estimate --precision fp8)")
    parser.add_argument("--dropout", type=flag_float, metavar="P",
                        help="--machine: the GPT's dropout probability (default 0.1, GPT-3's; 0: none, as Llama "
                             "trains: no dropout kernels, masks or kept outputs)")
    parser.add_argument("--kept", choices=("graph", "megatron"),
                        help="--machine: what each block keeps for backward (default megatron's set)")
    parser.add_argument("--max-dry-runs", type=int, metavar="N",
                        help="--machine: at most N configurations priced by a dry run (default 24)")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="--machine: N worker processes run the dry runs the search asks for next, ahead of "
                             "it: the same choice and table, sooner where N cores are free (default 1: none)")
    parser.add_argument("--moe-cells", action="store_true", default=None,
                        help="--machine, a GPT with experts=N: bound the configurations by layer cells too (six "
                             "small dry runs each, one per tp, sp, micro-batch, recomputation, ep and etp: slower, "
                             "prunes more, prices better configurations and tries the experts folded into ep, etp 1; "
                             "docs/howto/choose-configuration.md)")


def _fixes(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise SpmdsimError(f"--fix {item!r} must read OP=STRATEGY, e.g. 'MatMul1=((2,4),(4,1))'")
        name, text = name.strip(), text.strip()
        if name != "*":  # a malformed strategy is refused before any search or launch
            _parse_fix(name, text)
        if "".join(out.get(name, text).split()) != "".join(text.split()):  # held two ways: the last would win unsaid
            raise SpmdsimError(f"--fix {name}={out[name]} and --fix {name}={text} hold {name} two ways; give one")
        out[name] = text
    return out


def _network(args: argparse.Namespace, devices: int) -> tuple:
    """(network name or graph, hand-written layouts or None) for autoshard."""
    if args.gpt is None:
        return args.network, None
    if args.network not in ("gpt", "gpt_sp"):
        raise SpmdsimError(f"--gpt sizes the GPT; --network {args.network!r} is not 'gpt' or 'gpt_sp'")

    return gpt_network(devices, gpt_config(args.gpt), sp=args.network == "gpt_sp")


def _choose(args: argparse.Namespace, devices: int, flops: float | None) -> Any:
    if args.node_limit < 1:
        raise SpmdsimError(f"--node-limit {args.node_limit!r} must be >= 1")
    check_devices(devices)
    network, hand = _network(args, devices)
    return autoshard(network, devices, fix=_fixes(args.fix), memory_limit=args.memory_limit,
                     objective=args.objective, method=args.method, flops_per_s=flops,
                     node_limit=args.node_limit, training=args.training, hand=hand)


#: The operator search's options and their defaults, set in `run` when not given: None from the parser says the
#: user gave none, so that the search by a machine file refuses only what was given (it uses none of them).
OPERATOR_DEFAULTS = {"objective": "bytes", "method": "search", "node_limit": 200_000, "repeat": 3}


def run(args: argparse.Namespace) -> int:
    if args.machine is not None:
        from .autoshard_machine import run_machine

        return run_machine(args)
    if args.repeat is not None and not args.run:  # before the default: only a --repeat the user gave
        raise SpmdsimError(f"--repeat {args.repeat} counts the forward passes of --run; add --run")
    if args.repeat is not None and args.repeat < 1:  # 0 printed a table and PASS after no pass at all
        raise SpmdsimError(f"--repeat {args.repeat} must be at least 1 (forward passes of --run)")
    if args.repeat is not None and args.repeat > MAX_REPEAT:  # 10**30 would run till killed, without a word
        raise SpmdsimError(f"--repeat {args.repeat:,} is too many; expected at most {MAX_REPEAT:,} (forward passes "
                           "of --run, each of the whole network on every rank: the median of a few is the measure)")
    _fixes(args.fix)  # a malformed or twice-given --fix is refused before any search or launch
    if args.node_limit is not None and args.method == "propagate":  # not taken and ignored without a word
        raise SpmdsimError(f"--node-limit {args.node_limit} bounds the search's branch and bound; --method propagate "
                           "searches nothing: leave one of them out")
    for flag, default in OPERATOR_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, default)

    given = architecture_flags(_Fields(architecture_fields(args)))
    if given:  # the operators' graph (spmdsim.tools.autoshard.gpt) is the GPT's own architecture: never ignored
        what = "the attention core (FlashAttention-2's tiles)" if given[0].startswith("--attention") else \
            "Llama's architecture"
        raise SpmdsimError(f"{given[0]} sets {what}, which only the search by a machine file prices "
                           "(the operators' graph is the GPT's own): add --machine (e.g. --machine a100-dgx)")
    for flag in ("precision", "dropout", "kept", "max_dry_runs", "moe_cells", "jobs"):  # the machine search's own
        given = getattr(args, flag)
        if given is not None:  # (never ignored; a float, --dropout's, as typed)
            value = "" if given is True else f" {typed(given) if isinstance(given, float) else given}"
            raise SpmdsimError(f"--{flag.replace('_', '-')}{value} is an option of the search by "
                               "predicted step time: give --machine NAME|PATH too")
    if args.flops is not None and not (math.isfinite(args.flops) and args.flops > 0):
        raise SpmdsimError(f"--flops {typed(args.flops)} must be a finite number > 0 (FLOP/s of one rank)")
    if args.ranks is not None and not args.run:
        raise SpmdsimError("--ranks N simulates the ranks of --run; add --run")
    if args.run:
        return _run_mpi(args)
    devices = 8 if args.devices is None else args.devices
    check_devices(devices)
    with still_working(args, devices):
        result = _choose(args, devices, args.flops)
    print(json.dumps(result.to_json(), indent=1) if args.json else result.table())
    return 0


class _Fields:
    """GPTConfig's architecture fields as attributes (for spmdsim.models.gpt.flags.architecture_flags)."""

    def __init__(self, fields: dict) -> None:
        self.__dict__.update(fields)


def check_devices(devices: int) -> None:
    """One line unless 1 <= devices <= MAX_PLAN_DEVICES (plan's, explain's and show's limit)."""
    if devices < 1:
        raise SpmdsimError(f"--devices {devices!r} must be >= 1")
    if devices > MAX_PLAN_DEVICES:
        raise SpmdsimError(f"--devices {devices:,} is too many; expected at most {MAX_PLAN_DEVICES:,} "
                           "(as plan, explain and show)")


def _run_mpi(args: argparse.Namespace) -> int:
    from .common import guarded, on_world

    if args.ranks is not None:  # --devices checked before the banner too: the only line when it differs
        return on_world(args, lambda comm: _run_choice(args, comm),
                        lambda n: _check_devices_match(args, n, SIMULATE))
    from ...runtime.mpi_library import load_mpi

    comm = load_mpi().COMM_WORLD
    return guarded(lambda: _run_choice(args, comm), comm)


def _check_devices_match(args: argparse.Namespace, size: int, started: str) -> None:
    """Refuse a --devices other than the `size` ranks --run runs on, saying how to launch as many, as `started`
    (spmdsim.base.context: SIMULATE, --ranks, before the ranks start; else the running rank's launcher)."""
    n = args.devices
    if n not in (None, size):
        error = RankCountError(f"--run uses the {size} ranks of the launch; --devices {n} differs", n, size)
        raise error.with_ways(f" (launch with --ranks {n})" if started == SIMULATE else ways_out(n, size, started))


def _run_choice(args: argparse.Namespace, comm: Any) -> int:
    from ..autoshard.execute import run_choice
    from ..autoshard.report import format_checks, format_measured
    from ..autoshard.runnable import check_runnable, is_chain
    from ...runtime.shared_reference import shared_once_on

    size, started = comm.Get_size(), launcher(comm.Get_size())
    if size == 1 and args.ranks is None:  # one rank, no --ranks: say how to get ranks as it was launched
        n = args.devices or 8
        if started == ONE_PROCESS:  # (mpiexec -n 1 too)
            ways = f": launch it with mpiexec -n {n}, or add --ranks {n}"
            raise RankCountError(f"--run in one process would run on 1 rank{ways}", n, size, ways=ways)
        ways = ways_out(n, size, started)  # spmdsim mpirun -n 1: mpirun's -n, not --ranks (it reads none)
        raise RankCountError(f"--run would run on 1 rank{ways}", n, size, ways=ways)
    _check_devices_match(args, size, started)
    # Every rank measures at once (they share the cores, as they will when running);
    # the slowest rate, agreed, makes every rank choose the same strategies.
    flops = args.flops or min(engine_of(comm).all_gather_object(comm, measure_flops_rate()))
    # The search is local work on inputs every rank shares (the command line, the agreed rate): one rank
    # searches for all (simulated ranks: the first to ask; MPI ranks: rank 0, the others get its choice).
    result = shared_once_on(comm, ("spmdsim autoshard: choice", size, flops), _choose, args, size, flops)
    check_runnable(result)  # an operator the runners lack raises here, on every rank
    checks, no_backward = None, ""
    if is_chain(result):
        measured, passed = run_choice(result, comm, args.repeat)
        if args.training:  # said, as a graph without a numpy backward says it: never a silent forward-only PASS
            no_backward = "chains run through the network runner, forward only"
    else:
        from ..autoshard.dag import run_dag

        report = run_dag(result, comm, args.repeat, train=args.training)
        measured, passed, checks = report.measured, report.passed, report
    if comm.Get_rank() == 0:
        if args.json:
            record = result.to_json()
            record["measured"] = [{"name": m.name, "bytes_received_per_rank": m.bytes_received,
                                   "comm_seconds": m.comm_seconds, "seconds": m.seconds}
                                  for m in measured]
            if checks is not None:
                record["checked"] = {name: bool(v) for name, v in checks.verdicts.items()}
                record["loss"] = None if checks.loss is None else {"ranks": checks.loss[0],
                                                                   "numpy": checks.loss[1]}
                back = checks.backward
                record["backward_measured"] = None if back is None else {
                    "bytes_received_per_rank": back.bytes_received, "seconds": back.seconds,
                    "checked": {name: bool(v) for name, v in back.verdicts.items()}}
            if no_backward:
                record["backward_measured"] = None
            record["passed"] = passed
            print(json.dumps(record, indent=1))
        else:
            print(result.table())
            print()
            print(format_measured(result, measured))
            if checks is not None:
                print(format_checks(result, checks))
            if no_backward:
                print(f"backward not run (forward only): {no_backward}")
            print("PASS" if passed else "FAIL")
    return 0 if passed else 1
