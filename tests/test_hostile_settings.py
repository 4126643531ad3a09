"""Settings and paths a new user gets wrong: one `spmdsim: error:` line each, never a traceback.

Every environment variable is checked on simulated ranks as it is under MPI, so
a typo found on a laptop is not first found on the cluster; output paths in a
folder that does not exist are refused, not made.
"""
from __future__ import annotations

import subprocess

import pytest

from docs_commands import run_here
from spmdsim.tools.cli.main import main
from spmdsim.runtime import debug
from spmdsim.runtime.sim.launch import run_on_ranks
from testkit import unfold

RUN = ["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,16,16", "--ranks", "8"]
SHOW = ["show", "--device-matrix", "2,4", "--alias", "dp,mp", "--tensor-map", "mp,None", "--shape", "8,6"]


@pytest.fixture(autouse=True)
def _fresh_debug_settings():
    debug._reset()  # the hooks read the environment once: read it again for each case
    yield
    debug._reset()


def _one_error_line(capsys, argv: list[str], needle: str, code: int = 2) -> str:
    assert main(argv) == code
    out, err = capsys.readouterr()
    errors = [line for line in unfold(err).splitlines() if not line.startswith("spmdsim: running on")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("spmdsim: error: ") and needle in errors[0], errors[0]
    assert "PASS" not in out, out
    return errors[0]


@pytest.mark.parametrize("name, value, needle", [
    ("SPMDSIM_WAIT", "sleepy", "SPMDSIM_WAIT='sleepy' is not a known wait mode; expected one of "
                               "('busy', 'polite', 'auto')"),
    ("SPMDSIM_EXPECT_WORLD", "abc", "SPMDSIM_EXPECT_WORLD='abc' is not a number of ranks"),
    ("SPMDSIM_EXPECT_WORLD", "0", "SPMDSIM_EXPECT_WORLD='0' is not a number of ranks"),
    ("SPMDSIM_WATCHDOG", "1e-9", "SPMDSIM_WATCHDOG='1e-9' is below the watchdog's minimum of 1 s"),
    ("SPMDSIM_MEMORY", "0", "SPMDSIM_MEMORY='0' would give a rank no memory at all; expected bytes per rank"),
    ("SPMDSIM_CHECK", "maybe", "SPMDSIM_CHECK='maybe' is not a switch"),
    ("SPMDSIM_CHECK", " Maybe", "SPMDSIM_CHECK=' Maybe' is not a switch"),  # the value as it was set
    ("SPMDSIM_WATCHDOG", "yes", "SPMDSIM_WATCHDOG='yes' is not a number of seconds; expected seconds from 1 to "
                                "604,800, or 0 for off"),
    ("SPMDSIM_WATCHDOG", "-1", "SPMDSIM_WATCHDOG='-1' must be a positive, finite number of seconds; expected "
                               "seconds from 1 to 604,800, or 0 for off"),
])
def test_a_bad_setting_is_refused_on_simulated_ranks_too(monkeypatch, capsys, name, value, needle):
    monkeypatch.setenv(name, value)
    _one_error_line(capsys, RUN, needle)


def test_expected_world_is_read_the_same_way_under_mpi(monkeypatch):
    from spmdsim.errors import RuntimeMismatchError
    from spmdsim.runtime.mesh import _expected_world

    for value, want in (("", None), (" 8 ", 8)):
        monkeypatch.setenv("SPMDSIM_EXPECT_WORLD", value)
        assert _expected_world() == want
    for bad in ("abc", "-4", "0", "8.0", "\u00b2"):  # a superscript two is a digit to str.isdigit, not to int()
        monkeypatch.setenv("SPMDSIM_EXPECT_WORLD", bad)
        with pytest.raises(RuntimeMismatchError, match=rf"^SPMDSIM_EXPECT_WORLD={bad!r} is not a number of ranks"):
            _expected_world()


def test_good_settings_still_run_on_simulated_ranks(monkeypatch, capsys):
    # Simulated ranks are not the world mpiexec launched: a count is only checked for its spelling.
    for name, value in (("SPMDSIM_WAIT", "polite"), ("SPMDSIM_EXPECT_WORLD", "4"),
                        ("SPMDSIM_WATCHDOG", "30"), ("SPMDSIM_MEMORY", "1G")):
        monkeypatch.setenv(name, value)
    assert main(RUN) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


@pytest.mark.parametrize("memory", ["off", ""])
def test_numpy_out_of_memory_is_one_line(monkeypatch, capsys, memory):
    # With the estimate switched off (or short), numpy's own MemoryError is the one line left.
    monkeypatch.setenv("SPMDSIM_MEMORY", memory)

    def rank():
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (80000004096,) and data type uint8")

    assert run_on_ranks(8, rank) == 2
    err = unfold(capsys.readouterr().err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("spmdsim: error: out of memory: Unable to allocate 74.5 GiB")
    if memory == "off":
        assert err.rstrip().endswith("the memory check is off (SPMDSIM_MEMORY=off): unset it to have such a "
                                     "run refused before it starts")
    else:
        assert err.rstrip().endswith("SPMDSIM_MEMORY sets what a rank may use")


def test_out_of_memory_on_some_ranks_names_them(capsys):
    from spmdsim import world

    def rank():
        if world().Get_rank() == 3:
            raise MemoryError("Unable to allocate 1 GiB")
        return 0

    assert run_on_ranks(4, rank) == 1
    err = capsys.readouterr().err
    assert err.startswith("spmdsim: error on simulated rank 3: out of memory: Unable to allocate 1 GiB")
    assert "Traceback" not in err


def test_output_paths_in_a_missing_folder_are_refused_and_nothing_is_made(capsys, tmp_path):
    missing = tmp_path / "no" / "such"
    line = _one_error_line(capsys, SHOW + ["--png", str(missing / "x.png")], "cannot be written")
    assert line.endswith(f"directory {str(missing)!r} does not exist; expected a path in an existing directory")
    _one_error_line(capsys, RUN + ["--trace-out", str(missing / "t.json")],
                    f"directory {str(missing)!r} does not exist")
    _one_error_line(capsys, ["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
                             "--shape", "8,8", "--png", str(missing / "pics")], "does not exist")
    assert not (tmp_path / "no").exists()
    # A new picture directory in an existing folder is made, as before.
    assert main(["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
                 "--shape", "8,8", "--png", str(tmp_path / "pics")]) == 0
    assert sorted(p.name for p in (tmp_path / "pics").iterdir())[0] == "bytes.png"


@pytest.mark.parametrize("argv, needle", [
    (SHOW + ["--png", ""], "--png '': picture file must end in one of ('.png', '.svg', '.pdf')"),
    (RUN + ["--trace-out", ""], "--trace-out '' is empty; expected a file path"),
    (["collective", "ring-allreduce", "--size", "1K", "--ranks", "4", "--png", ""], "--png '' is empty"),
])
def test_an_empty_output_path_is_refused_not_ignored(capsys, argv, needle):
    _one_error_line(capsys, argv, needle)


def test_version(capsys):
    from spmdsim import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"spmdsim {__version__}\n"
    from importlib.metadata import version

    assert version("spmdsim") == __version__  # setup.cfg reads it from the package


@pytest.mark.parametrize("argv, code, needle", [
    (["--ranks=8"], 0, None),  # "--ranks 8": tests/test_sim_engine.py
    (["--rank", "8"], 0, None),  # a prefix, as argparse takes it for the CLI's --ranks (ran 1 process)
    # and how to get 8 ranks (it was said for a 1-rank run only)
    (["--ranks", "4"], 2, "spmdsim: error: device matrix (2, 4) needs 8 ranks but the communicator has 4 (simulate 8 "
                          "ranks with `--ranks 8` / spmdsim.simulate(8, main), or launch them with "
                          "`mpiexec -n 8 ...`)"),
])
def test_readme_library_example_takes_ranks_as_every_script_does(tmp_path, argv, code, needle):
    from testkit import readme_library_example, unfold

    (tmp_path / "my_matmul.py").write_text(readme_library_example())
    code_run, out, err = run_here(str(tmp_path / "my_matmul.py"), argv)  # as `python my_matmul.py`, in process
    run = subprocess.CompletedProcess(argv, code_run, out, err)
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr
    if needle:
        assert unfold(run.stderr.strip()) == needle
    else:
        assert "ranks 0-7:\n  check passed: every element within atol 1e-05 + rtol 0.0001 x |ref|" in run.stdout
