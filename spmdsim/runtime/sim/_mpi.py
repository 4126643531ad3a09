"""mpi4py's module, constants and errors as the simulated MPI reads them, without importing mpi4py.

MPI.IN_PLACE, MPI.ANY_SOURCE / ANY_TAG / PROC_NULL / ... (MPICH's values while mpi4py is not loaded), the
buffer errors mpi4py raises (BufferSpecError, DatatypeMapError), MPI.Exception with MPICH's detail
(`mpi_error`), and the checks of a rank, root, tag or count (`integer`, `floating`, `c_int`), which load no
numpy for a program without it.
"""
from __future__ import annotations

import sys
from typing import Any

from ...errors import SpmdsimError
from ..engines.base import SimulationError


class _InPlace:
    """spmdsim.runtime.sim.IN_PLACE: MPI.IN_PLACE for code that does not import mpi4py."""

    def __repr__(self) -> str:
        return "IN_PLACE"


#: MPI.IN_PLACE for code that does not import mpi4py.
IN_PLACE = _InPlace()


class BufferSpecError(SpmdsimError, BufferError):
    """A buffer MPI cannot move as it is (not one block, read-only where written, not in native byte order):
    a BufferError, as mpi4py's."""

    #: The class mpi4py raises here, which spmdsim mpirun names in its report, as the program would read it
    mpi4py_name = "BufferError"


class DatatypeMapError(SpmdsimError, KeyError):
    """A buffer whose numpy dtype maps to no MPI datatype (Python objects): a KeyError, as mpi4py's."""

    mpi4py_name = "KeyError"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# Public as spmdsim.runtime.sim's (a traceback names a class by its module, not spmdsim.runtime.sim._buffers)
BufferSpecError.__module__ = DatatypeMapError.__module__ = "spmdsim.runtime.sim"

# MPICH's values, used when mpi4py is not loaded (a program that passes MPI's
# constants has loaded it, and then its own values are read).
_DEFAULTS = {"ANY_SOURCE": -2, "ANY_TAG": -1, "PROC_NULL": -1, "UNDEFINED": -32766, "ROOT": -3,
             "IDENT": 0, "CONGRUENT": 1, "SIMILAR": 2, "UNEQUAL": 3, "COMM_TYPE_SHARED": 1}


def mpi_module() -> Any:
    """mpi4py.MPI when the program has imported it (its constants and classes), else None.

    None too while another thread is still importing it (a module is in sys.modules before its
    names are: a simulated rank read MPI.IN_PLACE from the half-made module and failed); a buffer
    or constant the program passes comes from the finished module, so none can be its yet."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is _WHOLE[0]:  # asked for several times per message: the module once seen whole stays whole
        return mpi
    if mpi is None or getattr(getattr(mpi, "__spec__", None), "_initializing", False):
        return None
    _WHOLE[0] = mpi
    return mpi


_WHOLE: list = [None]  # the mpi4py.MPI module `mpi_module` last found whole


_DETAILED: dict = {}  # mpi4py.MPI.Exception -> its subclass that says what happened


def mpi_error(mpi: Any, code: int, detail: str) -> BaseException:
    """MPI.Exception(code) (`except MPI.Exception` and Get_error_class work) whose text goes on with
    `detail`: MPICH's error stack names the ranks and sizes, mpi4py's bare class text does not. A class this
    process's MPI lacks (mpi4py gives it MPI.ERR_LASTCODE: Open MPI has no MPI_ERR_ERRHANDLER, and the code
    would read as MPI.ERR_UNKNOWN) is MPI.ERR_ARG, the class such an MPI gives for the bad argument."""
    if code == mpi.ERR_LASTCODE:
        code = mpi.ERR_ARG
    base = mpi.Exception
    cls = _DETAILED.get(base)
    if cls is None:
        def __init__(self: Any, ierr: int = 0, detail: str = "") -> None:
            base.__init__(self, ierr)
            self.detail = detail

        def __str__(self: Any) -> str:
            text = base.__str__(self)
            return f"{text}: {self.detail}" if self.detail else text

        cls = _DETAILED[base] = type("Exception", (base,), {"__init__": __init__, "__str__": __str__,
                                                            "__module__": base.__module__})
    return cls(code, detail)


def named_error(cls: str, text: str) -> BaseException:
    """`mpi_error` of the error class named `cls` ("ERR_RANK") of a simulated rank's mpi4py, or where no mpi4py
    is loaded a SimulationError of `text`."""
    mpi = mpi_module()
    return mpi_error(mpi, getattr(mpi, cls), text) if mpi is not None else SimulationError(text)

def _numpy_type(name: str) -> Any:
    """numpy's `name` (integer, floating, ndarray) where numpy is loaded, else None: before it loads, no value
    is of its types, so checks of a rank, tag or count load no numpy for a program without it."""
    return getattr(sys.modules.get("numpy"), name, None)


def integer(value: Any) -> bool:
    """``isinstance(value, (int, np.integer))``, numpy not loaded for it."""
    if isinstance(value, int):
        return True
    found = _numpy_type("integer")
    return found is not None and isinstance(value, found)


def floating(value: Any) -> bool:
    """``isinstance(value, (float, np.floating))``, numpy not loaded for it."""
    if isinstance(value, float):
        return True
    found = _numpy_type("floating")
    return found is not None and isinstance(value, found)


def c_int(value: Any, what: str) -> int:
    """`value` as mpi4py takes a rank, root or tag (a C int): an int, a numpy integer, a bool, a float (truncated:
    ``root=size / 2`` is rank 1 of 2, as in mpi4py's demos); anything else mpi4py's TypeError ("an integer is
    required"), and a value past a C int its OverflowError, each naming the argument."""
    if type(value) is not int:
        if not (integer(value) or floating(value)):
            raise TypeError(f"an integer is required: {what} is {value!r}")
        value = int(value)
    if not -(1 << 31) <= value < 1 << 31:
        raise OverflowError(f"value too large to convert to int: {what} is {value!r}")
    return value


def special(name: str) -> int:
    """MPI.ANY_SOURCE / ANY_TAG / PROC_NULL / UNDEFINED ... as this process's MPI defines them."""
    mpi = mpi_module()
    if mpi is None:
        return _DEFAULTS[name]
    found = _SPECIAL.get(name)
    if found is None or found[0] is not mpi:  # read once per name (a message asks for several)
        found = _SPECIAL[name] = (mpi, int(getattr(mpi, name)))
    return found[1]


_SPECIAL: dict = {}  # name -> (the mpi4py.MPI module, its value of MPI.<name>)


def wildcards() -> tuple[int, int]:
    """(MPI.ANY_SOURCE, MPI.ANY_TAG): the two `special` values every message and request asks for."""
    mpi = mpi_module()
    found = _WILDCARDS.get(mpi)
    if found is None:
        found = _WILDCARDS[mpi] = (special("ANY_SOURCE"), special("ANY_TAG"))
    return found


_WILDCARDS: dict = {}  # the mpi4py.MPI module (None: not loaded) -> its (ANY_SOURCE, ANY_TAG)


def in_place(buf: Any) -> bool:
    """MPI.IN_PLACE (or None, which mpi4py takes for it in a collective's send buffer)."""
    if buf is None or buf is IN_PLACE:
        return True
    mpi = mpi_module()
    return mpi is not None and buf is mpi.IN_PLACE
