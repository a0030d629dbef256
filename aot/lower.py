"""Core ATen -> aotc IR. One table: aten overload -> builder function.

Every supported overload is a short function below, registered with ``@lower(...)``. Anything else
fails the build with ``UnsupportedOp`` listing every missing op, its count and first source line.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy
import torch
from aotc.errors import UnsupportedOp

from .builder import Builder
from .capture import Captured
from .ir import (
    ArangeAttr,
    AxisAttr,
    Dim,
    DType,
    Graph,
    InputAttr,
    Node,
    Op,
    PadAttr,
    Shape,
    SliceAttr,
    StridedAttr,
    Symbol,
    WeightAttr,
    as_dim,
    dims_equal,
)

aten = torch.ops.aten

TORCH_DTYPES = {
    torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
    torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
    torch.uint8: DType.u8, torch.bool: DType.bool,
}  # fmt: skip

LowerFn = Callable[["Ctx", Any], Any]
TABLE: dict[Any, LowerFn] = {}
IGNORED = {
    aten.sym_size.int, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
    aten._assert_tensor_metadata.default, aten.sym_numel.default, aten.sym_stride.int,
    operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod, operator.neg,
    operator.eq, operator.ne, operator.ge, operator.le, operator.lt, operator.gt, operator.truediv,
}  # fmt: skip


def lower(*targets: Any) -> Callable[[LowerFn], LowerFn]:
    def reg(fn: LowerFn) -> LowerFn:
        for t in targets:
            TABLE[t] = fn
        return fn

    return reg


# ---- context ---------------------------------------------------------------------------------------


class Ctx:
    """Lowering state for one FX node: resolved arguments, its meta, and the builder."""

    def __init__(self, b: Builder, env: dict[torch.fx.Node, Any]) -> None:
        self.b = b
        self.env = env
        self.fx: torch.fx.Node

    def arg(self, i: int, default: Any = None) -> Any:
        a = self.fx.args[i] if i < len(self.fx.args) else self.fx.kwargs.get(self._argname(i), default)
        return self.value(a)

    def kw(self, name: str, pos: int, default: Any = None) -> Any:
        if name in self.fx.kwargs:
            return self.value(self.fx.kwargs[name])
        if pos < len(self.fx.args):
            return self.value(self.fx.args[pos])
        return default

    @property
    def target(self) -> Any:
        return self.fx.target

    def kwarg(self, name: str, default: Any = None) -> Any:
        return self.fx.kwargs.get(name, default)

    def _argname(self, i: int) -> str:
        schema = getattr(self.fx.target, "_schema", None)
        return schema.arguments[i].name if schema is not None and i < len(schema.arguments) else ""

    def value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a in self.env:
                return self.env[a]
            return sym_value(a.meta.get("val"))
        if isinstance(a, list | tuple):
            return type(a)(self.value(x) for x in a)
        return sym_value(a)

    @property
    def out_dtype(self) -> DType:
        v = self.fx.meta["val"]
        v = v[0] if isinstance(v, list | tuple) else v
        return TORCH_DTYPES[v.dtype]

    @property
    def out_shape(self) -> Shape:
        v = self.fx.meta["val"]
        v = v[0] if isinstance(v, list | tuple) else v
        return meta_shape(v)


def sym_value(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        return as_dim(v.node.expr)
    if isinstance(v, torch.SymFloat | torch.SymBool):
        raise UnsupportedOp(f"symbolic scalar {v} is not supported (a float/bool computed from shapes)")
    return v


def meta_shape(v: Any) -> Shape:
    return tuple(as_dim(d.node.expr) if isinstance(d, torch.SymInt) else int(d) for d in v.shape)


def source_line(fx: torch.fx.Node) -> str | None:
    trace = fx.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    user = [f for f in frames if "/torch/" not in f[0] and "/transformers/" not in f[0]] or frames
    if not user:
        return None

    def fmt(f: tuple[str, str, str, str]) -> str:
        return f"{f[0].rsplit('/', 1)[-1]}:{f[1]} in {f[2]}: {f[3].strip()}"

    # the library line that made the op (transformers' code, say), when it is not the user's own
    inner = [f for f in frames if "/torch/" not in f[0]]
    via = f" (inside {fmt(inner[-1])})" if inner and inner[-1] != user[-1] else ""
    return fmt(user[-1]) + via


def promote(*args: Any) -> DType:
    """torch's result type for a mix of tensors (IR nodes) and python scalars."""
    dummies: list[Any] = []
    for a in args:
        if isinstance(a, Node):
            td = next(k for k, v in TORCH_DTYPES.items() if v is a.dtype)
            dummies.append(torch.empty((1,) if a.type.rank else (), dtype=td))
        elif a is not None:
            dummies.append(a)
    out = dummies[0] if len(dummies) == 1 else torch.result_type(dummies[0], dummies[1])
    for d in dummies[2:]:
        out = torch.promote_types(out, torch.result_type(torch.empty((), dtype=out), d))
    if isinstance(out, torch.Tensor):
        out = out.dtype
    elif not isinstance(out, torch.dtype):
        out = torch.result_type(torch.tensor(out), torch.tensor(out))
    return TORCH_DTYPES[out]


