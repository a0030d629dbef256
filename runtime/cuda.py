"""Run a package's CUDA target: cubins loaded from memory, launched through libcuda, no torch or triton.

What it is: the three entry points ``runtime/model.py`` uses — ``available()``, ``pick_target(raw_targets)``
and ``CudaExecutor(target, members, weights)`` — on top of ``cuda_driver`` (the cffi binding) and
``cuda_plan`` (the manifest format). The executor uploads the weights once, keeps one arena per model
(grown when larger symbol values need more), packs each launch's arguments once per symbol binding, and
replays the whole launch sequence as one CUDA graph per binding, falling back to plain launches if capture
fails. What it is not: input validation against the user-facing signature (``model.py`` does that; this
module only refuses what would be unsafe to launch) or the package reader (which checks hashes first).

Note: every buffer pointer handed to a kernel is 16-byte aligned, because the builder tells Triton so
(``tt.divisibility``) to get vector loads. Weights, arena and staging buffers are laid out at 256 bytes;
caller-owned device buffers that are not 16-byte aligned are staged through the executor's own memory.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import cuda_plan as plan
from . import shapes
from .cuda_arrays import check_elf, device_ptr, host_array, shape_of
from .cuda_driver import (
    CAPTURE_THREAD_LOCAL,
    CLUSTER_POLICY_SPREAD,
    FUNC_ATTR_MAX_DYNAMIC_SMEM,
    FUNC_ATTR_NON_PORTABLE_CLUSTER,
    LAUNCH_ATTR_CLUSTER_DIM,
    LAUNCH_ATTR_CLUSTER_POLICY,
    LAUNCH_ATTR_COOPERATIVE,
    LAUNCH_ATTR_PDL,
    NO_BINARY,
    STREAM_NON_BLOCKING,
    Device,
    DeviceArray,
    Driver,
    driver,
    host_ptr,
)
from .errors import AotcError, DeviceError, IncompatiblePackage, InputMismatch, PackageCorrupt
from .schema import dtype_name
from .schema import numpy_dtype as np_dtype

__all__ = [
    "CudaExecutor",
    "DeviceArray",
    "ModelExecutor",
    "available",
    "device_info",
    "open_executor",
    "pick_target",
]

ALIGN = 256
_PACK = {"i1": "<B", "i8": "<b", "u8": "<B", "i16": "<h", "i32": "<i", "i64": "<q", "f16": "<e", "f32": "<f",
         "f64": "<d"}  # fmt: skip


def _up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


# ---- entry points for model.py -----------------------------------------------------------------------


def available() -> bool:
    """Whether this process can run CUDA targets: libcuda loads, initialises and sees a GPU. Never raises."""
    try:
        return driver().device_count() > 0
    except AotcError:
        return False


def device_info(device: int = 0) -> dict[str, Any]:
    """Name, arch, driver version and memory of a GPU (for `aotc info` and benchmark records)."""
    drv = driver()
    d = drv.device(device)
    return {"name": d.name, "arch": d.arch, "sm_count": d.sm_count, "driver_version": drv.version,
            "total_mem": d.total_mem}  # fmt: skip


def runs_on(arch: str, dev: Device) -> bool:
    """Whether a cubin for ``arch`` runs on ``dev``: same major, minor not above the device's; Triton's
    sm_90+ cubins are arch-specific (sm_90a, ...) and run only on exactly that SM."""
    sm = int(arch.removeprefix("sm_").rstrip("a"))
    if sm >= 90 or arch.endswith("a"):
        return sm == dev.sm
    return sm // 10 == dev.sm // 10 and sm <= dev.sm


def pick_target(raw_targets: Sequence[Mapping[str, Any]], device: int = 0) -> dict[str, Any] | None:
    """The manifest CUDA target that runs on GPU ``device``, or None when the package has no CUDA target.

    Raises ``PackageCorrupt`` for a malformed CUDA entry and ``IncompatiblePackage`` when there is no libcuda,
    no cubin for this GPU's arch, or the driver is older than the cubins need."""
    cuda = [t for t in raw_targets if isinstance(t, Mapping) and t.get("kind") == "cuda"]
    if not cuda:
        return None
    parsed = [(dict(t), plan.parse(t, f"manifest target {i} (cuda)")) for i, t in enumerate(cuda)]
    drv = driver()
    dev = drv.device(device)
    fits = [(raw, p) for raw, p in parsed if runs_on(p.arch, dev)]
    if not fits:
        have = ", ".join(sorted(p.arch for _, p in parsed))
        raise IncompatiblePackage(
            f"the package has CUDA code for {have}, but GPU {device} ({dev.name}) is {dev.arch}: "
            f"rebuild with `aotc build --target cuda:{dev.arch}`"
        )
    raw, p = max(fits, key=lambda rp: (rp[1].sm == dev.sm, rp[1].sm))
    _check_driver(p, drv)
    return raw


