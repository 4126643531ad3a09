"""A mesh flag given as a framework's own mesh object, copied from a script: OneFlow's
``flow.placement("cuda", ranks=[[0, 1], [2, 3]])``, Paddle's ``dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp",
"mp"])``, PyTorch's ``DeviceMesh("cpu", [[0, 1], [2, 3]])`` or ``init_device_mesh("cpu", (2, 2))``. None is read; the
refusal writes the flags that say the same (the shape, and the names as --alias). Pure: never imports mpi4py.
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from ...errors import DialectError
from ...layouts.dialects._common import ranks_shape

__all__ = ["framework_mesh_hint"]

#: The constructor's name (any module prefix), and whose it is.
_CALL = re.compile(r"^\s*(?:[\w.]+\.)?(placement|ProcessMesh|DeviceMesh|init_device_mesh)\s*\((.*)\)\s*$", re.S)
_WHOSE = {"placement": "OneFlow's flow.placement", "ProcessMesh": "Paddle's ProcessMesh",
          "DeviceMesh": "PyTorch's DeviceMesh", "init_device_mesh": "PyTorch's init_device_mesh"}
_NAMES = re.compile(r"(?:mesh_dim_names|dim_names)\s*=\s*[\[(]([^\])]*)[\])]")
_ARRAY = re.compile(r"[\[(][\[(\d\s,\])]*[\])]")


def framework_mesh_hint(text: object, flag: str) -> Optional[str]:
    """For `text` that is a framework's mesh object: "--placement "flow.placement(...)" is OneFlow's
    flow.placement, which spmdsim does not read; expected its shape, --placement 2,2" (and "--alias dp,mp" for its
    dim names); None for any other text, or where `flag` is a case key (not a flag: "case key 'placement'")."""
    match = _CALL.match(text) if isinstance(text, str) and flag.startswith("--") else None
    if match is None:
        return None
    kind, args = match.groups()
    said = f"{flag} {text!r} is {_WHOSE[kind]}, which spmdsim does not read"
    array = _ARRAY.search(args)
    sizes = None
    if array is not None:
        try:
            items = ast.literal_eval(array.group(0))
            sizes = tuple(items) if kind == "init_device_mesh" else ranks_shape(items, flag)
        except (ValueError, SyntaxError, TypeError, DialectError):
            sizes = None
    if not sizes:
        return f"{said}; expected its shape, such as {flag} 2,4"
    names = _NAMES.search(args)
    alias = ",".join(n.strip().strip("'\"") for n in names.group(1).split(",") if n.strip()) if names else ""
    return (f"{said}; expected its shape, {flag} {','.join(map(str, sizes))}"
            + (f", with its names as --alias {alias}" if alias else ""))
