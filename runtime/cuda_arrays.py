"""Arrays handed to the CUDA executor: numpy on the host, or device arrays used in place.

What it is: reading a caller's array into (device address | host ndarray) after checking dtype, shape and
layout: ``__cuda_array_interface__`` (v3: CuPy, Numba, torch) first, then DLPack (``__dlpack__`` on a
CUDA device), else numpy. What it is not: the executor (``cuda.py``), which decides what to stage.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any

import numpy as np

from .cuda_driver import (
    MEMORYTYPE_DEVICE,
    MEMORYTYPE_UNIFIED,
    PTR_ATTR_DEVICE_ORDINAL,
    PTR_ATTR_MEMORY_TYPE,
    Driver,
)
from .errors import InputMismatch, PackageCorrupt
from .schema import Kernel, TensorSpec
from .schema import numpy_dtype as np_dtype

_DL_DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool",
    (1, 1): "bool",
}  # fmt: skip
KDL_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * np_dtype(dtype).itemsize


class Checked:
    """What earlier calls proved about caller arrays, so a steady stream of calls re-checks nothing: array
    descriptions (dtype, shape, strides) that matched a buffer, and addresses that are device memory of
    this GPU. Bounded; a miss only means the check runs again."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.layouts: dict[tuple[Any, ...], None] = {}
        self.device: dict[int, None] = {}

    def remember(self, table: dict[Any, None], key: Any) -> None:
        if len(table) >= self.limit:
            table.clear()
        table[key] = None


def device_ptr(
    drv: Driver, ordinal: int, stream: Any, x: Any, *, t: TensorSpec, shape: tuple[int, ...],
    keep: list[Any], writable: bool, checked: Checked | None = None,
) -> int | None:  # fmt: skip
    """The device address of ``x`` when it is a CUDA array of ``t``'s dtype and ``shape``, else None (host
    data). ``keep`` receives what must stay alive until the work that reads it has finished."""
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        strides, s = cai.get("strides"), cai.get("stream")
        key = (t.name, cai["typestr"], cai["shape"], strides, shape, readonly and writable, cai.get("mask") is None)
        if checked is None or key not in checked.layouts:
            want = np_dtype(t.dtype)
            got = np.dtype(cai["typestr"])
            if got != want and not (t.dtype == "bfloat16" and got.kind == "V" and got.itemsize == 2):
                raise InputMismatch(f"{t.name}: expected dtype {t.dtype}, got a device array of {got}")
            check_dense(t.name, tuple(cai["shape"]), shape, strides, want.itemsize)
            if cai.get("mask") is not None:
                raise InputMismatch(f"{t.name}: masked device arrays are not supported")
            if writable and readonly:
                raise InputMismatch(f"{t.name}: the output device array is read-only")
            if checked is not None:
                checked.remember(checked.layouts, key)
        if s not in (None, 0):  # v3: work on that stream must finish before we read
            r = drv.lib.cuStreamSynchronize(drv.ffi.cast("CUstream", s))
            drv.check(r, "cuStreamSynchronize", hint=f"the stream of {t.name}")
        if ptr and (checked is None or ptr not in checked.device):
            check_device_memory(drv, ordinal, int(ptr), t.name)
            if checked is not None:
                checked.remember(checked.device, ptr)
        return int(ptr)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = x.__dlpack_device__()
        if int(dev_type) not in KDL_CUDA:
            return None
        if int(dev_id) != ordinal:
            raise InputMismatch(f"{t.name} is on cuda:{dev_id}; this executor runs on cuda:{ordinal}")
        try:  # the producer makes the data ready on our stream
            cap = x.__dlpack__(stream=int(drv.ffi.cast("uintptr_t", stream)))
        except TypeError:
            cap = x.__dlpack__()
        keep.append(cap)  # its destructor calls the tensor's deleter: we never consume it
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        dl = drv.ffi.cast("DLManagedTensor *", get(cap, b"dltensor")).dl_tensor
        want = np_dtype(t.dtype)
        name = _DL_DTYPES.get((int(dl.dtype.code), int(dl.dtype.bits)))
        if name != t.dtype or int(dl.dtype.lanes) != 1:
            got_dt = name or (int(dl.dtype.code), int(dl.dtype.bits))
            raise InputMismatch(f"{t.name}: expected dtype {t.dtype}, got a DLPack tensor of {got_dt}")
        got_shape = tuple(int(dl.shape[k]) for k in range(dl.ndim))
        strides = None
        if dl.strides != drv.ffi.NULL:
            strides = tuple(int(dl.strides[k]) * want.itemsize for k in range(dl.ndim))
        check_dense(t.name, got_shape, shape, strides, want.itemsize)
        return int(drv.ffi.cast("uintptr_t", dl.data)) + int(dl.byte_offset)
    return None


def check_device_memory(drv: Driver, ordinal: int, ptr: int, name: str) -> None:
    """``ptr`` is device memory of GPU ``ordinal`` (not a host pointer in disguise)."""
    v = drv.ffi.new("unsigned int *")
    r = drv.lib.cuPointerGetAttribute(v, PTR_ATTR_MEMORY_TYPE, ptr)
    if r or int(v[0]) not in (MEMORYTYPE_DEVICE, MEMORYTYPE_UNIFIED):
        raise InputMismatch(f"{name}: address {ptr:#x} is not CUDA device memory")
    d = drv.ffi.new("int *")
    if not drv.lib.cuPointerGetAttribute(d, PTR_ATTR_DEVICE_ORDINAL, ptr) and int(d[0]) != ordinal:
        raise InputMismatch(f"{name} is on cuda:{d[0]}; this executor runs on cuda:{ordinal}")


def host_array(x: Any, t: TensorSpec, shape: tuple[int, ...]) -> np.ndarray:
    want = np_dtype(t.dtype)
    a = np.from_dlpack(x) if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__") else np.asarray(x)
    if a.dtype != want:
        raise InputMismatch(f"input {t.name}: expected dtype {t.dtype}, got {a.dtype}")
    if tuple(a.shape) != shape:
        raise InputMismatch(f"input {t.name}: expected shape {list(shape)}, got {list(a.shape)}")
    return np.ascontiguousarray(a)


def check_dense(name: str, got: tuple[int, ...], want: tuple[int, ...], strides: Any, itemsize: int) -> None:
    if tuple(got) != tuple(want):
        raise InputMismatch(f"{name}: expected shape {list(want)}, got {list(got)}")
    if strides is None:
        return
    expect, acc = [], itemsize
    for d in reversed(want):
        expect.append(acc)
        acc *= d
    if any(d > 1 and s != e for d, s, e in zip(want, tuple(strides), reversed(expect), strict=True)):
        raise InputMismatch(f"{name}: device arrays must be C-contiguous (strides {list(strides)})")


def check_elf(image: bytes, sm: int, k: Kernel) -> None:
    """The member is a CUDA ELF for this target's SM, before it goes anywhere near the driver."""
    head_ok = len(image) >= 64 and image[:4] == b"\x7fELF" and image[4] == 2
    if not head_ok or struct.unpack_from("<H", image, 0x12)[0] != 190:
        raise PackageCorrupt(f"member {k.member} (kernel {k.name}) is not a CUDA ELF cubin")
    flags = struct.unpack_from("<I", image, 0x30)[0]
    major = int(k.ptxas_version.split(".")[0]) if k.ptxas_version[:2].isdigit() else 0
    got = (flags >> 8) & 0xFF if major >= 13 else flags & 0xFF
    if k.ptxas_version and got != sm:
        raise PackageCorrupt(f"member {k.member} is a cubin for sm_{got}, but the target says sm_{sm}")
