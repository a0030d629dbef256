"""Kernel launches for the CUDA executor: device regions, argument packing at PTX widths, the launch loop.

What it is: ``Region`` (one growable device allocation), ``Call`` (one launch with its arguments packed
into 8-byte slots), ``pack`` (a manifest ``Launch`` → ``Call`` for one symbol binding; pointer slots are
filled later by ``repack``, since buffers move) and ``launch_all``. Pointer slots name buffers by a small
integer (the executor numbers every buffer once), so the per-call pointer table is a plain list. What it is not: the executor
(``aotc.cuda``), which decides where buffers live, or graph capture (``aotc.cuda_graph``).
"""

from __future__ import annotations

import struct
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import shapes
from .cuda_driver import (
    CLUSTER_POLICY_SPREAD,
    LAUNCH_ATTR_CLUSTER_DIM,
    LAUNCH_ATTR_CLUSTER_POLICY,
    LAUNCH_ATTR_COOPERATIVE,
    LAUNCH_ATTR_PDL,
    Driver,
)
from .errors import DeviceError, InputMismatch
from .schema import Kernel, Launch, Ref

ALIGN = 256
_PACK = {"i1": "<B", "i8": "<b", "u8": "<B", "i16": "<h", "i32": "<i", "i64": "<q", "f16": "<e", "f32": "<f",
         "f64": "<d"}  # fmt: skip

# A pointer slot's buffer: a manifest Ref, or the name of a scratch region ("global_scratch", ...).
Slot = Ref | str


def up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


class Region:
    """One growable device allocation (arena, staging, scratch)."""

    def __init__(self, drv: Driver, what: str) -> None:
        self.drv, self.what, self.ptr, self.size = drv, what, 0, 0

    def ensure(self, n: int) -> bool:
        """Make room for ``n`` bytes; True when the allocation moved."""
        if n <= self.size and self.ptr:
            return False
        self.drv.free(self.ptr)
        self.ptr = 0
        size = max(up(n), up(self.size + self.size // 4))
        self.ptr = self.drv.alloc(size, self.what)
        self.size = size
        return True

    def release(self) -> None:
        self.drv.free(self.ptr)
        self.ptr = self.size = 0


@dataclass
class Call:
    """One launch with its arguments packed: 8-byte slots, ``argv`` pointing at each."""

    kernel: str
    func: Any
    grid: tuple[int, int, int]  # gridDimX already multiplied by num_ctas
    block: int
    shared: int
    slots: Any  # uint64_t[n]
    argv: Any  # void*[n]
    ptr_slots: list[tuple[int, int]]  # (parameter index, buffer number)
    config: Any = None  # CUlaunchConfig* when cuLaunchKernelEx is needed
    keep: list[Any] = field(default_factory=list)


def pack(
    drv: Driver, func: Any, k: Kernel, launch: Launch, grid: tuple[int, int, int], env: Mapping[str, int], number: Mapping[Slot, int]
) -> Call:
    """``launch`` of kernel ``k`` (function ``func``) with its scalars packed for ``env``; ``number`` gives each
    buffer's number in the executor's pointer table."""
    ffi = drv.ffi
    n = len(k.params)
    slots = ffi.new("uint64_t[]", max(1, n))
    argv = ffi.new("void *[]", max(1, n))
    base = int(ffi.cast("uintptr_t", slots))
    view = ffi.buffer(slots)
    ptr_slots: list[tuple[int, int]] = []
    for j in range(n):
        argv[j] = ffi.cast("void *", base + 8 * j)
    for j, (a, p) in enumerate(zip(launch.args, k.params, strict=False)):
        if a.buffer is not None:
            ptr_slots.append((j, number[a.buffer]))
            continue
        value: Any = a.value if a.expr is None else shapes.evaluate(a.expr, env)
        try:
            if p.kind == "bf16":
                import ml_dtypes

                struct.pack_into("<H", view, 8 * j, int(np.array(value, ml_dtypes.bfloat16).view(np.uint16)))
            else:
                struct.pack_into(_PACK[p.kind], view, 8 * j, bool(value) if p.kind == "i1" else value)
        except (struct.error, OverflowError, TypeError) as e:
            raise InputMismatch(f"argument {j} of kernel {k.name} ({a.expr or a.value!r}) does not fit {p.kind}: {e}") from None
    for j in range(k.num_args, n):
        ptr_slots.append((j, number[k.params[j].kind]))
    call = Call(k.name, func, grid, 32 * k.num_warps, k.shared, slots, argv, ptr_slots)
    if k.num_ctas > 1 or k.launch_cooperative_grid or k.launch_pdl:
        call.config, call.keep = _config(drv, k, grid)
    return call


def _config(drv: Driver, k: Kernel, grid: tuple[int, int, int]) -> tuple[Any, list[Any]]:
    """The cuLaunchKernelEx configuration: clusters, programmatic dependent launch, cooperative grids."""
    ffi = drv.ffi
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
        attrs[na].value.clusterDim.x, attrs[na].value.clusterDim.y, attrs[na].value.clusterDim.z = k.num_ctas, 1, 1
        attrs[na + 1].id = LAUNCH_ATTR_CLUSTER_POLICY
        attrs[na + 1].value.clusterSchedulingPolicyPreference = CLUSTER_POLICY_SPREAD
        na += 2
    cfg = ffi.new("CUlaunchConfig *")
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 32 * k.num_warps, 1, 1
    cfg.sharedMemBytes = k.shared
    cfg.attrs = attrs
    cfg.numAttrs = na
    return cfg, [attrs]


def repack(calls: Sequence[Call], ptrs: Sequence[int], names: Sequence[str], scratch: Container[int]) -> None:
    """Write the buffers' device pointers (``ptrs``, by buffer number) into the pointer slots; every buffer a
    kernel sees is 16-byte aligned (the builder promised Triton so), ``scratch`` buffers aside."""
    for c in calls:
        for j, slot in c.ptr_slots:
            v = ptrs[slot]
            if v % 16 and slot not in scratch:
                raise DeviceError(f"buffer {names[slot]} of kernel {c.kernel} is at {v:#x}, not 16-byte aligned")
            c.slots[j] = v


def launch_all(drv: Driver, calls: Sequence[Call], stream: Any, debug_sync: bool) -> None:
    lib, null = drv.lib, drv.ffi.NULL
    for c in calls:
        if c.config is None:
            r = lib.cuLaunchKernel(c.func, c.grid[0], c.grid[1], c.grid[2], c.block, 1, 1, c.shared, stream, c.argv, null)
        else:
            c.config.hStream = stream
            r = lib.cuLaunchKernelEx(c.config, c.func, c.argv, null)
        if r:
            raise drv.error(r, "cuLaunchKernel", c.kernel)
        if debug_sync:
            drv.check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize after launch", c.kernel)


def names(calls: Sequence[Call]) -> str:
    """The kernels of a launch sequence, for error messages."""
    ks = [c.kernel for c in calls]
    return ", ".join(ks[:8]) + (f" and {len(ks) - 8} more" if len(ks) > 8 else "")
