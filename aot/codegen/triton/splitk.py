"""Split-K for skinny matmuls on a GPU target: a Matmul whose output tiles leave most SMs idle while K is
long becomes a batched Matmul over K slices writing fp32 partial sums to an arena workspace, then a Pointwise
kernel that adds the slices in a fixed order and runs the original epilogue once. Deterministic: no atomics.

What it is: ``split_factor`` (the decision, from the tile cost model of configs.py) and ``split_k`` (the
Program rewrite, done per CUDA target before its memory plan, so CPU targets keep the plain Matmul).
What it is not: stream-K, or a split of batched matmuls and convs (their batch or M fills the chip already).

Note: the split is expressed with the IR kernels that exist, so every backend and the kernel interpreter
run the rewritten Program unchanged: slice ``s`` is batch element ``i0`` of a Matmul with K/S columns whose
operand offsets move by ``i0 * K/S`` along K; the sum kernel's loop variables (i0 = m, i1 = n) are the ones
the epilogue's stores were written over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any

import sympy

from ... import kernel as K
from ...ir import DType, Op
from ...options import BuildOptions
from .configs import PEAK, SM_COUNT, Shape, estimate_ms, heuristic
from .sizes import example

SPLITS = (2, 4, 8)  # more slices: the partial sums outweigh what the extra CTAs win
MIN_SLICE = 256  # K columns a slice keeps: below that the partial sums cost more than they save
LAUNCH_MS = 0.003  # the sum kernel's launch and tail, on top of its memory traffic
GAIN = 0.8  # split only when the model says it takes at most this fraction of the plain kernel's time


def split_factor(s: Shape, sm: int) -> int:
    """How many K slices ``s`` should run as on ``sm`` (1: none)."""
    if s.kind != "matmul" or s.batch != 1 or s.mode not in ("f16", "tf32", "f32") or sm < 80:
        return 1
    sms = SM_COUNT.get(sm, 108)
    plain = estimate_ms(heuristic(s, sm), s, sm)
    hbm = PEAK.get(sm, PEAK[80] if sm < 90 else PEAK[90])[2]
    best, best_ms = 1, plain * GAIN
    for n in SPLITS:
        if s.k % (n * 64) or s.k // n < MIN_SLICE:
            continue
        part = Shape("matmul", s.mode, s.m, s.n, s.k // n, n)
        c = heuristic(part, sm)
        if -(-s.m // c.block_m) * -(-s.n // c.block_n) >= sms:
            continue  # one slice alone fills the chip: nothing to win
        total = estimate_ms(c, part, sm) + LAUNCH_MS + 1e3 * (n + 1) * s.m * s.n * 4 / (hbm * 1e12 * 0.5)
        if total < best_ms:
            best, best_ms = n, total
    return best


def split_k(
    prog: K.Program, sm: int, options: BuildOptions, decide: Callable[[Shape, int], int] = split_factor
) -> K.Program:
    """``prog`` with every Matmul that ``decide`` (``split_factor``) splits rewritten (``prog`` itself when none is)."""
    from .templates.matmul import shape

    kernels: list[K.Kernel] = []
    arena = list(prog.arena)
    for k in prog.kernels:
        n = 1
        if isinstance(k, K.Matmul) and not k.batch and k.a.dtype in (DType.f32, DType.f16, DType.bf16):
            kk = example(prog, k.k)
            if sympy.sympify(k.k).is_Integer and kk == int(k.k):
                n = decide(shape(prog, k, options), sm)
        if n == 1:
            kernels.append(k)
            continue
        assert isinstance(k, K.Matmul)
        ws = K.Buffer(f"{k.name}_partials", DType.f32, (n, k.m, k.n), "arena")
        arena.append(ws)
        kernels.extend(_split(k, n, ws.name))
    if len(kernels) == len(prog.kernels):
        return prog
    return K.Program(prog.symbols, prog.inputs, prog.outputs, prog.weights, arena, kernels, prog.labels)


def _split(k: K.Matmul, n: int, ws: str) -> tuple[K.Matmul, K.Pointwise]:
    i0, i1, i2 = K.loop_vars("i", 3)
    part = int(k.k) // n
    a = replace(k.a, offset=k.a.offset + i0 * part * k.a.strides[1])
    b = replace(k.b, offset=k.b.offset + i0 * part * k.b.strides[0])
    mm = replace(k, batch=(n,), k=sympy.Integer(part), a=a, b=b, stores=(K.Store(ws, (i0 * k.m + i1) * k.n + i2, K.Acc(DType.f32)),))
    m, nn = K.loop_vars("i", 2)
    total: K.Value = K.Load(ws, K.Index(m * k.n + nn), DType.f32)
    for s in range(1, n):
        total = K.Binary(Op.ADD, total, K.Load(ws, K.Index((s * k.m + m) * k.n + nn), DType.f32), DType.f32)
    stores = tuple(replace(st, value=_with_acc(st.value, total)) for st in k.stores)
    return mm, K.Pointwise(f"{k.name}_sum", (k.m, k.n), stores)


def _with_acc(v: Any, total: K.Value) -> Any:
    """``v`` with every ``Acc`` replaced by ``total``."""
    if isinstance(v, K.Acc):
        return total
    if not is_dataclass(v) or isinstance(v, type):
        return v
    changes = {}
    for f in fields(v):
        x = getattr(v, f.name)
        y = _with_acc(x, total) if is_dataclass(x) else x
        if y is not x:
            changes[f.name] = y
    return replace(v, **changes) if changes else v
