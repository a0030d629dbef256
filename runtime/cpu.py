"""The CPU executor: a cffi (ABI mode) binding of a generated library and the choice of CPU target.

What it is: ``select_target`` (the best CPU target this machine runs, from the flags each target needs),
``CpuExecutor`` (loads the library's hash-checked bytes through a sealed memfd, checks its ABI version,
runs it with numpy arrays, a cached 64-byte-aligned arena and an error buffer). The C side of the contract
is ``cpp_templates/aotc_abi.h``; ``CDEF`` below declares the same three functions.
What it is not: input validation. ``aotc.model`` checks names, dtypes, shapes and symbol ranges before
calling ``run``; this module trusts what it is given.

Note: ``dlopen`` identifies libraries by the path string first. A ``/proc/self/fd/N`` path can name a
library loaded earlier through a since-reused fd (glibc keeps libraries with unique C++ symbols loaded
after dlclose), and dlopen would hand back that stale library. Each load therefore probes its path with
RTLD_NOLOAD and moves the memfd to another descriptor until the path is unused.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import json
import math
import os
import platform
import re
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .cpu_features import LEVEL_FEATURES, LEVELS, cpu_flags, cpu_level, missing_features
from .errors import DeviceError, IncompatiblePackage, InputMismatch, PackageCorrupt, UsageError
from .package import Package, aligned_empty
from .schema import INTERFACE_MARK, CpuTarget, Manifest, TensorSpec, cpu_interface, dtype_name, numpy_dtype, size_at

ABI_VERSION = 1  # AOTC_ABI_VERSION in cpp_templates/aotc_abi.h
CDEF = """
int32_t aotc_abi_version(void);
int32_t aotc_run(const int64_t* syms, const void* const* inputs, void* const* outputs,
                 const void* const* weights, void* arena, char* err, size_t errlen);
void aotc_set_num_threads(int32_t n);
int32_t aotc_pool_stats_get(int64_t* out, int32_t n);
"""
# CDEF parsed ahead of time (cffi's out-of-line ABI mode): parsing it at import would import pycparser,
# ~60 ms of a cold start. tests/test_ffi_modules.py regenerates the module and checks it matches CDEF.
from ._cffi_cpu import ffi as _ffi  # noqa: E402

_ERRLEN = 4096
# aotc_pool_stats_get's counters, in its order (struct aotc_pool_stats in cpp_templates/aotc_pool_loop.h)
POOL_STATS = (
    "calls", "loops", "stalls", "drops", "solo_calls", "probes", "wakes",
    "wait_ns", "loss_ns", "gain_ns", "worker_chunks", "chunks", "serial", "explores", "busy_skips", "moves", "pulls",
)  # fmt: skip
MAX_THREADS = 1024  # a pool this large is already far past any machine's cores; more only exhausts memory
_OPENMP_RUNTIMES = (b"libgomp.so.1", b"libomp.so", b"libomp.so.5", b"libiomp5.so")


def select_target(targets: Sequence[CpuTarget], flags: frozenset[str] | None = None, machine: str | None = None) -> CpuTarget:
    """The highest-level CPU target whose required features this CPU has."""
    machine = (machine or platform.machine()).lower()
    if not targets:
        raise IncompatiblePackage("the package has no CPU target: rebuild it with --target cpu (or cpu:native)")
    if machine not in ("x86_64", "amd64") or not sys.platform.startswith("linux"):
        raise IncompatiblePackage(f"the package's CPU targets are x86-64 Linux libraries; this machine is {sys.platform}/{machine}")
    have = cpu_flags() if flags is None else flags
    ranked = sorted(targets, key=lambda t: LEVELS.index(t.level), reverse=True)
    for t in ranked:
        if not missing_features(_needs(t), have):
            return t
    needs = "; ".join(f"cpu:{t.level} needs {', '.join(missing_features(_needs(t), have))}" for t in ranked)
    raise IncompatiblePackage(
        f"no CPU target of this package runs on this CPU ({cpu_level(have)}): {needs}. "
        f"Rebuild with --target cpu:{cpu_level(have)} (or cpu:native on this machine)"
    )


def _needs(t: CpuTarget) -> tuple[str, ...]:
    """The features a target needs: its level's, whatever its list says (a list edited to claim less must
    not let an AVX-512 library reach an AVX2 CPU), plus any extra it names."""
    return tuple(dict.fromkeys((*LEVEL_FEATURES[t.level], *t.features)))


def embedded_interface(code: bytes, name: str) -> str:
    """The interface text a library embeds after INTERFACE_MARK (``aotc.schema.interface_text``)."""
    at = code.find(INTERFACE_MARK)
    end = code.find(b"\0", at)
    if at < 0 or code.find(INTERFACE_MARK, at + 1) >= 0 or end < 0:
        raise PackageCorrupt(f"{name} carries no single aotc interface record: it was not built by this aotc; rebuild the package")
    try:
        return code[at + len(INTERFACE_MARK) : end].decode("ascii")
    except UnicodeDecodeError:
        raise PackageCorrupt(f"{name}: its interface record is not ASCII; rebuild the package") from None


def check_interface(code: bytes, m: Manifest, t: CpuTarget) -> None:
    """Refuse, before dlopen, a manifest that describes a library other than the one it holds: the sizes the
    code reads and writes are the ones it was built with, whatever the manifest says."""
    got, want = embedded_interface(code, t.library), cpu_interface(m, t)
    if got == want:
        return
    try:
        built = json.loads(got)
        said = json.loads(want)
        key = next((k for k in sorted(said) if said.get(k) != built.get(k)), "?")
        what = f"its {key} are {json.dumps(built.get(key))[:300]}, the manifest says {json.dumps(said.get(key))[:300]}"
    except (ValueError, RecursionError):
        what = "its interface record is malformed"
    raise PackageCorrupt(
        f"{t.library} was built for another interface than its manifest describes: {what}; "
        "the manifest was edited or the package is damaged: rebuild it"
    )


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc as (major, minor); None under another C library (musl)."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError):
        return None
    m = re.fullmatch(r"glibc (\d+)\.(\d+).*", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_glibc(target: CpuTarget, have: tuple[int, int] | None = None) -> None:
    """Refuse before dlopen, which would only say "version `GLIBC_2.36' not found"."""
    if not target.min_glibc:
        return
    need = tuple(int(x) for x in target.min_glibc.split("."))
    have = glibc_version() if have is None else have
    if have is None:
        raise IncompatiblePackage(
            f"{target.library} needs glibc {target.min_glibc} or newer; this machine has no glibc (musl?): "
            "run it on a glibc Linux, or build the package on one whose glibc is no newer than the target's"
        )
    if have < need:
        raise IncompatiblePackage(
            f"{target.library} needs glibc {target.min_glibc} or newer; this machine has {have[0]}.{have[1]}: "
            f"build the package on a machine whose glibc is {have[0]}.{have[1]} or older (the library takes "
            "the newest symbol versions of the build machine's glibc)"
        )


@functools.lru_cache(maxsize=1)
def _libdl() -> ctypes.CDLL:
    """libc's dlopen/dlclose, for the two calls cffi cannot make (see _is_loaded)."""
    libc = ctypes.CDLL(None)
    libc.dlopen.restype = ctypes.c_void_p
    libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.dlclose.argtypes = [ctypes.c_void_p]
    return libc


