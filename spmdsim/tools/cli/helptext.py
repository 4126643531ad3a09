"""What the help shows first: `spmdsim --help`'s commands grouped by task, and one example per command.

Each example is a real command line that runs (tests/test_cli_help.py runs every one); a command's
``--help`` shows it right after its usage line. docs/reference/cli.md is written from the same parsers
(spmdsim.tools.cli.reference), so the page and ``--help`` say the same.
"""
from __future__ import annotations

import argparse
from typing import Iterable

__all__ = ["GROUPS", "EXAMPLES", "EXAMPLE_HEAD", "ExampleFormatter", "add_examples", "command_list", "subcommands",
           "one_liners"]

#: The commands by what a user wants to do, in the order `spmdsim --help` lists them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("learn how layouts, collectives and pipelines work",
     ("slices", "explain", "show", "demo", "collective", "pipeline", "context")),
    ("run and check a sharded program", ("run", "launch")),
    ("plan moves between layouts", ("plan", "convert")),
    ("size a cluster", ("estimate", "autoshard", "calibrate")),
    ("emulate MPI", ("mpirun",)),
    ("teach with exercises graded on simulated ranks", ("lab",)),
)

#: One command line per command (and per `run` operator) that runs as written; those that need an MPI
#: launcher start with `timeout -k` so that they cannot hang.
EXAMPLES: dict[str, str] = {
    "slices": "spmdsim slices --device-matrix 2,4 --alias dp,mp --tensor-map mp,None --shape 8,6",
    "explain": "spmdsim explain --device-matrix 2,2 --alias dp,mp --tensor-map dp,mp --shape 4,4",
    "show": 'spmdsim show --matmul --strategy "((1,2),(2,1))" --shape 2,4,2',
    "demo": "spmdsim demo --only matmul_2x4_4x1,mlp --ranks 8",
    "collective": "spmdsim collective ring-allreduce --ranks 4 --size 64K",
    "pipeline": "spmdsim pipeline --schedule 1f1b --stages 4 --microbatches 8",
    "context": "spmdsim context --cp 4 --seq 4096 --heads 32 --kv-heads 8",
    "run": 'spmdsim run matmul --strategy "((2,1),(1,4))" --shape 256,128,192 --ranks 8',
    "run matmul": 'spmdsim run matmul --strategy "((2,4),(4,1))" --shape 64,32,48 --ranks 8 --explain',
    "run linear": "spmdsim run linear --parallel row --shape 64,200,72 --ranks 8",
    "run embedding": "spmdsim run embedding --mode vocab --shape 10,4,1000,48 --ranks 8",
    "run mlp": "spmdsim run mlp --shape 24,96,360 --activation relu --ranks 8",
    "run redistribute": ("spmdsim run redistribute --device-matrix 2,2 --alias x,y --from x,y --to y,x "
                         "--shape 8,8 --ranks 4"),
    "launch": "spmdsim launch -n 4 --timeout 120 -- spmdsim run mlp --shape 24,96,360",
    "plan": 'spmdsim plan --device-matrix 8 --alias x --from "x,None" --to "None,x" --shape 1024,1024',
    "convert": 'spmdsim convert --device-matrix 2,4 --alias dp,mp --tensor-map "mp,None" --shape 8,6',
    "estimate": "spmdsim estimate gpt --layers 8 --hidden 512 --heads 8 --tp 2 --pp 2 --dp 2",
    "autoshard": "spmdsim autoshard --network mlp --devices 8",
    "calibrate": "timeout -k 5 300 mpiexec -n 2 spmdsim calibrate --sizes 1K,64K --ops allreduce --dry-run",
    "lab": "spmdsim lab list",
    "mpirun": 'spmdsim mpirun -n 4 -c "from mpi4py import MPI; print(MPI.COMM_WORLD.allreduce(1))"',
}

#: The line above each command's example in its --help.
EXAMPLE_HEAD = "example:"


class ExampleFormatter(argparse.HelpFormatter):
    """argparse's formatter, keeping the description's first paragraph (the example) as written.

    argparse fills a description into one paragraph: a command line folded at the width would no
    longer be one that can be copied.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if not text.startswith(EXAMPLE_HEAD):
            return super()._fill_text(text, width, indent)
        head, _, rest = text.partition("\n\n")
        return head + ("\n\n" + super()._fill_text(rest, width, indent) if rest.strip() else "")


def add_example(parser: argparse.ArgumentParser, command: str) -> None:
    """Put `command`'s example first in `parser`'s description (its --help shows it after the usage)."""
    parser.description = f"{EXAMPLE_HEAD}\n  {EXAMPLES[command]}\n\n{parser.description or ''}".rstrip()
    parser.formatter_class = ExampleFormatter


def add_examples(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Put its example first in the description of every subcommand under `parser` that has one."""
    for name, sub in subcommands(parser).items():
        command = f"{prefix}{name}"
        if command in EXAMPLES:
            add_example(sub, command)
        add_examples(sub, f"{command} ")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands by name (empty when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def one_liners(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help (its `help=`), by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def command_list(parser: argparse.ArgumentParser, groups: Iterable = GROUPS) -> str:
    """The registered subcommands of `parser` under their groups' titles, one line each."""
    helps = one_liners(parser)
    width = max((len(name) for name in helps), default=0) + 2
    blocks = []
    for title, names in groups:
        lines = [f"  {name:<{width}}{helps[name]}" for name in names if name in helps]
        if lines:
            blocks.append("\n".join([f"{title}:", *lines]))
    return "\n\n".join(blocks)
