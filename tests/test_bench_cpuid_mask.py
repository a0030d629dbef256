"""benchmarks/cpuid_mask.py, the AVX2 stand-in's CPUID mask for ONNX Runtime (cpu_side_by_side.py --avx2): inside
the block CPUID hides AVX-512 on the calling thread and on threads started there, other faults still reach
their handler, and after the block the calling thread sees the machine again. Runs in a child process (the mask
installs a SIGSEGV handler). Skipped where Linux offers no CPUID faulting or the CPU has no AVX-512 to hide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cpuid_mask  # noqa: E402

CHILD = """
import sys, threading
sys.path.insert(0, sys.argv[1])
import cpuid_mask
lib = cpuid_mask._lib()
before = lib.cpuid_mask_leaf7_ebx() & cpuid_mask.AVX512F
seen = []
with cpuid_mask.cpuid_masked():
    inside = lib.cpuid_mask_leaf7_ebx() & cpuid_mask.AVX512F
    t = threading.Thread(target=lambda: seen.append(lib.cpuid_mask_leaf7_ebx() & cpuid_mask.AVX512F))
    t.start()
    t.join()
after = lib.cpuid_mask_leaf7_ebx() & cpuid_mask.AVX512F
print(bool(before), bool(inside), bool(seen[0]), bool(after), cpuid_mask.trapped() >= 2)
import ctypes
ctypes.string_at(8)  # a real segfault still kills the process
"""


def _has_avx512() -> bool:
    return "avx512f" in Path("/proc/cpuinfo").read_text().split()


@pytest.mark.skipif(not (cpuid_mask.available() and _has_avx512()), reason="no CPUID faulting or no AVX-512 here")
def test_the_mask_hides_avx512_inside_the_block_only() -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "benchmarks")], capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.stdout.split() == ["True", "False", "False", "True", "True"], r.stdout + r.stderr
    assert r.returncode < 0, "a segfault that is not CPUID's must not be swallowed"
