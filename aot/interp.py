"""The numpy reference interpreter: the living definition of every IR op.

Slow and plain on purpose. Generated C++ and Triton are checked against it (and against eager torch).
Sizes are evaluated with ``env`` (symbol name -> int), bound from the inputs' shapes.
What it is not: fast, or the kernel-level interpreter (``kernel_interp.py`` runs fused kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import sympy

from .ir import (
    ArangeAttr,
    AttentionAttr,
    AxisAttr,
    ConvAttr,
    Dim,
    DType,
    FullAttr,
    Graph,
    Node,
    Op,
    PadAttr,
    PermuteAttr,
    PoolAttr,
    ReduceAttr,
    SliceAttr,
    StridedAttr,
    WeightAttr,
)


def _in_range(index: np.ndarray, n: int) -> np.ndarray:
    """Gather indices must lie in [0, n), as the kernels require: numpy would wrap a negative one silently
    (torch's wrapping of negative indices is made explicit when lowering)."""
    if index.size and (index.min() < 0 or index.max() >= n):
        raise IndexError(f"gather index out of range [0, {n}): min {index.min()}, max {index.max()}")
    return index


def size(d: Dim, env: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    e = sympy.sympify(d)
    return int(e.subs({s: env[s.name] for s in e.free_symbols}))


def bind(graph: Graph, inputs: Sequence[np.ndarray]) -> dict[str, int]:
    env: dict[str, int] = {}
    for node, x in zip(graph.inputs, inputs, strict=True):
        for d, v in zip(node.shape, x.shape, strict=True):
            if isinstance(d, sympy.Symbol):
                env[d.name] = int(v)
    return env


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _not(x: np.ndarray) -> np.ndarray:
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iub":
        return np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b)))
    return np.true_divide(a, b)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iub":
        return np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b)))
    r = np.fmod(a, b)  # torch.remainder on floats
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _logical(f: Callable[[np.ndarray, np.ndarray], np.ndarray], g: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    return lambda a, b: f(a, b) if a.dtype == np.bool_ else g(a, b)


UNARY: dict[Op, Callable[[np.ndarray], np.ndarray]] = {
    Op.NEG: np.negative,
    Op.ABS: np.abs,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.SQRT: np.sqrt,
    Op.RSQRT: lambda x: 1 / np.sqrt(x),
    Op.TANH: np.tanh,
    Op.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    Op.ERF: _erf,
    Op.SIN: np.sin,
    Op.COS: np.cos,
    Op.RELU: lambda x: np.maximum(x, np.zeros((), x.dtype)),
    Op.RECIP: lambda x: 1 / x,
    Op.FLOOR: lambda x: np.floor(x) if x.dtype.kind == "f" else x,
    Op.NOT: _not,
}

BINARY: dict[Op, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: _div,
    Op.MOD: _mod,
    Op.MAX: np.maximum,
    Op.MIN: np.minimum,
    Op.POW: np.power,
    Op.EQ: np.equal,
    Op.NE: np.not_equal,
    Op.LT: np.less,
    Op.LE: np.less_equal,
    Op.GT: np.greater,
    Op.GE: np.greater_equal,
    Op.AND: _logical(np.logical_and, np.bitwise_and),
    Op.OR: _logical(np.logical_or, np.bitwise_or),
}

REDUCE = {Op.SUM: np.sum, Op.RMAX: np.max, Op.RMIN: np.min}


def _conv(x: np.ndarray, w: np.ndarray, a: ConvAttr) -> np.ndarray:
    n, c, h, wd = x.shape
    co, ci, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw), g = a.stride, a.padding, a.dilation, a.groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, co, oh, ow), dtype=np.float64)
    cog = co // g
    for gi in range(g):
        xs = xp[:, gi * ci : (gi + 1) * ci].astype(np.float64)
        ws = w[gi * cog : (gi + 1) * cog].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                out[:, gi * cog : (gi + 1) * cog] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out.astype(x.dtype)


def _pool(x: np.ndarray, a: PoolAttr, out_hw: tuple[int, int]) -> np.ndarray:
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
    oh, ow = out_hw
    fill = -np.inf if a.kind == "max" else 0.0
    # pad generously so ceil_mode windows that run past the edge read the fill value
    xp = np.full((n, c, h + 2 * ph + sh * oh + dh * kh, w + 2 * pw + sw * ow + dw * kw), fill, dtype=np.float64)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    vals = []
    counts = np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            vals.append(xp[:, :, i * dh : i * dh + sh * oh : sh, j * dw : j * dw + sw * ow : sw][:, :, :oh, :ow])
    stack = np.stack(vals)
    if a.kind == "max":
        return stack.max(0).astype(x.dtype)
    for y in range(oh):
        for z in range(ow):
            h0, w0 = y * sh - ph, z * sw - pw
            h1, w1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
            if a.count_include_pad:
                counts[y, z] = (h1 - h0) * (w1 - w0)
            else:
                counts[y, z] = (min(h1, h) - max(h0, 0)) * (min(w1, w) - max(w0, 0))
    div = a.divisor if a.divisor else counts
    return (stack.sum(0) / div).astype(x.dtype)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, a: AttentionAttr) -> np.ndarray:
    """softmax(q @ k^T * scale + mask) @ v in float64, written plainly: kv heads repeated by index, masked
    scores at -inf, rows with no key left give zeros."""
    hq, hk = q.shape[-3], k.shape[-3]
    heads = np.arange(hq) // (hq // hk)
    k64 = k.astype(np.float64)[..., heads, :, :]
    v64 = v.astype(np.float64)[..., heads, :, :]
    scores = np.matmul(q.astype(np.float64), np.swapaxes(k64, -1, -2)) * a.scale
    L, S = scores.shape[-2:]
    keep = np.ones(scores.shape, dtype=bool)
    if a.causal:
        keep &= np.arange(L)[:, None] >= np.arange(S)[None, :]
    if a.mask == "bool":
        assert mask is not None
        keep &= mask
    elif a.mask == "add":
        assert mask is not None
        scores = scores + mask.astype(np.float64)
    scores = np.where(keep, scores, -np.inf)
    top = scores.max(-1, keepdims=True) if S else np.zeros((*scores.shape[:-1], 1))
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - top)
    total = p.sum(-1, keepdims=True)
    p = np.where(total > 0, p / np.where(total > 0, total, 1.0), 0.0)
    return np.matmul(p, v64)