def _is_loaded(path: str) -> bool:
    """Whether dlopen already knows a library by this path. (cffi's dlopen crashes on the NULL that an
    RTLD_NOLOAD miss returns without a dlerror message, so this asks libc directly.)"""
    handle = _libdl().dlopen(path.encode(), os.RTLD_NOW | os.RTLD_NOLOAD)
    if not handle:
        return False
    _libdl().dlclose(handle)
    return True


def _pin_openmp() -> None:
    """Keep the OpenMP runtime a model library pulled in loaded for good. Its worker threads outlive every
    parallel region, sleeping inside it; unloading it with the last model library would crash the process.
    """
    for name in _OPENMP_RUNTIMES:
        _libdl().dlopen(name, os.RTLD_NOW | os.RTLD_NOLOAD | os.RTLD_NODELETE)


# Note: libraries built by this aotc run their loops on their own thread pool (cpp_templates/aotc_pool.h),
# which neither spins at barriers nor waits for a thread that another process keeps off its core. Older
# packages (same ABI) use OpenMP regions, whose threads spin 300000 rounds at each barrier before they
# sleep; on a machine where other processes keep the cores busy that spin steals the time slice the late
# thread needs: BERT (4 layers, 2 threads, load ~7 on 2 cores) measured 1956 ms a call with the default,
# 460 ms with 20000 rounds, 674 ms on one thread. So for them a short spin: libgomp reads this once, when
# the first library that needs it loads; a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
_GOMP_SPINCOUNT = "10000"


def _openmp_defaults() -> None:
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", _GOMP_SPINCOUNT)


