"""ONNX rules for elementwise ops, activations, casts, comparisons and reductions.

Every rule folds at build time when all its inputs are ``Static`` (numpy, with sympy sizes), and otherwise
emits IR through ``Builder.ew``, which makes broadcasts and casts explicit.
What it is not: the meaning of the IR ops (``aot/interp.py``) nor reductions' lowering (``lower/nn.py``'s
``reduce``/``mean``/``softmax`` are reused here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

from ..ir import ArangeAttr, DType, Node, Op
from ..lower.nn import mean, reduce, softmax
from .table import Ctx, Static, Value, axis_of, dtype_of, op

# ---- elementwise -------------------------------------------------------------------------------------

_UNARY: dict[str, tuple[Op, Callable[[np.ndarray], np.ndarray] | None]] = {
    "Relu": (Op.RELU, lambda x: np.maximum(x, 0)), "Sigmoid": (Op.SIGMOID, None), "Tanh": (Op.TANH, np.tanh),
    "Erf": (Op.ERF, None), "Exp": (Op.EXP, np.exp), "Log": (Op.LOG, np.log), "Sqrt": (Op.SQRT, np.sqrt),
    "Reciprocal": (Op.RECIP, lambda x: 1 / x), "Neg": (Op.NEG, lambda x: -x), "Abs": (Op.ABS, np.abs),
    "Floor": (Op.FLOOR, np.floor), "Sin": (Op.SIN, np.sin), "Cos": (Op.COS, np.cos), "Not": (Op.NOT, np.logical_not),
}  # fmt: skip


@op(*_UNARY)
def _unary(c: Ctx) -> Value:
    ir_op, fold = _UNARY[c.node.op_type]
    s = c.static(0)
    if s is not None and s.symbolic and c.node.op_type in ("Floor", "Neg", "Abs", "Relu"):
        sym = {"Floor": sympy.floor, "Neg": lambda v: -v, "Abs": abs, "Relu": lambda v: sympy.Max(v, 0)}[c.node.op_type]
        return Static.of(np.vectorize(sym, otypes=[object])(s.value), s.dtype)
    if s is not None and fold is not None and not s.symbolic:
        return Static.of(fold(s.value), s.dtype)
    return c.b.ew(ir_op, c.t(0))


_BINARY: dict[str, tuple[Op, Callable[[Any, Any], Any]]] = {
    "Add": (Op.ADD, lambda a, b: a + b), "Sub": (Op.SUB, lambda a, b: a - b), "Mul": (Op.MUL, lambda a, b: a * b),
    "Div": (Op.DIV, None), "Equal": (Op.EQ, lambda a, b: a == b), "Less": (Op.LT, lambda a, b: a < b),  # type: ignore[dict-item]
    "LessOrEqual": (Op.LE, lambda a, b: a <= b), "Greater": (Op.GT, lambda a, b: a > b),
    "GreaterOrEqual": (Op.GE, lambda a, b: a >= b), "And": (Op.AND, np.logical_and), "Or": (Op.OR, np.logical_or),
    "Xor": (Op.NE, np.logical_xor),
}  # fmt: skip


def _div_static(a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
    if not dt.is_int:
        return a / b
    if object in (a.dtype, b.dtype):  # sizes are non-negative: C division is floor division
        return a // b
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


@op(*_BINARY)
def _binary(c: Ctx) -> Value:
    ir_op, fold = _BINARY[c.node.op_type]
    dt = c.dtype(0)
    out_dt = DType.bool if ir_op in (Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR, Op.NE) else dt
    if c.all_static():
        a, b = c.static(0), c.static(1)
        assert a is not None and b is not None
        symbolic_compare = (a.symbolic or b.symbolic) and out_dt is DType.bool and ir_op is not Op.EQ
        if not symbolic_compare:  # a < b over sympy sizes has no single answer: leave it to run time
            with np.errstate(all="ignore"):
                v = _div_static(a.value, b.value, dt) if ir_op is Op.DIV else fold(a.value, b.value)
            if ir_op is Op.EQ and (a.symbolic or b.symbolic):
                v = np.vectorize(lambda x, y: bool(x == y), otypes=[bool])(a.value, b.value)
            return Static.of(v, out_dt)
    x, y = c.t(0), c.t(1)
    if ir_op is Op.DIV and dt.is_int:  # ONNX integer division truncates; the IR's floors
        q = c.b.ew(Op.DIV, x, y, dtype=dt)
        inexact = c.b.ew(Op.NE, c.b.ew(Op.MUL, q, y, dtype=dt), x, dtype=dt)
        signs = c.b.ew(Op.NE, c.b.ew(Op.LT, x, 0, dtype=dt), c.b.ew(Op.LT, y, 0, dtype=dt))
        return c.b.where(c.b.ew(Op.AND, inexact, signs), c.b.ew(Op.ADD, q, 1, dtype=dt), q, dt)
    if ir_op in (Op.AND, Op.OR, Op.NE) and c.node.op_type in ("And", "Or", "Xor"):
        return c.b.ew(ir_op, x, y, dtype=DType.bool)
    return c.b.ew(ir_op, x, y, dtype=dt)


@op("Mod", check=lambda n, a: None)
def _mod(c: Ctx) -> Value:
    dt = c.dtype(0)
    fmod = int(c.attr("fmod", 0))
    if c.all_static() and not fmod:
        a, b = c.static(0), c.static(1)
        assert a is not None and b is not None
        return Static.of(a.value % b.value, dt)
    x, y = c.t(0), c.t(1)
    if not fmod:
        return c.b.ew(Op.MOD, x, y, dtype=dt)
    # C fmod: the remainder takes the dividend's sign
    m = c.b.ew(Op.MOD, x, y, dtype=dt)
    fix = c.b.ew(Op.AND, c.b.ew(Op.NE, m, 0, dtype=dt), c.b.ew(Op.NE, c.b.ew(Op.LT, x, 0, dtype=dt), c.b.ew(Op.LT, y, 0, dtype=dt)))
    return c.b.where(fix, c.b.ew(Op.SUB, m, y, dtype=dt), m, dt)


@op("Pow")
def _pow(c: Ctx) -> Value:
    dt = c.dtype(0)
    e = c.static(1)
    if c.all_static() and not c.static(0).symbolic and e is not None and not e.symbolic:  # type: ignore[union-attr]
        return Static.of(np.power(c.static(0).value, e.value.astype(c.static(0).value.dtype)), dt)  # type: ignore[union-attr]
    x = c.t(0)
    if e is not None and e.value.size == 1 and not e.symbolic:
        p = float(e.value.ravel()[0])
        if p == 1:
            return x
        if p == 2:
            return c.b.ew(Op.MUL, x, x)
        if p == 0.5 and dt.is_float:
            return c.b.ew(Op.SQRT, x)
        if p == 3:
            return c.b.ew(Op.MUL, c.b.ew(Op.MUL, x, x), x)
    if not dt.is_float:
        raise c.fail(f"Pow on {dt.value} with a non-constant exponent (only float Pow is supported)")
    return c.b.ew(Op.POW, x, c.b.cast(c.t(1), dt), dtype=dt)


def _variadic(c: Ctx, ir_op: Op, fold: Callable[[Any, Any], Any]) -> Value:
    if c.all_static() and not any(s.symbolic for s in c.ins if isinstance(s, Static)):
        vals = [s.value for s in c.ins if isinstance(s, Static)]
        out = vals[0]
        for v in vals[1:]:
            out = fold(out, v)
        return Static.of(out, c.dtype(0))
    acc = c.t(0)
    for i in range(1, len(c.ins)):
        acc = c.b.ew(ir_op, acc, c.t(i), dtype=acc.dtype)
    return acc


@op("Max")
def _max(c: Ctx) -> Value:
    return _variadic(c, Op.MAX, np.maximum)


@op("Min")
def _min(c: Ctx) -> Value:
    return _variadic(c, Op.MIN, np.minimum)


@op("Sum")
def _sum(c: Ctx) -> Value:
    return _variadic(c, Op.ADD, np.add)


@op("Mean")
def _mean_var(c: Ctx) -> Value:
    s = _variadic(c, Op.ADD, np.add)
    n = len(c.ins)
    if isinstance(s, Static):
        return Static.of(s.value / n, s.dtype)
    return c.b.ew(Op.MUL, s, 1.0 / n)


@op("Identity", "Dropout")
def _identity(c: Ctx) -> Any:
    if c.node.op_type == "Dropout" and len(c.node.output) > 1 and c.node.output[1]:
        v = c.ins[0]
        assert v is not None
        return v, c.b.full(True, DType.bool, tuple(v.shape))
    return c.ins[0]


@op("Cast")
def _cast(c: Ctx) -> Value:
    return _cast_to(c, dtype_of(int(c.attr("to")), f"{c.where}'s target type"))


@op("CastLike")
def _cast_like(c: Ctx) -> Value:
    return _cast_to(c, c.dtype(1))


def _cast_to(c: Ctx, dt: DType) -> Value:
    s = c.static(0)
    if s is not None:
        if not s.symbolic:
            return Static.of(s.value.astype(dt.numpy()), dt)
        if dt.is_int or dt.is_float:
            return Static.of(s.value, dt)  # sizes stay sizes; a float cast keeps the exact integer
    return c.b.cast(c.t(0), dt)


@op("Where")
def _where(c: Ctx) -> Value:
    if c.all_static():
        cond, x, y = (c.static(i) for i in range(3))
        assert cond is not None and x is not None and y is not None
        if not cond.symbolic:
            return Static.of(np.where(cond.value.astype(bool), x.value, y.value), x.dtype)
    return c.b.where(c.t(0), c.t(1), c.t(2), c.dtype(1))


@op("IsNaN")
def _isnan(c: Ctx) -> Value:
    s = c.static(0)
    if s is not None and not s.symbolic:
        return Static.of(np.isnan(s.value), DType.bool)
    x = c.t(0)
    return c.b.ew(Op.NE, x, x)


@op("Sign")
def _sign(c: Ctx) -> Value:
    x = c.t(0)
    dt = x.dtype
    return c.b.where(c.b.ew(Op.GT, x, 0), 1, c.b.where(c.b.ew(Op.LT, x, 0), -1, 0, dt), dt)


@op("Ceil")
def _ceil(c: Ctx) -> Value:
    s = c.static(0)
    if s is not None:
        return Static.of(np.vectorize(sympy.ceiling, otypes=[object])(s.value) if s.symbolic else np.ceil(s.value), s.dtype)
    return c.b.ew(Op.NEG, c.b.ew(Op.FLOOR, c.b.ew(Op.NEG, c.t(0))))


# ---- activations ---------------------------------------------------------------------------------------


def gelu(c: Ctx, x: Node, tanh: bool) -> Node:
    b = c.b
    if tanh:
        inner = b.ew(Op.MUL, b.ew(Op.ADD, x, b.ew(Op.MUL, b.ew(Op.MUL, b.ew(Op.MUL, x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
        return b.ew(Op.MUL, b.ew(Op.MUL, x, 0.5), b.ew(Op.ADD, b.ew(Op.TANH, inner), 1.0))
    return b.ew(Op.MUL, b.ew(Op.MUL, x, 0.5), b.ew(Op.ADD, b.ew(Op.ERF, b.ew(Op.MUL, x, 1.0 / math.sqrt(2.0))), 1.0))


@op("Gelu", check=lambda n, a: None if a.get("approximate", "none") in ("none", "tanh") else f"approximate={a['approximate']!r}")
def _gelu(c: Ctx) -> Value:
    return gelu(c, c.t(0), c.attr("approximate", "none") == "tanh")


@op("LeakyRelu")
def _leaky(c: Ctx) -> Value:
    x = c.t(0)
    return c.b.where(c.b.ew(Op.GE, x, 0), x, c.b.ew(Op.MUL, x, float(c.attr("alpha", 0.01))), x.dtype)


@op("PRelu")
def _prelu(c: Ctx) -> Value:
    x, slope = c.t(0), c.b.cast(c.t(1), c.dtype(0))
    return c.b.where(c.b.ew(Op.GE, x, 0), x, c.b.ew(Op.MUL, x, slope), x.dtype)


@op("Elu")
def _elu(c: Ctx) -> Value:
    x = c.t(0)
    neg = c.b.ew(Op.MUL, c.b.ew(Op.SUB, c.b.ew(Op.EXP, x), 1.0), float(c.attr("alpha", 1.0)))
    return c.b.where(c.b.ew(Op.GT, x, 0), x, neg, x.dtype)


@op("Selu")
def _selu(c: Ctx) -> Value:
    x = c.t(0)
    alpha, gamma = float(c.attr("alpha", 1.67326319217681884765625)), float(c.attr("gamma", 1.05070102214813232421875))
    neg = c.b.ew(Op.MUL, c.b.ew(Op.SUB, c.b.ew(Op.EXP, x), 1.0), alpha)
    return c.b.ew(Op.MUL, c.b.where(c.b.ew(Op.GT, x, 0), x, neg, x.dtype), gamma)


@op("Softplus")
def _softplus(c: Ctx) -> Value:
    x = c.t(0)  # max(x, 0) + log(1 + exp(-|x|)): no overflow for large x
    return c.b.ew(Op.ADD, c.b.ew(Op.RELU, x), c.b.ew(Op.LOG, c.b.ew(Op.ADD, c.b.ew(Op.EXP, c.b.ew(Op.NEG, c.b.ew(Op.ABS, x))), 1.0)))


@op("Softsign")
def _softsign(c: Ctx) -> Value:
    x = c.t(0)
    return c.b.ew(Op.DIV, x, c.b.ew(Op.ADD, c.b.ew(Op.ABS, x), 1.0))


@op("Mish")
def _mish(c: Ctx) -> Value:
    x = c.t(0)
    sp = c.b.ew(Op.ADD, c.b.ew(Op.RELU, x), c.b.ew(Op.LOG, c.b.ew(Op.ADD, c.b.ew(Op.EXP, c.b.ew(Op.NEG, c.b.ew(Op.ABS, x))), 1.0)))
    return c.b.ew(Op.MUL, x, c.b.ew(Op.TANH, sp))


@op("HardSigmoid")
def _hardsigmoid(c: Ctx) -> Value:
    x = c.t(0)
    y = c.b.ew(Op.ADD, c.b.ew(Op.MUL, x, float(c.attr("alpha", 0.2))), float(c.attr("beta", 0.5)))
    return c.b.ew(Op.MIN, c.b.ew(Op.MAX, y, 0.0), 1.0)


@op("HardSwish")
def _hardswish(c: Ctx) -> Value:
    x = c.t(0)
    y = c.b.ew(Op.MIN, c.b.ew(Op.MAX, c.b.ew(Op.ADD, c.b.ew(Op.MUL, x, 1.0 / 6), 0.5), 0.0), 1.0)
    return c.b.ew(Op.MUL, x, y)


@op("Clip")
def _clip(c: Ctx) -> Value:
    x = c.t(0)
    lo, hi = c.opt(1), c.opt(2)
    if lo is not None:
        x = c.b.ew(Op.MAX, x, c.b.cast(lo, x.dtype))
    if hi is not None:
        x = c.b.ew(Op.MIN, x, c.b.cast(hi, x.dtype))
    return x


# ---- softmax and reductions ------------------------------------------------------------------------------


@op("Softmax", "LogSoftmax")
def _softmax(c: Ctx) -> Value:
    x = c.t(0)
    return softmax(c.b, x, axis_of(int(c.attr("axis", -1)), x.type.rank), c.node.op_type == "LogSoftmax")


def _reduce_axes(c: Ctx, rank: int) -> tuple[int, ...] | None:
    """The axes as a sorted tuple; None for "no reduction" (empty axes with noop_with_empty_axes)."""
    axes = [int(a) for a in c.need(1, "axes").ravel().tolist()] if c.has(1) else list(c.attr("axes", []))
    if not axes:
        return None if c.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted(axis_of(a, rank) for a in axes))


_REDUCE_FOLD: dict[str, Callable[..., Any]] = {
    "ReduceSum": np.sum, "ReduceProd": np.prod, "ReduceMax": np.max, "ReduceMin": np.min, "ReduceMean": np.mean}


@op("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp")
def _reduce(c: Ctx) -> Value:
    kind = c.node.op_type
    v = c.ins[0]
    assert v is not None
    rank = len(v.shape)
    axes = _reduce_axes(c, rank)
    keep = bool(c.attr("keepdims", 1))
    if axes is None:
        return v
    s = c.static(0)
    if s is not None and kind in _REDUCE_FOLD and (not s.symbolic or kind in ("ReduceProd", "ReduceSum")):
        return Static.of(_REDUCE_FOLD[kind](s.value, axis=axes, keepdims=keep), s.dtype)
    x = c.t(0)
    b = c.b
    if kind == "ReduceSum":
        return reduce(b, Op.SUM, x, axes, keep)
    if kind == "ReduceMean":
        return mean(b, x, axes, keep, x.dtype)
    if kind in ("ReduceMax", "ReduceMin"):
        return reduce(b, Op.RMAX if kind == "ReduceMax" else Op.RMIN, x, axes, keep)
    if kind == "ReduceL1":
        return reduce(b, Op.SUM, b.ew(Op.ABS, x), axes, keep)
    if kind in ("ReduceL2", "ReduceSumSquare"):
        ss = reduce(b, Op.SUM, b.ew(Op.MUL, x, x), axes, keep)
        return b.ew(Op.SQRT, ss) if kind == "ReduceL2" else ss
    if kind == "ReduceLogSumExp":
        m = reduce(b, Op.RMAX, x, axes, True)
        s_ = reduce(b, Op.SUM, b.ew(Op.EXP, b.ew(Op.SUB, x, m)), axes, keep)
        m2 = m if keep else b.reshape(m, s_.shape)
        return b.ew(Op.ADD, b.ew(Op.LOG, s_), m2)
    raise c.fail("ReduceProd over run-time data is not supported (only over build-time constants)")


@op("ArgMax", "ArgMin", check=lambda n, a: "select_last_index=1" if a.get("select_last_index", 0) else None)
def _argmax(c: Ctx) -> Value:
    """The first index of the max (min): min over where(x == max, index, size)."""
    x = c.t(0)
    axis = axis_of(int(c.attr("axis", 0)), x.type.rank)
    keep = bool(c.attr("keepdims", 1))
    b = c.b
    m = reduce(b, Op.RMAX if c.node.op_type == "ArgMax" else Op.RMIN, x, (axis,), True)
    size = x.shape[axis]
    shape = [1] * x.type.rank
    shape[axis] = size
    idx = b.reshape(b.add(Op.ARANGE, (), DType.i64, (size,), ArangeAttr(0, 1)), tuple(shape))
    hit = b.where(b.ew(Op.EQ, x, m), idx, b.full(size, DType.i64), DType.i64)
    return reduce(b, Op.RMIN, hit, (axis,), keep)
