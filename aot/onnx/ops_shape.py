"""ONNX rules for shapes and movement: Shape, Reshape, Transpose, (Un)Squeeze, Flatten, Concat, Split, Slice,
Gather, GatherElements, Expand, Tile, Pad, Range, ConstantOfShape, Constant, Trilu, CumSum, DepthToSpace.

Shape arithmetic is folded: on ``Static`` inputs each rule computes with numpy (sizes of dynamic dimensions
are sympy expressions in object arrays), so the IR only sees the resulting RESHAPE/EXPAND/SLICE.
What it is not: index arithmetic; fusion folds these nodes into kernels' loads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy
from onnx import numpy_helper

from ..builder import broadcast_shapes
from ..ir import ArangeAttr, AxisAttr, Dim, DType, Node, Op, PadAttr, as_dim, dims_equal
from ..lower.movement import _slice
from .table import Ctx, Static, Value, axis_of, dtype_of, exact_div, op

BIG = 2**62  # ONNX writes "to the end" as INT64_MAX (or a large negative for "from the start")
FOLD_LIMIT = 1 << 16  # larger build-time arrays stay tensors (FULL/EXPAND), not stored copies


def _prod(dims: Any) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return as_dim(out)


@op("Shape")
def _shape(c: Ctx) -> Value:
    shape = list(c.shape(0))
    start, end = int(c.attr("start", 0)), c.attr("end")
    return Static.of(shape[start : (None if end is None else int(end))], DType.i64)


@op("Size")
def _size(c: Ctx) -> Value:
    return Static.of(np.asarray(_prod(c.shape(0)), dtype=object), DType.i64)


@op("Constant")
def _constant(c: Ctx) -> Value:
    a = c.a
    if "value" in a:
        t = a["value"]
        return Static(np.asarray(numpy_helper.to_array(t)), dtype_of(t.data_type, f"{c.where}'s value"), c.node.output[0])
    for key, dt in (("value_float", DType.f32), ("value_floats", DType.f32), ("value_int", DType.i64), ("value_ints", DType.i64)):
        if key in a:
            return Static.of(np.asarray(a[key]), dt)
    raise c.fail(f"Constant with {', '.join(a) or 'no value'} (sparse and string constants are not supported)")


def _reshape_target(c: Ctx, shape: tuple[Dim, ...], target: list[Dim], allowzero: bool) -> tuple[Dim, ...]:
    out = [shape[k] if (isinstance(d, int) and d == 0 and not allowzero) else d for k, d in enumerate(target)]
    if any(isinstance(d, int) and d == -1 for d in out):
        k = next(k for k, d in enumerate(out) if isinstance(d, int) and d == -1)
        rest = _prod(d for j, d in enumerate(out) if j != k)
        out[k] = as_dim(sympy.simplify(sympy.sympify(_prod(shape)) / sympy.sympify(rest)))
    return tuple(as_dim(d) for d in out)


@op("Reshape")
def _reshape(c: Ctx) -> Value:
    target = _reshape_target(c, c.shape(0), c.ints(1, "target shape"), bool(c.attr("allowzero", 0)))
    s = c.static(0)
    if s is not None and all(isinstance(d, int) for d in target):
        return Static(s.value.reshape(target), s.dtype, s.name)
    x = c.t(0)
    if not dims_equal(x.type.numel(), _prod(target)):
        raise c.fail(f"cannot reshape {list(x.shape)} to {list(target)}")
    return c.b.reshape(x, target)


def _reshaped(c: Ctx, target: tuple[Dim, ...]) -> Value:
    """Input 0 in shape ``target`` (same elements): folded when it is a constant, else a reshape node."""
    s = c.static(0)
    if s is not None:
        return Static(s.value.reshape(target), s.dtype, s.name)
    return c.b.reshape(c.t(0), target)


@op("Flatten")
def _flatten(c: Ctx) -> Value:
    shape = c.shape(0)
    axis = axis_of(int(c.attr("axis", 1)), len(shape))
    target = (_prod(shape[:axis]), _prod(shape[axis:]))
    return _reshaped(c, target)


@op("Transpose")
def _transpose(c: Ctx) -> Value:
    rank = len(c.shape(0))
    perm = [int(p) for p in c.attr("perm", list(range(rank))[::-1])]
    s = c.static(0)
    if s is not None:
        return Static(np.ascontiguousarray(np.transpose(s.value, perm)), s.dtype, s.name)
    return c.b.permute(c.t(0), perm)


def _axes_arg(c: Ctx, i: int) -> list[int] | None:
    if c.has(i):
        return [int(a) for a in c.need(i, "axes").ravel().tolist()]
    axes = c.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@op("Squeeze")
def _squeeze(c: Ctx) -> Value:
    shape = c.shape(0)
    axes = _axes_arg(c, 1)
    ones = {k for k, d in enumerate(shape) if isinstance(d, int) and d == 1}
    drop = ones if axes is None else {axis_of(a, len(shape)) for a in axes}
    target = tuple(d for k, d in enumerate(shape) if k not in drop)
    return _reshaped(c, target)


@op("Unsqueeze")
def _unsqueeze(c: Ctx) -> Value:
    shape = list(c.shape(0))
    axes = _axes_arg(c, 1) or []
    rank = len(shape) + len(axes)
    for a in sorted(axis_of(a, rank) for a in axes):
        shape.insert(a, 1)
    return _reshaped(c, tuple(shape))


@op("Concat")
def _concat(c: Ctx) -> Value:
    vals = [v for v in c.ins if v is not None]
    rank = len(vals[0].shape)
    axis = axis_of(int(c.attr("axis")), rank)
    dt = vals[0].dtype
    if c.all_static():
        arrs = [v.value for v in vals if isinstance(v, Static)]
        if any(a.dtype == object for a in arrs):
            arrs = [a.astype(object) for a in arrs]
        return Static.of(np.concatenate(arrs, axis=axis), dt)
    xs = [c.b.cast(c.imp.tensor(v, c.b), dt) for v in vals if not any(isinstance(d, int) and d == 0 for d in v.shape)]
    if len(xs) == 1:
        return xs[0]
    shape = list(xs[0].shape)
    shape[axis] = as_dim(sum((x.shape[axis] for x in xs), start=0))
    return c.b.add(Op.CAT, xs, dt, tuple(shape), AxisAttr(axis))


@op("Split")
def _split(c: Ctx) -> tuple[Value, ...]:
    shape = c.shape(0)
    axis = axis_of(int(c.attr("axis", 0)), len(shape))
    n_out = len(c.node.output)
    if c.has(1):
        sizes: list[Dim] = c.ints(1, "split sizes")
    elif c.attr("split") is not None:
        sizes = [int(v) for v in c.attr("split")]
    else:
        n = int(c.attr("num_outputs", n_out))
        total = shape[axis]
        if not isinstance(total, int):
            sizes = [exact_div(total, n)] * n  # a dynamic dim split evenly
        else:
            step = -(-total // n)
            sizes = [min(step, total - k * step) for k in range(n)]
    s = c.static(0)
    if s is not None and all(isinstance(v, int) for v in sizes):
        cuts = np.cumsum(sizes)[:-1]
        return tuple(Static(p, s.dtype) for p in np.split(s.value, cuts, axis=axis))
    x = c.t(0)
    outs: list[Value] = []
    start: Dim = 0
    for size in sizes:
        outs.append(_slice(c.b, x, axis, start, size, 1))
        start = as_dim(start + size)
    return tuple(outs)


def _clamp(v: Dim, size: Dim, step: int) -> Dim:
    """ONNX Slice's start/end: negative counts from the end, then clamp to [0, size] (step > 0)."""
    if isinstance(v, int):
        if v >= BIG or (isinstance(size, int) and v >= size):
            return size
        if v <= -BIG:
            return 0
        if v < 0:
            v = as_dim(size + v)
            return max(v, 0) if isinstance(v, int) else v
    return v


