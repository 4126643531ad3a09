"""spmdsim.base.files.write_aside: a file written beside its path and renamed onto it."""
from __future__ import annotations

import os
import stat

import pytest

from spmdsim.base.files import write_aside


def _bytes(data: bytes):
    return lambda f: f.write(data)


def test_a_file_is_written_whole_and_nothing_left_beside_it(tmp_path):
    path = tmp_path / "out.bin"
    assert write_aside(str(path), _bytes(b"one")) is None
    assert write_aside(str(path), _bytes(b"two")) is None
    assert path.read_bytes() == b"two" and os.listdir(tmp_path) == ["out.bin"]


def test_text_is_utf8_with_newlines_as_written(tmp_path):
    path = tmp_path / "book.csv"
    assert write_aside(str(path), lambda f: f.write("é,1\r\n"), text=True) is None
    assert path.read_bytes() == "é,1\r\n".encode()


def test_a_link_is_followed_the_file_it_names_replaced_and_the_link_kept(tmp_path):
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_bytes(b"old")
    link.symlink_to(real)
    assert write_aside(str(link), _bytes(b"new")) is None
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["link.txt", "real.txt"]


def test_a_file_replaced_keeps_its_mode(tmp_path):
    path = tmp_path / "kept"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    assert write_aside(str(path), _bytes(b"new")) is None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640 and path.read_bytes() == b"new"


def test_a_device_is_written_in_place():
    assert write_aside("/dev/null", _bytes(b"gone")) is None
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_failure_says_why_and_leaves_no_partial_file(tmp_path):
    assert write_aside(str(tmp_path / "missing" / "out.bin"), _bytes(b"x")) == "No such file or directory"

    def fails(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    assert write_aside(str(tmp_path / "full.bin"), fails) == "No space left on device"
    assert os.listdir(tmp_path) == []


def test_another_error_of_the_writer_is_raised_its_partial_file_removed(tmp_path):
    def fails(f):
        f.write(b"half")
        raise ValueError("not an array")

    with pytest.raises(ValueError, match="not an array"):
        write_aside(str(tmp_path / "out.bin"), fails)
    assert os.listdir(tmp_path) == []
