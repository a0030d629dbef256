"""libcuda through cffi in ABI mode: the driver calls aotc needs, each checked, and device buffers.

What it is: a thin, typed layer over ``libcuda.so.1`` (no CUDA toolkit, no compiler, no torch). Every
CUresult is checked; a failure becomes ``DeviceError`` naming the call, the error name and string, and the
kernel when there is one. After a fault that leaves the context unusable (illegal address, illegal
instruction, launch failure, ...) the binding refuses every later call with one clear message instead of
returning garbage. What it is not: the executor (``cuda.py``) or the manifest format (``schema.py``).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DeviceError, IncompatiblePackage

CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

typedef union {
    char pad[64];
    struct { unsigned int x; unsigned int y; unsigned int z; } clusterDim;
    int cooperative;
    int clusterSchedulingPolicyPreference;
    int programmaticStreamSerializationAllowed;
} CUlaunchAttributeValue;
typedef struct {
    int id;
    char pad[4];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value);
CUresult cuFuncGetAttribute(int *pi, int attrib, CUfunction hfunc);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s);
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);

typedef struct { int device_type; int device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;
"""

# enum values from cuda.h
DEV_ATTR_SM_COUNT = 16
DEV_ATTR_CC_MAJOR = 75
DEV_ATTR_CC_MINOR = 76
DEV_ATTR_SMEM_OPTIN = 97
FUNC_ATTR_MAX_DYNAMIC_SMEM = 8
FUNC_ATTR_NON_PORTABLE_CLUSTER = 9
LAUNCH_ATTR_COOPERATIVE = 2
LAUNCH_ATTR_CLUSTER_DIM = 4
LAUNCH_ATTR_CLUSTER_POLICY = 5
LAUNCH_ATTR_PDL = 6
CLUSTER_POLICY_SPREAD = 1
STREAM_NON_BLOCKING = 1
CAPTURE_THREAD_LOCAL = 1
PTR_ATTR_MEMORY_TYPE = 2
PTR_ATTR_DEVICE_ORDINAL = 9
MEMORYTYPE_DEVICE = 2
MEMORYTYPE_UNIFIED = 4
# Faults after which the context cannot be used again (the CUDA docs: "the process must be terminated").
STICKY = {700, 702, 710, 714, 715, 716, 717, 718, 719}
OUT_OF_MEMORY = 2
NO_BINARY = {209, 218, 222}  # NO_BINARY_FOR_GPU, INVALID_PTX, UNSUPPORTED_PTX_VERSION


def new_ffi() -> Any:
    """The cffi FFI of CDEF, parsed ahead of time (out-of-line ABI mode: no pycparser at run time); see
    tests/test_ffi_modules.py, which regenerates it and checks it matches CDEF."""
    from ._cffi_cuda import ffi

    return ffi


@dataclass(frozen=True)
class Device:
    ordinal: int
    handle: int
    name: str
    cc: tuple[int, int]
    sm_count: int
    smem_optin: int
    total_mem: int

    @property
    def sm(self) -> int:
        return self.cc[0] * 10 + self.cc[1]

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"


