#!/usr/bin/env python
"""Write docs/reference/cli.md and cli-cluster.md, every spmdsim command and flag, from the CLI's parsers.

    python scripts/cli_reference.py            # rewrite the pages
    python scripts/cli_reference.py --check    # exit 1, naming a page, when it differs from the parsers

tests/test_cli_reference.py runs the check, so a flag added without rewriting the pages fails there.
"""
from __future__ import annotations

import sys
from pathlib import Path

from spmdsim.base.once_parser import OnceParser
from spmdsim.tools.cli.main import run_script
from spmdsim.tools.cli.reference import REGENERATE, pages

#: The page, from the repository's root (this file's folder's parent).
FOLDER = Path(__file__).resolve().parents[1] / "docs" / "reference"


def main(argv: list[str] | None = None) -> int:
    parser = OnceParser(prog="cli_reference.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a page differs from what the parsers give")
    parser.add_argument("--output", type=Path, default=FOLDER, metavar="DIR",
                        help=f"where the pages go (default {FOLDER.relative_to(FOLDER.parents[1])})")
    args = parser.parse_args(argv)
    texts = pages()
    if args.check:
        for name, text in texts.items():
            page = args.output / name
            if not page.exists() or page.read_text() != text:
                print(f"{page} is not what the parsers give; rewrite it with: {REGENERATE}", file=sys.stderr)
                return 1
        print(f"{', '.join(str(args.output / n) for n in texts)} are current")
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (args.output / name).write_text(text)
        print(f"wrote {args.output / name} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
