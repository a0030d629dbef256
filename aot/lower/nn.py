"""Lowering rules for reductions, softmax and norms, and the library ops (matmul, attention, conv, pooling,
resampling); each registers with ``@lower``.

What it is not: the templates that run library ops; those are chosen by fusion and codegen.
"""

from __future__ import annotations

import math
from typing import Any

from aotc.errors import UnsupportedOp

from ..builder import Builder, broadcast_shapes
from ..ir import ArangeAttr, AttentionAttr, AxisAttr, ConvAttr, DType, FullAttr, Node, Op, PoolAttr, ReduceAttr, Shape, as_dim, dims_equal
from .table import Ctx, aten, compute_dtype, lower, norm_axis

# ---- reductions ------------------------------------------------------------------------------------


def _axes(dims: Any, rank: int) -> tuple[int, ...]:
    if dims is None or dims == []:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(norm_axis(d, rank) for d in dims))


def reduce_shape(shape: Shape, axes: tuple[int, ...], keepdim: bool) -> Shape:
    return tuple((1 if k in axes else d) for k, d in enumerate(shape) if keepdim or k not in axes)


def reduce(b: Builder, op: Op, x: Node, axes: tuple[int, ...], keepdim: bool, dtype: DType | None = None) -> Node:
    x = b.cast(x, dtype or x.dtype)
    return b.add(op, (x,), x.dtype, reduce_shape(x.shape, axes, keepdim), ReduceAttr(axes, keepdim))


def count(shape: Shape, axes: tuple[int, ...]) -> Any:
    n: Any = 1
    for a in axes:
        n = n * shape[a]
    return as_dim(n)


def mean(b: Builder, x: Node, axes: tuple[int, ...], keepdim: bool, dtype: DType) -> Node:
    s = reduce(b, Op.SUM, x, axes, keepdim, dtype)
    n = count(x.shape, axes)
    if isinstance(n, int):
        return b.ew(Op.MUL, s, 1.0 / n)
    return b.ew(Op.DIV, s, b.cast(b.full(n, DType.i64), dtype))  # a symbolic count as a 0-d tensor


@lower(aten.sum.dim_IntList, aten.sum.default)
def _sum(c: Ctx) -> Node:
    x = c.arg(0)
    axes = _axes(c.arg(1) if c.target is aten.sum.dim_IntList else None, x.type.rank)
    return reduce(c.b, Op.SUM, x, axes, bool(c.kw("keepdim", 2, False)), c.out_dtype)


@lower(aten.mean.dim, aten.mean.default)
def _mean(c: Ctx) -> Node:
    x = c.arg(0)
    axes = _axes(c.arg(1) if c.target is aten.mean.dim else None, x.type.rank)
    return mean(c.b, x, axes, bool(c.kw("keepdim", 2, False)), c.out_dtype)


