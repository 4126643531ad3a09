"""docs/reference/cli.md and cli-cluster.md, written from the parsers `spmdsim` itself uses, so that
the pages cannot drift.

`pages()` gives them by file name; scripts/cli_reference.py writes them (or, with --check, says
whether the committed pages are current). The first holds the commands by task and the commands to
learn, run and plan moves; the second those that size a cluster, emulate MPI and teach (two pages of
at most 600 lines each). Every command gets its one-line help, its example, its usage, its
description and every flag with its help; prose is wrapped within 100 columns.
"""
from __future__ import annotations

import argparse
import re
import textwrap
from typing import Iterator

from .helptext import EXAMPLE_HEAD, GROUPS, one_liners, subcommands
from .main import build_parser

__all__ = ["pages", "markdown", "commands", "flag_entry", "WIDTH", "REGENERATE", "PAGES"]

#: The page's width for prose and usage lines.
WIDTH = 100
#: The command that rewrites the pages, from the repository's root.
REGENERATE = "python scripts/cli_reference.py"
#: Each page's file name and the task groups (spmdsim.tools.cli.helptext.GROUPS) it holds, by count.
PAGES: tuple[tuple[str, int], ...] = (("cli.md", 3), ("cli-cluster.md", len(GROUPS) - 3))


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The words of every command under `parser` (its own first, as ``()``), depth first."""
    yield words
    for name, sub in subcommands(parser).items():
        yield from commands(sub, (*words, name))


def _parser_of(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> argparse.ArgumentParser:
    for word in words:
        parser = subcommands(parser)[word]
    return parser


def _fill(text: str, first: str = "", rest: str = "") -> str:
    """`text` filled within WIDTH, words never broken (a flag's hyphens included)."""
    # a code span (`python scripts/cli_reference.py`) kept on one line: its spaces hidden from textwrap
    text = re.sub(r"`[^`]*`", lambda span: span.group().replace(" ", "\0"), " ".join(text.split()))
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False).replace("\0", " ")


_HEAD = "# Command-line reference\n\n" + _fill(
    f"Every `spmdsim` command and every flag it takes, written from the command's own parsers by "
    f"`{REGENERATE}` (a test fails when these pages and the parsers differ). `spmdsim COMMAND --help` "
    f"prints the same: its usage, an example that runs, and its flags. Every command also takes "
    f"`-h`, `--help`. The commands that size a cluster, emulate MPI and teach are on "
    f"[a second page](cli-cluster.md).")
_HEAD_2 = "# Command-line reference: size a cluster, emulate MPI, teach\n\n" + _fill(
    "The commands of the last three tasks of [the command-line reference](cli.md), written from their "
    "parsers as that page is.")


def _escaped(text: str) -> str:
    """Help text as Markdown shows it: `*` and `<` taken literally (never emphasis or a tag)."""
    return text.replace("*", r"\*").replace("<", r"\<")


def _anchor(words: tuple[str, ...]) -> str:
    return "-".join(("spmdsim", *words))


def _split_description(parser: argparse.ArgumentParser) -> tuple[str, str]:
    """(example command line, the description's prose) of a parser (helptext.add_example's form)."""
    text = parser.description or ""
    if not text.startswith(EXAMPLE_HEAD):
        return "", text
    head, _, rest = text.partition("\n\n")
    return head[len(EXAMPLE_HEAD):].strip(), rest


