"""Which CUDA target of a package runs on this machine's GPU, and whether one can run at all.

What it is: ``available()``, ``device_info()``, ``runs_on(arch, device)``, ``pick_target(targets)`` and
``choose(targets)`` (a target whose cubins run on the GPU first, else one whose PTX the driver compiles for
it, ``aotc.cuda_ptx``), and ``check_driver`` (a driver older than the cubins need is refused).
``aotc.cuda`` re-exports them as the entry points ``aotc.load`` and the tools use.
What it is not: loading or running the target (``aotc.cuda.CudaExecutor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import cuda_ptx
from .cuda_driver import Device, Driver, driver
from .errors import AotcError, IncompatiblePackage
from .schema import CudaTarget


def available() -> bool:
    """Whether this process can run CUDA targets: libcuda loads, initialises and sees a GPU. Never raises."""
    try:
        return driver().device_count() > 0
    except AotcError:
        return False


def device_info(device: int = 0) -> dict[str, Any]:
    """Name, arch, driver version and memory of a GPU (for benchmark records)."""
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


def pick_target(targets: Sequence[CudaTarget], device: int = 0) -> CudaTarget | None:
    """The CUDA target that runs on GPU ``device``, or None when there is none to choose from.

    Raises ``IncompatiblePackage`` when there is no libcuda, no cubin (nor PTX) for this GPU's arch, or the
    driver is older than the cubins need."""
    return choose(targets, device)[0]


def choose(targets: Sequence[CudaTarget], device: int = 0) -> tuple[CudaTarget | None, bool]:
    """``pick_target``, and whether the target runs through the driver's JIT: a target whose cubins run on
    this GPU first; else one whose PTX compiles for it (``aotc.cuda_ptx``)."""
    if not targets:
        return None, False
    drv = driver()
    dev = drv.device(device)
    fits = [t for t in targets if runs_on(t.arch, dev) and all(k.member is not None for k in t.kernels)]
    if fits:
        t = max(fits, key=lambda t: (t.sm == dev.sm, t.sm))
        check_driver(t, drv)
        return t, False
    jit = cuda_ptx.pick(targets, dev)
    if jit is not None:
        return jit, True
    have = ", ".join(sorted(t.arch for t in targets))
    raise IncompatiblePackage(
        f"the package has CUDA code for {have}, but GPU {device} ({dev.name}) is {dev.arch} and no cubin or PTX "
        f"of the package runs on it: rebuild with `aotc build --target cuda:{dev.arch}`"
    )


def check_driver(t: CudaTarget, drv: Driver) -> None:
    """Refuses a driver older than ``t``'s cubins need (``IncompatiblePackage``, with the fix)."""
    if drv.version < t.min_driver:
        have = f"{drv.version // 1000}.{drv.version % 1000 // 10}"
        need = f"{t.min_driver // 1000}.{t.min_driver % 1000 // 10}"
        raise IncompatiblePackage(
            f"the NVIDIA driver supports CUDA {have}, but the package's {t.arch} cubins (ptxas {t.ptxas_version}) "
            f"need CUDA {need}: update the driver, or rebuild with a Triton whose ptxas is {have} or older"
        )
