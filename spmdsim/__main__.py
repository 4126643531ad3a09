"""`python -m spmdsim` is the `spmdsim` console script."""
from .tools.cli.main import main

raise SystemExit(main())
