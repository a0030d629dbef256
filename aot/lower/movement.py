"""Lowering rules for movement: views, slices, concatenation, padding and the gathers (embedding, indexing).

What it is not: index arithmetic; fusion folds these nodes into the kernels' loads.
"""

from __future__ import annotations

from typing import Any

from aotc.errors import UnsupportedOp

from ..builder import Builder
from ..ir import AxisAttr, Dim, DType, Node, Op, PadAttr, SliceAttr, StridedAttr, as_dim, dims_equal
from .table import Ctx, aten, lower, meta_shape, norm_axis


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dims, aten.squeeze.dim,
       aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints)  # fmt: skip
def _view(c: Ctx) -> Node:
    return c.b.reshape(c.arg(0), c.out_shape)


@lower(aten.as_strided.default)
def _as_strided(c: Ctx) -> Node:
    x, stride = c.arg(0), c.arg(2)
    offset = c.arg(3, 0) or 0
    flat = c.b.reshape(x, (x.type.numel(),))
    attr = StridedAttr(tuple(as_dim(d) for d in stride), as_dim(offset))
    return c.b.add(Op.AS_STRIDED, (flat,), x.dtype, c.out_shape, attr)


@lower(aten.permute.default)
def _permute(c: Ctx) -> Node:
    return c.b.permute(c.arg(0), c.arg(1))


@lower(aten.t.default, aten.transpose.int)
def _transpose(c: Ctx) -> Node:
    x = c.arg(0)
    r = x.type.rank
    d0, d1 = (0, 1) if c.target is aten.t.default else (norm_axis(c.arg(1), r), norm_axis(c.arg(2), r))
    perm = list(range(r))
    if r >= 2:
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return c.b.permute(x, perm)


@lower(aten.expand.default, aten.expand_as.default)
def _expand(c: Ctx) -> Node:
    return c.b.broadcast_to(c.arg(0), c.out_shape)


def _slice(b: Builder, x: Node, axis: int, start: Any, length: Any, step: int) -> Node:
    shape = list(x.shape)
    if isinstance(start, int) and start == 0 and step == 1 and dims_equal(length, shape[axis]):
        return x
    shape[axis] = length
    return b.add(Op.SLICE, (x,), x.dtype, tuple(shape), SliceAttr(axis, as_dim(start), step))


@lower(aten.slice.Tensor)
def _slice_lower(c: Ctx) -> Node:
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
def _select(c: Ctx) -> Node:
    x = c.arg(0)
    axis = norm_axis(c.arg(1), x.type.rank)
    idx = c.arg(2)
    if isinstance(idx, int) and idx < 0:
        idx = x.shape[axis] + idx
    return c.b.reshape(_slice(c.b, x, axis, idx, 1, 1), c.out_shape)


@lower(aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default)
def _split(c: Ctx) -> tuple[Node, ...]:
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
def _cat(c: Ctx) -> Node:
    xs = [x for x in c.arg(0) if not any(isinstance(d, int) and d == 0 for d in x.shape)]
    axis = norm_axis(c.arg(1, 0), c.out_shape.__len__())
    dt = c.out_dtype
    xs = [c.b.cast(x, dt) for x in xs]
    if len(xs) == 1:
        return xs[0]
    return c.b.add(Op.CAT, xs, dt, c.out_shape, AxisAttr(axis))


@lower(aten.constant_pad_nd.default)
def _pad(c: Ctx) -> Node:
    x, pad, value = c.arg(0), list(c.arg(1)), c.arg(2, 0)
    r = x.type.rank
    pads = [(0, 0)] * r
    for k in range(len(pad) // 2):
        pads[r - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    return c.b.add(Op.PAD, (x,), x.dtype, c.out_shape, PadAttr(tuple(pads), value))


@lower(aten.embedding.default)
def _embedding(c: Ctx) -> Node:
    w, ids = c.arg(0), c.arg(1)
    flat = c.b.reshape(ids, (ids.type.numel(),))
    rows = c.b.add(Op.INDEX_SELECT, (w, c.b.cast(flat, DType.i64)), w.dtype, (flat.shape[0], *w.shape[1:]), AxisAttr(0))
    return c.b.reshape(rows, c.out_shape)


@lower(aten.index_select.default)
def _index_select(c: Ctx) -> Node:
    x, axis, idx = c.arg(0), c.arg(1), c.arg(2)
    axis = norm_axis(axis, x.type.rank)
    idx = c.b.cast(c.b.reshape(idx, (idx.type.numel(),)), DType.i64)
    return c.b.add(Op.INDEX_SELECT, (x, idx), x.dtype, c.out_shape, AxisAttr(axis))


@lower(aten.gather.default)
def _gather(c: Ctx) -> Node:
    x, axis, idx = c.arg(0), c.arg(1), c.arg(2)
    axis = norm_axis(axis, x.type.rank)
    return c.b.add(Op.GATHER, (x, c.b.cast(idx, DType.i64)), x.dtype, c.out_shape, AxisAttr(axis))


@lower(aten.index.Tensor)
def _index(c: Ctx) -> Node:
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
def _repeat(c: Ctx) -> Node:
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
