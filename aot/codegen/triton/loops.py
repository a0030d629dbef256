"""The loop kernels of the Triton backend: Pointwise over flat 1-D blocks, Reduce and Scan over
[XBLOCK, RBLOCK] tiles (one pass in registers when the reduce length is bounded, else a loop per step).

What it is not: the value printer (values.py) or the library templates (templates/).
"""

from __future__ import annotations

import math

import sympy

from ... import kernel as K
from ...ir import DType, Op
from ...options import BuildOptions
from .configs import Config, Shape, choose, reduce_default
from .sizes import cdiv, example, hint, prod, upper
from .values import TL, XR, Gen, R, TritonKernel, X, literal, next_pow2

# Longest reduce/scan kept whole in registers: one read of each row, where the loop re-reads it per step
# (layer-norm: mean, variance, then the normalized row); 8192 fp32 values fit 16 warps' registers.
SINGLE_PASS_MAX = 8192
LOOP_RBLOCK = 1024
REDUCE_FN = {Op.SUM: "tl.sum", Op.RMAX: "tl.max", Op.RMIN: "tl.min"}


def identity(op: Op, dtype: DType) -> str:
    if op is Op.SUM:
        return literal(0, dtype)
    big = {DType.i64: 2**63 - 1, DType.i32: 2**31 - 1, DType.i16: 2**15 - 1, DType.i8: 127, DType.u8: 255}
    if dtype.is_float:
        return literal(-math.inf if op is Op.RMAX else math.inf, dtype)
    if dtype is DType.bool:
        return "0" if op is Op.RMAX else "1"
    lo = 0 if dtype is DType.u8 else -big[dtype] - 1
    return str(lo if op is Op.RMAX else big[dtype])


def pointwise(prog: K.Program, k: K.Pointwise, index_i64: bool, options: BuildOptions, sm: int) -> TritonKernel:
    del options, sm  # the tiles of loop kernels depend on neither yet
    g = Gen(prog, index_i64)
    numel = prod(k.ranges)
    n_hint = upper(prog, numel) or hint(prog, numel)
    block = min(1024, max(128, next_pow2(n_hint)))
    warps = max(1, min(4, block // 256))
    n, _ = g.index(numel)
    g.w.line(f"xindex = {g.pid()} * XBLOCK + tl.arange(0, XBLOCK)")
    g.w.line(f"xmask = xindex < {n}")
    g.axes["xindex"] = g.axes["xmask"] = X
    g.decompose("xindex", k.ranges, "i", X)
    for st in k.stores:
        g.store(st, "xmask")
    return g.finish(k.name, g.w, {"XBLOCK": block}, (cdiv(numel, block), 1, 1), num_warps=warps)


def tiles(prog: K.Program, outer: sympy.Expr | int, rlen: sympy.Expr | int) -> tuple[bool, int]:
    """(single pass?, RBLOCK) for a reduce/scan over ``rlen`` per outer position."""
    r_max = upper(prog, rlen)
    if r_max is not None and r_max <= SINGLE_PASS_MAX:
        return True, next_pow2(max(1, r_max))
    return False, LOOP_RBLOCK


def reduce_shape(prog: K.Program, k: K.Reduce, options: BuildOptions) -> Shape:
    """The reduction as the config chooser and the tuner key it: rows at the example sizes, the row block."""
    del options
    _, rb = tiles(prog, prod(k.ranges), prod(k.reduce_ranges))
    return Shape("reduce", k.steps[0].dtype.value, example(prog, prod(k.ranges)), rb, 1)


def worth_tuning(prog: K.Program, k: K.Reduce) -> bool:
    """Reductions over at least a million elements: below that a launch costs more than any tile saves."""
    return example(prog, prod(k.ranges)) * example(prog, prod(k.reduce_ranges)) >= 1 << 20


def _outer(g: Gen, ranges: tuple[sympy.Expr, ...]) -> sympy.Expr | int:
    outer = prod(ranges)
    n, _ = g.index(outer)
    g.w.line(f"xindex = {g.pid()} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    g.w.line(f"xmask = xindex < {n}")
    g.axes["xindex"] = g.axes["xmask"] = X
    g.decompose("xindex", ranges, "i", X)
    return outer


def _rindex(g: Gen, ranges: tuple[sympy.Expr, ...], start: str | None) -> None:
    rn, _ = g.index(prod(ranges))
    base = "tl.arange(0, RBLOCK)[None, :]"
    g.w.line(f"rindex = {start} + {base}" if start else f"rindex = {base}")
    g.w.line(f"rmask = rindex < {rn}")
    g.w.line("xrmask = xmask & rmask")
    g.axes["rindex"] = g.axes["rmask"] = R
    g.axes["xrmask"] = XR
    g.narrow["xrmask"] = {X: "xmask", R: "rmask"}
    g.decompose("rindex", ranges, "r", R)


def reduce(
    prog: K.Program, k: K.Reduce, index_i64: bool, options: BuildOptions, sm: int, config: Config | None = None
) -> TritonKernel:
    g = Gen(prog, index_i64, ("XBLOCK", "RBLOCK"))
    rlen = prod(k.reduce_ranges)
    outer = prod(k.ranges)
    single, rb = tiles(prog, outer, rlen)
    cfg = config or choose(reduce_shape(prog, k, options), sm)[0]
    xb, warps = cfg.block_m, cfg.num_warps
    _outer(g, k.ranges)
    rn, _ = g.index(rlen)

    def step_value(s: K.Reduction) -> str:
        v, va = g.value(s.value, "xrmask")
        v = g.cast(v, s.value.dtype, _red_dtype(s.dtype))
        return g.bcast(v, va, XR)

    if single:
        _rindex(g, k.reduce_ranges, None)
        for i, s in enumerate(k.steps):
            v = step_value(s)
            masked = g.tmp(f"tl.where(xrmask, {v}, {identity(s.op, s.dtype)})", XR)
            g.refs[i] = g.tmp(_finish_reduce(s, masked), X)
        for st in k.stores:
            g.store(st, "xmask")
        for st in k.row_stores:
            g.store(st, "xrmask")
        return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (cdiv(outer, xb), 1, 1), num_warps=warps)
    for i, s in enumerate(k.steps):
        acc = f"acc{i}"
        rdt = _red_dtype(s.dtype)
        g.w.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity(s.op, s.dtype)}, {TL[rdt]})")
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, k.reduce_ranges, "roffset")
            v = step_value(s)
            v = g.tmp(f"tl.where(xrmask, {v}, {identity(s.op, s.dtype)})", XR)
            nan = ", propagate_nan=tl.PropagateNan.ALL" if s.dtype.is_float else ""
            combine = {
                Op.SUM: f"{acc} + {v}",
                Op.RMAX: f"tl.maximum({acc}, {v}{nan})",
                Op.RMIN: f"tl.minimum({acc}, {v}{nan})",
            }
            g.w.line(f"{acc} = {combine[s.op]}")
        g.axes[acc] = XR
        g.refs[i] = g.tmp(_finish_reduce(s, acc), X)
    for st in k.stores:
        g.store(st, "xmask")
    if k.row_stores:
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, k.reduce_ranges, "roffset")
            for st in k.row_stores:
                g.store(st, "xrmask")
    return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (cdiv(outer, xb), 1, 1), num_warps=warps)


