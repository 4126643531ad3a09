"""Reading mpi4py-style message arguments, datatypes, ops and MPI constants without importing mpi4py.

A message is read as mpi4py reads it (its msgbuffer.pxi): ``buf``, ``[buf, datatype]``,
``[buf, count]``, ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]`` or
``[buf, count, displ, datatype]``, where a count is per peer in the collectives that move one
block per peer (`blocks`), and a buffer is anything with the buffer protocol, ``__dlpack__``
or ``__cuda_array_interface__`` (host memory), seen in place, never copied.
"""
from __future__ import annotations

import array
import math
import mmap
import operator
import sys
from typing import Any, Optional

from ...errors import ShapeError, SpmdsimError
from ...base.validate import dtype_name  # noqa: F401 - the collectives' signatures name dtypes with it
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it


class _InPlace:
    """spmdsim.runtime.sim.IN_PLACE: MPI.IN_PLACE for code that does not import mpi4py."""

    def __repr__(self) -> str:
        return "IN_PLACE"


#: MPI.IN_PLACE for code that does not import mpi4py.
IN_PLACE = _InPlace()

#: The byte order numpy marks as not this machine's ('>' on little-endian machines).
_FOREIGN = ">" if sys.byteorder == "little" else "<"


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


# Public as spmdsim.runtime.sim's (a traceback names a class by its module: was spmdsim.runtime.sim._buffers.BufferSpecError)
BufferSpecError.__module__ = DatatypeMapError.__module__ = "spmdsim.runtime.sim"

# MPICH's values, used when mpi4py is not loaded (a program that passes MPI's
# constants has loaded it, and then its own values are read).
_DEFAULTS = {"ANY_SOURCE": -2, "ANY_TAG": -1, "PROC_NULL": -1, "UNDEFINED": -32766, "ROOT": -3,
             "IDENT": 0, "CONGRUENT": 1, "SIMILAR": 2, "UNEQUAL": 3, "COMM_TYPE_SHARED": 1}

# Ops a numpy ufunc computes (the fast path; named, as numpy loads on first use); the others go through
# MPI.Op.Reduce_local.
_REDUCTIONS = {
    "sum": ("add", operator.add),
    "max": ("maximum", max),
    "min": ("minimum", min),
    "prod": ("multiply", operator.mul),
    "land": ("logical_and", lambda a, b: a and b),
    "lor": ("logical_or", lambda a, b: a or b),
    "lxor": ("logical_xor", lambda a, b: bool(a) != bool(b)),
    "band": ("bitwise_and", operator.and_),
    "bor": ("bitwise_or", operator.or_),
    "bxor": ("bitwise_xor", operator.xor),
}
_OTHER_OPS = ("maxloc", "minloc", "replace", "no_op")


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


class Reduction:
    """One reduction op: its name, numpy ufunc (None: MPI computes it), Python function for objects."""

    __slots__ = ("name", "_ufunc", "fn", "op")

    def __init__(self, name: str, ufunc: Any, fn: Any, op: Any) -> None:
        self.name, self._ufunc, self.fn, self.op = name, ufunc, fn, op

    @property
    def ufunc(self) -> Any:
        found = self._ufunc
        if type(found) is str:  # numpy's name for it: a reduction of objects alone does not load numpy
            found = self._ufunc = getattr(np, found)
        return found

    def __getitem__(self, i: int) -> Any:
        """(name, ufunc, fn)[i], as runtime.algorithms reads a reduction."""
        return (self.name, self.ufunc, self.fn)[i]


_BY_NAME: dict = {}
_BY_OP: dict = {}  # id(MPI.SUM) -> its Reduction, for the predefined ops


