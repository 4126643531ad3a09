"""`spmdsim mpirun` on the command lines a student types from habit: a launcher's command pasted whole, a script
named without its `.py`: refused in one line that says what was meant."""
from __future__ import annotations

from spmdsim.tools.cli.main import main
from testkit import unfold


def test_mpiexec_pasted_after_mpirun_says_the_command_to_type(tmp_path, monkeypatch, capsys):
    """`spmdsim mpirun -n 4 mpiexec -n 4 python prog.py` said only "script 'mpiexec' does not exist"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("print('hi')\n")
    assert main(["mpirun", "-n", "4", "mpiexec", "-n", "4", "python", "prog.py"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim mpirun: error: script 'mpiexec' does not exist: spmdsim mpirun takes the command mpiexec runs, not "
        "mpiexec itself: spmdsim mpirun -n 4 python prog.py\n")
    assert main(["mpirun", "-n", "2", "prog"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim mpirun: error: script 'prog' does not exist (the file is 'prog.py')\n")
    assert main(["mpirun", "-n", "2", "python", "other.py"]) == 2
    assert unfold(capsys.readouterr().err) == "spmdsim mpirun: error: script 'other.py' does not exist\n"