def _check_driver(p: plan.CudaTarget, drv: Driver) -> None:
    if drv.version < p.min_driver:
        have = f"{drv.version // 1000}.{drv.version % 1000 // 10}"
        need = f"{p.min_driver // 1000}.{p.min_driver % 1000 // 10}"
        raise IncompatiblePackage(
            f"the NVIDIA driver supports CUDA {have}, but the package's {p.arch} cubins (ptxas "
            f"{p.ptxas_version}) "
            f"need CUDA {need}: update the driver, or rebuild with a Triton whose ptxas is {have} or older"
        )


# ---- the executor ------------------------------------------------------------------------------------


class _Region:
    """One growable device allocation (arena, staging, scratch)."""

    def __init__(self, drv: Driver, what: str) -> None:
        self.drv, self.what, self.ptr, self.size = drv, what, 0, 0

    def ensure(self, n: int) -> bool:
        """Make room for ``n`` bytes; True when the allocation moved."""
        if n <= self.size and self.ptr:
            return False
        self.drv.free(self.ptr)
        self.ptr = 0
        size = max(_up(n), _up(self.size + self.size // 4))
        self.ptr = self.drv.alloc(size, self.what)
        self.size = size
        return True

    def release(self) -> None:
        self.drv.free(self.ptr)
        self.ptr = self.size = 0


@dataclass
class _Call:
    """One launch with its arguments packed: 8-byte slots, ``argv`` pointing at each."""

    kernel: str
    func: Any
    grid: tuple[int, int, int]  # gridDimX already multiplied by num_ctas
    block: int
    shared: int
    slots: Any  # uint64_t[n]
    argv: Any  # void*[n]
    ptr_slots: list[tuple[int, str]]
    config: Any = None  # CUlaunchConfig* when cuLaunchKernelEx is needed
    keep: list[Any] = field(default_factory=list)


@dataclass
class _Bound:
    """Everything that depends on the symbol values: shapes, layouts and packed launches."""

    key: tuple[int, ...]
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    io_offsets: list[int]  # inputs then outputs, in the staging region
    io_bytes: int
    arena_bytes: int
    arena_offsets: dict[str, int]
    scratch: tuple[int, int]  # bytes of global and profile scratch (0: pass a null pointer)
    scratch_align: tuple[int, int]
    calls: list[_Call]
    packed: dict[str, int] = field(default_factory=dict)  # pointer values currently in the slots


class CudaExecutor:
    """Runs one CUDA target of a package on one GPU.

    ``target``: the manifest dict (or a parsed ``CudaTarget``); ``members``: member name → bytes (a mapping or
    a callable), already hash-checked by the package reader; ``weights``: arrays in the target's ``weights``
    order (or a name → array mapping). ``graphs``: replay the launch sequence as a CUDA graph per symbol
    binding. ``debug_sync``: synchronise after each launch so a fault names its kernel."""

    def __init__(
        self,
        target: Mapping[str, Any] | plan.CudaTarget,
        members: Mapping[str, bytes] | Callable[[str], bytes],
        weights: Sequence[np.ndarray] | Mapping[str, np.ndarray],
        *,
        device: int = 0,
        graphs: bool = True,
        debug_sync: bool = False,
    ) -> None:
        self.plan = target if isinstance(target, plan.CudaTarget) else plan.parse(target)
        self.drv = drv = driver()
        self.dev = drv.device(device)
        self.graphs = graphs
        self.debug_sync = debug_sync
        self.graph_error: str | None = None
        self._lock = threading.Lock()
        self._closed = True
        p = self.plan
        if not runs_on(p.arch, self.dev):
            raise IncompatiblePackage(
                f"this CUDA target is {p.arch} but GPU {device} ({self.dev.name}) is {self.dev.arch}: "
                f"rebuild with `aotc build --target cuda:{self.dev.arch}`"
            )
        _check_driver(p, drv)
        drv.context(self.dev)
        ffi, lib = drv.ffi, drv.lib
        self._ffi, self._lib = ffi, lib
        s = ffi.new("CUstream *")
        drv.check(lib.cuStreamCreate(s, STREAM_NON_BLOCKING), "cuStreamCreate")
        self.stream = s[0]
        self._modules: list[Any] = []
        self._funcs: dict[str, Any] = {}
        self._weights_mem = _Region(drv, "weights")
        self._arena = _Region(drv, "the arena")
        self._io = _Region(drv, "input/output staging")
        self._gscratch = _Region(drv, "global scratch")
        self._pscratch = _Region(drv, "profile scratch")
        self._bound: OrderedDict[tuple[int, ...], _Bound] = OrderedDict()
        self._graph_execs: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._closed = False  # from here on, close() releases what was made
        read = members if callable(members) else members.__getitem__
        for k in p.kernels:
            self._funcs[k.name] = self._load(k, read)
        self._weight_ptrs = self._upload(weights)

    # -- loading

    def _load(self, k: plan.Kernel, read: Callable[[str], bytes]) -> Any:
        try:
            image = read(k.member)
        except KeyError:
            raise PackageCorrupt(f"package member {k.member!r} (kernel {k.name}) is missing") from None
        check_elf(image, self.plan.sm, k)
        drv, ffi = self.drv, self._ffi
        mod = ffi.new("CUmodule *")
        buf = ffi.from_buffer(image)
        r = self._lib.cuModuleLoadData(mod, buf)
        if r in NO_BINARY:
            raise IncompatiblePackage(
                f"the driver cannot load cubin {k.member} ({drv.error_name(r)}): it was built for "
                f"{self.plan.arch} "
                f"by ptxas {k.ptxas_version}, GPU is {self.dev.arch} with driver {drv.version}"
            )
        drv.check(r, "cuModuleLoadData", k.name)
        self._modules.append(mod[0])
        fn = ffi.new("CUfunction *")
        drv.check(self._lib.cuModuleGetFunction(fn, mod[0], k.name.encode()), "cuModuleGetFunction", k.name)
        if k.shared > self.dev.smem_optin:
            raise IncompatiblePackage(
                f"kernel {k.name} needs {k.shared} bytes of shared memory; {self.dev.name} allows {self.dev.smem_optin}"
            )
        if k.shared > 48 * 1024:
            r = self._lib.cuFuncSetAttribute(fn[0], FUNC_ATTR_MAX_DYNAMIC_SMEM, k.shared)
            drv.check(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", k.name)
        if k.num_ctas > 8:
            drv.check(
                self._lib.cuFuncSetAttribute(fn[0], FUNC_ATTR_NON_PORTABLE_CLUSTER, 1),
                "cuFuncSetAttribute",
                k.name,
            )
        return fn[0]

    def _upload(self, weights: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> dict[str, int]:
        specs = self.plan.weights
        if isinstance(weights, Mapping):
            missing = [t.name for t in specs if t.name not in weights]
            if missing:
                raise PackageCorrupt(f"weights {missing} of the CUDA target are not in the package")
            arrays = [weights[t.name] for t in specs]
        else:
            arrays = list(weights)
            if len(arrays) != len(specs):
                raise PackageCorrupt(f"the CUDA target has {len(specs)} weights, the package gave {len(arrays)}")
        offsets, end = [], 0
        for t, a in zip(specs, arrays, strict=True):
            try:
                shape = tuple(shapes.evaluate(d, {}) for d in t.shape)
            except shapes.ShapeExprError as e:
                raise PackageCorrupt(f"weight {t.name}: {e}") from None
            want = np_dtype(t.dtype)
            if a.dtype != want or tuple(a.shape) != shape:
                raise PackageCorrupt(f"weight {t.name} is {a.dtype}{list(a.shape)}, the CUDA target expects {want}{list(shape)}")
            offsets.append(end)
            end = _up(end + a.nbytes)
        self._weights_mem.ensure(end)
        base = self._weights_mem.ptr
        for w, off in zip(arrays, offsets, strict=True):
            a = np.ascontiguousarray(w)
            if a.nbytes:
                self.drv.check(
                    self._lib.cuMemcpyHtoD_v2(base + off, host_ptr(self._ffi, a), a.nbytes),
                    "cuMemcpyHtoD (weights)",
                )
        return {t.name: base + off for t, off in zip(specs, offsets, strict=True)}

    # -- binding symbol values

    def _key(self, syms: Mapping[str, int] | None, inputs: Sequence[Any]) -> tuple[int, ...]:
        env = dict(syms or {})
        for t, x in zip(self.plan.inputs, inputs, strict=False):
            shp = shape_of(x)
            if shp is None or len(shp) != len(t.shape):
                continue
            for d, v in zip(t.shape, shp, strict=True):
                if isinstance(d, str) and d in self.plan.symbols and d not in env:
                    env[d] = int(v)
        missing = [s for s in self.plan.symbols if s not in env]
        if missing:
            raise InputMismatch(f"no value for the dynamic dimension(s) {missing}: pass syms={{...}} or inputs that bind them")
        return tuple(int(env[s]) for s in self.plan.symbols)

    def _bind(self, key: tuple[int, ...]) -> _Bound:
        b = self._bound.get(key)
        if b is not None:
            self._bound.move_to_end(key)
            return b
        env = dict(zip(self.plan.symbols, key, strict=True))
        p = self.plan

        def ev(size: shapes.Size, what: str) -> int:
            try:
                v = shapes.evaluate(size, env)
            except shapes.ShapeExprError as e:
                raise InputMismatch(f"{what}: {e}") from None
            if v < 0:
                raise InputMismatch(f"{what} is {v} < 0 for {env}: a dynamic dimension is out of range")
            return v

        in_shapes = [tuple(ev(d, f"input {t.name} shape") for d in t.shape) for t in p.inputs]
        out_shapes = [tuple(ev(d, f"output {t.name} shape") for d in t.shape) for t in p.outputs]
        io_offsets, end = [], 0
        for t, shp in zip((*p.inputs, *p.outputs), (*in_shapes, *out_shapes), strict=True):
            io_offsets.append(end)
            end = _up(end + int(np.prod(shp, dtype=np.int64)) * np_dtype(t.dtype).itemsize)
        arena_offsets = {name: ev(off, f"arena offset of {name}") for name, off in p.arena}
        for name, off in arena_offsets.items():
            if off % 16:
                raise PackageCorrupt(f"arena buffer {name} is at offset {off}, not 16-byte aligned")
        gs = ps = 0
        galign = palign = 1
        calls = []
        for i, launch in enumerate(p.launches):
            k = p.kernel(launch.kernel)
            grid = [ev(g, f"grid of launch {i} ({k.name})") for g in launch.grid]
            if 0 in grid:
                continue  # an empty output: nothing to launch
            if grid[0] * k.num_ctas > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
                raise InputMismatch(f"kernel {k.name} needs grid {grid}, over CUDA's limits, for {env}")
            n = grid[0] * grid[1] * grid[2] * k.num_ctas
            if k.global_scratch_size:  # one region serves every launch: they run one after another
                gs = max(gs, _up(n * k.global_scratch_size, k.global_scratch_align) + k.global_scratch_align)
            if k.profile_scratch_size:
                ps = max(ps, _up(n * k.profile_scratch_size, k.profile_scratch_align) + k.profile_scratch_align)
            galign = max(galign, k.global_scratch_align)
            palign = max(palign, k.profile_scratch_align)
            calls.append(self._pack(k, launch, (grid[0] * k.num_ctas, grid[1], grid[2]), env))
        return self._remember(_Bound(key, in_shapes, out_shapes, io_offsets, end,
                                     ev(p.arena_bytes, "arena_bytes"), arena_offsets, (gs, ps),
                                     (galign, palign), calls))  # fmt: skip

    def _remember(self, b: _Bound) -> _Bound:
        self._bound[b.key] = b
        while len(self._bound) > 64:
            self._bound.popitem(last=False)
        return b

    def _pack(self, k: plan.Kernel, launch: plan.Launch, grid: tuple[int, int, int], env: dict[str, int]) -> _Call:
        ffi = self._ffi
        n = len(k.params)
        slots = ffi.new("uint64_t[]", max(1, n))
        argv = ffi.new("void *[]", max(1, n))
        base = int(ffi.cast("uintptr_t", slots))
        view = ffi.buffer(slots)
        ptr_slots = []
        for j in range(n):
            argv[j] = ffi.cast("void *", base + 8 * j)
        for j, (a, (kind, _)) in enumerate(zip(launch.args, k.params, strict=False)):
            if kind == "ptr":
                ptr_slots.append((j, a.buffer or ""))
                continue
            value: Any = a.value if a.expr is None else shapes.evaluate(a.expr, env)
            try:
                if kind == "bf16":
                    import ml_dtypes

                    struct.pack_into("<H", view, 8 * j, int(np.array(value, ml_dtypes.bfloat16).view(np.uint16)))
                else:
                    struct.pack_into(_PACK[kind], view, 8 * j, bool(value) if kind == "i1" else value)
            except (struct.error, OverflowError, TypeError) as e:
                raise InputMismatch(f"argument {j} of kernel {k.name} ({a.expr or a.value!r}) does not fit {kind}: {e}") from None
        for j in range(k.num_args, n):
            ptr_slots.append((j, "$" + k.params[j][0]))
        call = _Call(k.name, self._funcs[k.name], grid, 32 * k.num_warps, k.shared, slots, argv, ptr_slots)
        if k.num_ctas > 1 or k.launch_cooperative_grid or k.launch_pdl:
            call.config, call.keep = self._config(k, grid)
        return call

    def _config(self, k: plan.Kernel, grid: tuple[int, int, int]) -> tuple[Any, list[Any]]:
        ffi = self._ffi
        attrs = ffi.new("CUlaunchAttribute[4]")
        na = 0
        if k.launch_pdl:
            attrs[na].id = LAUNCH_ATTR_PDL
            attrs[na].value.programmaticStreamSerializationAllowed = 1
            na += 1
        if k.launch_cooperative_grid:
            attrs[na].id = LAUNCH_ATTR_COOPERATIVE
            attrs[na].value.cooperative = 1
            na += 1
        if k.num_ctas > 1:
            attrs[na].id = LAUNCH_ATTR_CLUSTER_DIM
            attrs[na].value.clusterDim.x, attrs[na].value.clusterDim.y, attrs[na].value.clusterDim.z = (
                k.num_ctas,
                1,
                1,
            )
            attrs[na + 1].id = LAUNCH_ATTR_CLUSTER_POLICY
            attrs[na + 1].value.clusterSchedulingPolicyPreference = CLUSTER_POLICY_SPREAD
            na += 2
        cfg = ffi.new("CUlaunchConfig *")
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 32 * k.num_warps, 1, 1
        cfg.sharedMemBytes = k.shared
        cfg.hStream = self.stream
        cfg.attrs = attrs
        cfg.numAttrs = na
        return cfg, [attrs]

    # -- running

    def run(
        self,
        inputs: Sequence[Any],
        syms: Mapping[str, int] | None = None,
        *,
        outputs: Sequence[Any] | None = None,
        device_outputs: bool = False,
        graph: bool | None = None,
    ) -> list[Any]:
        """Run the model once and wait for it.

        ``inputs``: numpy arrays (copied to the GPU) or device arrays with ``__cuda_array_interface__`` or
        DLPack (used in place), in the target's input order. ``syms``: values of the dynamic dimensions by
        name (those that are a whole input dimension are read from the inputs when left out). Results: the
        ``outputs`` given (device arrays written in place), else new ``DeviceArray``s when
        ``device_outputs``, else numpy arrays. ``graph``: override the executor's CUDA-graph setting."""
        with self._lock:
            if self._closed:
                raise DeviceError("this CudaExecutor was closed")
            self.drv.guard()
            self.drv.context(self.dev)
            p = self.plan
            if len(inputs) != len(p.inputs):
                raise InputMismatch(f"the model takes {len(p.inputs)} inputs ({[t.name for t in p.inputs]}), got {len(inputs)}")
            if outputs is not None and len(outputs) != len(p.outputs):
                raise InputMismatch(f"the model has {len(p.outputs)} outputs, got {len(outputs)} output buffers")
            b = self._bind(self._key(syms, inputs))
            moved = self._arena.ensure(b.arena_bytes) | self._io.ensure(b.io_bytes)
            moved |= self._gscratch.ensure(b.scratch[0]) | self._pscratch.ensure(b.scratch[1])
            if moved:
                self._drop_graphs()
            keep: list[Any] = []
            ptrs, external, after = self._place(b, inputs, outputs, keep)
            self._repack(b, ptrs)
            use_graph = self.graphs if graph is None else graph
            if use_graph and self.graph_error is None and not self.debug_sync:
                self._launch_graph(b, tuple(sorted(external.items())))
            else:
                self._launch_all(b)
            return self._finish(b, outputs, device_outputs, after, keep)

    def _place(
        self, b: _Bound, inputs: Sequence[Any], outputs: Sequence[Any] | None, keep: list[Any]
    ) -> tuple[dict[str, int], dict[str, int], list[tuple[int, int, int]]]:
        """Device pointers of every buffer; HtoD copies of host inputs; DtoD staging where needed."""
        p, lib, stream = self.plan, self._lib, self.stream
        ptrs = dict(self._weight_ptrs)
        external: dict[str, int] = {}
        after: list[tuple[int, int, int]] = []  # (dst, src, bytes) copies once the kernels ran
        for name, off in b.arena_offsets.items():
            ptrs[name] = self._arena.ptr + off
        ptrs["$global_scratch"] = _up(self._gscratch.ptr, b.scratch_align[0]) if b.scratch[0] else 0
        ptrs["$profile_scratch"] = _up(self._pscratch.ptr, b.scratch_align[1]) if b.scratch[1] else 0
        n_in = len(p.inputs)
        for i, (t, x) in enumerate(zip(p.inputs, inputs, strict=True)):
            staged = self._io.ptr + b.io_offsets[i]
            dev = device_ptr(self.drv, self.dev.ordinal, stream, x, t=t, shape=b.in_shapes[i], keep=keep, writable=False)
            nbytes = int(np.prod(b.in_shapes[i], dtype=np.int64)) * np_dtype(t.dtype).itemsize
            if dev is None:
                a = host_array(x, t, b.in_shapes[i])
                keep.append(a)
                ptrs[t.name] = staged
                if nbytes:
                    self.drv.check(
                        lib.cuMemcpyHtoDAsync_v2(staged, host_ptr(self._ffi, a), nbytes, stream),
                        "cuMemcpyHtoDAsync",
                        hint=f"input {t.name}",
                    )
            elif dev % 16:
                ptrs[t.name] = staged
                if nbytes:
                    self.drv.check(
                        lib.cuMemcpyDtoDAsync_v2(staged, dev, nbytes, stream),
                        "cuMemcpyDtoDAsync",
                        hint=f"input {t.name}",
                    )
            else:
                ptrs[t.name] = external[t.name] = dev
        for j, t in enumerate(p.outputs):
            staged = self._io.ptr + b.io_offsets[n_in + j]
            ptrs[t.name] = staged
            if outputs is None:
                continue
            y, shape = outputs[j], b.out_shapes[j]
            dev = device_ptr(self.drv, self.dev.ordinal, stream, y, t=t, shape=shape, keep=keep, writable=True)
            if dev is None:
                raise InputMismatch(f"output buffer {j} ({t.name}) is not a device array")
            if dev % 16:
                nbytes = int(np.prod(b.out_shapes[j], dtype=np.int64)) * np_dtype(t.dtype).itemsize
                after.append((dev, staged, nbytes))
            else:
                ptrs[t.name] = external[t.name] = dev
        return ptrs, external, after

    def _repack(self, b: _Bound, ptrs: dict[str, int]) -> None:
        if b.packed == ptrs:
            return
        for c in b.calls:
            for j, name in c.ptr_slots:
                v = ptrs[name]
                if v % 16 and not name.startswith("$"):
                    raise DeviceError(f"buffer {name} of kernel {c.kernel} is at {v:#x}, not 16-byte aligned")
                c.slots[j] = v
        b.packed = dict(ptrs)

    def _launch_all(self, b: _Bound) -> None:
        lib, stream, null = self._lib, self.stream, self._ffi.NULL
        for c in b.calls:
            if c.config is None:
                r = lib.cuLaunchKernel(c.func, c.grid[0], c.grid[1], c.grid[2], c.block, 1, 1, c.shared, stream, c.argv, null)
            else:
                c.config.hStream = stream
                r = lib.cuLaunchKernelEx(c.config, c.func, c.argv, null)
            if r:
                raise self.drv.error(r, "cuLaunchKernel", c.kernel)
            if self.debug_sync:
                self.drv.check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize after launch", c.kernel)

    def _launch_graph(self, b: _Bound, external: tuple[tuple[str, int], ...]) -> None:
        key = (b.key, external)
        ge = self._graph_execs.get(key)
        if ge is None:
            ge = self._capture(b)
            if ge is None:
                self._launch_all(b)
                return
            self._graph_execs[key] = ge
            while len(self._graph_execs) > 16:
                self._lib.cuGraphExecDestroy(self._graph_execs.popitem(last=False)[1])
        else:
            self._graph_execs.move_to_end(key)
        self.drv.check(self._lib.cuGraphLaunch(ge, self.stream), "cuGraphLaunch", hint=f"kernels {_names(b)}")

    def _capture(self, b: _Bound) -> Any:
        """The launch sequence as an instantiated graph; None (and ``graph_error`` set) if capture fails."""
        ffi, lib, drv = self._ffi, self._lib, self.drv
        r = lib.cuStreamBeginCapture_v2(self.stream, CAPTURE_THREAD_LOCAL)
        if r:
            self.graph_error = f"cuStreamBeginCapture: {drv.error_name(r)}"
            return None
        err = None
        try:
            self._launch_all(b)
        except DeviceError as e:
            err = str(e)
        g = ffi.new("CUgraph *")
        r = lib.cuStreamEndCapture(self.stream, g)
        drv.guard()
        if err is None and r:
            err = f"cuStreamEndCapture: {drv.error_name(r)}"
        ge = ffi.new("CUgraphExec *")
        if err is None:
            r = lib.cuGraphInstantiateWithFlags(ge, g[0], 0)
            if r:
                err = f"cuGraphInstantiateWithFlags: {drv.error_name(r)}"
        if g[0] != ffi.NULL:
            lib.cuGraphDestroy(g[0])
        if err is not None:
            self.graph_error = err  # later runs launch plainly
            return None
        return ge[0]

    def _drop_graphs(self) -> None:
        for ge in self._graph_execs.values():
            self._lib.cuGraphExecDestroy(ge)
        self._graph_execs.clear()
        for b in self._bound.values():
            b.packed = {}

    def _finish(self, b: _Bound, outputs: Sequence[Any] | None, device_outputs: bool,
                after: list[tuple[int, int, int]], keep: list[Any]) -> list[Any]:  # fmt: skip
        p, lib, stream, drv = self.plan, self._lib, self.stream, self.drv
        for dst, src, n in after:
            drv.check(lib.cuMemcpyDtoDAsync_v2(dst, src, n, stream), "cuMemcpyDtoDAsync (output)")
        results: list[Any] = []
        n_in = len(p.inputs)
        for j, t in enumerate(p.outputs):
            src = self._io.ptr + b.io_offsets[n_in + j]
            shape, dt = b.out_shapes[j], np_dtype(t.dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            if outputs is not None:
                results.append(outputs[j])
            elif device_outputs:
                d = DeviceArray.empty(drv, shape, dt)
                if nbytes:
                    drv.check(lib.cuMemcpyDtoDAsync_v2(d.ptr, src, nbytes, stream), "cuMemcpyDtoDAsync (output)")
                results.append(d)
            else:
                a = np.empty(shape, dt)
                if nbytes:
                    drv.check(
                        lib.cuMemcpyDtoHAsync_v2(host_ptr(self._ffi, a), src, nbytes, stream),
                        "cuMemcpyDtoHAsync",
                        hint=f"output {t.name}",
                    )
                results.append(a)
        r = lib.cuStreamSynchronize(stream)
        if r:
            raise drv.error(
                r,
                "cuStreamSynchronize",
                hint=f"after kernels {_names(b)}; pass debug_sync=True to name the failing one",
            )
        del keep[:]
        return results

    # -- helpers for callers and tests

    def to_device(self, a: np.ndarray) -> DeviceArray:
        """A device copy of a host array (for zero-copy inputs and reusable output buffers)."""
        self.drv.context(self.dev)
        return DeviceArray.from_numpy(self.drv, a)

    def empty(self, shape: tuple[int, ...], dtype: str | np.dtype) -> DeviceArray:
        self.drv.context(self.dev)
        return DeviceArray.empty(self.drv, tuple(shape), np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype))

    def synchronize(self) -> None:
        self.drv.check(self._lib.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def close(self) -> None:
        """Free the GPU memory, graphs, modules and stream now (also done when the executor is collected)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        drv, lib = self.drv, self._lib
        if drv.broken is not None:
            return  # nothing can be released through a broken context
        drv.context(self.dev)
        lib.cuStreamSynchronize(self.stream)
        self._drop_graphs()
        for r in (self._arena, self._io, self._gscratch, self._pscratch, self._weights_mem):
            r.release()
        for m in self._modules:
            lib.cuModuleUnload(m)
        lib.cuStreamDestroy_v2(self.stream)

    def __enter__(self) -> CudaExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(AotcError):
            self.close()


def _names(b: _Bound) -> str:
    names = [c.kernel for c in b.calls]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


# ---- the adapter model.py drives ---------------------------------------------------------------------


class ModelExecutor:
    """``aotc.model``'s executor protocol over a ``CudaExecutor``: ``accept`` describes an input without
    copying it, ``execute`` runs on checked inputs. Outputs are numpy arrays when every input was host data,
    else ``DeviceArray``s (``to_host`` copies one back)."""

    def __init__(self, ex: CudaExecutor) -> None:
        self.ex = ex
        self.device = f"cuda:{ex.dev.ordinal}"
        self.target = f"cuda:{ex.plan.arch}"

    def accept(self, value: Any, spec: Any) -> tuple[Any, tuple[int, ...], str]:
        cai = None
        with contextlib.suppress(AttributeError, TypeError):  # torch raises TypeError for bf16 CAI
            cai = value.__cuda_array_interface__
        if cai is not None:
            got = np.dtype(cai["typestr"])
            name = dtype_name(got) or ("bfloat16" if got.kind == "V" and got.itemsize == 2 else got.str)
            return value, tuple(int(s) for s in cai["shape"]), name
        if hasattr(value, "__dlpack_device__") and int(value.__dlpack_device__()[0]) in (2, 13):
            name = str(getattr(value, "dtype", "")).rsplit(".", 1)[-1]
            return value, tuple(int(s) for s in value.shape), name
        try:
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        except Exception as e:
            raise InputMismatch(
                f"input {spec.name!r}: cannot be read as an array ({type(e).__name__}: {e}); pass a numpy "
                "array or a CUDA array (__cuda_array_interface__ or DLPack)"
            ) from None
        return arr, tuple(arr.shape), dtype_name(arr.dtype) or arr.dtype.str

    def execute(self, inputs: Sequence[Any], env: Mapping[str, int], out_shapes: Sequence[tuple[int, ...]]) -> list[Any]:
        on_host = all(isinstance(x, np.ndarray) for x in inputs)
        return self.ex.run(inputs, env, device_outputs=not on_host)

    def to_host(self, value: Any) -> np.ndarray:
        return value.numpy() if isinstance(value, DeviceArray) else np.asarray(value)

    def close(self) -> None:
        self.ex.close()


def open_executor(package: Any, targets: Sequence[Any], device: str = "cuda") -> ModelExecutor:
    """The executor for ``aotc.load``: pick the target for this GPU among the package's CUDA targets (raw
    manifest entries with a ``raw`` dict, or the dicts themselves), load its checked cubins and weights."""
    ordinal = int(device.split(":", 1)[1]) if ":" in device else 0
    raws = [t.raw if hasattr(t, "raw") else t for t in targets]
    raw = pick_target(raws, ordinal)
    if raw is None:
        raise IncompatiblePackage("the package has no CUDA target: rebuild with --target cuda:sm_NN")
    return ModelExecutor(CudaExecutor(raw, package.read, package.weights(), device=ordinal))
