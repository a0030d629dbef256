"""Lowering rules for elementwise ops, activations, copies and constants (full, arange).

What it is not: broadcasting and casting themselves; ``Builder.ew`` makes those explicit for every rule.
"""

from __future__ import annotations

import math
from typing import Any

from aotc.errors import UnsupportedOp

from ..ir import ArangeAttr, DType, Node, Op
from .table import Ctx, aten, compute_dtype, lower, promote

_UNARY = {
    aten.neg.default: Op.NEG, aten.abs.default: Op.ABS, aten.exp.default: Op.EXP, aten.log.default: Op.LOG,
    aten.sqrt.default: Op.SQRT, aten.rsqrt.default: Op.RSQRT, aten.tanh.default: Op.TANH,
    aten.sigmoid.default: Op.SIGMOID, aten.erf.default: Op.ERF, aten.sin.default: Op.SIN,
    aten.cos.default: Op.COS, aten.relu.default: Op.RELU, aten.reciprocal.default: Op.RECIP,
    aten.floor.default: Op.FLOOR,
}  # fmt: skip


@lower(*_UNARY)
def _unary(c: Ctx) -> Node:
    return c.b.ew(_UNARY[c.target], c.arg(0), dtype=c.out_dtype)


_BINARY = {
    aten.add.Tensor: Op.ADD, aten.add.Scalar: Op.ADD, aten.sub.Tensor: Op.SUB, aten.sub.Scalar: Op.SUB,
    aten.mul.Tensor: Op.MUL, aten.mul.Scalar: Op.MUL, aten.div.Tensor: Op.DIV, aten.div.Scalar: Op.DIV,
    aten.maximum.default: Op.MAX, aten.minimum.default: Op.MIN, aten.pow.Tensor_Scalar: Op.POW,
    aten.pow.Tensor_Tensor: Op.POW, aten.remainder.Tensor: Op.MOD, aten.remainder.Scalar: Op.MOD,
    aten.fmod.Tensor: Op.MOD, aten.fmod.Scalar: Op.MOD,
    aten.eq.Tensor: Op.EQ, aten.eq.Scalar: Op.EQ, aten.ne.Tensor: Op.NE, aten.ne.Scalar: Op.NE,
    aten.lt.Tensor: Op.LT, aten.lt.Scalar: Op.LT, aten.le.Tensor: Op.LE, aten.le.Scalar: Op.LE,
    aten.gt.Tensor: Op.GT, aten.gt.Scalar: Op.GT, aten.ge.Tensor: Op.GE, aten.ge.Scalar: Op.GE,
    aten.logical_and.default: Op.AND, aten.logical_or.default: Op.OR, aten.bitwise_and.Tensor: Op.AND,
    aten.bitwise_or.Tensor: Op.OR,
}  # fmt: skip


@lower(*_BINARY)
def _binary(c: Ctx) -> Node:
    op = _BINARY[c.target]
    a, b = c.arg(0), c.arg(1)
    alpha = c.kwarg("alpha", 1)
    if op in (Op.ADD, Op.SUB) and alpha != 1:
        b = c.b.ew(Op.MUL, b, alpha, dtype=promote(b, alpha)) if isinstance(b, Node) else b * alpha
    if op is Op.POW and not isinstance(b, Node) and b == 2:
        x = a if isinstance(a, Node) else None
        if x is not None:
            return c.b.ew(Op.MUL, x, x, dtype=c.out_dtype)
    if op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE):
        compute = promote(a, b)
    elif op in (Op.AND, Op.OR):
        compute = DType.bool
        if c.out_dtype is not DType.bool:
            raise UnsupportedOp(f"bitwise {op.name.lower()} on {c.out_dtype.value} (only bool is supported)")
    else:
        compute = c.out_dtype
    if not isinstance(a, Node):
        a = c.b.full(a, compute)
    return c.b.ew(op, a, b, dtype=compute)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(c: Ctx) -> Node:
    a, b, mode = c.arg(0), c.arg(1), c.kwarg("rounding_mode")
    dt = c.out_dtype
    if mode is None:
        return c.b.ew(Op.DIV, a, b, dtype=dt)
    if mode != "floor":
        raise UnsupportedOp("aten.div with rounding_mode='trunc'")
    if dt.is_float:
        return c.b.ew(Op.FLOOR, c.b.ew(Op.DIV, a, b, dtype=dt), dtype=dt)
    return c.b.ew(Op.DIV, a, b, dtype=dt)


@lower(aten.floor_divide.default)
def _floordiv(c: Ctx) -> Node:
    return c.b.ew(Op.DIV, c.arg(0), c.arg(1), dtype=c.out_dtype)


@lower(aten.logical_not.default, aten.bitwise_not.default)
def _not(c: Ctx) -> Node:
    x = c.arg(0)
    if x.dtype is not DType.bool:
        if c.target is aten.bitwise_not.default:
            raise UnsupportedOp(f"aten.bitwise_not on {x.dtype.value} (only bool is supported)")
        x = c.b.ew(Op.NE, x, 0, dtype=x.dtype)
    return c.b.ew(Op.NOT, x)


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(c: Ctx) -> Node:
    return c.b.where(c.arg(0), c.arg(1), c.arg(2), c.out_dtype)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(c: Ctx) -> Node:
    return c.b.where(c.arg(1), c.arg(2), c.arg(0), c.out_dtype)


