"""The docs hang together: every page is on the maps, every link lands, the how-to's program runs."""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from docs_commands import ROOT, mismatch

PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
#: Written from the argparse parsers on another branch; linked from the maps before it lands.
CLI = "docs/reference/cli.md"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # commands and outputs hold no links
    text = re.sub(r"``.*?``|`[^`\n]*`", "", text)  # nor code spans
    return [target for target in _LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def _anchors(path) -> set[str]:
    text = path.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):  # GitHub's heading anchors
        ids.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return ids


def test_every_relative_link_lands_on_a_page_and_anchor():
    bad = []
    for page in ["README.md"] + PAGES:
        for target in _links(page):
            path, _, anchor = target.partition("#")
            where = ((ROOT / page).parent / path).resolve() if path else ROOT / page
            name = str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(where)
            if not where.exists():
                if name != CLI:
                    bad.append(f"{page}: {target}")
                continue
            if anchor and where.suffix == ".md" and anchor not in _anchors(where):
                bad.append(f"{page}: {target} (no such anchor)")
    assert bad == []


def test_the_index_and_the_readme_map_every_page():
    index = {str(((ROOT / "docs") / t).resolve().relative_to(ROOT)) for t in _links("docs/index.md")}
    readme = {t.partition("#")[0] for t in _links("README.md")}
    for page in PAGES:
        if page == "docs/index.md":
            continue
        assert page in index, f"docs/index.md does not list {page}"
        assert page in readme, f"README.md's map does not list {page}"
    assert CLI in index and CLI in readme


def test_glossary_terms_are_linked_from_the_pages():
    linked = {t.partition("#")[2] for page in ["README.md"] + PAGES for t in _links(page) if "glossary.md#" in t}
    for term in ("zero", "gpipe", "mfu", "sbp", "kept-set", "partial"):
        assert term in linked, term


@pytest.mark.parametrize("name", ["softsign.py", "rms_split.py", "gather_cols.py"])
def test_the_add_operator_programs_print_what_the_page_shows(name):
    text = (ROOT / "docs/howto/add-operator.md").read_text()
    program = re.search(rf"[Ss]ave (?:this )?as `{name}`.*?^```python\n(.*?)^```", text, re.S | re.M).group(1)
    shown = re.search(rf"^```\n\$ python {name}\n(.*?)^```", text, re.S | re.M).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(program, name, "exec"), {"__name__": "__main__"})
    assert mismatch(tuple(shown.splitlines()), out.getvalue()) is None, out.getvalue()
    assert "True, True)" in out.getvalue() and "False" not in out.getvalue()
