"""PTX for the driver's JIT: which GPUs a CUDA target's PTX runs on, and the checks before the driver sees it.

What it is: ``jit_runs_on`` (the selection rule) and ``pick`` (the target it picks), ``check_target`` (a
target whose kernels all carry PTX; the note the CLI tells the user), ``image`` (the member's ``.version``
and ``.target`` read from its hash-checked text, the driver's version compared with what that PTX ISA
needs, before the driver sees it). ``aotc.cuda`` loads PTX only when no cubin of the package runs on the
GPU: a GPU newer than the package, or a package whose cubins were left out.
What it is not: a PTX compiler. The driver compiles it (cuModuleLoadData), and caches the result on disk
(``~/.nv/ComputeCache``), so only the first load on a machine pays for it.

Note: Triton writes arch-specific PTX from sm_90 on (``.target sm_90a``: wgmma, TMA), which the driver
compiles only for exactly that SM; PTX for sm_80 and older (``.target sm_80``) compiles for any newer GPU.
A package meant for GPUs that do not exist yet therefore carries a ``cuda:sm_80`` target besides its sm_90
one: the sm_90 cubins run on an H100/H200, the sm_80 PTX on anything newer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .cuda_driver import Device, Driver
from .errors import IncompatiblePackage, PackageCorrupt
from .schema import CudaTarget, Kernel

# The CUDA version (cuDriverGetVersion form) that first understood each PTX ISA version.
ISA_CUDA = {
    (7, 8): 11080, (8, 0): 12000, (8, 1): 12010, (8, 2): 12020, (8, 3): 12030, (8, 4): 12040,
    (8, 5): 12050, (8, 6): 12070, (8, 7): 12080, (8, 8): 12090, (9, 0): 13000, (9, 1): 13010,
}  # fmt: skip
_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)\s*$", re.M)
_TARGET = re.compile(rb"^\s*\.target\s+(sm_\d+a?)\b", re.M)
HEAD = 4096  # .version and .target come first, after comments
JIT_COMPILER_NOT_FOUND = 221  # cuModuleLoadData's answer where the driver has no PTX compiler


def jit_runs_on(arch: str, dev: Device) -> bool:
    """Whether the PTX of a target for ``arch`` compiles for ``dev``: arch-specific PTX (sm_90 and newer,
    as Triton writes it) only for that SM; older PTX for that SM or any newer one."""
    sm = int(arch.removeprefix("sm_").rstrip("a"))
    if sm >= 90 or arch.endswith("a"):
        return sm == dev.sm
    return sm <= dev.sm


def has_ptx(t: CudaTarget) -> bool:
    return bool(t.kernels) and all(k.ptx is not None for k in t.kernels)


def pick(targets: Sequence[CudaTarget], dev: Device) -> CudaTarget | None:
    """The target whose PTX compiles for ``dev`` (one for this very SM first, else the newest), or None."""
    jit = [t for t in targets if has_ptx(t) and jit_runs_on(t.arch, dev)]
    return max(jit, key=lambda t: (t.sm == dev.sm, t.sm)) if jit else None


def check_target(t: CudaTarget, dev: Device, stripped: bool) -> str:
    """The note for the user about running ``t``'s PTX on ``dev`` (``stripped``: the package holds no cubins
    for ``t``); ``IncompatiblePackage`` when a kernel has no PTX."""
    if not has_ptx(t):
        raise IncompatiblePackage(f"the {t.arch} target has kernels with neither a cubin nor PTX: rebuild the package")
    return note(t, dev, stripped)


def image(data: bytes, t: CudaTarget, k: Kernel, dev: Device, drv: Driver) -> bytes:
    """Kernel ``k``'s PTX member, checked (``check_ptx``) and ready for cuModuleLoadData."""
    check_ptx(data, t, k, dev, drv)
    return data + b"\0"  # the driver reads PTX as a C string


def needed_driver(isa: tuple[int, int]) -> int:
    """The driver version (CUDA major*1000 + minor*10) whose JIT reads this PTX ISA version."""
    if isa in ISA_CUDA:
        return ISA_CUDA[isa]
    newest = max(ISA_CUDA)
    if isa < newest:
        return min(v for k, v in ISA_CUDA.items() if k >= isa)
    return 13000 + (isa[0] - 9) * 1000 + isa[1] * 10  # past the table: ISA 9.x is CUDA 13.x so far


def check_ptx(image: bytes, t: CudaTarget, k: Kernel, dev: Device, drv: Driver) -> None:
    """The PTX member is PTX for this target's SM, in an ISA version this driver reads, before the driver
    sees it: a refusal names the versions and the fix, instead of a JIT error code."""
    head = image[:HEAD]
    version, target = _VERSION.search(head), _TARGET.search(head)
    if version is None or target is None or b"\0" in image:
        raise PackageCorrupt(f"member {k.ptx} (kernel {k.name}) is not PTX text (no .version/.target line)")
    got = target.group(1).decode()
    if got.rstrip("a") != t.arch.rstrip("a"):
        raise PackageCorrupt(f"member {k.ptx} is PTX for {got}, but the target says {t.arch}")
    isa = (int(version.group(1)), int(version.group(2)))
    need = needed_driver(isa)
    if drv.version < need:
        raise IncompatiblePackage(
            f"the NVIDIA driver supports CUDA {_cuda(drv.version)}, but the package's {t.arch} PTX (ISA {isa[0]}.{isa[1]}) "
            f"needs CUDA {_cuda(need)} to compile for {dev.name} ({dev.arch}): update the driver, or rebuild with "
            f"`aotc build --target cuda:{dev.arch}`"
        )


def note(t: CudaTarget, dev: Device, stripped: bool) -> str:
    why = "the package holds no cubins for it" if stripped else f"no cubin in the package runs on {dev.arch}"
    return (
        f"running the {t.arch} PTX through the driver's JIT compiler on {dev.name} ({dev.arch}): {why}; the first "
        f"load compiles it (the driver caches the result); `aotc build --target cuda:{dev.arch}` avoids this"
    )


def _cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"