def _red_dtype(d: DType) -> DType:
    return DType.i32 if d is DType.bool else d  # tl.max/min/sum on i1 are not defined


def _finish_reduce(s: K.Reduction, x: str) -> str:
    out = f"{REDUCE_FN[s.op]}({x}, axis=1, keep_dims=True)"
    if s.dtype is DType.bool:
        return f"({out} != 0)"
    if s.op is not Op.SUM and s.dtype.is_float:
        # tl.max/tl.min drop NaN (maxnum semantics); torch's max/min and max-pooling propagate it
        return f"tl.where(tl.max(({x} != {x}).to(tl.int32), axis=1, keep_dims=True) > 0, {literal(math.nan, s.dtype)}, {out})"
    return out


def scan(prog: K.Program, k: K.Scan, index_i64: bool, options: BuildOptions, sm: int) -> TritonKernel:
    del options  # the tiles of scans depend on neither yet
    g = Gen(prog, index_i64, ("XBLOCK", "RBLOCK"))
    outer = prod(k.ranges)
    single, rb = tiles(prog, outer, k.length)
    cfg = reduce_default(Shape("reduce", k.dtype.value, hint(prog, outer), rb, 1))
    xb, warps = cfg.block_m, cfg.num_warps
    _outer(g, k.ranges)
    rn, _ = g.index(k.length)
    dt = TL[k.dtype]

    def body() -> str:
        v, va = g.value(k.value, "xrmask")
        v = g.cast(v, k.value.dtype, k.dtype)
        return g.tmp(f"tl.where(xrmask, {g.bcast(v, va, XR)}, 0).to({dt})", XR)

    if single:
        _rindex(g, (k.length,), None)
        g.prefix = (g.tmp(f"tl.cumsum({body()}, axis=1)", XR), XR)
        for st in k.stores:
            g.store(st, "xrmask")
    else:
        g.w.line(f"carry = tl.zeros([XBLOCK, 1], {dt})")
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, (k.length,), "roffset")
            v = body()
            g.prefix = (g.tmp(f"tl.cumsum({v}, axis=1) + carry", XR), XR)
            for st in k.stores:
                g.store(st, "xrmask")
            g.w.line(f"carry = carry + tl.sum({v}, axis=1, keep_dims=True)")
    return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (cdiv(outer, xb), 1, 1), num_warps=warps)