@lower(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _amax(c: Ctx) -> Node:
    x = c.arg(0)
    op = Op.RMAX if c.target in (aten.amax.default, aten.max.default) else Op.RMIN
    axes = _axes(c.arg(1) if c.target in (aten.amax.default, aten.amin.default) else None, x.type.rank)
    return reduce(c.b, op, x, axes, bool(c.kw("keepdim", 2, False)))


@lower(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.default)
def _any(c: Ctx) -> Node:
    x = c.arg(0)
    is_any = c.target in (aten.any.dim, aten.any.dims, aten.any.default)
    axes = _axes(c.arg(1) if c.target not in (aten.any.default, aten.all.default) else None, x.type.rank)
    f = c.b.cast(x if x.dtype is DType.bool else c.b.ew(Op.NE, x, 0), DType.f32)
    r = reduce(c.b, Op.RMAX if is_any else Op.RMIN, f, axes, bool(c.kw("keepdim", 2, False)))
    return c.b.ew(Op.NE, r, 0.0)


@lower(aten.var.correction, aten.var.dim)
def _var(c: Ctx) -> Node:
    x, dt = c.arg(0), c.out_dtype
    axes = _axes(c.arg(1), x.type.rank)
    keep = bool(c.kwarg("keepdim", False))
    corr = c.kwarg("correction", 1 if c.kwarg("unbiased", True) else 0)
    m = mean(c.b, x, axes, True, dt)
    d = c.b.ew(Op.SUB, x, m)
    n = count(x.shape, axes)
    s = reduce(c.b, Op.SUM, c.b.ew(Op.MUL, d, d), axes, keep)
    return c.b.ew(Op.MUL, s, 1.0 / max(n - corr, 1))


@lower(aten.cumsum.default)
def _cumsum(c: Ctx) -> Node:
    x = c.b.cast(c.arg(0), c.out_dtype)
    axis = norm_axis(c.arg(1), x.type.rank)
    return c.b.add(Op.CUMSUM, (x,), x.dtype, x.shape, AxisAttr(axis))


def softmax(b: Builder, x: Node, axis: int, log: bool = False) -> Node:
    m = reduce(b, Op.RMAX, x, (axis,), True)
    z = b.ew(Op.SUB, x, m)
    e = b.ew(Op.EXP, z)
    s = reduce(b, Op.SUM, e, (axis,), True)
    return b.ew(Op.SUB, z, b.ew(Op.LOG, s)) if log else b.ew(Op.DIV, e, s)


@lower(aten._softmax.default, aten._log_softmax.default)
def _softmax(c: Ctx) -> Node:
    x = c.b.cast(c.arg(0), compute_dtype(c.out_dtype))
    y = softmax(c.b, x, norm_axis(c.arg(1), x.type.rank), c.target is aten._log_softmax.default)
    return c.b.cast(y, c.out_dtype)


@lower(aten.native_layer_norm.default)
def _layer_norm(c: Ctx) -> tuple[Node, Node, Node]:
    x, shape, w, bias, eps = c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4)
    b = c.b
    out_dtype = x.dtype
    x = b.cast(x, compute_dtype(x.dtype))
    axes = tuple(range(x.type.rank - len(shape), x.type.rank))
    m = mean(b, x, axes, True, x.dtype)
    d = b.ew(Op.SUB, x, m)
    var = mean(b, b.ew(Op.MUL, d, d), axes, True, x.dtype)
    rstd = b.ew(Op.RSQRT, b.ew(Op.ADD, var, float(eps)))
    y = b.ew(Op.MUL, d, rstd)
    if w is not None:
        y = b.ew(Op.MUL, y, b.cast(w, x.dtype))
    if bias is not None:
        y = b.ew(Op.ADD, y, b.cast(bias, x.dtype))
    return b.cast(y, out_dtype), m, rstd


@lower(aten.native_group_norm.default)
def _group_norm(c: Ctx) -> tuple[Node, Node, Node]:
    """GroupNorm: layer-norm statistics over each group of C/G channels and all positions, then a per-channel
    affine. Returns (out, mean, rstd) with the statistics shaped (N, G), as torch's native op does."""
    x, w, bias, groups, eps = c.arg(0), c.arg(1), c.arg(2), int(c.arg(6)), float(c.arg(7))
    b = c.b
    n, ch = x.shape[0], x.shape[1]
    if not isinstance(ch, int) or ch % groups:
        raise UnsupportedOp(f"group_norm over {ch} channels in {groups} groups")
    xc = b.cast(x, compute_dtype(x.dtype))
    per_group: Any = ch // groups
    for d in x.shape[2:]:
        per_group = per_group * d
    g = b.reshape(xc, (n, groups, as_dim(per_group)))
    m = mean(b, g, (2,), True, g.dtype)
    d = b.ew(Op.SUB, g, m)
    rstd = b.ew(Op.RSQRT, b.ew(Op.ADD, mean(b, b.ew(Op.MUL, d, d), (2,), True, g.dtype), eps))
    y = b.reshape(b.ew(Op.MUL, d, rstd), x.shape)
    cshape = (1, ch) + (1,) * (x.type.rank - 2)
    if w is not None:
        y = b.ew(Op.MUL, y, b.reshape(b.cast(w, y.dtype), cshape))
    if bias is not None:
        y = b.ew(Op.ADD, y, b.reshape(b.cast(bias, y.dtype), cshape))
    return b.cast(y, x.dtype), b.reshape(m, (n, groups)), b.reshape(rstd, (n, groups))