@op("Slice")
def _slice_op(c: Ctx) -> Value:
    shape = c.shape(0)
    rank = len(shape)
    starts, ends = c.ints(1, "starts"), c.ints(2, "ends")
    axes = [axis_of(int(a), rank) for a in c.ints(3, "axes")] if c.has(3) else list(range(len(starts)))
    steps = [int(s) for s in c.ints(4, "steps")] if c.has(4) else [1] * len(starts)
    s = c.static(0)
    if s is not None:
        idx: list[Any] = [slice(None)] * rank
        for a, st, en, sp in zip(axes, starts, ends, steps, strict=True):
            if not (isinstance(st, int) and isinstance(en, int)):
                break
            idx[a] = slice(max(min(st, BIG), -BIG), max(min(en, BIG), -BIG), sp)
        else:
            return Static(s.value[tuple(idx)], s.dtype)
    x = c.t(0)
    for a, st, en, sp in zip(axes, starts, ends, steps, strict=True):
        size = x.shape[a]
        if sp < 0:
            raise c.fail("Slice with a negative step (reversal) on a run-time tensor is not supported")
        lo, hi = _clamp(st, size, sp), _clamp(en, size, sp)
        if isinstance(lo, int) and isinstance(hi, int) and hi < lo:
            hi = lo
        length = as_dim((hi - lo + sp - 1) // sp) if sp > 1 else as_dim(hi - lo)
        x = _slice(c.b, x, a, lo, length, sp)
    return x


def _normalize_index(c: Ctx, idx: Node, size: Dim) -> Node:
    idx = c.b.cast(idx, DType.i64)
    return c.b.where(c.b.ew(Op.LT, idx, 0), c.b.ew(Op.ADD, idx, c.b.full(size, DType.i64)), idx, DType.i64)


@op("Gather")
def _gather(c: Ctx) -> Value:
    data_shape = c.shape(0)
    axis = axis_of(int(c.attr("axis", 0)), len(data_shape))
    s, i = c.static(0), c.static(1)
    if s is not None and i is not None and not i.symbolic:
        return Static.of(np.take(s.value, i.value.astype(np.int64), axis=axis), s.dtype)
    x = c.t(0)
    if i is not None and not i.symbolic and i.value.ndim == 0:  # one index: a slice, no gather
        k = int(i.value)
        k = as_dim(x.shape[axis] + k) if k < 0 else k
        one = _slice(c.b, x, axis, k, 1, 1)
        return c.b.reshape(one, tuple(d for j, d in enumerate(x.shape) if j != axis))
    idx = c.t(1)
    flat = _normalize_index(c, c.b.reshape(idx, (idx.type.numel(),)), x.shape[axis])
    shape = list(x.shape)
    shape[axis] = flat.shape[0]
    sel = c.b.add(Op.INDEX_SELECT, (x, flat), x.dtype, tuple(shape), AxisAttr(axis))
    return c.b.reshape(sel, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]))


