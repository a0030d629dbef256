"""A numpy reference interpreter for loop-level kernels (``kernel.Program``): the oracle the C++ and
Triton code generators are checked against, and the way to test fusion without a compiler.

What it is: a direct, vectorised reading of the semantics in ``kernel.py``. Loop variables become
broadcast index grids, value trees are evaluated as whole arrays, loads are flat gathers.
What it is not: fast, or a model of the memory plan -- every buffer (arena ones included) is its own
flat array, so aliasing bugs in the plan are invisible here.

Note: f16/bf16 values are computed in float32: a load widens, an explicit CAST or a store rounds to
nearest-even. That is what generated code does (one rounding per fused chain, like Inductor), so this
oracle and the compiled kernels agree up to float32 rounding, not bf16 rounding. Float matmul/conv/scan
accumulate in float64 here (a more accurate reference than any kernel); SUM reductions accumulate in the
step's dtype like the kernels do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import sympy

from . import kernel as K
from .interp import BINARY, UNARY  # one definition of each op's meaning
from .ir import DType, Op

Array = np.ndarray
Env = Mapping[str, "int | Array"]

_HALF = (DType.f16, DType.bf16)


def compute_dtype(dt: DType) -> np.dtype:
    """The numpy dtype values of ``dt`` are computed in (f16/bf16 widen to float32)."""
    return np.dtype(np.float32) if dt in _HALF else dt.numpy()


# ---- sympy index expressions -> integer numpy arrays --------------------------------------------------


def _floordiv(a: Array | int, b: Array | int) -> Array | int:
    return np.floor_divide(a, b)


def eval_index(e: sympy.Expr | int, env: Env) -> Array | int:
    """An integer index expression over loop-variable grids and shape symbols, in exact int64 math."""
    if isinstance(e, int):
        return e
    e = sympy.sympify(e)
    name = type(e).__name__
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        try:
            return env[e.name]
        except KeyError:
            raise KeyError(f"index symbol {e.name!r} has no value") from None
    if isinstance(e, sympy.Add):
        out: Array | int = 0
        for t in e.args:
            out = out + eval_index(t, env)
        return out
    if isinstance(e, sympy.Mul):
        coeff, rest = e.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            return _floordiv(eval_index(coeff.p * rest, env), coeff.q)
        out = 1
        for f in e.args:
            out = out * eval_index(f, env)
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return eval_index(e.base, env) ** int(e.exp)
    if isinstance(e, sympy.floor | sympy.ceiling):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        n, d = eval_index(num, env), eval_index(den, env)
        return _floordiv(n, d) if isinstance(e, sympy.floor) else -_floordiv(-n, d)
    if name in ("FloorDiv", "IntTrueDiv"):
        return _floordiv(eval_index(e.args[0], env), eval_index(e.args[1], env))
    if name == "CeilDiv":
        return -_floordiv(-eval_index(e.args[0], env), eval_index(e.args[1], env))
    if name == "ModularIndexing":
        x, d, m = (eval_index(a, env) for a in e.args)
        return np.mod(_floordiv(x, d), m)
    if name in ("Mod", "PythonMod"):
        return np.mod(eval_index(e.args[0], env), eval_index(e.args[1], env))
    if isinstance(e, sympy.Max) or name == "Max":
        return functools.reduce(np.maximum, [eval_index(a, env) for a in e.args])
    if isinstance(e, sympy.Min) or name == "Min":
        return functools.reduce(np.minimum, [eval_index(a, env) for a in e.args])
    raise ValueError(f"cannot evaluate index expression {e!r} ({name})")


def _int(e: sympy.Expr | int, env: Env) -> int:
    return int(eval_index(e, env))


# ---- the op table ---------------------------------------------------------------------------------------


def _round_half(x: Array, dt: DType) -> Array:
    return np.asarray(x, dtype=dt.numpy()).astype(np.float32)


def _cast(x: Array, dt: DType) -> Array:
    if dt is DType.bool:
        return np.asarray(x != 0)
    if dt in _HALF:
        return _round_half(np.asarray(x, dtype=np.float32), dt)
    return np.asarray(x).astype(dt.numpy())


# ---- value trees -----------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    """Evaluation context of one loop nest: index grids, buffers, and the library/reduction results."""

    kernel: str
    env: Env
    bufs: dict[str, Array]
    acc: Array | None = None
    prefix: Array | None = None  # a Scan's running sum
    refs: dict[int, Array] = field(default_factory=dict)
    memo: dict[tuple[K.Value, bool], Array] = field(default_factory=dict)


def evaluate(v: K.Value, ctx: _Ctx, masked: bool = False) -> Array:
    """The array of ``v`` over the context's grids. Inside a Masked body (``masked``) loads clip their
    indices, since the lanes where the mask fails are thrown away; outside, an out-of-range load is an
    error, as it would be a wild read in generated code."""
    key = (v, masked)
    if key in ctx.memo:
        return ctx.memo[key]
    out = _evaluate(v, ctx, masked)
    ctx.memo[key] = out
    return out


def _evaluate(v: K.Value, ctx: _Ctx, masked: bool) -> Array:
    cdt = compute_dtype(v.dtype)
    if isinstance(v, K.Const):
        val = v.value
        if v.dtype in _HALF:
            return _round_half(np.asarray(val, np.float32), v.dtype)
        return np.asarray(val, dtype=cdt)
    if isinstance(v, K.Index):
        return np.asarray(eval_index(v.expr, ctx.env), dtype=np.int64).astype(cdt)
    if isinstance(v, K.Load):
        buf = ctx.bufs[v.buf]
        idx = np.asarray(evaluate(v.index, ctx, masked)).astype(np.int64)
        if masked:
            idx = np.clip(idx, 0, max(buf.size - 1, 0))
        elif idx.size and (idx.min() < 0 or idx.max() >= buf.size):
            raise IndexError(
                f"kernel {ctx.kernel}: load from {v.buf} at index {int(idx.min())}..{int(idx.max())}, outside its {buf.size} elements"
            )
        return buf[idx].astype(cdt) if buf.size else np.zeros(idx.shape, cdt)
    if isinstance(v, K.Unary):
        x = evaluate(v.x, ctx, masked)
        if v.op is Op.CAST:
            return _cast(x, v.dtype)
        return np.asarray(UNARY[v.op](x)).astype(cdt, copy=False)
    if isinstance(v, K.Binary):
        a, b = evaluate(v.a, ctx, masked), evaluate(v.b, ctx, masked)
        out = np.asarray(BINARY[v.op](a, b))
        return out.astype(cdt, copy=False)
    if isinstance(v, K.Where):
        c = evaluate(v.cond, ctx, masked)
        a, b = evaluate(v.a, ctx, masked), evaluate(v.b, ctx, masked)
        return np.where(c, a, b).astype(cdt, copy=False)
    if isinstance(v, K.Masked):
        m = evaluate(v.mask, ctx, masked)
        body = evaluate(v.body, ctx, True)
        other = _cast(np.asarray(v.other), v.dtype)
        return np.where(m, body, other).astype(cdt, copy=False)
    if isinstance(v, K.Acc):
        assert ctx.acc is not None, f"kernel {ctx.kernel}: Acc outside a Matmul/Conv"
        return ctx.acc.astype(cdt, copy=False)
    if isinstance(v, K.ReduceRef):
        return ctx.refs[v.step].astype(cdt, copy=False)
    if isinstance(v, K.Prefix):
        assert ctx.prefix is not None, f"kernel {ctx.kernel}: Prefix outside a Scan"
        return ctx.prefix.astype(cdt, copy=False)
    raise TypeError(f"unknown value node {v!r}")


def _store(ctx: _Ctx, st: K.Store, shape: tuple[int, ...]) -> None:
    buf = ctx.bufs[st.buf]
    idx = np.broadcast_to(np.asarray(eval_index(st.index, ctx.env), dtype=np.int64), shape).ravel()
    val = np.broadcast_to(evaluate(st.value, ctx), shape).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= buf.size):
        raise IndexError(f"kernel {ctx.kernel}: store to {st.buf} outside its {buf.size} elements")
    buf[idx] = _to_storage(val, buf.dtype)


def _to_storage(val: Array, dt: np.dtype) -> Array:
    if dt == np.bool_:
        return val != 0
    return val.astype(dt)


def _grids(names: list[str], sizes: list[int]) -> dict[str, Array]:
    n = len(sizes)
    out = {}
    for k, (name, size) in enumerate(zip(names, sizes, strict=True)):
        shape = [1] * n
        shape[k] = size
        out[name] = np.arange(size, dtype=np.int64).reshape(shape)
    return out


# ---- kernels ---------------------------------------------------------------------------------------------


def _pointwise(k: K.Pointwise, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    sizes = [_int(r, syms) for r in k.ranges]
    ctx = _Ctx(k.name, {**syms, **_grids([f"i{j}" for j in range(len(sizes))], sizes)}, bufs)
    for st in k.stores:
        _store(ctx, st, tuple(sizes))


def _reduce(k: K.Reduce, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    outer = [_int(r, syms) for r in k.ranges]
    inner = [_int(r, syms) for r in k.reduce_ranges]
    names = [f"i{j}" for j in range(len(outer))] + [f"r{j}" for j in range(len(inner))]
    ctx = _Ctx(k.name, {**syms, **_grids(names, outer + inner)}, bufs)
    full = tuple(outer + inner)
    axes = tuple(range(len(outer), len(full)))
    for j, step in enumerate(k.steps):
        val = np.broadcast_to(evaluate(step.value, ctx), full)
        ctx.refs[j] = _reduction(step, val, axes)
    for st in k.stores:
        _store(ctx, st, tuple(outer + [1] * len(inner)))
    for st in k.row_stores:
        _store(ctx, st, full)


def _reduction(step: K.Reduction, val: Array, axes: tuple[int, ...]) -> Array:
    cdt = compute_dtype(step.dtype)
    if step.op is Op.SUM:
        return np.sum(val, axis=axes, dtype=cdt, keepdims=True)
    big = np.inf if cdt.kind == "f" else (True if cdt.kind == "b" else np.iinfo(cdt).max)
    if step.op is Op.RMAX:
        init = -big if cdt.kind != "b" else False
        return np.max(val.astype(cdt), axis=axes, keepdims=True, initial=init)
    if step.op is Op.RMIN:
        return np.min(val.astype(cdt), axis=axes, keepdims=True, initial=big)
    raise ValueError(f"unknown reduction {step.op}")


def _acc_dtype(*dts: DType) -> np.dtype:
    """Reference accumulation: float64 for float operands, int64 otherwise."""
    return np.dtype(np.float64) if any(d.is_float for d in dts) else np.dtype(np.int64)


def _gather(op: K.Strided, bufs: dict[str, Array], env: Env, dims: list[Array]) -> Array:
    """``op`` as a dense array: element (a, b, ...) over the given broadcast index grids."""
    idx: Array = np.asarray(eval_index(op.offset, env), dtype=np.int64)
    for d, s in zip(dims, op.strides, strict=True):
        idx = idx + d * np.int64(eval_index(s, env))
    buf = bufs[op.buf]
    if idx.size and (idx.min() < 0 or idx.max() >= buf.size):
        raise IndexError(f"operand {op.buf}: element offsets outside its {buf.size} elements")
    return buf[idx].astype(np.float32 if op.dtype in _HALF else op.dtype.numpy())


def _matmul(k: K.Matmul, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    batch = [_int(b, syms) for b in k.batch]
    m, n, kk = (_int(x, syms) for x in (k.m, k.n, k.k))
    nb = len(batch)
    bgrid = _grids([f"i{j}" for j in range(nb)], batch)
    benv: dict[str, int | Array] = {
        **syms,
        **{name: g.reshape((*g.shape, 1, 1)) for name, g in bgrid.items()},
    }
    rows, cols = np.arange(m).reshape(m, 1), np.arange(kk).reshape(1, kk)
    a = _gather(k.a, bufs, benv, [rows, cols])
    rows, cols = np.arange(kk).reshape(kk, 1), np.arange(n).reshape(1, n)
    b = _gather(k.b, bufs, benv, [rows, cols])
    acc_dt = _acc_dtype(k.a.dtype, k.b.dtype)
    shape = (*batch, m, n)
    acc = np.broadcast_to(np.matmul(a.astype(acc_dt), b.astype(acc_dt)), shape)
    ctx = _Ctx(k.name, {**syms, **_grids([f"i{j}" for j in range(nb + 2)], [*batch, m, n])}, bufs, acc=acc)
    for st in k.stores:
        _store(ctx, st, shape)


def _conv(k: K.Conv, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    n, h, w = (_int(x, syms) for x in (k.batch, k.height, k.width))
    oh, ow = (_int(x, syms) for x in k.out_hw)
    c, o, g = k.c_in, k.c_out, k.groups
    kh, kw = k.kernel
    (sh, sw), (ph, pw), (dh, dw) = k.stride, k.padding, k.dilation
    ar = np.arange
    x = _gather(k.x, bufs, syms, [ar(n).reshape(-1, 1, 1, 1), ar(c).reshape(-1, 1, 1), ar(h).reshape(-1, 1), ar(w)])
    wt = _gather(k.w, bufs, syms, [ar(o).reshape(-1, 1, 1, 1), ar(c // g).reshape(-1, 1, 1),
                                    ar(kh).reshape(-1, 1), ar(kw)])  # fmt: skip
    acc_dt = _acc_dtype(k.x.dtype, k.w.dtype)
    xp = np.zeros((n, c, h + 2 * ph + sh * oh + dh * kh, w + 2 * pw + sw * ow + dw * kw), acc_dt)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    xg = xp.reshape(n, g, c // g, *xp.shape[2:])
    wg = wt.astype(acc_dt).reshape(g, o // g, c // g, kh, kw)
    acc = np.zeros((n, g, o // g, oh, ow), acc_dt)
    for a in range(kh):
        for b in range(kw):
            win = xg[:, :, :, a * dh : a * dh + sh * oh : sh, b * dw : b * dw + sw * ow : sw]
            acc += np.einsum("ngchw,goc->ngohw", win, wg[:, :, :, a, b])
    shape = (n, o, oh, ow)
    ctx = _Ctx(k.name, {**syms, **_grids(["i0", "i1", "i2", "i3"], list(shape))}, bufs, acc=acc.reshape(shape))
    for st in k.stores:
        _store(ctx, st, shape)


def _scan(k: K.Scan, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    outer = [_int(r, syms) for r in k.ranges]
    length = _int(k.length, syms)
    names = [f"i{j}" for j in range(len(outer))] + ["r0"]
    ctx = _Ctx(k.name, {**syms, **_grids(names, [*outer, length])}, bufs)
    full = (*outer, length)
    val = np.broadcast_to(evaluate(k.value, ctx), full)
    acc_dt = np.float64 if k.dtype.is_float else np.int64
    out = np.cumsum(val, axis=-1, dtype=acc_dt).astype(compute_dtype(k.dtype))
    ctx.prefix = _round_half(out, k.dtype) if k.dtype in _HALF else out
    for st in k.stores:
        _store(ctx, st, full)


def _attention(k: K.Attention, bufs: dict[str, Array], syms: Mapping[str, int]) -> None:
    from .interp import attention  # the IR op's definition; the kernel adds only strides and the head map
    from .ir import AttentionAttr

    batch = [_int(b, syms) for b in k.batch]
    lq, lk, e, ev = (_int(x, syms) for x in (k.q_len, k.kv_len, k.head_dim, k.v_dim))
    nb = len(batch)
    grids = _grids([f"i{j}" for j in range(nb)], batch)
    env: dict[str, int | Array] = {**syms, **{n: g.reshape((*g.shape, 1, 1)) for n, g in grids.items()}}
    head = f"i{nb - 1}"
    kv_env = {**env, head: np.asarray(env[head]) // k.group}  # k and v offsets name the kv head

    def dense(op: K.Strided, env: Env, rows: int, cols: int) -> Array:
        got = _gather(op, bufs, env, [np.arange(rows).reshape(rows, 1), np.arange(cols).reshape(1, cols)])
        return np.broadcast_to(got, (*batch, rows, cols))

    q = dense(k.q, env, lq, e)
    kk = dense(k.k, kv_env, lk, e)
    v = dense(k.v, kv_env, lk, ev)
    mask = None
    if k.mask is not None:
        mask = dense(k.mask, env, lq, lk)
        mask = mask != 0 if k.mask_kind == "bool" else mask
    shape = (*batch, lq, ev)
    # the per-position k/v above already follow the head map: one kv head per query head
    acc = attention(q, kk, v, mask, AttentionAttr(k.scale, k.causal, k.mask_kind))
    ctx = _Ctx(k.name, {**syms, **_grids([f"i{j}" for j in range(nb + 2)], list(shape))}, bufs, acc=np.broadcast_to(acc, shape))
    for st in k.stores:
        _store(ctx, st, shape)


_KERNELS: dict[type, Callable[..., None]] = {
    K.Attention: _attention,
    K.Pointwise: _pointwise,
    K.Reduce: _reduce,
    K.Matmul: _matmul,
    K.Conv: _conv,
    K.Scan: _scan,
}


# ---- the whole program -----------------------------------------------------------------------------------


def _alloc(b: K.Buffer, env: Mapping[str, int]) -> Array:
    n = _int(b.numel(), env)
    dt = b.dtype.numpy()
    if b.dtype.is_float:  # scratch starts as NaN so that a read before a write shows up
        return np.full(n, np.nan, dtype=dt)
    return np.zeros(n, dtype=dt)


def run_program(prog: K.Program, inputs: list[Array], weights: list[Array], env: dict[str, int]) -> list[Array]:
    """Run every kernel of ``prog`` in order; returns the outputs shaped as declared.

    ``inputs``/``weights`` are positional like ``prog.inputs``/``prog.weights`` (any layout; they are
    read in C order and cast to the declared dtype); ``env`` binds every shape symbol."""
    if len(inputs) != len(prog.inputs) or len(weights) != len(prog.weights):
        raise ValueError(
            f"run_program: got {len(inputs)} inputs and {len(weights)} weights, the program has {len(prog.inputs)} and {len(prog.weights)}"
        )
    missing = [s.name for s in prog.symbols if s.name not in env]
    if missing:
        raise ValueError(f"run_program: no value for symbols {missing}")
    bufs: dict[str, Array] = {}
    for b, arr in zip([*prog.inputs, *prog.weights], [*inputs, *weights], strict=True):
        want = tuple(_int(d, env) for d in b.shape)
        if tuple(np.shape(arr)) != want:
            raise ValueError(f"run_program: {b.name} has shape {np.shape(arr)}, expected {want}")
        bufs[b.name] = np.ascontiguousarray(arr).astype(b.dtype.numpy(), copy=False).ravel()
    for b in (*prog.outputs, *prog.arena):
        bufs[b.name] = _alloc(b, env)
    with np.errstate(all="ignore"):  # masked-off lanes may divide by zero or take log(-1)
        for k in prog.kernels:
            _KERNELS[type(k)](k, bufs, env)
    return [bufs[b.name].reshape(tuple(_int(d, env) for d in b.shape)) for b in prog.outputs]