def norm_axis(axis: int, rank: int) -> int:
    return axis % rank if rank else 0


# ---- elementwise -------------------------------------------------------------------------------------

_UNARY = {
    aten.neg.default: Op.NEG, aten.abs.default: Op.ABS, aten.exp.default: Op.EXP, aten.log.default: Op.LOG,
    aten.sqrt.default: Op.SQRT, aten.rsqrt.default: Op.RSQRT, aten.tanh.default: Op.TANH,
    aten.sigmoid.default: Op.SIGMOID, aten.erf.default: Op.ERF, aten.sin.default: Op.SIN,
    aten.cos.default: Op.COS, aten.relu.default: Op.RELU, aten.reciprocal.default: Op.RECIP,
    aten.floor.default: Op.FLOOR,
}  # fmt: skip


def _unary(c: Ctx, x: Any) -> Node:
    op = _UNARY[c.target]
    x = c.arg(0)
    return c.b.ew(op, x, dtype=c.out_dtype)


for _t in _UNARY:
    TABLE[_t] = _unary

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


def _binary(c: Ctx, _: Any) -> Node:
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


for _t in _BINARY:
    TABLE[_t] = _binary


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(c: Ctx, _: Any) -> Node:
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
def _floordiv(c: Ctx, _: Any) -> Node:
    return c.b.ew(Op.DIV, c.arg(0), c.arg(1), dtype=c.out_dtype)


@lower(aten.logical_not.default, aten.bitwise_not.default)
def _not(c: Ctx, _: Any) -> Node:
    x = c.arg(0)
    if x.dtype is not DType.bool:
        if c.target is aten.bitwise_not.default:
            raise UnsupportedOp(f"aten.bitwise_not on {x.dtype.value} (only bool is supported)")
        x = c.b.ew(Op.NE, x, 0, dtype=x.dtype)
    return c.b.ew(Op.NOT, x)


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(c: Ctx, _: Any) -> Node:
    return c.b.where(c.arg(0), c.arg(1), c.arg(2), c.out_dtype)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(c: Ctx, _: Any) -> Node:
    return c.b.where(c.arg(1), c.arg(2), c.arg(0), c.out_dtype)


@lower(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default)
def _clamp(c: Ctx, _: Any) -> Node:
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


def compute_dtype(dt: DType) -> DType:
    """Norms and softmax in bf16/f16 compute in fp32 and round once at the end, as torch's kernels do."""
    return DType.f32 if dt in (DType.bf16, DType.f16) else dt


@lower(aten.gelu.default)
def _gelu(c: Ctx, _: Any) -> Node:
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
def _silu(c: Ctx, _: Any) -> Node:
    x = c.b.cast(c.arg(0), compute_dtype(c.out_dtype))
    return c.b.cast(c.b.ew(Op.MUL, x, c.b.ew(Op.SIGMOID, x)), c.out_dtype)