@op("GatherElements")
def _gather_elements(c: Ctx) -> Value:
    x, idx = c.t(0), c.t(1)
    axis = axis_of(int(c.attr("axis", 0)), x.type.rank)
    return c.b.add(Op.GATHER, (x, _normalize_index(c, idx, x.shape[axis])), x.dtype, idx.shape, AxisAttr(axis))


@op("Expand")
def _expand(c: Ctx) -> Value:
    shape = c.shape(0)
    target = tuple(c.ints(1, "target shape"))
    out = broadcast_shapes(tuple(shape), target)
    s = c.static(0)
    if s is not None and not s.symbolic and all(isinstance(d, int) for d in out) and _prod(out) <= FOLD_LIMIT:
        return Static(np.broadcast_to(s.value, out).copy(), s.dtype)
    return c.b.broadcast_to(c.t(0), out)


@op("Tile")
def _tile(c: Ctx) -> Value:
    reps = c.ints(1, "repeats")
    s = c.static(0)
    if s is not None and not s.symbolic and all(isinstance(r, int) for r in reps):
        return Static(np.tile(s.value, reps), s.dtype)
    x = c.t(0)
    spread: list[Dim] = []
    tiled: list[Dim] = []
    for r, d in zip(reps, x.shape, strict=True):
        spread += [1, d]
        tiled += [r, d]
    y = c.b.broadcast_to(c.b.reshape(x, tuple(spread)), tuple(tiled))
    return c.b.reshape(y, tuple(as_dim(r * d) for r, d in zip(reps, x.shape, strict=True)))


@op("Pad", check=lambda n, a: None if a.get("mode", "constant") == "constant" else f"mode={a['mode']!r}")
def _pad(c: Ctx) -> Value:
    x = c.t(0)
    rank = x.type.rank
    pads = [int(p) for p in c.need(1, "pads").ravel().tolist()]
    value: Any = 0
    if c.has(2):
        value = c.need(2, "constant value").ravel()[0].item()
    axes = [axis_of(int(a), rank) for a in c.need(3, "axes").ravel().tolist()] if c.has(3) else list(range(rank))
    n = len(axes)
    per = [(0, 0)] * rank
    for k, a in enumerate(axes):
        per[a] = (pads[k], pads[k + n])
    shape = tuple(as_dim(d + lo + hi) for d, (lo, hi) in zip(x.shape, per, strict=True))
    if all(p == (0, 0) for p in per):
        return x
    return c.b.add(Op.PAD, (x,), x.dtype, shape, PadAttr(tuple(per), value))