def reduction(op: Any) -> Reduction:
    """The Reduction of MPI.SUM/MAX/..., a user MPI.Op, or the names "sum", "max", "min", "prod"."""
    if isinstance(op, str):
        found = _BY_NAME.get(op.lower())
        if found is None and op.lower() in _REDUCTIONS:
            ufunc, fn = _REDUCTIONS[op.lower()]
            found = _BY_NAME[op.lower()] = Reduction(op.lower(), ufunc, fn, None)
        if found is not None:
            return found
    found = _BY_OP.get(id(op))
    if found is not None and found.op is op:  # MPI.SUM, ...: the object itself, kept by the cache
        return found
    mpi = mpi_module()
    if mpi is not None and isinstance(op, mpi.Op):
        for name in (*_REDUCTIONS, *_OTHER_OPS):
            if op == getattr(mpi, name.upper()):
                ufunc, fn = _REDUCTIONS.get(name, (None, op))
                found = Reduction(name, ufunc, fn, op)
                if op is getattr(mpi, name.upper()):
                    _BY_OP[id(op)] = found
                return found
        if op != mpi.OP_NULL:
            # Not named by its handle: each simulated rank runs the script's MPI.Op.Create itself,
            # so one op has a handle per rank, where MPI's processes agree.
            return Reduction("user op", None, op, op)
    raise ShapeError(f"reduction {op!r} is not simulated; expected an MPI.Op (MPI.SUM, MPI.MAX, ...) "
                     f"or one of 'sum', 'max', 'min', 'prod'")


def fold(red: Reduction, parts: list, out: np.ndarray, datatype: Any = None, tree: Any = None) -> None:
    """out = parts[0] op parts[1] op ... in that order (the fixed order every run repeats); with `tree` (nested
    pairs of indices of `parts`, or a function of their count giving them: spmdsim.runtime.sim.orders) a floating-point
    sum, product, max or min in that association instead."""
    if tree is not None and len(parts) > 2 and red.ufunc is not None and out.dtype.kind in "fc":
        if callable(tree):
            tree = tree(len(parts))
        red.ufunc(_evaluate(red.ufunc, parts, tree[0]), _evaluate(red.ufunc, parts, tree[1]), out=out)
        return
    if len(parts) == 1:
        np.copyto(out, parts[0])
        return
    if red.ufunc is not None and out.dtype.fields is None:
        red.ufunc(parts[0], parts[1], out=out)
        for part in parts[2:]:
            red.ufunc(out, part, out=out)
        return
    mpitype = datatype if datatype is not None else mpi_datatype(out.dtype)
    acc = np.array(parts[0])
    for part in parts[1:]:
        nxt = np.array(part)
        red.op.Reduce_local([acc, mpitype], [nxt, mpitype])  # nxt = acc op nxt
        acc = nxt
    np.copyto(out, acc)


def _evaluate(ufunc: Any, parts: list, tree: Any) -> np.ndarray:
    if type(tree) is int:
        return parts[tree]
    return ufunc(_evaluate(ufunc, parts, tree[0]), _evaluate(ufunc, parts, tree[1]))


# -- datatypes -------------------------------------------------------------------------------

_DTYPES: dict = {}
_BY_OBJECT: dict = {}  # id(a predefined MPI datatype object) -> (the object, its numpy dtype)
_FLAT = (bytearray, bytes, mmap.mmap, array.array)  # buffers that are always one contiguous block


def typecode_datatype(mpi: Any, code: str) -> Any:
    """The MPI datatype of an mpi4py typecode ('d', 'i', ...): DatatypeMapError (a KeyError) for an unknown one,
    as mpi4py's lookup refuses it."""
    found = mpi._typedict.get(code)
    if found is None:
        raise DatatypeMapError(f"cannot map typecode {code!r} to an MPI datatype")
    return found


