"""What a wheel of spmdsim holds: every file of the package tree that is tracked by git, found as setuptools
finds it (a module of a package, a folder with __init__.py) or named by setup.cfg's package_data. A folder of
files that is no package (lab's exercises) was left out of the wheel: `spmdsim lab list` installed from it said
"exercise folder '.../spmdsim/tools/lab/exercises' does not exist"; an editable install and the tests, which read
the tree, never saw it."""
from __future__ import annotations

import configparser
import fnmatch
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _tracked() -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "spmdsim"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no git")
    if done.returncode != 0 or not done.stdout:
        pytest.skip("not a git checkout")
    return done.stdout.split()


def _package_data() -> dict:
    """setup.cfg's [options.package_data]: package -> its patterns."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {package: [p.strip() for p in patterns.replace("\n", ",").split(",") if p.strip()]
            for package, patterns in config["options.package_data"].items()}


def _shipped(path: str, data: dict) -> bool:
    folder = pathlib.Path(path).parent
    if path.endswith(".py") and (ROOT / folder / "__init__.py").exists():
        return True  # a module of a package
    for package, patterns in data.items():
        base = package.replace(".", "/") + "/"
        if path.startswith(base) and any(fnmatch.fnmatch(path[len(base):], p) for p in patterns):
            return True
    return False


def test_every_tracked_file_of_the_package_goes_into_its_wheel():
    data = _package_data()
    left = [path for path in _tracked() if not _shipped(path, data)]
    assert not left, f"tracked under spmdsim/ but in no package nor setup.cfg's package_data: {left}"
