"""A max/min pool fused into the packed conv before it, for CPU targets (cpp_templates/conv_pool.h).

What it is: a rewrite of a CPU plan after ``pack_plan``. A ResNet stem is conv -> (bias, ReLU) -> max-pool;
fusion leaves it as a Conv kernel storing its raw output and a Reduce reading 3x3 windows of it with the
bias and ReLU in front. At 4x16x224x224 that intermediate is 12.8 MB written and read back, more time than
the conv's arithmetic. Where the pair has exactly that shape, the Conv takes the Reduce's stores and a
``kernel.Pool`` (the pre-pool expression over ``Acc``, the windows), the Reduce goes, and the template pools
bands of conv rows while they are in cache.
What it is not: a general epilogue fuser. Every condition below is checked, and anything else (a dilated
or strided-by-gather window, a pool read by two kernels, an average pool) is left as it was.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import sympy

from .. import kernel as K
from ..ir import DType, Op

_CMP = {
    Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater, Op.GE: np.greater_equal,
    Op.EQ: np.equal, Op.NE: np.not_equal, Op.AND: np.logical_and, Op.OR: np.logical_or,
}  # fmt: skip


def _int(e: object) -> int | None:
    x = sympy.sympify(e)
    return int(x) if x.is_Integer else None


def _eval_mask(v: K.Value, env: dict[sympy.Symbol, np.ndarray]) -> np.ndarray | None:
    """The boolean mask ``v`` over the grid ``env`` (loop variable -> array), or None where it is not a
    plain comparison tree of index expressions."""
    if isinstance(v, K.Const):
        return np.asarray(v.value)
    if isinstance(v, K.Index):
        e = sympy.sympify(v.expr)
        if not e.free_symbols <= set(env):
            return None
        return np.asarray(sympy.lambdify(list(env), e, "numpy")(*env.values()))
    if isinstance(v, K.Binary) and (v.op in _CMP or v.op in (Op.ADD, Op.SUB, Op.MUL)):
        a, b = _eval_mask(v.a, env), _eval_mask(v.b, env)
        if a is None or b is None:
            return None
        fn = _CMP.get(v.op) or {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply}[v.op]
        return np.asarray(fn(a, b))
    if isinstance(v, K.Unary) and v.op is Op.NOT:
        a = _eval_mask(v.x, env)
        return None if a is None else np.logical_not(a)
    return None


def _rename(v: K.Value, names: dict[sympy.Symbol, sympy.Symbol]) -> K.Value:
    """``v`` with the loop variables of its index expressions renamed (all at once)."""
    if isinstance(v, K.Index):
        return K.Index(sympy.sympify(v.expr).xreplace(names), v.dtype)
    if isinstance(v, K.Load):
        return K.Load(v.buf, _rename(v.index, names), v.dtype)
    if isinstance(v, K.Unary):
        return K.Unary(v.op, _rename(v.x, names), v.dtype)
    if isinstance(v, K.Binary):
        return K.Binary(v.op, _rename(v.a, names), _rename(v.b, names), v.dtype)
    if isinstance(v, K.Where):
        return K.Where(_rename(v.cond, names), _rename(v.a, names), _rename(v.b, names), v.dtype)
    if isinstance(v, K.Masked):
        return K.Masked(_rename(v.mask, names), _rename(v.body, names), v.other, v.dtype)
    return v  # Const, Acc, ReduceRef, Prefix


def _pre(body: K.Value, buf: str) -> K.Value | None:
    """``body`` (over i3 = channel) with its load of ``buf`` as the conv's Acc and the channel renamed i1
    (the conv's), or None where anything in it depends on more than the channel or is not plain."""
    i1, i3 = K.loop_var("i", 1), K.loop_var("i", 3)
    skip = {v.index for v in K.walk(body) if isinstance(v, K.Load) and v.buf == buf}
    for v in K.walk(body):
        if (isinstance(v, K.Load) and v.buf == buf) or v in skip:
            continue
        if isinstance(v, K.Masked | K.Acc | K.ReduceRef | K.Prefix):
            return None
        if isinstance(v, K.Load) and not isinstance(v.index, K.Index):
            return None
        if isinstance(v, K.Index) and not sympy.sympify(v.expr).free_symbols <= {i3}:
            return None

    def go(v: K.Value) -> K.Value:
        if isinstance(v, K.Load) and v.buf == buf:
            return K.Acc(v.dtype)
        if isinstance(v, K.Load):
            return K.Load(v.buf, go(v.index), v.dtype)
        if isinstance(v, K.Index):
            return K.Index(sympy.sympify(v.expr).xreplace({i3: i1}), v.dtype)
        if isinstance(v, K.Unary):
            return K.Unary(v.op, go(v.x), v.dtype)
        if isinstance(v, K.Binary):
            return K.Binary(v.op, go(v.a), go(v.b), v.dtype)
        if isinstance(v, K.Where):
            return K.Where(go(v.cond), go(v.a), go(v.b), v.dtype)
        return v

    return go(body)


# Unary ops that never decrease (NaN in, NaN out): what ``monotone`` lets through.
_RISING = frozenset({Op.RELU, Op.EXP, Op.TANH, Op.SIGMOID, Op.ERF})


def monotone(pre: K.Value) -> bool:
    """Whether ``pre`` is non-decreasing in ``Acc`` (sums, max/min, subtracting or scaling by a non-negative
    constant what does not depend on it, ReLU and the like): then max(pre(v)) = pre(max(v)), min alike, and
    conv_pool.h pools the conv's values and applies ``pre`` to the pooled ones only (a quarter of them
    after a 3x3/2 pool). Anything else (a Where, a product with a weight of either sign) is False."""

    def free(v: K.Value) -> bool:
        return not any(isinstance(u, K.Acc) for u in K.walk(v))

    def rising(v: K.Value) -> bool:
        if free(v) or isinstance(v, K.Acc):
            return True
        if isinstance(v, K.Unary):
            return (v.op in _RISING or (v.op is Op.CAST and v.dtype.is_float)) and rising(v.x)
        if isinstance(v, K.Binary):
            if v.op in (Op.ADD, Op.MAX, Op.MIN):
                return rising(v.a) and rising(v.b)
            if v.op is Op.SUB:
                return rising(v.a) and free(v.b)
            if v.op is Op.MUL:
                c, other = (v.b, v.a) if free(v.b) else (v.a, v.b)
                return isinstance(c, K.Const) and float(c.value) >= 0 and rising(other)
        return False

    return rising(pre)


def _fused(plan: K.Plan, conv: K.Kernel, red: K.Kernel) -> K.Conv | None:
    """``conv`` with ``red`` (the pool reading its output) fused in, or None where the pair does not fit."""
    if not (isinstance(conv, K.Conv) and conv.packed and not conv.wino and conv.pool is None and isinstance(red, K.Reduce)):
        return None
    if len(conv.stores) != 1 or red.row_stores or red.has_gather:
        return None
    # the conv stores its accumulator, or (a bf16 model) the accumulator rounded to bf16 (by a cast, or by
    # the store into a bf16 tensor: cpp_widen.py), which the pool then takes the max or min of: rounding is
    # monotone, so the fused pool (on the fp32 values, rounded as it stores) gives what rounding first gives,
    # but for the conv's own rounding before the pre ops
    v, dt = conv.stores[0].value, red.steps[0].dtype
    rounded = isinstance(v, K.Unary) and v.op is Op.CAST and v.dtype is DType.bf16 and isinstance(v.x, K.Acc)
    if not (isinstance(v, K.Acc) and dt in (DType.f32, DType.bf16) or rounded and dt is DType.bf16):
        return None
    if len(red.steps) != 1 or red.steps[0].op not in (Op.RMAX, Op.RMIN):
        return None
    if len(red.ranges) != 4 or len(red.reduce_ranges) != 2:
        return None
    buf = conv.stores[0].buf
    if buf not in {b.name for b in plan.arena} or any(buf in K.reads(k) for k in plan.kernels if k is not red):
        return None
    if any(isinstance(v, K.Load) and v.buf == buf for st in red.stores for v in K.walk(st.value)):
        return None
    dims = [_int(d) for d in (conv.c_out, *conv.out_hw, *red.ranges[1:], *red.reduce_ranges)]
    if any(d is None for d in dims) or sympy.sympify(red.ranges[0] - conv.batch) != 0:
        return None
    O, OH, OW, KH, KW = (int(d) for d in (dims[0], dims[1], dims[2], dims[6], dims[7]))  # type: ignore[arg-type]
    i, r = K.loop_vars("i", 4), K.loop_vars("r", 2)
    if sympy.expand(conv.stores[0].index - (i[0] * OH * OW * O + i[2] * OW * O + i[3] * O + i[1])) != 0:
        return None  # the conv stores dense NHWC
    step = red.steps[0]
    loads = [v for v in K.walk(step.value) if isinstance(v, K.Load) and v.buf == buf]
    if len(loads) != 1 or not isinstance(loads[0].index, K.Index):
        return None
    # the reduce's outer loops in any order: rename them (n, pooled row, pooled column, channel) = i0..i3
    idx = sympy.expand(loads[0].index.expr)
    coef = {v: idx.coeff(v) for v in i[1:]}
    chan = [v for v in i[1:] if coef[v] == 1]
    if len(chan) != 1:
        return None
    hv, wv = sorted((v for v in i[1:] if v != chan[0]), key=lambda v: -coef[v])
    names = {hv: i[1], wv: i[2], chan[0]: i[3]}
    PH, PW, C = (_int(red.ranges[1 + i[1:].index(v)]) for v in (hv, wv, chan[0]))
    if PH is None or PW is None or C != O:
        return None
    stores = tuple(K.Store(st.buf, sympy.sympify(st.index).xreplace(names), _rename(st.value, names)) for st in red.stores)
    big = math.inf if step.op is Op.RMIN else -math.inf
    body: K.Value = _rename(step.value, names)
    mask: K.Value | None = None
    if isinstance(body, K.Masked):
        if body.other != big:
            return None
        mask = body.mask
        body = body.body
    load = next(v for v in K.walk(body) if isinstance(v, K.Load) and v.buf == buf)
    assert isinstance(load.index, K.Index)
    idx = sympy.expand(load.index.expr)
    sh, sw = idx.coeff(i[1]) / (OW * O), idx.coeff(i[2]) / O
    if not (sh.is_Integer and sw.is_Integer and sh > 0 and sw > 0):
        return None
    const = _int(idx.subs(dict.fromkeys((*i, *r), 0)))
    pads = [(a, b) for a in range(KH) for b in range(KW) if const == -(a * OW * O + b * O)]
    if len(pads) != 1:
        return None
    ph, pw = pads[0]
    want = i[0] * OH * OW * O + (i[1] * sh - ph + r[0]) * OW * O + (i[2] * sw - pw + r[1]) * O + i[3]
    if sympy.expand(idx - want) != 0:
        return None
    # the mask must be exactly "the window position lies inside the conv's output"
    g1, g2, g3, g4 = np.meshgrid(np.arange(PH), np.arange(PW), np.arange(KH), np.arange(KW), indexing="ij")
    oh, ow = g1 * int(sh) - ph + g3, g2 * int(sw) - pw + g4
    inside = (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
    if mask is None:
        if not inside.all():
            return None
    else:
        got = _eval_mask(mask, {i[1]: g1, i[2]: g2, r[0]: g3, r[1]: g4})
        if got is None or not np.array_equal(np.broadcast_to(got, inside.shape), inside):
            return None
    pre = _pre(body, buf)
    if pre is None:
        return None
    pool = K.Pool(step.op, (KH, KW), (int(sh), int(sw)), (ph, pw), (sympy.Integer(PH), sympy.Integer(PW)), pre)
    return dataclasses.replace(conv, stores=stores, pool=pool)


def fuse_pools(plan: K.Plan) -> K.Plan:
    """``plan`` with each packed conv followed by the pool of its output fused (see the module doc)."""
    kernels: list[K.Kernel] = []
    gone: set[str] = set()
    j = 0
    while j < len(plan.kernels):
        k = plan.kernels[j]
        fused = _fused(plan, k, plan.kernels[j + 1]) if j + 1 < len(plan.kernels) else None
        if fused is not None:
            assert isinstance(k, K.Conv)
            gone.add(k.stores[0].buf)
            kernels.append(fused)
            j += 2
            continue
        kernels.append(k)
        j += 1
    if not gone:
        return plan
    return dataclasses.replace(plan, kernels=kernels, arena=[b for b in plan.arena if b.name not in gone])
