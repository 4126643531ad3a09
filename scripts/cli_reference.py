#!/usr/bin/env python
"""Write docs/reference/cli.md, every spmdsim command and flag, from the CLI's own parsers.

    python scripts/cli_reference.py            # rewrite the page
    python scripts/cli_reference.py --check    # exit 1, naming the page, when it differs from the parsers

tests/test_cli_reference.py runs the check, so a flag added without rewriting the page fails there.
"""
from __future__ import annotations

import sys
from pathlib import Path

from spmdsim.base.once_parser import OnceParser
from spmdsim.tools.cli.main import run_script
from spmdsim.tools.cli.reference import REGENERATE, markdown

#: The page, from the repository's root (this file's folder's parent).
PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"


def main(argv: list[str] | None = None) -> int:
    parser = OnceParser(prog="cli_reference.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the page differs from what the parsers give")
    parser.add_argument("--output", type=Path, default=PAGE, metavar="FILE",
                        help=f"where the page goes (default {PAGE.relative_to(PAGE.parents[2])})")
    args = parser.parse_args(argv)
    text = markdown()
    if args.check:
        current = args.output.read_text() if args.output.exists() else None
        if current != text:
            print(f"{args.output} is not what the parsers give; rewrite it with: {REGENERATE}", file=sys.stderr)
            return 1
        print(f"{args.output} is current")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
