"""spmdsim lab grade on a zip of submissions (a learning platform's "download all"): graded as the folder it
unpacks to, the zip's own folder entered, macOS's companions left out; a zip it cannot unpack refused in one
line before anything is written or run."""
from __future__ import annotations

import csv
import zipfile

import pytest

from test_lab_cli import SUBMISSIONS

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab import archive


def _zipped(path, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return str(path)


def test_a_zip_is_graded_as_its_folder_with_its_own_folder_entered(course, capsys):
    """A zip of one folder (download/) of student folders, beside macOS's __MACOSX/ of ._name.py companions:
    the students' rows as from the folder unpacked, no row for __MACOSX/, and the temporary folder removed."""
    made = _zipped(course / "download.zip", {
        "download/alice/double.py": SUBMISSIONS["right.py"], "download/bob/double.py": SUBMISSIONS["wrong.py"],
        "download/carol/notes.txt": "no code", "__MACOSX/download/alice/._double.py": "\x00\x05\x16\x07"})
    assert main(["lab", "grade", "1", made, "--csv", "g.csv", "--exercises", "course"]) == 0
    rows = list(csv.reader((course / "g.csv").open(encoding="utf-8")))
    assert [row[:3] for row in rows[1:]] == [["alice/double.py", "PASS", "2"], ["bob/double.py", "FAIL", "0"],
                                             ["carol/", "NOT GRADED", ""]], rows
    said = capsys.readouterr()
    assert said.out.splitlines()[-1] == "1 of 3 submissions pass, 1 not graded", said.out
    assert "__MACOSX" not in said.out + said.err  # (beside download/, which is graded: not even left out)
    assert "spmdsim-lab-" not in said.out + said.err  # (rows and lines name the zip's members, not its folder)


@pytest.mark.parametrize("case, said", [
    ("cut", "'s.zip' is not a zip file that can be read (cut short, or damaged?); expected a zip of the "
            "submissions, or their folder"),
    ("locked", "'s.zip' holds encrypted files ('a.py' and 0 more); expected a zip without a password, or its "
               "folder unpacked"),
    ("large", "'s.zip' unpacks to 2 MiB; expected at most 1 MiB of submissions (unpack it yourself and grade "
              "the folder)"),
    ("no code", "submission folder 's.zip' holds no .py file, and no folder holding one; expected one file per "
                "student, side by side in DIR (alice.py, bob.py) or each in its own folder")])
def test_a_zip_that_cannot_be_graded_is_one_line_naming_it(case, said, course, capsys, monkeypatch):
    path = course / "s.zip"
    if case == "cut":
        whole = _zipped(course / "whole.zip", {"a.py": SUBMISSIONS["right.py"] * 40})
        path.write_bytes(open(whole, "rb").read()[:100])
    elif case == "locked":  # a member flagged encrypted, as a zip made with a password has it (zipfile writes
        data = bytearray(open(_zipped(course / "open.zip", {"a.py": SUBMISSIONS["right.py"]}), "rb").read())
        for header, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # none: its flag bit 0 set in both headers)
            data[data.index(header) + at] |= 0x1
        path.write_bytes(bytes(data))
    elif case == "large":
        monkeypatch.setattr(archive, "MOST_BYTES", 1 << 20)
        _zipped(path, {"a.py": "#" * (2 << 20)})
    else:
        _zipped(path, {"notes.txt": "no code"})
    assert main(["lab", "grade", "1", "s.zip", "--csv", "g.csv", "--exercises", "course"]) == 2
    err = capsys.readouterr().err
    assert err.replace("\n  ", " ").splitlines()[-1] == f"spmdsim: error: {said}", err
    assert not (course / "g.csv").exists()