@lower(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(c: Ctx) -> tuple[Node, Node, Node]:
    x, w, bias, mean_, var, eps = c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), c.arg(6)
    b = c.b
    cshape = (1, x.shape[1]) + (1,) * (x.type.rank - 2)
    rs = b.ew(Op.RSQRT, b.ew(Op.ADD, b.reshape(var, cshape), float(eps)))
    scale = b.ew(Op.MUL, rs, b.reshape(w, cshape)) if w is not None else rs
    shift = b.ew(Op.NEG, b.ew(Op.MUL, b.reshape(mean_, cshape), scale))
    if bias is not None:
        shift = b.ew(Op.ADD, shift, b.reshape(bias, cshape))
    y = b.ew(Op.ADD, b.ew(Op.MUL, x, scale), shift)
    return y, mean_, var


# ---- library ops -------------------------------------------------------------------------------------


def matmul(b: Builder, x: Node, y: Node, dtype: DType) -> Node:
    """Batched matmul with batch broadcasting made explicit."""
    x, y = b.cast(x, dtype), b.cast(y, dtype)
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    x = b.broadcast_to(x, (*batch, *x.shape[-2:]))
    y = b.broadcast_to(y, (*batch, *y.shape[-2:]))
    return b.add(Op.MATMUL, (x, y), dtype, (*batch, x.shape[-2], y.shape[-1]))


@lower(aten.mm.default, aten.bmm.default)
def _mm(c: Ctx) -> Node:
    return matmul(c.b, c.arg(0), c.arg(1), c.out_dtype)


@lower(aten.addmm.default)
def _addmm(c: Ctx) -> Node:
    bias, x, y = c.arg(0), c.arg(1), c.arg(2)
    beta, alpha = c.kwarg("beta", 1), c.kwarg("alpha", 1)
    out = matmul(c.b, x, y, c.out_dtype)
    if alpha != 1:
        out = c.b.ew(Op.MUL, out, alpha)
    if beta != 0:
        out = c.b.ew(Op.ADD, out, bias if beta == 1 else c.b.ew(Op.MUL, bias, beta))
    return out


@lower(aten.scaled_dot_product_attention.default)
def _sdpa(c: Ctx) -> Node:
    q, k, v = c.arg(0), c.arg(1), c.arg(2)
    mask = c.kw("attn_mask", 3)
    causal = bool(c.kw("is_causal", 5, False))
    scale = c.kw("scale", 6)
    b, dt = c.b, c.out_dtype
    e = q.shape[-1]
    if scale is None and not isinstance(e, int):
        raise UnsupportedOp("scaled_dot_product_attention with a dynamic head dimension")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(e)
    squeeze = q.type.rank == 2  # [L, E]: one head of its own
    if squeeze:
        q, k, v = (b.reshape(t, (1, *t.shape)) for t in (q, k, v))
    batch = broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q = b.broadcast_to(b.cast(q, dt), (*batch, *q.shape[-3:]))
    k = b.broadcast_to(b.cast(k, dt), (*batch, *k.shape[-3:]))
    v = b.broadcast_to(b.cast(v, dt), (*batch, *v.shape[-3:]))
    # GQA (enable_gqa): query head h reads kv head h // (Hq / Hk) by index inside the kernel, no copies.
    # Heads repeated by the model (transformers' repeat_kv: expand + reshape) are read the same way.
    k0, v0 = _kv_heads(b, k), _kv_heads(b, v)
    if k0.shape[-3] == v0.shape[-3] and k0 is not k:
        k, v = k0, v0
    if mask is not None and mask.dtype is DType.bool:  # a causal mask built by the model becomes the flag
        found, rest = _causal_part(b, mask)
        if found:
            causal, mask = True, rest
    ins = [q, k, v]
    kind = "none"
    if mask is not None:
        kind = "bool" if mask.dtype is DType.bool else "add"
        mask = b.cast(mask, DType.bool if kind == "bool" else dt)
        ins.append(b.broadcast_to(mask, (*q.shape[:-1], k.shape[-2])))
    out = b.add(Op.ATTENTION, ins, dt, (*q.shape[:-1], v.shape[-1]), AttentionAttr(scale, causal, kind))
    return b.reshape(out, out.shape[1:]) if squeeze else out


def _is_one(d: Any) -> bool:
    return isinstance(d, int) and d == 1