@lower(aten.hardsigmoid.default)
def _hardsigmoid(c: Ctx, _: Any) -> Node:
    x = c.b.cast(c.arg(0), compute_dtype(c.out_dtype))
    y = c.b.ew(Op.MIN, c.b.ew(Op.MAX, c.b.ew(Op.ADD, c.b.ew(Op.DIV, x, 6.0), 0.5), 0.0), 1.0)
    return c.b.cast(y, c.out_dtype)


@lower(aten.hardswish.default)
def _hardswish(c: Ctx, _: Any) -> Node:
    b = c.b
    x = b.cast(c.arg(0), compute_dtype(c.out_dtype))
    r6 = b.ew(Op.MIN, b.ew(Op.MAX, b.ew(Op.ADD, x, 3.0), 0.0), 6.0)
    return b.cast(b.ew(Op.DIV, b.ew(Op.MUL, x, r6), 6.0), c.out_dtype)


@lower(aten._to_copy.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
       aten.detach.default, aten.contiguous.default)  # fmt: skip
def _copy(c: Ctx, _: Any) -> Node:
    return c.b.cast(c.arg(0), c.out_dtype)


@lower(aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
       aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.new_zeros.default,
       aten.new_ones.default, aten.new_full.default, aten.empty.memory_format, aten.empty_like.default)  # fmt: skip
def _full(c: Ctx, _: Any) -> Node:
    t = c.target
    value: Any = {aten.zeros.default: 0, aten.ones.default: 1, aten.zeros_like.default: 0, aten.ones_like.default: 1,
                  aten.new_zeros.default: 0, aten.new_ones.default: 1, aten.empty.memory_format: 0,
                  aten.empty_like.default: 0}.get(t)  # fmt: skip
    if value is None:
        value = c.arg(0) if t is aten.scalar_tensor.default else c.arg(1) if t is not aten.new_full.default else c.arg(2)
    return c.b.full(value, c.out_dtype, c.out_shape)


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(c: Ctx, _: Any) -> Node:
    args = [c.arg(i) for i in range(len(c.fx.args))]
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    if not isinstance(start, int | float) or not isinstance(step, int | float):
        raise UnsupportedOp("aten.arange with a symbolic start or step")
    return c.b.add(Op.ARANGE, (), c.out_dtype, c.out_shape, ArangeAttr(start, step))


# ---- movement ----------------------------------------------------------------------------------------


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dims, aten.squeeze.dim,
       aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints)  # fmt: skip
def _view(c: Ctx, _: Any) -> Node:
    return c.b.reshape(c.arg(0), c.out_shape)


@lower(aten.as_strided.default)
def _as_strided(c: Ctx, _: Any) -> Node:
    x, stride = c.arg(0), c.arg(2)
    offset = c.arg(3, 0) or 0
    flat = c.b.reshape(x, (x.type.numel(),))
    attr = StridedAttr(tuple(as_dim(d) for d in stride), as_dim(offset))
    return c.b.add(Op.AS_STRIDED, (flat,), x.dtype, c.out_shape, attr)


@lower(aten.permute.default)
def _permute(c: Ctx, _: Any) -> Node:
    return c.b.permute(c.arg(0), c.arg(1))


@lower(aten.t.default, aten.transpose.int)
def _transpose(c: Ctx, _: Any) -> Node:
    x = c.arg(0)
    r = x.type.rank
    d0, d1 = (0, 1) if c.target is aten.t.default else (norm_axis(c.arg(1), r), norm_axis(c.arg(2), r))
    perm = list(range(r))
    if r >= 2:
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return c.b.permute(x, perm)


@lower(aten.expand.default, aten.expand_as.default)
def _expand(c: Ctx, _: Any) -> Node:
    return c.b.broadcast_to(c.arg(0), c.out_shape)


