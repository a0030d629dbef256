"""Token ids in range: the check of ``IndexRange`` inputs, on the host and on the GPU.

What it is: ``index_error`` (the one message for an out-of-range id: the input, the value, where, and the
vocabulary size), used by ``aotc.model`` for host arrays before a call; and ``DeviceIndexCheck``, which
``aotc.cuda`` runs for device-resident inputs: a small PTX kernel per index input, launched on the call's
stream before the model's kernels, sets a flag in device memory when any value is outside [0, size); the
flag is copied back with the outputs and read after the call's stream sync, and only then does the call
raise ``InputMismatch`` (the outputs are dropped). Out-of-range gathers in the generated kernels read a
clamped row, never past a buffer, so running them before the flag is read is safe.
What it is not: a package member. The PTX is the runtime's own code (the driver compiles it for the GPU at
load), not something a package supplies, so the rule that package code is hash-checked first is untouched.

Note: the device path costs one tiny kernel per index input and a 4-byte copy per call; no extra sync
(the call synchronises its stream anyway). An id is compared as an unsigned number against the size, so
a negative id (a huge unsigned one) fails the same test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InputMismatch
from .schema import IndexRange, Manifest

BLOCK = 256
MAX_BLOCKS = 1024  # a grid-stride loop covers the rest


def index_error(r: IndexRange, v: np.ndarray) -> InputMismatch | None:
    """The refusal for ``v`` (the values of input ``r.input``) when one is outside [0, r.size), else None."""
    if not v.size or v.dtype.kind not in "iu":
        return None
    lo, hi = int(v.min()), int(v.max())
    if lo >= 0 and hi < r.size:
        return None
    bad = lo if lo < 0 else hi
    at = [int(i) for i in np.unravel_index(int(np.argmax(v == bad)), v.shape)]
    return InputMismatch(
        f"input {r.input!r}: value {bad} at {at} is outside [0, {r.size}), the rows of the {r.table}; "
        f"token ids must be below the vocabulary size {r.size}"
    )


def _ptx(name: str, load: str, widen: str) -> str:
    """for (i = global id; i < n; i += grid stride) if ((u64) ids[i] >= size) *flag = 1;"""
    shift = 3 if load == "s64" else 2
    return f"""
.visible .entry {name}(.param .u64 p_ids, .param .u64 p_n, .param .u64 p_size, .param .u64 p_flag)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_ids];
    ld.param.u64 %rd2, [p_n];
    ld.param.u64 %rd3, [p_size];
    ld.param.u64 %rd4, [p_flag];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd4, %rd4;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mov.u32 %r5, 1;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd7, %r4, %r2;
LOOP:
    setp.ge.u64 %p1, %rd5, %rd2;
    @%p1 bra DONE;
    shl.b64 %rd8, %rd5, {shift};
    add.u64 %rd9, %rd1, %rd8;
    ld.global.{load} {"%r6" if widen else "%rd10"}, [%rd9];
    {widen}
    setp.ge.u64 %p2, %rd10, %rd3;
    @%p2 st.global.u32 [%rd4], %r5;
    add.u64 %rd5, %rd5, %rd7;
    bra LOOP;
