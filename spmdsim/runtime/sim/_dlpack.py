"""A DLPack buffer (host memory) as a numpy array over the same memory, consumed as mpi4py consumes it.

numpy.from_dlpack renames the capsule "used" and calls the producer's deleter
when the array dies; mpi4py instead reads the tensor while it holds the
capsule and leaves the capsule to free it, and some producers (mpi4py's own
tests') free the tensor with the capsule. Reading it like mpi4py works with both.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_GET = ctypes.pythonapi.PyCapsule_GetPointer
_GET.restype, _GET.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_IS = ctypes.pythonapi.PyCapsule_IsValid
_IS.restype, _IS.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


class _Holder:
    """Keeps the capsule (and so the tensor) alive as long as the array that views it."""

    def __init__(self, capsule: Any, interface: dict) -> None:
        self.capsule = capsule
        self.__array_interface__ = interface


def from_dlpack(obj: Any) -> np.ndarray:
    """The host memory of a DLPack producer as a numpy array (no copy)."""
    if hasattr(obj, "__dlpack_device__") and int(obj.__dlpack_device__()[0]) not in (1, 3):
        raise TypeError(f"DLPack buffer on device {obj.__dlpack_device__()!r}: only host memory is simulated")
    try:  # DLPack 1.0, then the unversioned protocol (mpi4py's order)
        capsule = obj.__dlpack__(max_version=(1, 0), copy=False)
    except TypeError:
        capsule = obj.__dlpack__()
    readonly = False
    if _IS(capsule, b"dltensor_versioned"):
        managed = _Versioned.from_address(_GET(capsule, b"dltensor_versioned"))
        readonly = bool(managed.flags & 1)
    else:
        managed = _Managed.from_address(_GET(capsule, b"dltensor"))
    t = managed.dl_tensor
    kind, lanes = _KINDS.get(t.dtype.code), t.dtype.lanes
    if kind == "f" and lanes == 2:  # a complex number as two float lanes
        kind, lanes = "c", 1
    if lanes != 1 or kind is None:
        raise TypeError(f"DLPack dtype code {t.dtype.code} with {t.dtype.lanes} lanes is not simulated")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    strides = None
    if t.strides and t.ndim:
        strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
    typestr = ("|" if itemsize == 1 else "<") + kind + str(itemsize)
    address = (t.data or 0) + t.byte_offset
    interface = {"shape": shape, "typestr": typestr, "data": (address, readonly), "strides": strides,
                 "version": 3}
    if not address:  # an empty tensor may have no address; numpy wants one
        return np.empty(shape, np.dtype(typestr))
    return np.asarray(_Holder(capsule, interface))