@op("Range")
def _range(c: Ctx) -> Value:
    start, limit, delta = (c.need(i, name).ravel()[0] for i, name in enumerate(("start", "limit", "delta")))
    dt = c.dtype(0)
    if all(isinstance(v, int | float | np.generic) for v in (start, limit, delta)):
        return Static.of(np.arange(start, limit, delta, dtype=dt.numpy()), dt)
    if not (isinstance(start, int | np.integer) and isinstance(delta, int | np.integer)) or int(delta) <= 0:
        raise c.fail("Range with a symbolic limit needs an integer start and a positive integer delta")
    st, dl = int(start), int(delta)
    n = as_dim((sympy.sympify(limit) - st + dl - 1) // dl) if dl > 1 else as_dim(sympy.sympify(limit) - st)
    return c.b.add(Op.ARANGE, (), dt, (n,), ArangeAttr(st, dl))


@op("ConstantOfShape")
def _constant_of_shape(c: Ctx) -> Value:
    shape = c.ints(0, "shape")
    t = c.attr("value")
    arr = np.asarray(numpy_helper.to_array(t)).ravel() if t is not None else np.zeros(1, np.float32)
    dt = dtype_of(t.data_type, f"{c.where}'s value") if t is not None else DType.f32
    if all(isinstance(d, int) for d in shape) and _prod(shape) <= FOLD_LIMIT:
        return Static(np.full(shape, arr[0], dtype=dt.numpy()), dt)
    return c.b.full(arr[0].item(), dt, tuple(shape))


@op("Trilu")
def _trilu(c: Ctx) -> Value:
    k = int(c.need(1, "k").ravel()[0]) if c.has(1) else 0
    upper = bool(c.attr("upper", 1))
    s = c.static(0)
    if s is not None and not s.symbolic:
        return Static(np.triu(s.value, k) if upper else np.tril(s.value, k), s.dtype)
    x = c.t(0)
    rows, cols = x.shape[-2], x.shape[-1]
    b = c.b
    i = b.reshape(b.add(Op.ARANGE, (), DType.i64, (rows,), ArangeAttr(0, 1)), (rows, 1))
    j = b.reshape(b.add(Op.ARANGE, (), DType.i64, (cols,), ArangeAttr(0, 1)), (1, cols))
    diff = b.ew(Op.SUB, j, i)  # keep j - i >= k (upper) or <= k (lower)
    keep = b.ew(Op.GE if upper else Op.LE, diff, k)
    return b.where(keep, x, 0, x.dtype)


@op("CumSum", check=lambda n, a: "reverse=1" if a.get("reverse", 0) else None)
def _cumsum(c: Ctx) -> Value:
    x = c.t(0)
    axis = axis_of(int(c.need(1, "axis").ravel()[0]), x.type.rank)
    y = c.b.add(Op.CUMSUM, (x,), x.dtype, x.shape, AxisAttr(axis))
    return c.b.ew(Op.SUB, y, x) if c.attr("exclusive", 0) else y


@op("DepthToSpace", "SpaceToDepth")
def _depth_to_space(c: Ctx) -> Value:
    x = c.t(0)
    bs = int(c.attr("blocksize"))
    n, ch, h, w = x.shape
    b = c.b
    if c.node.op_type == "SpaceToDepth":
        y = b.reshape(x, (n, ch, exact_div(h, bs), bs, exact_div(w, bs), bs))
        return b.reshape(b.permute(y, (0, 3, 5, 1, 2, 4)), (n, ch * bs * bs, exact_div(h, bs), exact_div(w, bs)))
    c_out = exact_div(ch, bs * bs)
    if c.attr("mode", "DCR") == "DCR":
        y = b.reshape(x, (n, bs, bs, c_out, h, w))
        y = b.permute(y, (0, 3, 4, 1, 5, 2))
    else:
        y = b.reshape(x, (n, c_out, bs, bs, h, w))
        y = b.permute(y, (0, 1, 4, 2, 5, 3))
    return b.reshape(y, (n, c_out, as_dim(h * bs), as_dim(w * bs)))


@op("GatherND", check=lambda n, a: f"batch_dims={a['batch_dims']}" if a.get("batch_dims", 0) else None)
def _gather_nd(c: Ctx) -> Value:
    """data[idx[..., 0], ..., idx[..., k-1]]: the first k dims merged into one, addressed by the row-major
    flat index, then one INDEX_SELECT."""
    x, idx = c.t(0), c.t(1)
    k = idx.shape[-1]
    if not isinstance(k, int):
        raise c.fail("a dynamic index depth")
    b = c.b
    lead = _prod(x.shape[:k])
    xm = b.reshape(x, (lead, *x.shape[k:]))
    flat: Node | None = None
    for j in range(k):
        part = _slice(b, idx, idx.type.rank - 1, j, 1, 1)
        i = _normalize_index(c, b.reshape(part, idx.shape[:-1]), x.shape[j])
        flat = i if flat is None else b.ew(Op.ADD, b.ew(Op.MUL, flat, b.full(x.shape[j], DType.i64)), i)
    assert flat is not None
    rows = b.reshape(flat, (as_dim(flat.type.numel()),))
    sel = b.add(Op.INDEX_SELECT, (xm, rows), x.dtype, (rows.shape[0], *x.shape[k:]), AxisAttr(0))
    return b.reshape(sel, (*idx.shape[:-1], *x.shape[k:]))