class Driver:
    """The process's libcuda: loaded once; holds the sticky-fault state shared by every executor."""

    def __init__(self, lib: Any = None, ffi: Any = None) -> None:
        """``lib``/``ffi``: a stand-in for libcuda built on ``new_ffi()`` (tests); default: dlopen it."""
        self.ffi = ffi or new_ffi()
        try:
            self.lib: Any = lib if lib is not None else self.ffi.dlopen("libcuda.so.1")
        except OSError as e:
            raise IncompatiblePackage(
                f"cannot load libcuda.so.1 ({e}): this machine has no NVIDIA driver; install one, "
                "or run the package's CPU target (device='cpu')"
            ) from None
        self.broken: str | None = None
        self.lock = threading.Lock()
        r = self.lib.cuInit(0)
        if r:
            raise IncompatiblePackage(
                f"cuInit failed with {self.error_name(r)} ({self.error_string(r)}): no usable NVIDIA "
                f"GPU here; "
                "check nvidia-smi, or run the package's CPU target"
            )
        v = self.ffi.new("int *")
        self.check(self.lib.cuDriverGetVersion(v), "cuDriverGetVersion")
        self.version = int(v[0])  # e.g. 13000 for CUDA 13.0
        self._devices: dict[int, Device] = {}
        self._contexts: dict[int, Any] = {}

    # -- errors

    def error_name(self, r: int) -> str:
        p = self.ffi.new("const char **")
        if self.lib.cuGetErrorName(r, p) or p[0] == self.ffi.NULL:
            return f"CUresult {r}"
        return str(self.ffi.string(p[0]).decode())

    def error_string(self, r: int) -> str:
        p = self.ffi.new("const char **")
        if self.lib.cuGetErrorString(r, p) or p[0] == self.ffi.NULL:
            return "no description"
        return str(self.ffi.string(p[0]).decode())

    def check(self, r: int, call: str, kernel: str | None = None, hint: str = "") -> None:
        if r:
            raise self.error(r, call, kernel, hint)

    def error(self, r: int, call: str, kernel: str | None = None, hint: str = "") -> DeviceError:
        what = f"{call} failed with {self.error_name(r)} ({self.error_string(r)})"
        if kernel:
            what += f" in kernel {kernel}"
        if r in STICKY:
            self.broken = what
            what += "; the CUDA context is now unusable: restart the process"
        if hint:
            what += f"; {hint}"
        return DeviceError(what)

    def upload(self, dst: int, a: np.ndarray, what: str, wait: bool = True) -> None:
        """Copy a host array to the device and wait until it is there. A synchronous copy from pageable memory
        returns once the data is staged, with the DMA still queued on the legacy stream, which our
        non-blocking streams do not wait for: without the sync a kernel could read (or a later write race)
        the old bytes. Seen on an H200: a zero-copy run's output overwritten by its poisoned upload.
        ``wait=False`` leaves the wait to a later ``upload`` or ``wait_uploads`` (many weights, one wait)."""
        self.check(self.lib.cuMemcpyHtoD_v2(dst, host_ptr(self.ffi, a), a.nbytes), "cuMemcpyHtoD", hint=what)
        if wait:
            self.wait_uploads(what)

    def wait_uploads(self, what: str) -> None:
        self.check(self.lib.cuStreamSynchronize(self.ffi.NULL), "cuStreamSynchronize (legacy stream)", hint=what)

    def guard(self) -> None:
        if self.broken is not None:
            raise DeviceError(f"CUDA is unusable in this process after an earlier fault ({self.broken}); restart the process")

    # -- devices and contexts

    def device_count(self) -> int:
        n = self.ffi.new("int *")
        self.check(self.lib.cuDeviceGetCount(n), "cuDeviceGetCount")
        return int(n[0])

    def device(self, ordinal: int = 0) -> Device:
        if ordinal in self._devices:
            return self._devices[ordinal]
        count = self.device_count()
        if not 0 <= ordinal < count:
            raise IncompatiblePackage(f"CUDA device {ordinal} does not exist: this machine has {count} GPU(s)")
        d = self.ffi.new("CUdevice *")
        self.check(self.lib.cuDeviceGet(d, ordinal), "cuDeviceGet")
        name = self.ffi.new("char[256]")
        self.check(self.lib.cuDeviceGetName(name, 256, d[0]), "cuDeviceGetName")
        mem = self.ffi.new("size_t *")
        self.check(self.lib.cuDeviceTotalMem_v2(mem, d[0]), "cuDeviceTotalMem")

        def attr(a: int) -> int:
            v = self.ffi.new("int *")
            self.check(self.lib.cuDeviceGetAttribute(v, a, d[0]), "cuDeviceGetAttribute")
            return int(v[0])

        dev = Device(
            ordinal,
            int(d[0]),
            self.ffi.string(name).decode(errors="replace"),
            (attr(DEV_ATTR_CC_MAJOR), attr(DEV_ATTR_CC_MINOR)),
            attr(DEV_ATTR_SM_COUNT),
            attr(DEV_ATTR_SMEM_OPTIN),
            int(mem[0]),
        )
        self._devices[ordinal] = dev
        return dev

    def context(self, dev: Device) -> Any:
        """The device's primary context (the one torch and CuPy use too), made current on this thread."""
        self.guard()
        ctx = self._contexts.get(dev.ordinal)
        if ctx is None:
            p = self.ffi.new("CUcontext *")
            self.check(self.lib.cuDevicePrimaryCtxRetain(p, dev.handle), "cuDevicePrimaryCtxRetain")
            ctx = self._contexts[dev.ordinal] = p[0]
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return ctx

    # -- memory

    def alloc(self, nbytes: int, what: str) -> int:
        self.guard()
        p = self.ffi.new("CUdeviceptr *")
        r = self.lib.cuMemAlloc_v2(p, max(1, nbytes))
        if r == OUT_OF_MEMORY:  # not sticky: the model stays usable once memory is free again
            hint = "the GPU is out of memory: free some (other models or processes) or pass smaller inputs, then call again"
            raise self.error(r, f"cuMemAlloc of {nbytes:,} bytes for {what}", hint=hint)
        if r:
            raise self.error(r, f"cuMemAlloc of {nbytes} bytes for {what}")
        return int(p[0])

    def free(self, ptr: int) -> None:
        if ptr and self.broken is None:
            self.lib.cuMemFree_v2(ptr)  # no raise: called from finalizers