def _position(n: Node) -> tuple[int, Any] | None:
    """(axis, offset) when every element of ``n`` is its index along ``axis`` plus ``offset``: an arange
    (plus a constant) reshaped onto one axis and broadcast, as masks are built; else None."""
    while n.op is Op.EXPAND:
        n = n.inputs[0]
    axes = [k for k, d in enumerate(n.shape) if not _is_one(d)]
    if n.op is not Op.RESHAPE or len(axes) != 1:
        return None
    axis = axes[0]
    while n.op is Op.RESHAPE and sum(not _is_one(d) for d in n.shape) == 1:
        n = n.inputs[0]
    offset: Any = 0
    if n.op is Op.ADD:
        a, c = n.inputs
        if a.op is not Op.ARANGE:
            a, c = c, a
        while c.op in (Op.EXPAND, Op.RESHAPE):
            c = c.inputs[0]
        if c.op is not Op.FULL or not isinstance(c.attr, FullAttr) or not isinstance(c.attr.value, int):
            return None
        offset, n = c.attr.value, a
    if n.op is not Op.ARANGE or not isinstance(n.attr, ArangeAttr) or n.attr.step != 1 or n.type.rank != 1:
        return None
    return axis, offset + n.attr.start


def _leading_ones(m: Node) -> bool:
    """A reshape that only puts unit dims in front (rank extension for broadcasting)."""
    src, dst = m.inputs[0].shape, m.shape
    k = len(dst) - len(src)
    return k >= 0 and all(_is_one(d) for d in dst[:k]) and all(dims_equal(a, c) for a, c in zip(dst[k:], src, strict=True))


def _causal_part(b: Builder, m: Node) -> tuple[bool, Node | None]:
    """Split a bool mask into (whether it contains col <= row, top-left aligned, and-ed in; the rest of it, None
    where nothing is left). transformers builds causal masks as such expressions (create_causal_mask)."""
    while m.op is Op.EXPAND or (m.op is Op.RESHAPE and _leading_ones(m)):
        m = m.inputs[0]
    const = m
    while const.op in (Op.EXPAND, Op.RESHAPE):
        const = const.inputs[0]
    if const.op is Op.FULL and isinstance(const.attr, FullAttr) and const.attr.value is True:
        return False, None
    if m.op in (Op.LE, Op.GE) and m.type.rank >= 2:
        cols, rows = m.inputs if m.op is Op.LE else m.inputs[::-1]
        c, r = _position(cols), _position(rows)
        if c is not None and r is not None and (c[0], r[0]) == (m.type.rank - 1, m.type.rank - 2) and c[1] == r[1]:
            return True, None
    if m.op is Op.AND:
        (ca, ra), (cb, rb) = (_causal_part(b, x) for x in m.inputs)
        if ca or cb:
            rest = ra if rb is None else rb if ra is None else b.ew(Op.AND, ra, rb)
            return True, rest
    return False, m


def _kv_heads(b: Builder, t: Node) -> Node:
    """``t`` [..., Hk * rep, S, E] made by repeating each kv head ``rep`` times (reshape of an expand of
    [..., Hk, 1, S, E]) as the [..., Hk, S, E] it repeats; else ``t``."""
    if t.op is not Op.RESHAPE or t.inputs[0].op is not Op.EXPAND:
        return t
    ex = t.inputs[0]
    src = ex.inputs[0]
    ok = (
        ex.type.rank == t.type.rank + 1
        and src.shape[-3] == 1
        and isinstance(ex.shape[-4], int)
        and isinstance(t.shape[-3], int)
        and ex.shape[-4] * ex.shape[-3] == t.shape[-3]
        and all(dims_equal(x, y) for x, y in zip(ex.shape[:-3], src.shape[:-3], strict=True))
        and all(dims_equal(x, y) for x, y in zip((*ex.shape[:-4], *ex.shape[-2:]), (*t.shape[:-3], *t.shape[-2:]), strict=True))
    )
    return b.reshape(src, (*src.shape[:-3], *src.shape[-2:])) if ok else t


def _pair(v: Any, n: int = 2) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 else v


