"""What a MindSpore, OneFlow or Paddle user porting a sharding writes next, with the slips they make: read as
their framework means it, or refused in one line that names the value and says what to write instead."""
from __future__ import annotations

import pytest

from spmdsim import Layout, LayoutError
from spmdsim.tools.cli.main import main


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


# -- MindSpore's integer tensor_map over named axes ------------------------------------------------------
@pytest.mark.parametrize("entries, by_name", [
    ((1, 0), '("dp", "mp")'), (("dp", -1), '("dp", None)'), (("1", None), '("dp", None)'),
    ((-1, 0), '(None, "mp")'),
])
def test_an_integer_tensor_map_over_named_axes_is_written_by_name(entries, by_name):
    """MindSpore's tensor_map (1, 0) over alias_name ("dp", "mp") is ("dp", "mp") (seed 000: numbered from the
    right, -1 for none). Only a map over the default names axis_0, axis_1 ... got it written by name; with the
    axes named, the refusal said "write the axis's name" and left the user to count from the right."""
    with pytest.raises(LayoutError) as info:
        Layout((2, 4), ("dp", "mp"))(*entries)
    assert str(info.value).endswith(f"this map by name is {by_name}" + (")" if "1" in entries else "")), info.value


def test_run_matmul_writes_an_integer_map_by_its_alias_names(capsys):
    code, _, err = _run(["run", "matmul", "--device-matrix", "2,4", "--alias", "dp,mp", "--x-map", "1,0",
                         "--w-map", "0,-1", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 2 and err == (
        "spmdsim: error: --x-map '1,0': unknown alias '1' in tensor map (\"1\", \"0\"); expected one of ('dp', "
        "'mp') (an axis number? MindSpore's integer tensor_map is not read: write the axis's name; this map by "
        "name is (\"dp\", \"mp\"))"), err
    code, _, err = _run(["run", "matmul", "--device-matrix", "2,4", "--alias", "dp,mp", "--x-map", "dp,mp",
                         "--w-map", "mp,None", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 0, err  # the map it wrote runs