def host_ptr(ffi: Any, a: np.ndarray) -> Any:
    return ffi.cast("void *", a.ctypes.data)


_DRIVER: list[Driver] = []  # the one binding of this process, once loaded
_DRIVER_LOCK = threading.Lock()


def driver() -> Driver:
    """The process's driver binding, loaded on first use; ``IncompatiblePackage`` when there is no CUDA."""
    with _DRIVER_LOCK:
        if not _DRIVER:
            _DRIVER.append(Driver())
        return _DRIVER[0]


# ---- device buffers ----------------------------------------------------------------------------------


class Pool:
    """Device buffers of dropped outputs, kept by size for the next call's outputs, so a steady stream of calls
    allocates nothing (and never calls cuMemFree, which waits for the whole device). At most ``limit`` bytes
    are kept. Like CuPy's pool: work the caller queued on its own streams that reads an output must be done
    before the output is dropped, since its memory is then reused."""

    def __init__(self, drv: Driver, limit: int = 1 << 30) -> None:
        self.drv, self.limit = drv, limit
        self._free: dict[int, list[int]] = {}
        self._held = 0
        self._lock = threading.Lock()
        self._closed = False

    def take(self, n: int, what: str) -> int:
        with self._lock:
            ptrs = self._free.get(n)
            if ptrs:
                self._held -= n
                return ptrs.pop()
        return self.drv.alloc(n, what)

    def give(self, ptr: int, n: int) -> None:
        with self._lock:
            if not self._closed and self._held + n <= self.limit:
                self._free.setdefault(n, []).append(ptr)
                self._held += n
                return
        self.drv.free(ptr)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ptrs = [p for ps in self._free.values() for p in ps]
            self._free.clear()
            self._held = 0
        for p in ptrs:
            self.drv.free(p)


class DeviceArray:
    """A contiguous device buffer owned by aotc, freed with the object (or handed back to its ``pool``).
    Exposes ``__cuda_array_interface__`` (v3), so CuPy, Numba or torch can read it without a copy;
    ``numpy()`` copies it to the host."""

    def __init__(
        self, drv: Driver, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owned: bool = True, pool: Pool | None = None
    ) -> None:
        self._drv = drv
        self.ptr = ptr
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._owned = owned
        self._pool = pool

    @classmethod
    def empty(cls, drv: Driver, shape: tuple[int, ...], dtype: np.dtype, pool: Pool | None = None) -> DeviceArray:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        what = f"an output of shape {tuple(shape)}"
        return cls(drv, pool.take(n, what) if pool else drv.alloc(n, what), shape, dtype, pool=pool)

    @classmethod
    def from_numpy(cls, drv: Driver, a: np.ndarray) -> DeviceArray:
        a = np.ascontiguousarray(a)
        out = cls.empty(drv, a.shape, a.dtype)
        if a.nbytes:
            drv.upload(out.ptr, a, "a device array")
        return out

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}  # fmt: skip

    def numpy(self) -> np.ndarray:
        self._drv.guard()
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            self._drv.check(
                self._drv.lib.cuMemcpyDtoH_v2(host_ptr(self._drv.ffi, out), self.ptr, out.nbytes),
                "cuMemcpyDtoH",
            )
        return out

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr={self.ptr:#x})"

    def __del__(self) -> None:
        if getattr(self, "_owned", False):
            self._owned = False
            if self._pool is not None:
                self._pool.give(self.ptr, self.nbytes)
            else:
                self._drv.free(self.ptr)