@lower(aten.convolution.default)
def _conv(c: Ctx) -> Node:
    x, w, bias = c.arg(0), c.arg(1), c.arg(2)
    stride, padding, dilation, transposed, _outpad, groups = (c.arg(i) for i in range(3, 9))
    if transposed:
        raise UnsupportedOp("aten.convolution with transposed=True (ConvTranspose)")
    if x.type.rank == 3:  # conv1d as conv2d with a unit height
        x = c.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        w = c.b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
        stride, padding, dilation = (1, *_pair(stride, 1)), (0, *_pair(padding, 1)), (1, *_pair(dilation, 1))
        out_shape = c.out_shape
        shape4 = (out_shape[0], out_shape[1], 1, out_shape[2])
    elif x.type.rank == 4:
        shape4 = c.out_shape
    else:
        raise UnsupportedOp(f"aten.convolution on a rank-{x.type.rank} input (conv1d/conv2d only)")
    dt = c.out_dtype
    attr = ConvAttr(_pair(stride), _pair(padding), _pair(dilation), int(groups))  # type: ignore[arg-type]
    y = c.b.add(Op.CONV2D, (c.b.cast(x, dt), c.b.cast(w, dt)), dt, shape4, attr)
    if bias is not None:
        y = c.b.ew(Op.ADD, y, c.b.reshape(bias, (1, bias.shape[0], 1, 1)))
    return c.b.reshape(y, c.out_shape)


@lower(aten.max_pool2d_with_indices.default, aten.max_pool2d.default)
def _max_pool(c: Ctx) -> Any:
    x = c.arg(0)
    kernel = _pair(c.arg(1))
    stride = _pair(c.arg(2) or kernel)
    attr = PoolAttr("max", kernel, stride, _pair(c.arg(3, 0)), _pair(c.arg(4, 1)), bool(c.arg(5, False)), False)  # type: ignore[arg-type]
    y = c.b.add(Op.POOL2D, (x,), x.dtype, c.out_shape, attr)
    return (y, None) if c.target is aten.max_pool2d_with_indices.default else y


@lower(aten.avg_pool2d.default)
def _avg_pool(c: Ctx) -> Node:
    x = c.arg(0)
    kernel = _pair(c.arg(1))
    stride = _pair(c.arg(2) or kernel)
    attr = PoolAttr("avg", kernel, stride, _pair(c.arg(3, 0)), (1, 1), bool(c.arg(4, False)),  # type: ignore[arg-type]
                    bool(c.arg(5, True)), c.arg(6, None))  # fmt: skip
    return c.b.add(Op.POOL2D, (x,), x.dtype, c.out_shape, attr)


