"""Hide AVX-512 and AMX from CPUID while a block runs (benchmarks/cpuid_mask.c): an AVX2-only CPU, as seen by
a library that picks its kernels by CPUID when it first looks (ONNX Runtime's MLAS).

    with cpuid_masked():
        sess = onnxruntime.InferenceSession(...); sess.run(...)   # MLAS sets itself up for AVX2

Needs Linux's CPUID faulting (``cpuid_fault`` in /proc/cpuinfo) and gcc; ``available()`` says whether
both are there. The mask covers the calling thread and the threads it starts inside the block (ONNX
Runtime's pool); code that looked at CPUID earlier, or that reads XCR0, sees the real machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SOURCE = Path(__file__).with_name("cpuid_mask.c")
AVX512F = 1 << 16  # CPUID leaf 7 EBX


def available() -> bool:
    try:
        if "cpuid_fault" not in Path("/proc/cpuinfo").read_text().split():
            return False
        _lib()  # gcc builds it
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


@functools.cache
def _lib() -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp(prefix="cpuid_mask_")) / "cpuid_mask.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(SOURCE), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.cpuid_mask_set.argtypes = [ctypes.c_int]
    lib.cpuid_mask_trapped.restype = ctypes.c_long
    lib.cpuid_mask_leaf7_ebx.restype = ctypes.c_uint
    return lib


@contextlib.contextmanager
def cpuid_masked() -> Iterator[None]:
    """CPUID without AVX-512/AMX on this thread (and threads started meanwhile) for the block."""
    lib = _lib()
    if lib.cpuid_mask_set(1) != 0:
        raise OSError("CPUID faulting is not available (no cpuid_fault in /proc/cpuinfo)")
    try:
        if lib.cpuid_mask_leaf7_ebx() & AVX512F:
            raise OSError("CPUID still reports AVX-512F with the mask on")
        yield
    finally:
        lib.cpuid_mask_set(0)


def trapped() -> int:
    """CPUID instructions answered by the mask so far."""
    return int(_lib().cpuid_mask_trapped())