def numpy_dtype(datatype: Any) -> np.dtype:
    """The numpy dtype of an MPI datatype (predefined ones) or of a typecode string like 'd'."""
    found = _BY_OBJECT.get(id(datatype))
    if found is not None and found[0] is datatype:  # a predefined one seen before (kept: its id stays its own)
        return found[1]
    mpi = mpi_module()
    if isinstance(datatype, str):
        if mpi is None:
            return np.dtype(datatype)
        datatype = typecode_datatype(mpi, datatype)
    key = datatype.py2f() if mpi is not None and isinstance(datatype, mpi.Datatype) else id(datatype)
    found = _DTYPES.get(key)
    if found is not None:
        return found
    if mpi is None or not isinstance(datatype, mpi.Datatype):
        raise ShapeError(f"datatype {datatype!r} is not an MPI datatype or a typecode")
    if datatype == mpi.DATATYPE_NULL:
        raise ShapeError("datatype MPI.DATATYPE_NULL cannot carry a message")
    if not datatype.is_predefined:
        base, combiner, params = datatype.decode()
        if combiner != "CONTIGUOUS":  # not cached: a freed type's handle is given to the next one
            raise NotImplementedError("derived datatypes other than contiguous ones are not simulated "
                                      "(docs/howto/simulate.md)")
        return np.dtype((np.void, params["count"] * numpy_dtype(base).itemsize))  # its bytes, moved as one
    from mpi4py.util.dtlib import to_numpy_dtype

    if datatype in (mpi.BYTE, mpi.PACKED):
        found = np.dtype(np.uint8)
    else:
        found = to_numpy_dtype(datatype)
    _DTYPES[key] = found
    _BY_OBJECT[id(datatype)] = (datatype, found)
    return found


def mpi_datatype(dtype: np.dtype) -> Any:
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(dtype)


# -- buffers ---------------------------------------------------------------------------------

class _Interface:
    """A __cuda_array_interface__ on host memory, offered to numpy as an __array_interface__."""

    def __init__(self, cai: dict) -> None:
        self.__array_interface__ = {"shape": tuple(cai["shape"]), "typestr": cai["typestr"],
                                    "data": tuple(cai["data"]), "strides": cai.get("strides"),
                                    "version": 3}


def _from_interface(cai: dict, what: str) -> np.ndarray:
    """The host memory a __cuda_array_interface__ names, as a numpy array over it. An empty buffer's address
    may be 0 (an empty array.array's is): numpy before 2.3 takes no interface without memory, so such a
    buffer is an empty array of its type (nothing to read or write); 0 with entries is refused."""
    shape = tuple(cai["shape"])
    address, readonly = cai["data"]
    if not address:
        if math.prod(shape):
            raise BufferSpecError(f"{what}: __cuda_array_interface__ of shape {shape!r} at address 0; "
                                  "expected the address of its memory")
        a = np.empty(shape, np.dtype(cai["typestr"]))
        a.flags.writeable = not readonly
        return a
    return np.asarray(_Interface(cai))


def array_of(buf: Any, what: str, readonly: bool = True, typed: bool = False) -> np.ndarray:
    """`buf` as a flat numpy array over the same memory (never a copy); `typed`: a datatype comes with it,
    so its own dtype is not read (mpi4py moves the bytes of [big_endian_array, MPI.INT])."""
    if type(buf) is np.ndarray:
        a = buf
    elif isinstance(buf, np.ndarray):
        a = buf
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            view = None
        if view is not None:
            a = np.asarray(view)
        elif hasattr(buf, "__dlpack__"):
            from ._dlpack import from_dlpack

            a = from_dlpack(buf)
        elif hasattr(buf, "__cuda_array_interface__"):
            a = _from_interface(buf.__cuda_array_interface__, what)
        else:
            raise TypeError(f"{what}: {type(buf).__name__!r} is not a buffer (expected an array, "
                            f"or [buffer, count, datatype]; Python objects go with the lowercase methods: "
                            f"send, recv, bcast, ...)")
    if not a.flags.c_contiguous:
        if not a.flags.f_contiguous:
            raise BufferSpecError(f"{what}: buffer of shape {a.shape!r} and strides {a.strides!r} is not "
                                  f"contiguous; MPI moves one block (np.ascontiguousarray makes one)")
        a = a.T  # Fortran order: one block too, sent in memory order as mpi4py sends it
    if not readonly and not a.flags.writeable:
        raise BufferSpecError(f"{what}: buffer is read-only")
    if not typed:
        check_dtype(a.dtype, what)
    return a if a.ndim == 1 else a.reshape(-1)


