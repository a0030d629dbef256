"""Run a package's CUDA target: cubins loaded from memory, launched through libcuda, no torch or triton.

What it is: the entry points ``runtime/model.py`` uses — ``available()``, ``pick_target(targets)`` (from
``aotc.cuda_targets``, which chooses the target) and ``open_executor(package, device)`` — and
``CudaExecutor``, which implements ``aotc.model.Executor``. The executor uploads the weights once, keeps
one arena per model (grown when larger symbol values need more), packs each launch's arguments once per
symbol binding (``aotc.cuda_launch``), and replays the launch sequence as one CUDA graph per binding
(``aotc.cuda_graph``), launching plainly if capture fails.
What it is not: input validation. ``model.py`` checks names, dtypes, shapes and symbol ranges and binds
the symbols; the executor trusts that binding and only refuses what would be unsafe to launch (a device
array whose shape or dtype differs from what the kernels will read). Nor is it the package reader, which
checks hashes first.

Note: every buffer pointer handed to a kernel is 16-byte aligned, because the builder tells Triton so
(``tt.divisibility``) to get vector loads. Weights, arena and staging buffers are laid out at 256 bytes;
caller-owned device buffers that are not 16-byte aligned are staged through the executor's own memory.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import cuda_ptx, shapes
from .cuda_arrays import Checked, check_elf, device_ptr, host_array
from .cuda_arrays import nbytes as size_of
from .cuda_driver import (
    FUNC_ATTR_MAX_DYNAMIC_SMEM,
    FUNC_ATTR_NON_PORTABLE_CLUSTER,
    NO_BINARY,
    STREAM_NON_BLOCKING,
    DeviceArray,
    Pool,
    driver,
    host_ptr,
)
from .cuda_graph import Graphs
from .cuda_launch import Call, Region, Slot, launch_all, names, pack, repack, up
from .cuda_targets import available, check_driver, choose, device_info, pick_target, runs_on
from .errors import AotcError, IncompatiblePackage, InputMismatch, PackageCorrupt, UsageError
from .indices import DeviceIndexCheck
from .schema import SCRATCH, CudaTarget, Kernel, Manifest, Ref, TensorSpec, dtype_name
from .schema import numpy_dtype as np_dtype

__all__ = ["CudaExecutor", "DeviceArray", "available", "choose", "device_info", "np_dtype", "open_executor", "pick_target",
           "runs_on"]


# ---- entry point for aotc.load ---------------------------------------------------------------------


def open_executor(package: Any, device: str = "cuda") -> CudaExecutor:
    """The executor for ``aotc.load``: the package's CUDA target for this GPU, its checked cubins and weights."""
    ordinal = int(device.split(":", 1)[1]) if ":" in device else 0
    m: Manifest = package.manifest
    t, jit = choose(m.cuda_targets, ordinal)
    if t is None:
        raise IncompatiblePackage("the package has no CUDA target: rebuild with --target cuda:sm_NN")
    return CudaExecutor(m, t, package.read, package.weights(), device=ordinal, jit=jit)


# ---- the executor ------------------------------------------------------------------------------------


@dataclass
class _Bound:
    """Everything that depends on the symbol values: shapes, layouts and packed launches."""

    key: tuple[int, ...]
    in_shapes: list[tuple[int, ...]]
    io_offsets: list[int]  # inputs then outputs, in the staging region
    io_bytes: int
    arena_bytes: int
    arena_offsets: list[int]
    scratch: tuple[int, int]  # bytes of global and profile scratch (0: pass a null pointer)
    scratch_align: tuple[int, int]
    calls: list[Call]
    packed: list[int] = field(default_factory=list)  # pointer values currently in the slots, by buffer number
    base: tuple[tuple[int, ...], list[int]] = ((), [])  # (region addresses, pointers of weights/arena/scratch)