def eval_node(n: Node, ins: list[np.ndarray], env: dict[str, int], graph: Graph) -> np.ndarray:
    dt = n.dtype.numpy()
    shape = tuple(size(d, env) for d in n.shape)
    op, a = n.op, n.attr
    if op is Op.INPUT:
        raise AssertionError("inputs are bound by run()")
    if op is Op.WEIGHT:
        assert isinstance(a, WeightAttr)
        return graph.weights[a.name]
    if op is Op.FULL:
        assert isinstance(a, FullAttr)
        v = size(a.value, env) if isinstance(a.value, sympy.Expr) else a.value
        return np.full(shape, v, dtype=dt)
    if op is Op.ARANGE:
        assert isinstance(a, ArangeAttr)
        return (a.start + np.arange(shape[0], dtype=np.float64) * a.step).astype(dt)
    if op is Op.CAST:
        x = ins[0]
        if n.dtype.is_int and x.dtype.kind == "f":
            x = np.trunc(x)
        return x.astype(dt)
    if op in UNARY:
        with np.errstate(all="ignore"):
            return np.asarray(UNARY[op](ins[0])).astype(dt)
    if op in BINARY:
        with np.errstate(all="ignore"):
            return np.asarray(BINARY[op](ins[0], ins[1])).astype(dt)
    if op is Op.WHERE:
        return np.where(ins[0], ins[1], ins[2]).astype(dt)
    if op in REDUCE:
        assert isinstance(a, ReduceAttr)
        return np.asarray(REDUCE[op](ins[0], axis=a.axes, keepdims=a.keepdim)).astype(dt)  # type: ignore[operator]
    if op is Op.CUMSUM:
        assert isinstance(a, AxisAttr)
        return np.cumsum(ins[0], axis=a.axis).astype(dt)
    if op is Op.RESHAPE:
        return ins[0].reshape(shape)
    if op is Op.PERMUTE:
        assert isinstance(a, PermuteAttr)
        return np.transpose(ins[0], a.perm)
    if op is Op.EXPAND:
        return np.broadcast_to(ins[0], shape)
    if op is Op.SLICE:
        assert isinstance(a, SliceAttr)
        start = size(a.start, env)
        idx = [slice(None)] * len(shape)
        idx[a.axis] = slice(start, start + a.step * (shape[a.axis] - 1) + 1, a.step)
        return ins[0][tuple(idx)]
    if op is Op.AS_STRIDED:
        assert isinstance(a, StridedAttr)
        flat = np.ascontiguousarray(ins[0])
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat[size(a.offset, env):], shape, tuple(size(st, env) * item for st in a.strides), writeable=False
        )
        return np.array(view)
    if op is Op.CAT:
        assert isinstance(a, AxisAttr)
        return np.concatenate(ins, axis=a.axis)
    if op is Op.PAD:
        assert isinstance(a, PadAttr)
        x = ins[0]
        crop = tuple(slice(max(-lo, 0), x.shape[k] - max(-hi, 0)) for k, (lo, hi) in enumerate(a.pads))
        x = x[crop]
        return np.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in a.pads], constant_values=a.value).astype(dt)
    if op is Op.INDEX_SELECT:
        assert isinstance(a, AxisAttr)
        return np.take(ins[0], _in_range(ins[1], ins[0].shape[a.axis]), axis=a.axis)
    if op is Op.GATHER:
        assert isinstance(a, AxisAttr)
        return np.take_along_axis(ins[0], _in_range(ins[1], ins[0].shape[a.axis]), axis=a.axis)
    if op is Op.MATMUL:
        return np.matmul(ins[0].astype(np.float64), ins[1].astype(np.float64)).astype(dt)
    if op is Op.CONV2D:
        assert isinstance(a, ConvAttr)
        return _conv(ins[0], ins[1], a)
    if op is Op.ATTENTION:
        assert isinstance(a, AttentionAttr)
        return attention(ins[0], ins[1], ins[2], ins[3] if len(ins) > 3 else None, a).astype(dt)
    if op is Op.POOL2D:
        assert isinstance(a, PoolAttr)
        return _pool(ins[0], a, (shape[2], shape[3]))
    raise NotImplementedError(f"interp: {op}")


def run(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` (in graph.inputs order)."""
    env = bind(graph, inputs)
    vals: dict[Node, np.ndarray] = dict(zip(graph.inputs, (np.asarray(x) for x in inputs), strict=True))
    for n in graph.nodes:
        if n in vals:
            continue
        vals[n] = eval_node(n, [vals[i] for i in n.inputs], env, graph)
    return [np.ascontiguousarray(vals[o]) for o in graph.outputs]


__all__ = ["DType", "bind", "eval_node", "run", "size"]