def check_dtype(dtype: np.dtype, what: str) -> None:
    """Refuse what mpi4py refuses: a dtype in the other byte order (BufferError), or of Python objects
    (KeyError: no MPI datatype; their bytes are pointers)."""
    if not dtype.isnative:
        raise BufferSpecError(f"{what}: dtype {dtype.str!r} is not in this machine's byte order; MPI moves "
                              f"native values (array.astype({dtype.newbyteorder('=').str!r}) converts)")
    if dtype.hasobject:
        raise DatatypeMapError(f"{what}: cannot map dtype {dtype.str!r} (Python objects) to an MPI datatype; "
                               f"send objects with the lowercase methods (send, bcast, ...)")


def _typed(a: np.ndarray, dtype: Optional[np.dtype], what: str) -> np.ndarray:
    if dtype is None or dtype == a.dtype:
        return a
    raw = a.view(np.uint8)
    usable = raw.size - raw.size % dtype.itemsize
    return raw[:usable].view(dtype)


def _unpack(spec: Any, pair: Any = (list, tuple)) -> tuple:
    """(buffer, count, displ, datatype) of a message spec, as mpi4py's message_simple reads it.

    A count of a type in `pair` is (count, displ); message_vector passes ``tuple`` (its list is counts).
    """
    count = displ = dtype = None
    if isinstance(spec, (list, tuple)):
        n = len(spec)
        if n == 2:
            buf, count = spec
            if _is_datatype(count):
                count, dtype = None, count
            elif isinstance(count, pair):
                count, displ = count
        elif n == 3:
            buf, count, dtype = spec
            if isinstance(count, pair):
                count, displ = count
        elif n == 4:
            buf, count, displ, dtype = spec
        else:
            raise ValueError("message: expecting 2 to 4 items")
    else:
        buf = spec
    return buf, count, displ, dtype


def no_buffer(what: str, methods: str = "send, bcast, allreduce") -> TypeError:
    """mpi4py's TypeError for None where a message goes ("message: expecting buffer or list/tuple"): its readers
    take None only for a message MPI does not read (to or from MPI.PROC_NULL, a non-root's receive buffer of a
    gather or reduce, a non-root's send buffer of a scatter) and, where MPI allows it, as MPI.IN_PLACE; the callers
    pass neither here. Read as an empty buffer, it was a receive of 0 x uint8 ("send dtype 'float64' and receive
    dtype 'uint8' differ"), a Bcast that ran or whose ranks diverged."""
    return TypeError(f"{what}: message: expecting buffer or list/tuple, got None (Python objects go with the "
                     f"lowercase methods: {methods}, ...)")