class CudaExecutor:
    """Runs one CUDA target of a package on one GPU; ``aotc.model.Executor`` for ``Model``.

    ``manifest``: the package's (inputs, outputs, weights and symbols are its); ``target``: one of its CUDA
    targets; ``members``: member name → bytes (a mapping or a callable), already hash-checked by the package
    reader; ``weights``: arrays in the manifest's weight order (or a name → array mapping). ``graphs``:
    replay the launch sequence as a CUDA graph per symbol binding. ``debug_sync``: synchronise after each
    launch so a fault names its kernel."""

    def __init__(
        self,
        manifest: Manifest,
        target: CudaTarget,
        members: Mapping[str, bytes] | Callable[[str], bytes],
        weights: Sequence[np.ndarray] | Mapping[str, np.ndarray],
        *,
        device: int = 0,
        graphs: bool = True,
        debug_sync: bool = False,
        jit: bool = False,
    ) -> None:
        """``jit``: load the kernels' PTX (the driver compiles it) instead of their cubins; implied when the
        target holds no cubins."""
        self.manifest, self.cuda = manifest, target
        self.drv = drv = driver()
        self.dev = drv.device(device)
        self.device = f"cuda:{self.dev.ordinal}"
        self.target = f"cuda:{target.arch}"
        self.graphs = graphs
        self.debug_sync = debug_sync
        self._lock = threading.Lock()
        self._closed = True
        stripped = any(k.member is None for k in target.kernels)
        self.jit = jit or stripped
        if not (cuda_ptx.jit_runs_on if self.jit else runs_on)(target.arch, self.dev):
            raise IncompatiblePackage(
                f"this CUDA target is {target.arch} but GPU {device} ({self.dev.name}) is {self.dev.arch}: "
                f"rebuild with `aotc build --target cuda:{self.dev.arch}`"
            )
        self.note = cuda_ptx.check_target(target, self.dev, stripped) if self.jit else None
        if not self.jit:
            check_driver(target, drv)
        drv.context(self.dev)
        self._ffi, self._lib = drv.ffi, drv.lib
        s = drv.ffi.new("CUstream *")
        drv.check(drv.lib.cuStreamCreate(s, STREAM_NON_BLOCKING), "cuStreamCreate")
        self.stream = s[0]
        self._modules: list[Any] = []
        self._funcs: dict[str, Any] = {}
        self._weights_mem = Region(drv, "weights")
        self._arena = Region(drv, "the arena")
        self._io = Region(drv, "input/output staging")
        self._gscratch = Region(drv, "global scratch")
        self._pscratch = Region(drv, "profile scratch")
        self._bound: OrderedDict[tuple[int, ...], _Bound] = OrderedDict()
        self._graphs = Graphs(drv, self.stream)
        self._checked = Checked()
        self._out_shapes: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self._pool = Pool(drv)
        # Every buffer a launch can name gets a number once; a call's pointer table is then a plain list.
        slots: list[tuple[Slot, str]] = [
            (Ref(g, i), t.name) for g in ("weight", "input", "output") for i, t in enumerate(manifest.buffers(g))
        ]
        slots += [(Ref("arena", i), s.name) for i, s in enumerate(target.arena)]
        slots += [(kind, kind) for kind in SCRATCH]
        self._number: dict[Slot, int] = {slot: i for i, (slot, _) in enumerate(slots)}
        self._names = [name for _, name in slots]
        self._scratch = frozenset(self._number[kind] for kind in SCRATCH)
        self._first = {g: self._number.get(Ref(g, 0), 0) for g in ("input", "output", "arena")}
        self._closed = False  # from here on, close() releases what was made
        read = members if callable(members) else members.__getitem__
        for k in target.kernels:
            self._funcs[k.name] = self._load(k, read)
        self._weight_ptrs = self._upload(weights)
        self._ids = DeviceIndexCheck(drv, manifest, self._modules)  # device-resident token ids

    @property
    def graph_error(self) -> str | None:
        """Why CUDA-graph capture failed (later runs launch plainly), or None."""
        return self._graphs.error

    # -- loading

    def _load(self, k: Kernel, read: Callable[[str], bytes]) -> Any:
        drv, ffi, lib = self.drv, self._ffi, self._lib
        member = k.ptx if self.jit else k.member
        assert member is not None  # __init__ chose jit where a cubin is missing, and checked the PTX is there
        try:
            image = read(member)
        except KeyError:
            raise PackageCorrupt(f"package member {member!r} (kernel {k.name}) is missing") from None
        if self.jit:
            image = cuda_ptx.image(image, self.cuda, k, self.dev, drv)
        else:
            check_elf(image, self.cuda.sm, k)
        mod = ffi.new("CUmodule *")
        r = lib.cuModuleLoadData(mod, ffi.from_buffer(image))
        if r in NO_BINARY or (self.jit and r == cuda_ptx.JIT_COMPILER_NOT_FOUND):
            what = f"compile PTX {member} for it" if self.jit else f"load cubin {member}: it was built by ptxas {k.ptxas_version}"
            raise IncompatiblePackage(
                f"the driver cannot {what} ({drv.error_name(r)}); the target is {self.cuda.arch}, GPU {self.dev.name} is "
                f"{self.dev.arch} with driver {drv.version}: update the driver, or rebuild with `aotc build --target cuda:{self.dev.arch}`"
            )
        drv.check(r, "cuModuleLoadData", k.name)
        self._modules.append(mod[0])
        fn = ffi.new("CUfunction *")
        drv.check(lib.cuModuleGetFunction(fn, mod[0], k.name.encode()), "cuModuleGetFunction", k.name)
        if k.shared > self.dev.smem_optin:
            raise IncompatiblePackage(
                f"kernel {k.name} needs {k.shared} bytes of shared memory; {self.dev.name} allows {self.dev.smem_optin}"
            )
        if k.shared > 48 * 1024:
            r = lib.cuFuncSetAttribute(fn[0], FUNC_ATTR_MAX_DYNAMIC_SMEM, k.shared)
            drv.check(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", k.name)
        if k.num_ctas > 8:
            drv.check(lib.cuFuncSetAttribute(fn[0], FUNC_ATTR_NON_PORTABLE_CLUSTER, 1), "cuFuncSetAttribute", k.name)
        return fn[0]

    def _upload(self, weights: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[int]:
        """Copy the weights to the device; the pointer table with the weights' pointers filled in."""
        specs = self.manifest.weights.tensors
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
            shape = tuple(int(d) for d in t.shape)  # the schema refuses symbolic weight shapes
            want = np_dtype(t.dtype)
            if a.dtype != want or tuple(a.shape) != shape:
                raise PackageCorrupt(f"weight {t.name} is {a.dtype}{list(a.shape)}, the CUDA target expects {want}{list(shape)}")
            offsets.append(end)
            end = up(end + a.nbytes)
        self._weights_mem.ensure(end)
        base = self._weights_mem.ptr
        for w, off in zip(arrays, offsets, strict=True):
            a = np.ascontiguousarray(w)
            if a.nbytes:
                self.drv.upload(base + off, a, "weights", wait=False)
        self.drv.wait_uploads("weights")
        table = [0] * len(self._names)
        table[: len(offsets)] = [base + off for off in offsets]  # weights are numbered first
        return table

    # -- binding symbol values (model.py bound them; here they only select and shape the launches)

    def _bind(self, env: Mapping[str, int], out_shapes: Sequence[tuple[int, ...]]) -> _Bound:
        key = tuple(env[s.name] for s in self.manifest.symbols)
        b = self._bound.get(key)
        if b is not None:
            self._bound.move_to_end(key)
            return b
        m, t = self.manifest, self.cuda

        def ev(size: shapes.Size, what: str) -> int:
            try:
                v = shapes.evaluate(size, env)
            except shapes.ShapeExprError as e:
                raise InputMismatch(f"{what}: {e}") from None
            if v < 0:
                raise InputMismatch(f"{what} is {v} < 0 for {dict(env)}: a dynamic dimension is out of range")
            return v

        in_shapes = [tuple(ev(d, f"input {s.name} shape") for d in s.shape) for s in m.inputs]
        io_offsets, end = [], 0
        for spec, shp in zip((*m.inputs, *m.outputs), (*in_shapes, *out_shapes), strict=True):
            io_offsets.append(end)
            end = up(end + size_of(shp, spec.dtype))
        arena_offsets = [ev(s.offset, f"arena offset of {s.name}") for s in t.arena]
        for s, off in zip(t.arena, arena_offsets, strict=True):
            if off % 16:
                raise PackageCorrupt(f"arena buffer {s.name} is at offset {off}, not 16-byte aligned")
        gs = ps = 0
        galign = palign = 1
        calls = []
        for i, launch in enumerate(t.launches):
            k = t.kernel(launch.kernel)
            grid = [ev(g, f"grid of launch {i} ({k.name})") for g in launch.grid]
            if 0 in grid:
                continue  # an empty output: nothing to launch
            if grid[0] * k.num_ctas > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
                raise InputMismatch(f"kernel {k.name} needs grid {grid}, over CUDA's limits, for {dict(env)}")
            n = grid[0] * grid[1] * grid[2] * k.num_ctas
            if k.global_scratch_size:  # one region serves every launch: they run one after another
                gs = max(gs, up(n * k.global_scratch_size, k.global_scratch_align) + k.global_scratch_align)
            if k.profile_scratch_size:
                ps = max(ps, up(n * k.profile_scratch_size, k.profile_scratch_align) + k.profile_scratch_align)
            galign = max(galign, k.global_scratch_align)
            palign = max(palign, k.profile_scratch_align)
            calls.append(pack(self.drv, self._funcs[k.name], k, launch, (grid[0] * k.num_ctas, grid[1], grid[2]), env, self._number))
        b = _Bound(key, in_shapes, io_offsets, end, ev(t.arena_bytes, "arena_bytes"), arena_offsets, (gs, ps),
                   (galign, palign), calls)  # fmt: skip
        self._bound[key] = b
        while len(self._bound) > 64:
            self._bound.popitem(last=False)
        return b

    # -- running

    def accept(self, value: Any, spec: TensorSpec) -> tuple[Any, tuple[int, ...], str]:
        """``Executor.accept``: a CUDA array (``__cuda_array_interface__`` or DLPack) is kept as it is, anything
        else read as a numpy array; its shape and manifest dtype name, without copying."""
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
        """``Executor.execute``: numpy outputs when every input was host data, else ``DeviceArray``s."""
        on_host = all(isinstance(x, np.ndarray) for x in inputs)
        return self._run(inputs, env, out_shapes, None, not on_host, None)

    def run(
        self,
        inputs: Sequence[Any],
        env: Mapping[str, int],
        *,
        outputs: Sequence[Any] | None = None,
        device_outputs: bool = False,
        graph: bool | None = None,
    ) -> list[Any]:
        """Run once and wait, without ``Model``'s checks (for benchmarks and tests that drive the GPU directly).

        ``inputs``: numpy arrays (copied to the GPU) or device arrays with ``__cuda_array_interface__`` or
        DLPack (used in place), in manifest order. ``env``: the value of every symbol. Results: the
        ``outputs`` given (device arrays written in place), else new ``DeviceArray``s when
        ``device_outputs``, else numpy arrays. ``graph``: override the executor's CUDA-graph setting."""
        key = tuple(env[s.name] for s in self.manifest.symbols)
        out_shapes = self._out_shapes.get(key)
        if out_shapes is None:
            out_shapes = [tuple(shapes.evaluate(d, env) for d in t.shape) for t in self.manifest.outputs]
            self._out_shapes[key] = out_shapes
            if len(self._out_shapes) > 64:
                self._out_shapes.clear()
        return self._run(inputs, env, out_shapes, outputs, device_outputs, graph)

    def _run(
        self, inputs: Sequence[Any], env: Mapping[str, int], out_shapes: Sequence[tuple[int, ...]],
        outputs: Sequence[Any] | None, device_outputs: bool, graph: bool | None,
    ) -> list[Any]:  # fmt: skip
        with self._lock:
            if self._closed:
                raise UsageError("this model was closed; load the package again")
            self.drv.guard()
            self.drv.context(self.dev)
            b = self._bind(env, out_shapes)
            moved = self._arena.ensure(b.arena_bytes) | self._io.ensure(b.io_bytes)
            moved |= self._gscratch.ensure(b.scratch[0]) | self._pscratch.ensure(b.scratch[1])
            if moved:
                self._graphs.clear()
                for other in self._bound.values():
                    other.packed = []
            keep: list[Any] = []
            ptrs, external, after = self._place(b, inputs, out_shapes, outputs, keep)
            self._ids.launch(self.stream, inputs, ptrs[self._first["input"] :], b.in_shapes)
            use_graph = self.graphs if graph is None else graph
            plain = not use_graph or self.graph_error is not None or self.debug_sync
            key = (b.key, tuple((name, e[1]) for name, e in external.items()))
            if not plain and external and key not in self._graphs and self._graphs.count(b.key) >= 2:
                # Caller arrays at yet another address: copying them through staging keeps one graph for
                # every address, where capturing one per address set would cost far more than the copies.
                self._stage(ptrs, external, after)
                key = (b.key, ())
            if b.packed != ptrs:
                repack(b.calls, ptrs, self._names, self._scratch)
                b.packed = ptrs
            if plain or not self._graphs.run(key, lambda: self._launch(b), lambda: names(b.calls)):
                self._launch(b)
            return self._finish(b, out_shapes, outputs, device_outputs, after, keep)

    def _launch(self, b: _Bound) -> None:
        launch_all(self.drv, b.calls, self.stream, self.debug_sync)

    def profile(self, inputs: Sequence[Any], env: Mapping[str, int], *, repeats: int = 20) -> list[tuple[str, float]]:
        """Each launch's GPU time alone, in launch order: (kernel, ms), the mean of ``repeats`` back-to-back
        launches between two CUDA events, after one plain run on ``inputs``. Kernels shorter than a launch
        (~3 us) read as the launch rate, not their own time."""
        self.run(inputs, env, device_outputs=True, graph=False)
        drv, lib, ffi = self.drv, self._lib, self._ffi
        ev = ffi.new("CUevent[2]")
        out: list[tuple[str, float]] = []
        with self._lock:
            if self._closed:
                raise UsageError("this model was closed; load the package again")
            drv.context(self.dev)
            b = self._bound[tuple(env[s.name] for s in self.manifest.symbols)]
            for i in range(2):
                drv.check(lib.cuEventCreate(ev + i, 0), "cuEventCreate")
            try:
                for c in b.calls:
                    drv.check(lib.cuEventRecord(ev[0], self.stream), "cuEventRecord")
                    launch_all(drv, [c] * repeats, self.stream, False)
                    drv.check(lib.cuEventRecord(ev[1], self.stream), "cuEventRecord")
                    drv.check(lib.cuEventSynchronize(ev[1]), "cuEventSynchronize", c.kernel)
                    ms = ffi.new("float *")
                    drv.check(lib.cuEventElapsedTime(ms, ev[0], ev[1]), "cuEventElapsedTime")
                    out.append((c.kernel, ms[0] / repeats))
            finally:
                for i in range(2):
                    lib.cuEventDestroy_v2(ev[i])
        return out

    def _base(self, b: _Bound) -> list[int]:
        """The pointer table's weights, arena buffers and scratch for this binding (recomputed when a region moved)."""
        where = (self._arena.ptr, self._gscratch.ptr, self._pscratch.ptr)
        if b.base[0] != where:
            ptrs = self._weight_ptrs.copy()
            arena0 = self._first["arena"]
            for i, off in enumerate(b.arena_offsets):
                ptrs[arena0 + i] = self._arena.ptr + off
            gs, ps = self._number["global_scratch"], self._number["profile_scratch"]
            ptrs[gs] = up(self._gscratch.ptr, b.scratch_align[0]) if b.scratch[0] else 0
            ptrs[ps] = up(self._pscratch.ptr, b.scratch_align[1]) if b.scratch[1] else 0
            b.base = (where, ptrs)
        return b.base[1]

    def _stage(self, ptrs: list[int], external: dict[str, tuple[int, int, int, int, bool]], after: list[tuple[int, int, int]]) -> None:
        """Point the kernels at staging instead of the caller's arrays: inputs copied in now, outputs out after."""
        for ref, dev, staged, n, is_output in external.values():
            ptrs[ref] = staged
            if is_output:
                after.append((dev, staged, n))
            elif n:
                r = self._lib.cuMemcpyDtoDAsync_v2(staged, dev, n, self.stream)
                self.drv.check(r, "cuMemcpyDtoDAsync", hint="staging a caller's input")
        external.clear()

    def _place(
        self, b: _Bound, inputs: Sequence[Any], out_shapes: Sequence[tuple[int, ...]], outputs: Sequence[Any] | None,
        keep: list[Any],
    ) -> tuple[list[int], dict[str, tuple[int, int, int, int, bool]], list[tuple[int, int, int]]]:  # fmt: skip
        """Device pointers of every buffer; HtoD copies of host inputs; DtoD staging where needed."""
        m, lib, stream = self.manifest, self._lib, self.stream
        ptrs = self._base(b).copy()
        in0, out0 = self._first["input"], self._first["output"]
        # caller-owned device arrays the kernels use in place, which a graph bakes in:
        # name -> (pointer slot, address, staging address, bytes, is an output)
        external: dict[str, tuple[int, int, int, int, bool]] = {}
        after: list[tuple[int, int, int]] = []  # (dst, src, bytes) copies once the kernels ran
        n_in = len(m.inputs)
        for i, (t, x) in enumerate(zip(m.inputs, inputs, strict=True)):
            staged, ref = self._io.ptr + b.io_offsets[i], in0 + i
            dev = device_ptr(self.drv, self.dev.ordinal, stream, x, t=t, shape=b.in_shapes[i], keep=keep, writable=False,
                             checked=self._checked)
            nbytes = size_of(b.in_shapes[i], t.dtype)
            if dev is None:
                a = host_array(x, t, b.in_shapes[i])
                keep.append(a)
                ptrs[ref] = staged
                if nbytes:
                    r = lib.cuMemcpyHtoDAsync_v2(staged, host_ptr(self._ffi, a), nbytes, stream)
                    self.drv.check(r, "cuMemcpyHtoDAsync", hint=f"input {t.name}")
            elif dev % 16:
                ptrs[ref] = staged
                if nbytes:
                    self.drv.check(lib.cuMemcpyDtoDAsync_v2(staged, dev, nbytes, stream), "cuMemcpyDtoDAsync", hint=f"input {t.name}")
            else:
                ptrs[ref] = dev
                external[t.name] = (ref, dev, staged, nbytes, False)
        for j, t in enumerate(m.outputs):
            staged, ref = self._io.ptr + b.io_offsets[n_in + j], out0 + j
            ptrs[ref] = staged
            if outputs is None:
                continue
            dev = device_ptr(self.drv, self.dev.ordinal, stream, outputs[j], t=t, shape=out_shapes[j], keep=keep, writable=True,
                             checked=self._checked)  # fmt: skip
            if dev is None:
                raise InputMismatch(f"output buffer {j} ({t.name}) is not a device array")
            if dev % 16:
                after.append((dev, staged, size_of(out_shapes[j], t.dtype)))
            else:
                ptrs[ref] = dev
                external[t.name] = (ref, dev, staged, size_of(out_shapes[j], t.dtype), True)
        return ptrs, external, after

    def _finish(
        self, b: _Bound, out_shapes: Sequence[tuple[int, ...]], outputs: Sequence[Any] | None, device_outputs: bool,
        after: list[tuple[int, int, int]], keep: list[Any],
    ) -> list[Any]:  # fmt: skip
        m, lib, stream, drv = self.manifest, self._lib, self.stream, self.drv
        for dst, src, n in after:
            drv.check(lib.cuMemcpyDtoDAsync_v2(dst, src, n, stream), "cuMemcpyDtoDAsync (output)")
        results: list[Any] = []
        n_in = len(m.inputs)
        for j, t in enumerate(m.outputs):
            src = self._io.ptr + b.io_offsets[n_in + j]
            shape, dt = out_shapes[j], np_dtype(t.dtype)
            nbytes = size_of(shape, t.dtype)
            if outputs is not None:
                results.append(outputs[j])
            elif device_outputs:
                d = DeviceArray.empty(drv, shape, dt, self._pool)
                if nbytes:
                    drv.check(lib.cuMemcpyDtoDAsync_v2(d.ptr, src, nbytes, stream), "cuMemcpyDtoDAsync (output)")
                results.append(d)
            else:
                a = np.empty(shape, dt)
                if nbytes:
                    r = lib.cuMemcpyDtoHAsync_v2(host_ptr(self._ffi, a), src, nbytes, stream)
                    drv.check(r, "cuMemcpyDtoHAsync", hint=f"output {t.name}")
                results.append(a)
        self._ids.copy_back(stream)
        r = lib.cuStreamSynchronize(stream)
        if r:
            raise drv.error(r, "cuStreamSynchronize", hint=f"after kernels {names(b.calls)}; pass debug_sync=True to name the failing one")
        del keep[:]
        self._ids.raise_if_bad(b.in_shapes)
        return results

    # -- helpers for callers and tests

    def to_host(self, value: Any) -> np.ndarray:
        """``Executor.to_host``: an output as a numpy array."""
        return value.numpy() if isinstance(value, DeviceArray) else np.asarray(value)

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
        """Free the GPU memory, graphs, modules and stream now (also done when the executor is collected).
        A call in flight on another thread holds the lock: close waits for it to finish, and later calls
        raise UsageError, so memory in use is never freed under a kernel."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            self._release()

    def _release(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        drv, lib = self.drv, self._lib
        if drv.broken is not None:
            return  # nothing can be released through a broken context
        drv.context(self.dev)
        lib.cuStreamSynchronize(self.stream)
        self._graphs.clear()
        self._pool.close()
        for r in (self._arena, self._io, self._gscratch, self._pscratch, self._weights_mem):
            r.release()
        if hasattr(self, "_ids"):  # absent when loading a kernel failed
            self._ids.release()
        for mod in self._modules:
            lib.cuModuleUnload(mod)
        lib.cuStreamDestroy_v2(self.stream)

    def __enter__(self) -> CudaExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(AotcError):
            self.close()
