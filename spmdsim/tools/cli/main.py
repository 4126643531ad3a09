"""Entry point of the `spmdsim` command: dispatches to one module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (args -> exit code). Errors of the SpmdsimError family are
printed as one line and exit 2; under MPI the runtime's guard makes an error
raised on only some ranks end the whole job instead of hanging.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Callable, Sequence

from ...base.context import MPIRUN, current
from ...base.once import once
from ...base.once_parser import OnceParser
from ...base.output import output_error, quiet_stdout, ready_output
from ...base.threads import after_rank0_says, launcher_rank
from ...errors import SpmdsimError, fold_message
from .helptext import GROUPS, add_examples, command_list
from ... import __version__

__all__ = ["main", "build_parser", "SUBCOMMANDS", "OnceParser", "output_error"]

#: Subcommand modules under spmdsim.tools.cli, in the order `--help` lists them (by task: helptext.GROUPS).
SUBCOMMANDS: tuple[str, ...] = tuple(name for _, names in GROUPS for name in names)

#: The first line of `spmdsim --help`'s description.
DESCRIPTION = "Run and check tensor-parallel programs on plain CPUs, with MPI or simulated ranks."


def build_parser(commands: Sequence[str] = SUBCOMMANDS) -> argparse.ArgumentParser:
    """The parser of `commands` (each module imported to register it: every one for --help)."""
    parser = OnceParser(
        prog="spmdsim",
        epilog="`spmdsim COMMAND --help` shows a command's flags, with an example first.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the command list as command_list wrote it
    )

    parser.add_argument("--version", action="version", version=f"spmdsim {__version__}")
    # Listed by task in the description (command_list), not in argparse's one flat list.
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", help=argparse.SUPPRESS)
    for name in commands:
        importlib.import_module(f"{__package__}.{name}").register(subparsers)
    parser.usage = "%(prog)s [-h] [--version] COMMAND ..."  # (after add_subparsers, which names prog from it)
    parser.description = f"{DESCRIPTION}\n\n{command_list(parser)}"
    add_examples(parser)
    return parser


#: The parsers main() built, by the commands they hold: a parse leaves no state in them (each parse fills a
#: Namespace of its own; the defaults are constants), and building one costs about 1 ms of CPU for one command's,
#: 14 ms for every command's: that much a call of main() in a process that calls it again (the tests, a notebook).
_PARSERS: dict[tuple[str, ...], argparse.ArgumentParser] = {}


def _parser(commands: tuple[str, ...]) -> argparse.ArgumentParser:
    """build_parser(commands), built once a process."""
    parser = _PARSERS.get(commands)
    if parser is None:
        parser = _PARSERS[commands] = build_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    ready_output()  # a closed stdout drops the output; a file name never raises on an ASCII stdout
    # A command named first loads its own module only: the others' imports (the planner, the cost model)
    # took most of a short `spmdsim mpirun` program's start.
    parser = _parser(tuple(words[:1]) if words[:1] and words[0] in SUBCOMMANDS else SUBCOMMANDS)
    if words[:1] == ["mpirun"]:
        words = _mpirun_words(words)
    # A flag a subcommand does not know is refused with that subcommand's usage and its flags close to it
    # (OnceParser.parse_args), not the top-level usage argparse gives.
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()  # (OnceParser's: a failed write is one line and exit 1)
        return 2
    if launcher_rank() != 0 and _pure(args):
        # Under mpiexec every process runs the command line: a command that needs no other rank (no MPI) runs on
        # rank 0 alone, so its output is printed once and its files (--png, --output) written by one process.
        return 0
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a full disk under `> file` shows here, not as a traceback at exit
        return code
    except SpmdsimError as exc:
        # Under mpiexec only an error raised before any MPI call (the guarded commands report their own): each
        # process of the job checked the same command line, so rank 0 says it once, as OnceParser does.
        _say_once(fold_message(f"spmdsim: error: {exc}"))
        return after_rank0_says(2)
    except OSError as exc:
        return _output_failed(exc)


def _say_once(text: str) -> None:
    """Print an error every rank of the job may meet once: on rank 0 of mpiexec's; on simulated ranks of
    `spmdsim mpirun`, whose guard lets a command's errors pass to here on every rank, by the first rank that
    meets it (spmdsim.base.once: a text only some ranks meet is still said, as each rank's own process would)."""
    if current().launcher == MPIRUN:
        once("spmdsim: error", _say, text)
    elif launcher_rank() == 0:
        _say(text)


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _output_failed(exc: OSError) -> int:
    """The exit code for output that could not be written: 0 for a reader gone (`| head`); else, a full disk or
    an I/O error, one line naming it and 1."""
    quiet_stdout()
    if isinstance(exc, BrokenPipeError):
        return 0
    print(f"spmdsim: error: {output_error(exc)}", file=sys.stderr)
    return 1


def _mpirun_words(words: list) -> list:
    """`spmdsim mpirun -n 2 -m module ARGS` (or `-c CODE`), as `--help` offers it: a `--` put before the
    program's `-m`/`-c`, which argparse took for mpirun's own unknown flags ("unrecognized arguments: -m"),
    after any of mpirun's own flags (-n, --eager-limit, --oversubscribe)."""
    at = 1
    while at < len(words):
        word = words[at]
        if word in ("-n", "-np", "--np", "--eager-limit"):
            at += 2
        elif word == "--oversubscribe" or word.startswith(("-n", "--np=", "--eager-limit=")) \
                and word not in ("-m", "-c"):
            at += 1
        else:
            break
    if at < len(words) and words[at] in ("-m", "-c"):
        return words[:at] + ["--"] + words[at:]
    return words


#: Commands that never use MPI: under a launcher rank 0 alone runs them (`main`); autoshard is one without --run.
PURE_COMMANDS = frozenset({"slices", "explain", "show", "convert", "plan", "pipeline", "context", "estimate"})


def _pure(args: argparse.Namespace) -> bool:
    """Whether the parsed command needs no other rank: a pure command, or autoshard without --run."""
    return args.subcommand in PURE_COMMANDS or args.subcommand == "autoshard" and not getattr(args, "run", False)


def run_script(main: Callable[[], Any]) -> Any:
    """`main()`'s exit code, for a script of scripts/ (``sys.exit(run_script(main))``): its stdout flushed before it
    returns, and closed early by the reader (``| head``) it ends quietly with 141, a shell's code for a command
    that SIGPIPE stopped (as a ``--ranks`` run does, spmdsim.runtime.sim.launch), not with a
    BrokenPipeError traceback."""
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()  # (argparse's --help exits through here too)
    except BrokenPipeError:
        quiet_stdout()
        return 141
