"""Weights packed at build time for the CPU matmul micro-kernel (cpp_templates/matmul.h).

What it is: ``pack_plan`` (a pure rewrite of a Plan for one CPU level: every matmul whose B operand is a
weight seen through a constant view reads a new packed weight instead) and ``pack_array`` (the packed
values, computed from the weight's values by the builder, or by tests from random weights). The packed
tensors go into the CPU target's own safetensors member; the library takes them after the manifest's
weights, so loading them is a mmap like any weight, and no call repacks a panel.
What it is not: a layout pass for activations (they stream), nor anything a CUDA target sees. A package
with CPU targets only leaves out the original of a weight that only packed matmuls read (``packed_only``).

Note: the panel is [ceil(N / NR)][K][NR] in fp32 (a bf16/f16 weight is widened once here rather than on
every call), zero past N, with NR = AOTC_MM_NR_F32 of the level's vector width; the generated code
static_asserts that its header agrees.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import sympy

from .. import kernel as K
from ..ir import DType

PANEL = {"x86-64-v2": 8, "x86-64-v3": 16, "x86-64-v4": 32}  # AOTC_MM_NR_F32 at each level


@dataclass(frozen=True)
class Packing:
    """One packed weight: buffer ``name`` holds B[k, n] = source[offset + k*sk + n*sn] as panels of ``nr``."""

    name: str
    source: str
    offset: int
    sk: int
    sn: int
    k: int
    n: int
    nr: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (-(-self.n // self.nr), self.k, self.nr)


def _int(e: sympy.Expr | int) -> int | None:
    return int(e) if isinstance(e, int) or (isinstance(e, sympy.Expr) and e.is_Integer) else None


def _packable(k: K.Kernel, weights: set[str]) -> tuple[int, int, int, int, int] | None:
    """(offset, sk, sn, K, N) when ``k`` is a float matmul over a constant view of a weight."""
    if not isinstance(k, K.Matmul) or k.packed or k.b.buf not in weights:
        return None
    dts = (k.a.dtype, k.b.dtype)
    if DType.f64 in dts or not any(d.is_float for d in dts) or not k.b.dtype.is_float:
        return None
    got = [_int(e) for e in (k.b.offset, *k.b.strides, k.k, k.n)]
    ints = [v for v in got if v is not None]
    if len(ints) != 5 or ints[3] == 0 or ints[4] == 0:
        return None
    offset, sk, sn, kk, n = ints
    return offset, sk, sn, kk, n


def pack_plan(plan: K.Plan, level: str) -> tuple[K.Plan, list[Packing]]:
    """``plan`` with weight matmuls reading packed weights (appended to its weights), and the packings."""
    nr = PANEL[level]
    names = {b.name for b in plan.weights}
    taken = {b.name for b in (*plan.inputs, *plan.outputs, *plan.weights, *plan.arena)}
    labels_taken = set(plan.labels.values())
    found: dict[tuple[str, int, int, int, int, int], Packing] = {}
    kernels: list[K.Kernel] = []
    labels = dict(plan.labels)
    for k in plan.kernels:
        view = _packable(k, names)
        if view is None:
            kernels.append(k)
            continue
        assert isinstance(k, K.Matmul)
        key = (k.b.buf, *view)
        if key not in found:
            name, label, j = f"{k.b.buf}_packed", f"{plan.labels.get(k.b.buf, k.b.buf)}.packed{nr}", 1
            while name in taken or label in labels_taken:
                name, label, j = f"{k.b.buf}_packed{j}", f"{plan.labels.get(k.b.buf, k.b.buf)}.packed{nr}.{j}", j + 1
            taken.add(name)
            labels_taken.add(label)
            labels[name] = label
            found[key] = Packing(name, k.b.buf, *view, nr)
        p = found[key]
        b = K.Strided(p.name, sympy.Integer(0), (sympy.Integer(nr), sympy.Integer(1)), DType.f32)
        kernels.append(replace(k, b=b, packed=True))
    if not found:
        return plan, []
    packs = list(found.values())
    extra = [K.Buffer(p.name, DType.f32, p.shape, "weight") for p in packs]
    prog = K.Program(plan.symbols, plan.inputs, plan.outputs, [*plan.weights, *extra], plan.arena, kernels, labels)
    return K.Plan.of(prog, plan.arena_offsets, plan.arena_size), packs


def pack_array(p: Packing, weight: np.ndarray) -> np.ndarray:
    """The packed values of ``p`` from its source weight's values (any float dtype, C-contiguous)."""
    flat = np.ascontiguousarray(weight).reshape(-1).astype(np.float32)
    idx = p.offset + np.arange(p.k)[:, None] * p.sk + np.arange(p.n)[None, :] * p.sn
    if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
        raise ValueError(f"packing {p.source}: the matmul's view reaches outside the weight")
    b = flat[idx]  # [K, N]
    panels, _, nr = p.shape
    out = np.zeros((p.k, panels * nr), np.float32)
    out[:, : p.n] = b
    return np.ascontiguousarray(out.reshape(p.k, panels, nr).transpose(1, 0, 2))


def without(plan: K.Plan, names: set[str]) -> K.Plan:
    """``plan`` without the weights ``names`` (which no kernel of it reads)."""
    assert not any(names & K.reads(k) for k in plan.kernels), "dropping a weight a kernel reads"
    prog = K.Program(plan.symbols, plan.inputs, plan.outputs, [w for w in plan.weights if w.name not in names],
                     plan.arena, plan.kernels, plan.labels)  # fmt: skip
    return K.Plan.of(prog, plan.arena_offsets, plan.arena_size)


def packed_only(packed: list[tuple[K.Plan, list[Packing]]]) -> set[str]:
    """Weights that every given plan reads only through their packed copies: a package whose every target
    is one of these plans need not carry them (for a CUDA target, pass nothing: it reads them all)."""
    sources = {p.source for _, packs in packed for p in packs}
    read = {b for plan, _ in packed for k in plan.kernels for b in K.reads(k)}
    return sources - read
