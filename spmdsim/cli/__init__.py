"""Command-line interface: one module per subcommand, wired in `main.py`."""
