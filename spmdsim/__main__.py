"""`python -m spmdsim` is the `spmdsim` console script."""
from .tools.cli.console import console

raise SystemExit(console())