def _slice(b: Builder, x: Node, axis: int, start: Any, length: Any, step: int) -> Node:
    shape = list(x.shape)
    if isinstance(start, int) and start == 0 and step == 1 and dims_equal(length, shape[axis]):
        return x
    shape[axis] = length
    return b.add(Op.SLICE, (x,), x.dtype, tuple(shape), SliceAttr(axis, as_dim(start), step))


@lower(aten.slice.Tensor)
def _slice_lower(c: Ctx, _: Any) -> Node:
    x = c.arg(0)
    axis = norm_axis(c.arg(1, 0), x.type.rank)
    start, step = c.arg(2, None), c.arg(4, 1)
    size = x.shape[axis]
    start = 0 if start is None else start
    if isinstance(start, int) and start < 0:
        start = size + start
    if isinstance(start, int) and isinstance(size, int):
        start = min(max(start, 0), size)
    return _slice(c.b, x, axis, start, c.out_shape[axis], step)


@lower(aten.select.int)
def _select(c: Ctx, _: Any) -> Node:
    x = c.arg(0)
    axis = norm_axis(c.arg(1), x.type.rank)
    idx = c.arg(2)
    if isinstance(idx, int) and idx < 0:
        idx = x.shape[axis] + idx
    return c.b.reshape(_slice(c.b, x, axis, idx, 1, 1), c.out_shape)


@lower(aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default)
def _split(c: Ctx, _: Any) -> tuple[Node, ...]:
    x = c.arg(0)
    axis = norm_axis(c.kw("dim", 2, 0), x.type.rank)
    outs: list[Node] = []
    start: Any = 0
    for v in c.fx.meta["val"]:
        length = meta_shape(v)[axis]
        outs.append(_slice(c.b, x, axis, start, length, 1))
        start = as_dim(start + length)
    return tuple(outs)


@lower(aten.cat.default)
def _cat(c: Ctx, _: Any) -> Node:
    xs = [x for x in c.arg(0) if not any(isinstance(d, int) and d == 0 for d in x.shape)]
    axis = norm_axis(c.arg(1, 0), c.out_shape.__len__())
    dt = c.out_dtype
    xs = [c.b.cast(x, dt) for x in xs]
    if len(xs) == 1:
        return xs[0]
    return c.b.add(Op.CAT, xs, dt, c.out_shape, AxisAttr(axis))