@lower(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg(c: Ctx) -> Node:
    x = c.arg(0)
    oh, ow = _pair(c.arg(1))
    h, w = x.shape[2], x.shape[3]
    if not (isinstance(h, int) and isinstance(w, int)) or h % oh or w % ow:
        raise UnsupportedOp(f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow} (only exact divisors are supported)")
    k = (h // oh, w // ow)
    attr = PoolAttr("avg", k, k, (0, 0), (1, 1), False, True, None)
    return c.b.add(Op.POOL2D, (x,), x.dtype, c.out_shape, attr)


@lower(aten.linalg_vector_norm.default)
def _vector_norm(c: Ctx) -> Node:
    """torch.norm / linalg.vector_norm: sum(|x|^p)^(1/p), with the p = 2, 1, inf, -inf and 0 forms exact."""
    x, p = c.arg(0), c.kw("ord", 1, 2)
    axes = _axes(c.kw("dim", 2, None), x.type.rank)
    keepdim = bool(c.kw("keepdim", 3, False))
    dt = c.out_dtype
    a = c.b.ew(Op.ABS, c.b.cast(x, compute_dtype(dt)))
    if p == 2:
        r = c.b.ew(Op.SQRT, reduce(c.b, Op.SUM, c.b.ew(Op.MUL, a, a), axes, keepdim))
    elif p == 1:
        r = reduce(c.b, Op.SUM, a, axes, keepdim)
    elif p in (math.inf, -math.inf):
        r = reduce(c.b, Op.RMAX if p > 0 else Op.RMIN, a, axes, keepdim)
    elif p == 0:
        r = reduce(c.b, Op.SUM, c.b.cast(c.b.ew(Op.NE, a, 0.0), a.dtype), axes, keepdim)
    else:
        r = c.b.ew(Op.POW, reduce(c.b, Op.SUM, c.b.ew(Op.POW, a, float(p)), axes, keepdim), 1.0 / float(p))
    return c.b.cast(r, dt)


# ---- resampling --------------------------------------------------------------------------------------


def _source_scale(size_in: Any, size_out: Any, align_corners: bool, scale: float | None) -> Any:
    """torch's area_pixel_compute_scale: the source step per output pixel."""
    if align_corners:
        return (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    return 1.0 / scale if scale else size_in / size_out


def _coords(b: Builder, size_out: int, step: float, half_pixel: bool = False) -> Node:
    """Source positions in fp32 as torch computes them: dst * step, or (dst + 0.5) * step - 0.5 clamped at 0."""
    i = b.add(Op.ARANGE, (), DType.f32, (size_out,), ArangeAttr(0.5 if half_pixel else 0, 1))
    src = b.ew(Op.MUL, i, float(step))
    return b.ew(Op.MAX, b.ew(Op.SUB, src, 0.5), 0.0) if half_pixel else src


def _lerp_axis(b: Builder, x: Node, axis: int, size_out: int, step: float, align_corners: bool) -> Node:
    """Linear interpolation of ``x`` (fp32) along one spatial axis, as torch's upsample_bilinear2d does."""
    size_in = x.shape[axis]
    assert isinstance(size_in, int)
    src = _coords(b, size_out, step, half_pixel=not align_corners)
    lo = b.ew(Op.FLOOR, src)
    frac = b.ew(Op.SUB, src, lo)
    i0 = b.ew(Op.MIN, b.cast(lo, DType.i64), size_in - 1)
    i1 = b.ew(Op.MIN, b.ew(Op.ADD, i0, 1), size_in - 1)
    shape = [1] * x.type.rank
    shape[axis] = size_out
    w1 = b.reshape(frac, tuple(shape))
    w0 = b.ew(Op.SUB, b.full(1.0, DType.f32), w1)
    out_shape = tuple(size_out if k == axis else d for k, d in enumerate(x.shape))
    x0 = b.add(Op.INDEX_SELECT, (x, i0), x.dtype, out_shape, AxisAttr(axis))
    x1 = b.add(Op.INDEX_SELECT, (x, i1), x.dtype, out_shape, AxisAttr(axis))
    return b.ew(Op.ADD, b.ew(Op.MUL, x0, w0), b.ew(Op.MUL, x1, w1))


def _nearest_axis(b: Builder, x: Node, axis: int, size_out: int, step: float) -> Node:
    """torch's legacy 'nearest': source index floor(dst * step), clamped."""
    size_in = x.shape[axis]
    assert isinstance(size_in, int)
    idx = b.ew(Op.MIN, b.cast(b.ew(Op.FLOOR, _coords(b, size_out, step)), DType.i64), size_in - 1)
    out_shape = tuple(size_out if k == axis else d for k, d in enumerate(x.shape))
    return b.add(Op.INDEX_SELECT, (x, idx), x.dtype, out_shape, AxisAttr(axis))


@lower(aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec)
def _upsample(c: Ctx) -> Node:
    """F.interpolate on NCHW, separable: one axis at a time with INDEX_SELECT and (bilinear) a lerp in fp32.
    Needs static input and output H, W (the source positions are fixed per output pixel)."""
    x = c.arg(0)
    bilinear = c.target is aten.upsample_bilinear2d.vec
    align = bool(c.arg(2)) if bilinear else False
    scales = c.arg(3 if bilinear else 2)
    out_hw = c.out_shape[2:]
    if not all(isinstance(d, int) for d in (*x.shape[2:], *out_hw)):
        raise UnsupportedOp(f"{c.target} with a dynamic image size (input {x.shape}, output {c.out_shape})")
    y = c.b.cast(x, compute_dtype(x.dtype)) if bilinear else x
    for axis in (3, 2):  # W first: h0 * (w0 * x00 + w1 * x01) + h1 * (...), torch's order of operations
        k = axis - 2
        scale = float(scales[k]) if scales else None
        step = _source_scale(x.shape[axis], out_hw[k], align, scale)
        y = _lerp_axis(c.b, y, axis, out_hw[k], step, align) if bilinear else _nearest_axis(c.b, y, axis, out_hw[k], step)
    return c.b.cast(y, c.out_dtype)