def message(spec: Any, what: str, blocks: int = 1, readonly: bool = True) -> tuple[np.ndarray, int, Any]:
    """(typed flat view from the displacement on, count per block, MPI datatype or None) of `spec`.

    Without a count, the buffer's entries split into `blocks` equal blocks (mpi4py's rule). `spec` None is
    mpi4py's TypeError (`no_buffer`); a None buffer in a list (``[None, 0, MPI.DOUBLE]``) is empty, as mpi4py's.
    """
    if (type(spec) is np.ndarray and spec.flags.c_contiguous and spec.dtype.byteorder != _FOREIGN
            and spec.dtype.char != "O"):  # the hot path: a plain array (array_of says what the others lack)
        a = spec.reshape(-1)
        if not readonly and not a.flags.writeable:
            raise BufferSpecError(f"{what}: buffer is read-only")
        n = a.size
        if blocks > 1 and n % blocks:
            raise ValueError(f"{what}: {n} entries do not split into {blocks} equal blocks")
        return a, n // blocks if blocks > 1 else n, None
    if type(spec) in (list, tuple) and len(spec) == 3 and type(spec[1]) is int and spec[1] >= 0 and blocks == 1:
        buf, count, datatype = spec  # [buffer, count, predefined datatype]: each of osu_bw's messages
        known = _BY_OBJECT.get(id(datatype))
        if known is not None and known[0] is datatype and (type(buf) in _FLAT or type(buf) is _numpy_type("ndarray")):
            if type(buf) in _FLAT:  # one block of bytes: numpy's view of it directly, not through memoryview
                a = np.frombuffer(buf, np.uint8)
                if not readonly and not a.flags.writeable:
                    raise BufferSpecError(f"{what}: buffer is read-only")
            else:
                a = array_of(buf, what, readonly, True)
            a = _typed(a, known[1], what)  # as below, without the general cases
            if count > a.size:
                raise ShapeError(f"{what}: 1 x {count} entries do not fit a buffer of {a.size}")
            return a, count, datatype
    if spec is None:
        raise no_buffer(what)
    buf, count, displ, datatype = _unpack(spec)
    try:  # the buffer first, as mpi4py reads it: [1, 2, 3] is a list of numbers, not [buf, count, type]
        a = None if buf is None else array_of(buf, what, readonly, datatype is not None)
    except TypeError:
        if isinstance(spec, (list, tuple)):
            raise TypeError(f"{what}: {spec!r} is read as [buffer, count, datatype] and {buf!r} is not a "
                            f"buffer; pass a numpy array (np.array({spec!r})), or send Python objects with "
                            f"the lowercase methods (send, recv, bcast, ...)") from None
        raise
    dtype = None if datatype is None else numpy_dtype(datatype)
    if a is None:
        a = np.empty(0, dtype or np.uint8)
    else:
        if count is None and dtype is not None and a.nbytes % dtype.itemsize:
            raise ValueError(f"{what}: buffer length {a.nbytes} is not a multiple of datatype extent "
                             f"{dtype.itemsize}")
        a = _typed(a, dtype, what)
    if displ is not None:
        displ = operator.index(displ)
        if displ < 0 or displ > a.size:
            raise ValueError(f"{what}: displacement {displ} out of bounds of {a.size} entries")
        a = a[displ:]
    if count is None:
        if blocks > 1 and a.size % blocks:
            raise ValueError(f"{what}: {a.size} entries do not split into {blocks} equal blocks")
        count = a.size // blocks if blocks > 1 else a.size
    else:
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"{what}: negative count {count}")
    if count * max(blocks, 1) > a.size:
        raise ShapeError(f"{what}: {blocks} x {count} entries do not fit a buffer of {a.size}")
    return a, count, datatype


def wparts(spec: Any) -> tuple:
    """(buffer, counts or None, displacements or None, datatypes) of an Alltoallw message as mpi4py's
    message_vector_w reads it: ``[buf, types]``, ``[buf, (counts, displs), types]``, ``[buf, counts, displs,
    types]``; mpi4py's ValueError for another number of items."""
    if len(spec) == 2:
        buf, types = spec
        return buf, None, None, types
    if len(spec) == 3:
        buf, (counts, displs), types = spec
        return buf, counts, displs, types
    if len(spec) == 4:
        return tuple(spec)
    raise ValueError("message: expecting 2 to 4 items")


def wvector(spec: Any, what: str, blocks: int, readonly: bool = True) -> tuple[np.ndarray, list, list]:
    """(the buffer's bytes, each block's bytes, each block's byte displacement) of an Alltoallw message,
    as mpi4py's message_vector_w reads it: ``[buf, types]`` (each block one item at displacement 0),
    ``[buf, (counts, displs), types]`` or ``[buf, counts, displs, types]``, a block `counts[i]` items of
    `types[i]` (predefined, or contiguous: its bytes) at `displs[i]` bytes. A message from MPI.BOTTOM or of
    other derived datatypes is spmdsim.emulator.derived.wblocks'."""
    buf, counts, displs, types = wparts(spec)
    raw = as_bytes(array_of(buf, what, readonly, True))  # flat, one block of memory
    if counts is None and displs is None:
        counts, displs = [1] * blocks, [0] * blocks
    else:
        counts, displs = int_array(counts, blocks), int_array(displs, blocks)
    if len(types) != blocks:
        raise ValueError(f"expecting {blocks} items, got {len(types)}")
    sizes = [c * numpy_dtype(t).itemsize for c, t in zip(counts, types)]
    for i, (at, n) in enumerate(zip(displs, sizes)):
        if at < 0 or n < 0 or at + n > raw.size:
            raise ShapeError(f"{what}: block {i} ({counts[i]} items, {n} bytes at byte {at}) does not fit a "
                             f"buffer of {raw.size} bytes")
    return raw, sizes, list(displs)


