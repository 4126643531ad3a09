"""README.md and docs/ say what is true now, in pages a reader can take in: no history, short lines, short pages.

A line fails when it holds a date (YYYY-MM-DD), an issue number ("issue 58", "#58" in prose), a commit hash
(7 to 40 hex digits, letters and digits mixed), a "round" of measurement ("rounds 8-10", "the latest round",
"measured over rounds") or the load a figure was measured at ("at load 9"); a prose line (outside code blocks and
tables) fails past 100 characters. README.md has at most 250 lines, a docs page at most 600, the performance
page at most 300.
"""
from __future__ import annotations

import re

import pytest

from docs_commands import ROOT

PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
PERFORMANCE = "docs/explanation/performance.md"

DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")
ISSUE = re.compile(r"\b(?:issue|PR|pull request)\s+#?\d+\b|\bissues\s+#?\d+(?:,| and| or|\))|(?<![\w&`#])#\d+\b",
                   re.I)
HASH = re.compile(r"(?<![\w.+-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
#: "round" as a time of measuring, not a step of an algorithm ("round by round", "in 3 rounds").
#: A measurement's circumstances told as a story: "at load 9", "load average 3-6", "loads 1.0-2.6".
LOAD = re.compile(r"\bat loads? \d|\bloads? average|\bloads? of \d|\bloads? \d+(?:\.\d+)?\s*(?:-|to)\s*\d", re.I)
ROUND = re.compile(r"\brounds \d+\s*(?:-|to|and)\s*\d+|\b(?:latest|last|earlier|previous|recent|later|night's|"
                   r"morning's|evening's) rounds?\b|\brounds? of (?:measur|tim|bench|runs|launch)|"
                   r"\b(?:measured|timed|benchmarked) (?:in|over|across) (?:\w+ )?rounds?\b|\bin (?:that|this) round\b",
                   re.I)
WIDTH = 100


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks and tables."""
    out, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence and not line.lstrip().startswith("|"):
            out.append((number, line))
    return out


def _without_code(line: str) -> str:
    return re.sub(r"`[^`]*`", "``", line)


def history(text: str) -> list[str]:
    """The lines of `text` that tell history (a date, an issue number, a commit hash, a round of measuring)."""
    bad = []
    prose = dict(_prose(text))
    for number, line in enumerate(text.splitlines(), 1):
        what = [name for name, pattern, where in (("date", DATE, line), ("commit", HASH, line),
                                                 ("issue", ISSUE, _without_code(prose.get(number, ""))),
                                                 ("round", ROUND, prose.get(number, "")),
                                                 ("load", LOAD, prose.get(number, "")))
                if pattern.search(where)]
        if what:
            bad.append(f"{number}: {'/'.join(what)}: {line.strip()[:120]}")
    return bad


def too_wide(text: str) -> list[str]:
    """Prose lines past WIDTH, but for one that is a single word (a URL): it cannot be wrapped."""
    return [f"{number}: {len(line)} characters" for number, line in _prose(text)
            if len(line) > WIDTH and " " in line.strip()]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_tells_no_history(page):
    assert history((ROOT / page).read_text()) == []


@pytest.mark.parametrize("page", PAGES)
def test_prose_lines_fit_100_columns(page):
    assert too_wide((ROOT / page).read_text()) == []


@pytest.mark.parametrize("page", PAGES)
def test_pages_are_short(page):
    lines = len((ROOT / page).read_text().splitlines())
    limit = 250 if page == "README.md" else 300 if page == PERFORMANCE else 600
    assert lines <= limit, (page, lines)


def test_the_checks_catch_what_they_name():
    assert history("measured 2026-11-28 at load 1.2") and history("as issue 58 asked") and history("see #58")
    assert history("rounds 8-10 on the VM") and history("the latest round gave 1.1x")
    assert history("on tree 1dfb077: 4:40") and history("26 s here at load 9") and history("load average 3-6")
    assert not history("alone loads 79 modules")
    assert history("the ring's rounds, round by round; in 3 rounds; after round 3; each round's sends") == []
    assert history("as issues 54 and 58 asked") and not history("a step issues 41 collectives")
    assert history("shard `#2`; 0.75 s; 1e+15; 2**40; it rounds once, as the graph rounds") == []
    assert (too_wide("x " * 51) and not too_wide("  (<https://" + "x" * 100 + ">,")
            and not too_wide("| " + "x" * 200 + " |") and not too_wide("```\n" + "x" * 200 + "\n```"))
    assert PERFORMANCE in PAGES and "docs/reference/glossary.md" in PAGES and "docs/index.md" in PAGES
