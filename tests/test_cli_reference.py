"""docs/reference/cli.md and cli-cluster.md are what the parsers give (scripts/cli_reference.py), and
name every flag of every command in that command's own section."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from docs_commands import run_here
from spmdsim.tools.cli.helptext import EXAMPLES, subcommands
from spmdsim.tools.cli.main import SUBCOMMANDS, build_parser
from spmdsim.tools.cli.reference import PAGES, REGENERATE, WIDTH, pages

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def page() -> str:
    """Both pages, one after the other."""
    return "".join((FOLDER / name).read_text() for name, _ in PAGES)


def _parsers(parser, words=()):
    """(words, parser) of the top-level command and every command under it."""
    yield words, parser
    for name, sub in subcommands(parser).items():
        yield from _parsers(sub, (*words, name))


def _section(page: str, words: tuple[str, ...]) -> str:
    """The text under the heading of `spmdsim WORDS`, up to the next heading."""
    heading = re.escape(" ".join(("spmdsim", *words)))
    found = re.search(rf"(?m)^#{{2,3}} {heading}\n(.*?)(?=^#|\Z)", page, re.S)
    assert found, f"no section for {' '.join(('spmdsim', *words))!r}"
    return found.group(1)


def test_the_pages_are_what_the_parsers_give():
    for name, text in pages().items():
        assert (FOLDER / name).read_text() == text, f"docs/reference/{name} differs from the parsers; rewrite it " \
                                                     f"with: {REGENERATE}"


def test_every_flag_of_every_command_is_in_its_own_section(page):
    checked = 0
    for words, parser in _parsers(build_parser()):
        section = _section(page, words)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS and action.option_strings:
                continue  # (hidden: what a command refuses, mpirun's mpiexec-only placement options)
            shown = argparse.HelpFormatter("spmdsim")._metavar_formatter(action, action.dest)(1)[0]
            for name in action.option_strings or [shown]:  # a positional as --help shows it: NAME, {gpt}
                # a table row (`--flag VALUE`), or the list of a group linked to where it is described
                assert re.search(rf"`{re.escape(name)}[` ]", section), (words, name)
                checked += 1
    assert checked > 250  # every command's, the run operators' too


def test_the_page_says_every_command_takes_help_once(page):
    assert page.count("`-h`, `--help`") == 1
    assert all(isinstance(a, argparse._HelpAction) for a in build_parser()._actions if "-h" in a.option_strings)


def test_every_command_has_a_section_with_its_example(page):
    for command in SUBCOMMANDS:
        assert re.search(rf"\]\((cli-cluster\.md)?#spmdsim-{command}\)", page)  # linked from the index
    for command, example in EXAMPLES.items():
        assert example in _section(page, tuple(command.split()))


def test_prose_lines_fit_in_100_columns(page):
    lines = page.splitlines()
    fenced = False
    for line in lines:
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith(("|", "```")):
            assert len(line) <= WIDTH, line


def test_check_names_the_command_when_the_page_is_stale(tmp_path):
    for name, _ in PAGES:
        (tmp_path / name).write_text((FOLDER / name).read_text())
    stale = tmp_path / "cli.md"
    stale.write_text(stale.read_text().replace("--dry-run", "--dry-rum", 1))
    # `python scripts/cli_reference.py ...`, run in this process (docs_commands.run_here)
    done = run_here("scripts/cli_reference.py", ["--check", "--output", str(tmp_path)])
    assert done[0] == 1 and f"rewrite it with: {REGENERATE}" in done[2], done
    done = run_here("scripts/cli_reference.py", ["--output", str(tmp_path)])
    assert done[0] == 0 and stale.read_text() == (FOLDER / "cli.md").read_text(), done