def int_array(values: Any, count: Optional[int] = None) -> list:
    """`values` as a list of ints, as mpi4py reads an array argument (getarray: each through
    operator.index); with `count`, that many (chkarray: its ValueError for another length)."""
    out = [operator.index(v) for v in values]
    if count is not None and len(out) != count:
        raise ValueError(f"expecting {count} items, got {len(out)}")
    return out


def vector(spec: Any, what: str, blocks: int, readonly: bool = True) -> tuple[np.ndarray, list, list, Any]:
    """(typed flat buffer, counts, displacements, MPI datatype or None) of a v-collective message.

    As mpi4py's message_vector: ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf, counts,
    datatype]``, ``[buf, counts, displs, datatype]``; a count or a displacement may be one integer
    (every block that count; displacements i * that stride); no counts split the buffer evenly.
    """
    if (type(spec) is list and len(spec) == 2 and type(spec[0]) is np.ndarray and type(spec[1]) is tuple
            and len(spec[1]) == 2 and type(spec[1][0]) is list and spec[0].flags.c_contiguous
            and spec[0].dtype.byteorder != _FOREIGN and spec[0].dtype.char != "O"):
        # The hot path (runtime.executor's moves): [array, (counts, displs or None)], no datatype.
        a = spec[0].reshape(-1)
        if not readonly and not a.flags.writeable:
            raise BufferSpecError(f"{what}: buffer is read-only")
        counts, displs = spec[1]
        return (a, *_layout(counts, displs, blocks, a.size, what), None)
    if spec is None:
        raise no_buffer(what)
    buf, counts, displs, datatype = _unpack(spec, pair=tuple)
    dtype = None if datatype is None else numpy_dtype(datatype)
    a = (np.empty(0, dtype or np.uint8) if buf is None
         else _typed(array_of(buf, what, readonly, datatype is not None), dtype, what))
    if counts is None:
        size = a.size
        counts = [size // blocks + (size % blocks > i) for i in range(blocks)]
    elif _scalar(counts):  # one count for every block (a 0-d array too, as mpi4py reads it)
        counts = [operator.index(counts)] * blocks
    return (a, *_layout(counts, displs, blocks, a.size, what), datatype)


def _scalar(value: Any) -> bool:
    found = _numpy_type("ndarray")
    return integer(value) or (found is not None and isinstance(value, found) and value.ndim == 0)


def _layout(counts: Any, displs: Any, blocks: int, size: int, what: str) -> tuple[list, list]:
    """(counts, displacements) of `blocks` blocks, checked to lie inside a buffer of `size` entries."""
    counts = list(map(operator.index, counts))
    if len(counts) < blocks:
        raise ValueError(f"{what}: {len(counts)} counts for {blocks} ranks")
    del counts[blocks:]
    if displs is None:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    elif _scalar(displs):
        displs = [operator.index(displs) * i for i in range(blocks)]
    else:
        displs = list(map(operator.index, displs))
        del displs[blocks:]
    if blocks and (min(counts) < 0 or min(displs) < 0 or max(map(operator.add, counts, displs)) > size):
        bad = next((c, d) for c, d in zip(counts, displs) if c < 0 or d < 0 or c + d > size)
        raise ShapeError(f"{what}: block of {bad[0]} entries at {bad[1]} is outside a buffer of {size}")
    return counts, displs


def _is_datatype(value: Any) -> bool:
    if isinstance(value, str):
        return True
    mpi = mpi_module()
    return mpi is not None and isinstance(value, mpi.Datatype)


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a contiguous array (a view)."""
    return a.view(np.uint8) if a.dtype.itemsize != 1 or a.dtype != np.uint8 else a


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src, as bytes when the two dtypes differ (MPI moves a type signature's bytes)."""
    if dst.dtype == src.dtype:
        dst[...] = src
    else:
        as_bytes(dst)[...] = as_bytes(src)