@lower(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default)
def _clamp(c: Ctx) -> Node:
    x, dt = c.arg(0), c.out_dtype
    t = c.target
    lo = c.arg(1) if t in (aten.clamp.default, aten.clamp_min.default) else None
    hi = c.arg(2) if t is aten.clamp.default else (c.arg(1) if t is aten.clamp_max.default else None)
    if t is aten.hardtanh.default:
        lo, hi = c.arg(1, -1.0), c.arg(2, 1.0)
    x = c.b.cast(x, dt)
    if lo is not None:
        x = c.b.ew(Op.MAX, x, lo, dtype=dt)
    if hi is not None:
        x = c.b.ew(Op.MIN, x, hi, dtype=dt)
    return x


@lower(aten.leaky_relu.default)
def _leaky_relu(c: Ctx) -> Node:
    # where(x > 0, x, x * slope): NaN stays NaN (the comparison is false, and NaN * slope is NaN), as in torch
    x, dt = c.b.cast(c.arg(0), c.out_dtype), c.out_dtype
    return c.b.where(c.b.ew(Op.GT, x, 0, dtype=dt), x, c.b.ew(Op.MUL, x, c.arg(1, 0.01), dtype=dt), dt)


@lower(aten.gelu.default)
def _gelu(c: Ctx) -> Node:
    dt, b = c.out_dtype, c.b
    return b.cast(_gelu_math(c, b.cast(c.arg(0), compute_dtype(dt)), compute_dtype(dt)), dt)


def _gelu_math(c: Ctx, x: Node, dt: DType) -> Node:
    b = c.b
    if c.kwarg("approximate", c.arg(1, "none")) == "tanh":
        inner = b.ew(Op.MUL, b.ew(Op.ADD, x, b.ew(Op.MUL, b.ew(Op.MUL, b.ew(Op.MUL, x, x), x), 0.044715)),
                     math.sqrt(2.0 / math.pi))  # fmt: skip
        return b.ew(Op.MUL, b.ew(Op.MUL, x, 0.5), b.ew(Op.ADD, b.ew(Op.TANH, inner), 1.0), dtype=dt)
    erf = b.ew(Op.ERF, b.ew(Op.MUL, x, 1.0 / math.sqrt(2.0)))
    return b.ew(Op.MUL, b.ew(Op.MUL, x, 0.5), b.ew(Op.ADD, erf, 1.0), dtype=dt)


@lower(aten.silu.default)
def _silu(c: Ctx) -> Node:
    x = c.b.cast(c.arg(0), compute_dtype(c.out_dtype))
    return c.b.cast(c.b.ew(Op.MUL, x, c.b.ew(Op.SIGMOID, x)), c.out_dtype)


@lower(aten.hardsigmoid.default)
def _hardsigmoid(c: Ctx) -> Node:
    x = c.b.cast(c.arg(0), compute_dtype(c.out_dtype))
    y = c.b.ew(Op.MIN, c.b.ew(Op.MAX, c.b.ew(Op.ADD, c.b.ew(Op.DIV, x, 6.0), 0.5), 0.0), 1.0)
    return c.b.cast(y, c.out_dtype)


@lower(aten.hardswish.default)
def _hardswish(c: Ctx) -> Node:
    b = c.b
    x = b.cast(c.arg(0), compute_dtype(c.out_dtype))
    r6 = b.ew(Op.MIN, b.ew(Op.MAX, b.ew(Op.ADD, x, 3.0), 0.0), 6.0)
    return b.cast(b.ew(Op.DIV, b.ew(Op.MUL, x, r6), 6.0), c.out_dtype)


@lower(aten._to_copy.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
       aten.detach.default, aten.contiguous.default)  # fmt: skip
def _copy(c: Ctx) -> Node:
    return c.b.cast(c.arg(0), c.out_dtype)


@lower(aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
       aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.new_zeros.default,
       aten.new_ones.default, aten.new_full.default, aten.empty.memory_format, aten.empty_like.default)  # fmt: skip
def _full(c: Ctx) -> Node:
    t = c.target
    value: Any = {aten.zeros.default: 0, aten.ones.default: 1, aten.zeros_like.default: 0, aten.ones_like.default: 1,
                  aten.new_zeros.default: 0, aten.new_ones.default: 1, aten.empty.memory_format: 0,
                  aten.empty_like.default: 0}.get(t)  # fmt: skip
    if value is None:
        value = c.arg(0) if t is aten.scalar_tensor.default else c.arg(1) if t is not aten.new_full.default else c.arg(2)
    return c.b.full(value, c.out_dtype, c.out_shape)


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(c: Ctx) -> Node:
    args = [c.arg(i) for i in range(len(c.fx.args))]
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    if not isinstance(start, int | float) or not isinstance(step, int | float):
        raise UnsupportedOp("aten.arange with a symbolic start or step")
    return c.b.add(Op.ARANGE, (), c.out_dtype, c.out_shape, ArangeAttr(start, step))