def _dlopen_bytes(data: bytes, name: str) -> Any:
    """dlopen a library from memory: a sealed memfd, opened through /proc/self/fd (no file on disk)."""
    _openmp_defaults()
    if not hasattr(os, "memfd_create"):
        raise IncompatiblePackage(f"loading {name} needs memfd_create (Linux); this is {sys.platform}")
    fd = os.memfd_create(name.replace("/", "_"), os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    held = [fd]
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)  # nothing can change the checked bytes from here on
        while _is_loaded(f"/proc/self/fd/{held[-1]}"):
            held.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0))
        try:
            lib = _ffi.dlopen(f"/proc/self/fd/{held[-1]}", _ffi.RTLD_NOW | _ffi.RTLD_LOCAL)
            _pin_openmp()
            return lib
        except OSError as e:
            raise IncompatiblePackage(
                f"cannot load {name}: {e}. If it names a missing library such as libgomp.so.1, install the "
                f"GNU OpenMP runtime (e.g. apt-get install libgomp1)"
            ) from None
    finally:
        for h in held:  # the mapping keeps the library alive; the descriptors are not needed
            os.close(h)


def _thread_setting(num_threads: int | None, fixed: bool) -> int:
    """What ``aotc_set_num_threads`` takes: n > 0 at most n threads, adapting; 0 the default (every core),
    adapting; -n exactly n."""
    if num_threads is not None and (
        not isinstance(num_threads, int) or isinstance(num_threads, bool) or not 0 <= num_threads <= MAX_THREADS
    ):
        raise UsageError(
            f"num_threads must be an int from 0 to {MAX_THREADS} (0 or None: every core the process may use), got {num_threads!r}"
        )
    if fixed and not num_threads:
        raise UsageError("fixed_threads needs a thread count (num_threads >= 1)")
    return -int(num_threads or 0) if fixed else int(num_threads or 0)