DONE:
    ret;
}}
"""


KERNELS = {"int64": "aotc_index_check_i64", "int32": "aotc_index_check_i32"}
PTX = (
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    + _ptx(KERNELS["int64"], "s64", "")
    + _ptx(KERNELS["int32"], "s32", "cvt.s64.s32 %rd10, %r6;")
)


class DeviceIndexCheck:
    """The GPU side for one executor: ``launch`` before the model's kernels, ``copy_back`` before the stream
    sync, ``raise_if_bad`` after it. Inactive (every method a no-op) when the package has no index input
    of a dtype the kernels read (int64, int32)."""

    def __init__(self, drv: Any, manifest: Manifest, modules: list[Any]) -> None:
        """``modules``: the executor's list of modules to unload (the check's module joins them); the flags'
        device memory is this object's, freed by ``release``."""
        self.drv, self.ffi, self.lib = drv, drv.ffi, drv.lib
        names = [t.name for t in manifest.inputs]
        self.ranges = [
            (names.index(r.input), r, manifest.inputs[names.index(r.input)].dtype)
            for r in manifest.index_ranges
            if manifest.inputs[names.index(r.input)].dtype in KERNELS
        ]
        self.flags = np.zeros(max(len(self.ranges), 1), np.int32)
        self.flag0 = 0  # device address of the flags: 4 bytes per range
        self.funcs: dict[str, Any] = {}
        self.launched: list[tuple[int, IndexRange, int]] = []  # (range number, range, device pointer) this call
        if not self.ranges:
            return
        mod = self.ffi.new("CUmodule *")
        image = self.ffi.new("char[]", PTX.encode())
        drv.check(self.lib.cuModuleLoadData(mod, image), "cuModuleLoadData", hint="the token-id check (PTX)")
        modules.append(mod[0])
        for dtype, name in KERNELS.items():
            fn = self.ffi.new("CUfunction *")
            drv.check(self.lib.cuModuleGetFunction(fn, mod[0], name.encode()), "cuModuleGetFunction", name)
            self.funcs[dtype] = fn[0]
        self.flag0 = drv.alloc(4 * len(self.ranges), "token-id flags")

    def launch(self, stream: Any, inputs: Sequence[Any], ptrs: Sequence[int], shapes: Sequence[tuple[int, ...]]) -> None:
        """Check each index input that is not a numpy array (those were checked on the host) at ``ptrs[i]``."""
        self.launched = []
        if not self.ranges:
            return
        ffi, lib, flag0 = self.ffi, self.lib, self.flag0
        for k, (i, r, dtype) in enumerate(self.ranges):
            n = math.prod(shapes[i])
            if isinstance(inputs[i], np.ndarray) or not n:
                continue
            if not self.launched:
                self.drv.check(lib.cuMemsetD8Async(flag0, 0, 4 * len(self.ranges), stream), "cuMemsetD8Async", hint="token-id flags")
            args = ffi.new("uint64_t[4]", [ptrs[i], n, r.size, flag0 + 4 * k])
            argv = ffi.new("void *[4]", [args + j for j in range(4)])
            grid = min(-(-n // BLOCK), MAX_BLOCKS)
            r_ = lib.cuLaunchKernel(self.funcs[dtype], grid, 1, 1, BLOCK, 1, 1, 0, stream, argv, ffi.NULL)
            self.drv.check(r_, "cuLaunchKernel", KERNELS[dtype], hint=f"checking input {r.input!r}")
            self.launched.append((k, r, ptrs[i]))

    def copy_back(self, stream: Any) -> None:
        if self.launched:
            dst = self.ffi.cast("void *", self.flags.ctypes.data)
            self.drv.check(self.lib.cuMemcpyDtoHAsync_v2(dst, self.flag0, 4 * len(self.ranges), stream), "cuMemcpyDtoHAsync")

    def raise_if_bad(self, shapes: Sequence[tuple[int, ...]]) -> None:
        """After the sync: InputMismatch for the first flagged input, with the value and where it is (that
        input is copied back to find them: only on this error path)."""
        for k, r, ptr in self.launched:
            if not self.flags[k]:
                continue
            i, _, dtype = self.ranges[k]
            values = np.empty(shapes[i], np.dtype(dtype))
            dst = self.ffi.cast("void *", values.ctypes.data)
            self.drv.check(self.lib.cuMemcpyDtoH_v2(dst, ptr, values.nbytes), "cuMemcpyDtoH", hint=f"input {r.input!r}")
            raise index_error(r, values) or InputMismatch(
                f"input {r.input!r}: a value is outside [0, {r.size}), the rows of the {r.table}; "
                f"token ids must be below the vocabulary size {r.size}"
            )

    def release(self) -> None:
        """Free the flags (the executor unloads the module)."""
        self.drv.free(self.flag0)
        self.flag0 = 0