@lower(aten.constant_pad_nd.default)
def _pad(c: Ctx, _: Any) -> Node:
    x, pad, value = c.arg(0), list(c.arg(1)), c.arg(2, 0)
    r = x.type.rank
    pads = [(0, 0)] * r
    for k in range(len(pad) // 2):
        pads[r - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    return c.b.add(Op.PAD, (x,), x.dtype, c.out_shape, PadAttr(tuple(pads), value))


@lower(aten.embedding.default)
def _embedding(c: Ctx, _: Any) -> Node:
    w, ids = c.arg(0), c.arg(1)
    flat = c.b.reshape(ids, (ids.type.numel(),))
    rows = c.b.add(Op.INDEX_SELECT, (w, c.b.cast(flat, DType.i64)), w.dtype, (flat.shape[0], *w.shape[1:]), AxisAttr(0))
    return c.b.reshape(rows, c.out_shape)


@lower(aten.index_select.default)
def _index_select(c: Ctx, _: Any) -> Node:
    x, axis, idx = c.arg(0), c.arg(1), c.arg(2)
    axis = norm_axis(axis, x.type.rank)
    idx = c.b.cast(c.b.reshape(idx, (idx.type.numel(),)), DType.i64)
    return c.b.add(Op.INDEX_SELECT, (x, idx), x.dtype, c.out_shape, AxisAttr(axis))


@lower(aten.gather.default)
def _gather(c: Ctx, _: Any) -> Node:
    x, axis, idx = c.arg(0), c.arg(1), c.arg(2)
    axis = norm_axis(axis, x.type.rank)
    return c.b.add(Op.GATHER, (x, c.b.cast(idx, DType.i64)), x.dtype, c.out_shape, AxisAttr(axis))


@lower(aten.index.Tensor)
def _index(c: Ctx, _: Any) -> Node:
    """x[i0, i1, ...] with integer index tensors (None for a full slice). One index is an INDEX_SELECT.
    Several broadcast together and address the indexed dims as one merged dim: x is permuted so they sit
    together (where torch puts the broadcast dims: in place when adjacent, else in front), reshaped to
    merge them, and one INDEX_SELECT takes the row-major flat index."""
    x, indices = c.arg(0), c.arg(1)
    live = [(k, i) for k, i in enumerate(indices) if i is not None]
    if any(i.dtype is DType.bool for _, i in live):
        raise UnsupportedOp("aten.index.Tensor with a boolean mask (its output size depends on the data)")
    if len(live) == 1:
        axis, idx = live[0]
        one = c.b.cast(c.b.reshape(idx, (idx.type.numel(),)), DType.i64)
        # x[..., [-2], :] (Falcon's multi-query split): torch counts negative indices from the end
        one = c.b.where(c.b.ew(Op.LT, one, 0), c.b.ew(Op.ADD, one, c.b.full(x.shape[axis], DType.i64)), one, DType.i64)
        shape = list(x.shape)
        shape[axis] = one.shape[0]
        sel = c.b.add(Op.INDEX_SELECT, (x, one), x.dtype, tuple(shape), AxisAttr(axis))
        return c.b.reshape(sel, c.out_shape)
    axes = [k for k, _ in live]
    rest = [k for k in range(x.type.rank) if k not in axes]
    start = axes[0] if axes == list(range(axes[0], axes[0] + len(axes))) else 0
    xp = c.b.permute(x, rest[:start] + axes + rest[start:])
    merged: Dim = 1
    for k in axes:
        merged = merged * x.shape[k]
    xm = c.b.reshape(xp, (*xp.shape[:start], as_dim(merged), *xp.shape[start + len(axes) :]))
    flat: Node | None = None
    for k, idx in live:
        size = c.b.full(x.shape[k], DType.i64)
        i = c.b.cast(idx, DType.i64)
        i = c.b.where(c.b.ew(Op.LT, i, 0), c.b.ew(Op.ADD, i, size), i, DType.i64)  # torch's negative indices
        flat = i if flat is None else c.b.ew(Op.ADD, c.b.ew(Op.MUL, flat, size), i)
    assert flat is not None
    flat = c.b.reshape(flat, (flat.type.numel(),))
    shape = list(xm.shape)
    shape[start] = flat.shape[0]
    sel = c.b.add(Op.INDEX_SELECT, (xm, flat), x.dtype, tuple(shape), AxisAttr(start))
    return c.b.reshape(sel, c.out_shape)


@lower(aten.repeat.default)
def _repeat(c: Ctx, _: Any) -> Node:
    """x.repeat(r0, r1, ...): each dim d becomes (r_d, size_d) by EXPAND, then merges to r_d * size_d."""
    x, reps = c.arg(0), list(c.arg(1))
    x = c.b.reshape(x, (1,) * (len(reps) - x.type.rank) + tuple(x.shape))
    spread: list[Dim] = []
    for d in x.shape:
        spread += [1, d]
    tiled: list[Dim] = []
    for r, d in zip(reps, x.shape, strict=True):
        tiled += [r, d]
    y = c.b.broadcast_to(c.b.reshape(x, tuple(spread)), tuple(tiled))
    return c.b.reshape(y, c.out_shape)


# ---- the driver ----------------------------------------------------------------------------------------


def lower_program(cap: Captured) -> Graph:
    ep = cap.program
    gm = ep.graph_module
    b = Builder()
    env: dict[torch.fx.Node, Any] = {}

    _check_supported(gm)

    sig = ep.graph_signature
    consts = {**ep.state_dict, **getattr(ep, "constants", {})}
    kind_by_name = {s.arg.name: s for s in sig.input_specs}
    weights: dict[str, np.ndarray] = {}
    inputs: list[Node] = []
    used_names: set[str] = set()
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        spec = kind_by_name[n.name]
        b.source = None
        if spec.kind.name == "USER_INPUT":
            v = n.meta["val"]
            node = b.add(Op.INPUT, (), TORCH_DTYPES[v.dtype], meta_shape(v), InputAttr(n.name))
            inputs.append(node)
        else:
            target = spec.target
            t = consts[target]
            t = t.detach().contiguous()
            arr = (t.float().numpy().astype(DType.bf16.numpy()) if t.dtype is torch.bfloat16 else t.numpy()).copy()
            wname = _unique(re.sub(r"[^A-Za-z0-9_.]", "_", target), used_names)
            weights[wname] = arr
            node = b.add(Op.WEIGHT, (), TORCH_DTYPES[t.dtype], tuple(t.shape), WeightAttr(wname))
        env[n] = node

    outputs: list[Node] = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            if n.target in IGNORED:
                continue
            if n.target is operator.getitem:
                env[n] = env[n.args[0]][n.args[1]]
                continue
            b.source = source_line(n)
            c = Ctx(b, env)
            c.fx = n
            try:
                env[n] = TABLE[n.target](c, None)
            except UnsupportedOp as e:
                raise UnsupportedOp(f"{e}\n  at {b.source or 'an unknown source line'}") from None
        elif n.op == "output":
            for o in n.args[0]:
                if not isinstance(o, torch.fx.Node) or env.get(o) is None:
                    raise UnsupportedOp(f"model output {o!r} is not a tensor aotc can compute")
                outputs.append(env[o])

    return Graph(nodes=b.nodes, inputs=inputs, outputs=outputs, weights=weights, symbols=_symbols(cap, inputs))


def _unique(name: str, used: set[str]) -> str:
    out, k = name, 1
    while out in used:
        out, k = f"{name}_{k}", k + 1
    used.add(out)
    return out


def _symbols(cap: Captured, inputs: list[Node]) -> list[Symbol]:
    ranges = cap.program.range_constraints
    found: dict[str, Symbol] = {}
    for node in inputs:
        assert isinstance(node.attr, InputAttr)
        for axis, d in enumerate(node.shape):
            if isinstance(d, sympy.Symbol) and d.name not in found:
                vr = ranges.get(d)
                lo = int(vr.lower) if vr is not None else 0
                hi_raw = vr.upper if vr is not None else None
                hi = int(hi_raw) if hi_raw is not None and hi_raw.is_finite else None
                # the user's declared range wins: an export retried with Dim.AUTO reports min 2 for min=1 dims
                label, declared_lo, declared_hi = cap.dims.get((node.attr.name, axis), (f"{node.attr.name}.shape[{axis}]", lo, hi))
                lo, hi = declared_lo, hi if declared_hi is None else declared_hi
                found[d.name] = Symbol(d.name, label, max(lo, 0), hi)
    for node in inputs:
        for d in node.shape:
            if not isinstance(d, int):
                for s in d.free_symbols:
                    if s.name not in found:
                        raise UnsupportedOp(
                            f"input {node.attr.name!r} has a dimension {d} that is not a plain dynamic dim"  # type: ignore[union-attr]
                        )
    return sorted(found.values(), key=lambda s: s.name)


def _check_supported(gm: torch.fx.GraphModule) -> None:
    missing: Counter[str] = Counter()
    first: dict[str, str | None] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target in IGNORED or n.target is operator.getitem:
            continue
        if n.target not in TABLE:
            name = str(n.target)
            missing[name] += 1
            first.setdefault(name, source_line(n))
    if missing:
        lines = [f"  {op} (x{k}), first at {first[op] or 'an unknown source line'}" for op, k in sorted(missing.items())]
        raise UnsupportedOp(
            "the model uses ops aotc cannot lower yet:\n" + "\n".join(lines)
            + "\n  fix: rewrite those lines with supported ops (see docs/ops.md), or file an issue naming the op"
        )  # fmt: skip


# The reduction, normalisation and library-op lowerings live in lower_nn.py (it registers into TABLE);
# imported last because it builds on the helpers above.
from . import lower_nn  # noqa: E402, F401