class CpuExecutor:
    """One loaded CPU library with its weights; ``run`` is thread-safe (calls are serialised).

    ``num_threads``: at most this many threads per call (None or 0: every core the process may use, or
    OMP_NUM_THREADS). The library runs a call on one thread while the extra threads do not get a core
    (another process holds it) or while its calls measure faster on one thread, and tries the other way now
    and then (cpp_templates/aotc_pool.h); ``fixed_threads`` turns that off (benchmarks). ``pool_stats``
    shows what it did.
    """

    device = "cpu"

    def __init__(
        self,
        package: Package,
        target: CpuTarget,
        weights: Sequence[np.ndarray] | None = None,
        num_threads: int | None = None,
        fixed_threads: bool = False,
    ) -> None:
        threads = _thread_setting(num_threads, fixed_threads)
        if target.abi_version != ABI_VERSION:
            raise IncompatiblePackage(
                f"{target.library} uses aotc C ABI version {target.abi_version}; this runtime speaks version "
                f"{ABI_VERSION}: rebuild the package with this aotc, or install the aotc it was built with"
            )
        self.target = f"cpu:{target.level}"
        self.spec = target
        self._symbols = [s.name for s in package.manifest.symbols]
        self._n_in, self._n_out = len(package.manifest.inputs), len(package.manifest.outputs)
        self._out_dtypes = [numpy_dtype(o.dtype) for o in package.manifest.outputs]
        self._weights = list(package.weights() if weights is None else weights)
        if target.packed is not None:  # the library reads them after the manifest's weights
            self._weights += package.weights(target.packed)
        for w in self._weights:
            if w.ctypes.data % 64 and w.size:
                raise ValueError("weights must be 64-byte aligned (the C ABI promises it)")
        check_glibc(target)
        code = package.read(target.library)  # the sha256 check happens here, before dlopen sees a byte
        check_interface(code, package.manifest, target)
        self._lib = _dlopen_bytes(code, target.library)
        # cffi never dlcloses on its own; without this every load would leak a mapped library.
        self._close = weakref.finalize(self, _ffi.dlclose, self._lib)
        self._close.atexit = False  # at exit a daemon thread may still be inside the library
        got = int(self._lib.aotc_abi_version())
        if got != target.abi_version:
            raise IncompatiblePackage(
                f"{target.library} reports aotc ABI version {got}, the manifest says {target.abi_version}: rebuild the package"
            )
        self._threads = threads
        self._lib.aotc_set_num_threads(self._threads)
        self._lock = threading.Lock()
        self._arena = aligned_empty(0)
        self._err = _ffi.new("char[]", _ERRLEN)
        self._w = _ffi.new("void*[]", [_ffi.cast("void*", w.ctypes.data) for w in self._weights] or [_ffi.NULL])
        self._in = _ffi.new("void*[]", max(self._n_in, 1))
        self._out = _ffi.new("void*[]", max(self._n_out, 1))
        self._syms = _ffi.new("int64_t[]", max(len(self._symbols), 1))

    @property
    def num_threads(self) -> int | None:
        """The thread setting: at most this many threads per call (None: every core the process may use)."""
        return abs(self._threads) or None

    def set_threads(self, num_threads: int | None, fixed_threads: bool = False) -> None:
        """Change the thread count after loading; calls from the next one on use it (``__init__`` says how)."""
        threads = _thread_setting(num_threads, fixed_threads)
        with self._lock:
            self._threads = threads

    def pool_stats(self) -> dict[str, int] | None:
        """The library's thread-pool counters since it loaded (calls, loops, stalls, solo calls, ...: see
        ``aotc_pool_stats`` in cpp_templates/aotc_pool_loop.h); None for a library built before they existed."""
        with self._lock:
            if not self._close.alive:
                raise UsageError("this model was closed; load the package again")
            try:
                get = self._lib.aotc_pool_stats_get
            except (AttributeError, _ffi.error):  # cffi: "symbol ... not found in library"
                return None
            buf = _ffi.new("int64_t[]", len(POOL_STATS))
            have = int(get(buf, len(POOL_STATS)))
            return {name: int(buf[i]) for i, name in enumerate(POOL_STATS[:have])}

    # -- the Executor protocol used by aotc.model --

    def accept(self, value: Any, spec: TensorSpec) -> tuple[np.ndarray, tuple[int, ...], str]:
        """An input as a numpy array, its shape, and its dtype name for checking (no conversion of values)."""
        try:
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        except Exception as e:
            raise InputMismatch(
                f"input {spec.name!r}: cannot be read as a numpy array ({type(e).__name__}: {e}); pass a "
                f"numpy array (CPU tensors of other libraries convert with numpy.asarray)"
            ) from None
        return arr, tuple(arr.shape), dtype_name(arr.dtype) or arr.dtype.str

    def execute(self, inputs: Sequence[np.ndarray], env: Mapping[str, int], out_shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        arena = size_at(self.spec.arena_bytes, env, f"{self.target} arena_bytes")
        try:
            outs = [np.empty(s, d) for s, d in zip(out_shapes, self._out_dtypes, strict=True)]
            self.run(inputs, [env[s] for s in self._symbols], outs, arena)
        except MemoryError:
            total = arena + sum(math.prod(s) * d.itemsize for s, d in zip(out_shapes, self._out_dtypes, strict=True))
            raise DeviceError(f"out of memory: this call needs {total:,} bytes for its outputs and scratch; pass smaller inputs") from None
        return outs

    def to_host(self, value: np.ndarray) -> np.ndarray:
        return value

    def close(self) -> None:
        """Unload the library now (otherwise when the executor is garbage-collected)."""
        with self._lock:
            self._close()

    # -- the raw call --

    def run(
        self,
        inputs: Sequence[np.ndarray],
        syms: Sequence[int],
        outputs: Sequence[np.ndarray],
        arena_bytes: int,
    ) -> None:
        """One call of ``aotc_run``. Inputs are made C-contiguous and aligned (copied only when they are not);
        outputs must be C-contiguous arrays of the evaluated output shapes."""
        ins = [a if a.flags.c_contiguous and a.flags.aligned else np.ascontiguousarray(a) for a in inputs]
        if len(ins) != self._n_in or len(outputs) != self._n_out or len(syms) != len(self._symbols):
            raise ValueError("wrong number of inputs, outputs or symbols for this library")
        with self._lock:
            if not self._close.alive:
                raise UsageError("this model was closed; load the package again")
            if arena_bytes > self._arena.size:
                self._arena = aligned_empty(-(-arena_bytes // 4096) * 4096)
            for i, a in enumerate(ins):
                self._in[i] = _ffi.cast("void*", a.ctypes.data)
            for i, o in enumerate(outputs):
                if not o.flags.c_contiguous or not o.flags.writeable:
                    raise ValueError("outputs must be writeable C-contiguous arrays")
                self._out[i] = _ffi.cast("void*", o.ctypes.data)
            for i, v in enumerate(syms):
                self._syms[i] = v
            # Packages built before the thread pool keep the count in OpenMP's per-thread setting: set it on
            # the thread that runs.
            self._lib.aotc_set_num_threads(self._threads)
            arena = _ffi.cast("void*", self._arena.ctypes.data) if arena_bytes else _ffi.NULL
            self._err[0] = b"\0"
            rc = self._lib.aotc_run(self._syms, self._in, self._out, self._w, arena, self._err, _ERRLEN)
            if rc != 0:
                msg = _ffi.string(self._err).decode("utf-8", "replace") or "no message"
                raise DeviceError(f"{self.spec.library} failed with code {rc}: {msg}")
