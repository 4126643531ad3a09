"""The commands of the "Uneven shards" sections (docs/explanation/semantics.md, docs/explanation/redistribution.md)
print what they quote."""
from __future__ import annotations

import pytest

from docs_commands import mismatch, section
from spmdsim.tools.cli.main import main

QUOTES = (section("docs/explanation/semantics.md", "## Uneven shards")
          + section("docs/explanation/redistribution.md", "## Uneven shards"))


def test_the_sections_quote_commands_with_their_output():
    assert len([q for q in QUOTES if q.output]) >= 4 and all(q.argv for q in QUOTES if q.output)


@pytest.mark.parametrize("quote", [q for q in QUOTES if q.output], ids=lambda q: q.where())
def test_uneven_command_prints_what_the_doc_quotes(quote, capsys):
    assert main(quote.argv) == 0
    out = capsys.readouterr().out
    assert mismatch(quote.output, out) is None, (quote.where(), mismatch(quote.output, out))
    assert max(len(line) for line in out.splitlines()) <= 100
