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
from typing import Sequence

from .._once_parser import OnceParser
from ..errors import SpmdsimError, fold_message

__all__ = ["main", "build_parser", "SUBCOMMANDS", "OnceParser"]

#: Subcommand modules under spmdsim.cli, in the order `--help` lists them.
SUBCOMMANDS: tuple[str, ...] = ("slices", "explain", "show", "convert", "calibrate", "run", "demo", "launch",
                                 "plan", "autoshard", "collective", "mpirun")


def build_parser() -> argparse.ArgumentParser:
    parser = OnceParser(
        prog="spmdsim",
        description="Run and check tensor-parallel programs on plain CPUs with MPI.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"spmdsim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(subparsers)
    _mark_usage(parser)
    return parser


def _mark_usage(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)command remember its own parser, so its errors show its own usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_usage_parser=sub)
                _mark_usage(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse reports flags a subcommand does not know with the top-level usage;
        # the subcommand's own usage says which flags it takes.
        getattr(args, "_usage_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpmdsimError as exc:
        print(fold_message(f"spmdsim: error: {exc}"), file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
