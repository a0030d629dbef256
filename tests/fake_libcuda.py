"""A stand-in for libcuda, for testing ``aotc.cuda`` on machines without a GPU.

"Device" memory is host memory (so copies are real and checkable); modules, functions, streams and graphs
are handles; a launch decodes its packed arguments at the widths the test declares and hands them to a
callback that may compute the kernel's effect (with ``aotc_build.kernel_interp``). Graph capture records
launches with their argument bytes copied, as the driver does, and replays them.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_UNPACK = {
    "ptr": "<Q", "global_scratch": "<Q", "profile_scratch": "<Q", "i1": "<B", "i8": "<b", "u8": "<B",
    "i16": "<h", "i32": "<i", "i64": "<q", "f16": "<e", "bf16": "<H", "f32": "<f", "f64": "<d",
}  # fmt: skip
NAMES = {700: "CUDA_ERROR_ILLEGAL_ADDRESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
         900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}  # fmt: skip


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: int
    shared: int
    args: list[Any]
    raw: bytes
    ex: bool = False


@dataclass
class FakeLib:
    ffi: Any
    params: dict[str, list[str]] = field(default_factory=dict)  # kernel → kinds of its PTX params
    on_launch: Callable[[Launch], None] | None = None
    cost_ms: Callable[[Launch], float] = lambda launch: 0.01  # what a launch "takes" between two events
    cc: tuple[int, int] = (9, 0)
    version: int = 13000
    fail: dict[str, int] = field(default_factory=dict)  # call name → CUresult to return
    capture_fails: bool = False

    def __post_init__(self) -> None:
        self.mem: dict[int, np.ndarray] = {}
        self.launches: list[Launch] = []
        self.images: dict[int, bytes] = {}
        self.funcs: dict[int, str] = {}
        self.capturing: list[Launch] | None = None
        self.graphs: dict[int, list[Launch]] = {}
        self.calls: list[str] = []
        self._strings: list[Any] = []
        self._next = 0x1000
        self.events: dict[int, int] = {}  # event -> launches recorded when it was

    def _handle(self, typ: str) -> Any:
        self._next += 16
        return self.ffi.cast(typ, self._next)

    def _f(self, name: str) -> int:
        self.calls.append(name)
        return self.fail.get(name, 0)

    # -- init, errors, devices
    def cuInit(self, flags: int) -> int:
        return self._f("cuInit")

    def cuDriverGetVersion(self, p: Any) -> int:
        p[0] = self.version
        return 0

    def _str(self, p: Any, s: str) -> int:
        c = self.ffi.new("char[]", s.encode())
        self._strings.append(c)
        p[0] = c
        return 0

    def cuGetErrorName(self, r: int, p: Any) -> int:
        return self._str(p, NAMES.get(r, f"CUDA_ERROR_{r}"))

    def cuGetErrorString(self, r: int, p: Any) -> int:
        return self._str(p, "fake error")

    def cuDeviceGetCount(self, p: Any) -> int:
        p[0] = 1
        return 0

    def cuDeviceGet(self, p: Any, ordinal: int) -> int:
        p[0] = ordinal
        return 0

    def cuDeviceGetName(self, buf: Any, n: int, dev: int) -> int:
        self.ffi.memmove(buf, b"Fake GPU\0", 9)
        return 0

    def cuDeviceGetAttribute(self, p: Any, attr: int, dev: int) -> int:
        p[0] = {75: self.cc[0], 76: self.cc[1], 16: 132, 97: 232448}.get(attr, 0)
        return 0

    def cuDeviceTotalMem_v2(self, p: Any, dev: int) -> int:
        p[0] = 80 << 30
        return 0

    def cuDevicePrimaryCtxRetain(self, p: Any, dev: int) -> int:
        p[0] = self._handle("CUcontext")
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        return 0

    # -- modules
    def cuModuleLoadData(self, p: Any, image: Any) -> int:
        r = self._f("cuModuleLoadData")
        if r:
            return r
        h = self._handle("CUmodule")
        self.images[int(self.ffi.cast("uintptr_t", h))] = bytes(self.ffi.buffer(self.ffi.cast("char *", image), 64))
        p[0] = h
        return 0

    def cuModuleUnload(self, m: Any) -> int:
        return 0

    def cuModuleGetFunction(self, p: Any, mod: Any, name: Any) -> int:
        h = self._handle("CUfunction")
        self.funcs[int(self.ffi.cast("uintptr_t", h))] = (name if isinstance(name, bytes) else self.ffi.string(name)).decode()
        p[0] = h
        return 0

    def cuFuncSetAttribute(self, f: Any, attr: int, value: int) -> int:
        self.calls.append(f"cuFuncSetAttribute({attr}, {value})")
        return 0

    # -- memory
    def cuMemAlloc_v2(self, p: Any, n: int) -> int:
        r = self._f("cuMemAlloc")
        if r:
            return r
        buf = np.empty(n + 256, np.uint8)
        addr = -(-buf.ctypes.data // 256) * 256
        self.mem[addr] = buf
        p[0] = addr
        return 0

    def cuMemFree_v2(self, ptr: int) -> int:
        self.mem.pop(int(ptr), None)
        return 0

    def _addr(self, x: Any) -> int:
        return x if isinstance(x, int) else int(self.ffi.cast("uintptr_t", x))

    def cuMemcpyHtoD_v2(self, dst: int, src: Any, n: int) -> int:
        ctypes.memmove(dst, self._addr(src), n)
        return 0

    def cuMemcpyDtoH_v2(self, dst: Any, src: int, n: int) -> int:
        ctypes.memmove(self._addr(dst), src, n)
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst: int, src: Any, n: int, s: Any) -> int:
        return self.cuMemcpyHtoD_v2(dst, src, n)

    def cuMemcpyDtoHAsync_v2(self, dst: Any, src: int, n: int, s: Any) -> int:
        return self.cuMemcpyDtoH_v2(dst, src, n)

    def cuMemcpyDtoDAsync_v2(self, dst: int, src: int, n: int, s: Any) -> int:
        ctypes.memmove(dst, src, n)
        return 0

    def cuMemsetD8Async(self, dst: int, v: int, n: int, s: Any) -> int:
        ctypes.memset(dst, v, n)
        return 0

    def cuPointerGetAttribute(self, p: Any, attr: int, ptr: int) -> int:
        inside = any(a <= ptr < a + len(b) for a, b in self.mem.items())
        if not inside:
            return 1
        p[0] = 2 if attr == 2 else 0
        return 0

    # -- streams, launches, graphs
    def cuStreamCreate(self, p: Any, flags: int) -> int:
        p[0] = self._handle("CUstream")
        return 0

    def cuStreamDestroy_v2(self, s: Any) -> int:
        return 0

    def cuStreamSynchronize(self, s: Any) -> int:
        return self._f("cuStreamSynchronize")

    def _launch(self, f: Any, grid: tuple[int, int, int], *, block: int, shared: int, argv: Any, ex: bool) -> int:
        name = self.funcs[self._addr(f)]
        kinds = self.params.get(name, [])
        argp = self.ffi.cast("void **", argv)
        raw, args = b"", []
        for j, kind in enumerate(kinds):
            b = bytes(self.ffi.buffer(self.ffi.cast("char *", argp[j]), struct.calcsize(_UNPACK[kind])))
            raw += b
            args.append(struct.unpack(_UNPACK[kind], b)[0])
        launch = Launch(name, grid, block, shared, args, raw, ex)
        if self.capturing is not None:
            self.capturing.append(launch)
            return 0
        return self._run(launch)

    def _run(self, launch: Launch) -> int:
        self.launches.append(launch)
        r = self.fail.get(f"launch:{launch.kernel}", 0)
        if r:
            return r
        if self.on_launch is not None:
            self.on_launch(launch)
        return 0

    def cuLaunchKernel(
        self,
        f: Any,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        s: Any,
        argv: Any,
        extra: Any,
    ) -> int:
        return self._launch(f, (gx, gy, gz), block=bx, shared=shared, argv=argv, ex=False)

    def cuLaunchKernelEx(self, cfg: Any, f: Any, argv: Any, extra: Any) -> int:
        c = cfg[0]
        self.calls.append(f"ex attrs={[int(c.attrs[i].id) for i in range(c.numAttrs)]}")
        return self._launch(
            f,
            (c.gridDimX, c.gridDimY, c.gridDimZ),
            block=c.blockDimX,
            shared=c.sharedMemBytes,
            argv=argv,
            ex=True,
        )

    def cuEventCreate(self, p: Any, flags: int) -> int:
        p[0] = self._handle("CUevent")
        return 0

    def cuEventRecord(self, e: Any, s: Any) -> int:
        self.events[self._addr(e)] = len(self.launches)
        return 0

    def cuEventSynchronize(self, e: Any) -> int:
        return 0

    def cuEventElapsedTime(self, p: Any, start: Any, end: Any) -> int:
        a, b = self.events[self._addr(start)], self.events[self._addr(end)]
        p[0] = sum(self.cost_ms(x) for x in self.launches[a:b])
        return 0

    def cuEventDestroy_v2(self, e: Any) -> int:
        return 0

    def cuStreamBeginCapture_v2(self, s: Any, mode: int) -> int:
        self.capturing = []
        return 0

    def cuStreamEndCapture(self, s: Any, p: Any) -> int:
        launches, self.capturing = self.capturing, None
        if self.capture_fails:
            p[0] = self.ffi.NULL
            return 900
        h = self._handle("CUgraph")
        self.graphs[self._addr(h)] = launches or []
        p[0] = h
        return 0

    def cuGraphInstantiateWithFlags(self, p: Any, g: Any, flags: int) -> int:
        h = self._handle("CUgraphExec")
        self.graphs[self._addr(h)] = list(self.graphs[self._addr(g)])
        p[0] = h
        return 0

    def cuGraphDestroy(self, g: Any) -> int:
        return 0

    def cuGraphExecDestroy(self, g: Any) -> int:
        self.graphs.pop(self._addr(g), None)
        return 0

    def cuGraphLaunch(self, g: Any, s: Any) -> int:
        self.calls.append("cuGraphLaunch")
        for launch in self.graphs[self._addr(g)]:
            r = self._run(launch)
            if r:
                return r
        return 0


def view(ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
    """A numpy array over fake device memory."""
    dtype = np.dtype(dtype)
    buf = (ctypes.c_char * max(1, count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype, count)