def flag_entry(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """One table row: the flag's spellings with their value, then its help (%(default)s expanded)."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    if action.option_strings and action.nargs == 0:
        spellings = list(action.option_strings)
    elif action.option_strings:  # each spelling with its value, as --help wrote them before Python 3.13
        value = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
        spellings = [f"{option} {value}" for option in action.option_strings]
    else:
        spellings = [_positional(action)]
    names = ", ".join(f"`{spelling}`" for spelling in spellings)
    text = formatter._expand_help(action) if action.help else ""
    if isinstance(action, argparse._SubParsersAction):
        text = "one of " + ", ".join(f"`{name}`" for name in action.choices) + ", each below"
    elif action.required or not action.option_strings and action.nargs is None:  # (lab check's N and FILE: the
        text = f"(required) {text}"  # command says which is missing, argparse not asked to)
    default = action.default
    if (action.option_strings and default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0
            and "default" not in text):
        text = f"{text} (default {default})" if text else f"default {default}"
    return f"| {_cell(names)} | {_cell(_escaped(' '.join(text.split())))} |"


def _positional(action: argparse.Action) -> str:
    """A positional argument as --help names it: its metavar, its choices ({gpt}) or its dest."""
    return argparse.HelpFormatter("spmdsim")._metavar_formatter(action, action.dest)(1)[0]


def _cell(text: str) -> str:
    """`text` in a table cell: a `|` (`--machine NAME|PATH`) escaped, in a code span too, as GFM reads it."""
    return text.replace("|", "\\|")


def _section(root: argparse.ArgumentParser, words: tuple[str, ...], helps: dict[str, str],
             seen: dict[str, tuple[str, ...]]) -> str:
    """A command's section; a flag group met before (`seen`: its rows -> the command that has them) as a
    link to that command's, with the flags named."""
    parser = _parser_of(root, words)
    example, prose = _split_description(parser)
    parts = [f"{'#' * (2 if len(words) < 2 else 3)} spmdsim {' '.join(words)}".rstrip()]
    summary = helps.get(" ".join(words), "")
    if summary:
        parts.append(_fill(_escaped(summary[:1].upper() + summary[1:]) + "."))
    if example:  # a command too long for one line of prose in a block of its own
        line = f"Example: `{example}`"
        parts.append(line if len(line) <= WIDTH else f"Example:\n\n```sh\n{example}\n```")
    if prose and words and prose.rstrip(".").lower() != summary.lower():
        parts.append(_fill(_escaped(prose)))
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction) and (
            a.help != argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction))]  # (hidden: mpirun's refusals)
        if actions:
            title = group.title[:1].upper() + group.title[1:]
            rows = "\n".join(flag_entry(parser, a) for a in actions)
            if rows in seen:
                first = seen[rows]
                names = ", ".join("/".join(f"`{s}`" for s in a.option_strings or [_positional(a)]) for a in actions)
                parts.append(_fill(f"{title}: as [`spmdsim {' '.join(first)}`](#{_anchor(first)}) takes them "
                                   f"({names})."))
            else:
                seen[rows] = words
                parts.append(f"| {title} | Description |\n| --- | --- |\n{rows}")
    return "\n\n".join(parts)


def _page_of(name: str) -> str:
    """The file name of the page that holds command `name`'s section."""
    first = {n for _, names in GROUPS[:PAGES[0][1]] for n in names}
    return PAGES[0][0] if name in first else PAGES[1][0]


def _index(root: argparse.ArgumentParser) -> str:
    """The commands by task, as `spmdsim --help` groups them, each linked to its section."""
    helps = one_liners(root)
    rows = ["| Task | Command | What it does |", "| --- | --- | --- |"]
    for title, names in GROUPS:
        for at, name in enumerate(names):  # the task named on its first row
            where = "" if _page_of(name) == PAGES[0][0] else _page_of(name)
            rows.append(f"| {'' if at else title} | [`spmdsim {name}`]({where}#{_anchor((name,))}) | "
                        f"{_escaped(helps[name]).replace('|', '/')} |")
    return "## Commands by task\n\n" + "\n".join(rows)


def _all_helps(root: argparse.ArgumentParser) -> dict[str, str]:
    """Each command's one-line help by its words joined ("run matmul")."""
    helps = {}
    for words in commands(root):
        for name, text in one_liners(_parser_of(root, words)).items():
            helps[" ".join((*words, name))] = text
    return helps


def pages() -> dict[str, str]:
    """Each page by its file name, from the parsers of every command."""
    root = build_parser()
    helps = _all_helps(root)
    texts = {}
    for name, head in zip((p for p, _ in PAGES), (_HEAD, _HEAD_2)):
        sections = [head] + ([_index(root)] if name == PAGES[0][0] else [])
        seen: dict[str, tuple[str, ...]] = {}  # a group's rows -> the command of this page that has them
        sections += [_section(root, words, helps, seen) for words in commands(root)
                     if (_page_of(words[0]) if words else PAGES[0][0]) == name]
        texts[name] = "\n\n".join(sections) + "\n"
    return texts


def markdown() -> str:
    """Both pages one after the other (what the tests search for a command's section)."""
    return "".join(pages().values())
