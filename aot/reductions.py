"""The loop kernels of fusion that reduce: Reduce (sums, maxima, softmax and layer-norm rows), pooling windows
as Reduce kernels, and Scan (prefix sums).

What it is not: the choice of roots (``fusion.py``); the value trees come from ``values.py``.
"""

from __future__ import annotations

import sympy

from . import kernel as K
from .buffers import Buffers
from .ir import AxisAttr, Node, Op, PoolAttr, ReduceAttr, dims_equal
from .values import Realize, ValueBuilder, all_of, cmp, const


def reduce(f: Buffers, root: Node, red: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    assert isinstance(red.attr, ReduceAttr)
    x = red.inputs[0]
    axes = red.attr.axes
    sizes = tuple(x.shape[k] for k in axes)
    rvars = K.loop_vars("r", len(sizes))
    numel = root.type.numel()
    k = len(axes)
    trailing = axes == tuple(range(x.type.rank - k, x.type.rank))
    if dims_equal(numel, red.type.numel()):  # the root lives in the reduced space: one store per row
        outer = root.shape
        vars_ = K.loop_vars("i", len(outer))
        b = ValueBuilder(f, root, dict(zip((*vars_, *rvars), (*outer, *sizes), strict=True)), rvars, sizes)
        store_idx, val_idx = f.store_index(root, vars_), vars_
    elif trailing and len(root.shape) >= k and all(
        dims_equal(a, s) for a, s in zip(root.shape[-k:], sizes, strict=True)
    ):  # the root has the rows' shape: reductions, then a second pass over each row
        outer = root.shape[:-k]
        vars_ = K.loop_vars("i", len(outer))
        b = ValueBuilder(f, root, dict(zip((*vars_, *rvars), (*outer, *sizes), strict=True)), rvars, sizes)
        val_idx = (*vars_, *rvars)
        store_idx = f.store_index(root, val_idx)
    else:
        raise Realize(red, "its result is broadcast into a shape the kernel cannot loop over")
    store = K.Store(f.realized[root], store_idx, b.value(root, val_idx))
    per_row = len(val_idx) > len(vars_)  # the root has the rows' shape: written after the steps, per element
    kern = K.Reduce(
        name, tuple(sympy.sympify(d) for d in outer), tuple(sympy.sympify(d) for d in sizes), tuple(b.steps),
        () if per_row else (store,), (store,) if per_row else (),
    )  # fmt: skip
    return kern, b.region


def pool(f: Buffers, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    a = root.attr
    assert isinstance(a, PoolAttr)
    x = root.inputs[0]
    loop_vars = K.loop_vars("i", 4)
    vars_, shape = f.loop_order(root, loop_vars)
    r = K.loop_vars("r", 2)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
    h0, w0 = vars_[2] * sh - ph, vars_[3] * sw - pw
    ih, iw = h0 + r[0] * dh, w0 + r[1] * dw
    H, W = x.shape[2], x.shape[3]
    ranges = dict(zip((*loop_vars, *r), (*shape, kh, kw), strict=True))
    b = ValueBuilder(f, root, ranges, r, (kh, kw))
    mask = all_of([cmp(Op.GE, ih, 0), cmp(Op.LT, ih, H), cmp(Op.GE, iw, 0), cmp(Op.LT, iw, W)])
    dt = root.dtype
    body = b.value(x, (vars_[0], vars_[1], ih, iw))
    b.region.add(root)
    if a.kind == "max":
        steps = (K.Reduction(Op.RMAX, K.Masked(mask, body, float("-inf"), dt), dt),)
        value: K.Value = K.ReduceRef(0, dt)
    else:
        steps = (K.Reduction(Op.SUM, K.Masked(mask, body, 0.0, dt), dt),)
        if a.divisor:
            count: K.Value = const(a.divisor, dt)
        elif a.count_include_pad:
            hh = sympy.Min(h0 + kh, H + ph) - h0
            ww = sympy.Min(w0 + kw, W + pw) - w0
            count = K.Unary(Op.CAST, K.Index(hh * ww), dt)
        else:
            hh = sympy.Min(h0 + kh, H) - sympy.Max(h0, 0)
            ww = sympy.Min(w0 + kw, W) - sympy.Max(w0, 0)
            count = K.Unary(Op.CAST, K.Index(hh * ww), dt)
        value = K.Binary(Op.DIV, K.ReduceRef(0, dt), count, dt)
    store = K.Store(f.realized[root], f.store_index(root, vars_), value)
    return K.Reduce(name, tuple(sympy.sympify(d) for d in shape), (sympy.Integer(kh), sympy.Integer(kw)), steps, (store,)), b.region


def scan(f: Buffers, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    assert isinstance(root.attr, AxisAttr)
    ax = root.attr.axis
    outer = tuple(d for k, d in enumerate(root.shape) if k != ax)
    vars_ = K.loop_vars("i", len(outer))
    r0 = K.loop_var("r", 0)
    full = (*vars_[:ax], r0, *vars_[ax:])
    b = ValueBuilder(f, root, dict(zip(full, root.shape, strict=True)))
    body = b.value(root.inputs[0], full)
    b.region.add(root)
    return K.Scan(
        name, tuple(sympy.sympify(d) for d in outer), sympy.sympify(root.shape[ax]), body, root.dtype,
        (K.Store(f.realized[root], f.store_index(root, full), K.Prefix(root.dtype)),),
    ), b.region  # fmt: skip
