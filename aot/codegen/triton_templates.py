"""The library kernels of the Triton backend: Matmul and Conv as ``tl.dot`` templates with fused epilogues.

What it is: two templates printed through ``triton.Gen`` (so epilogues use the same value printer as
pointwise kernels) and the tile heuristics that stand in for autotuning on a machine without a GPU.
Conv is an implicit GEMM: rows are output pixels (n, oh, ow), columns output channels of one group, and
the reduction runs over (input channel, kh, kw) with padding handled by load masks.

Note: fp32 operands use ``input_precision="ieee"`` (no TF32) unless the build asks for bf16, which rounds
operands to bf16 and accumulates in fp32. Operand types ``tl.dot`` cannot take (fp64, integers) use a
broadcast-multiply-sum over small tiles: slow, but exact in the operand type.
"""

from __future__ import annotations

import sympy
from aotc.errors import CompileError

from .. import kernel as K
from ..ir import DType
from ..options import BuildOptions
from .triton import NO_AXES, TL, XR, Gen, R, TritonKernel, X, _prod, hint, next_pow2

DOT_TYPES = (DType.f32, DType.f16, DType.bf16)


def _acc_dtype(a: DType, b: DType) -> DType:
    if a in DOT_TYPES and b in DOT_TYPES:
        return DType.f32
    if a is DType.f64 or b is DType.f64:
        return DType.f64
    return DType.i64


def _dot_line(a: str, b: str, dt: DType, options: BuildOptions) -> str:
    """``acc`` += a @ b for tiles of operand type ``dt``."""
    if dt is DType.f32 and options.precision == "bf16":
        return f"acc = tl.dot({a}.to(tl.bfloat16), {b}.to(tl.bfloat16), acc)"
    if dt is DType.f32:
        return f'acc = tl.dot({a}, {b}, acc, input_precision="ieee")'
    if dt in DOT_TYPES:
        return f"acc = tl.dot({a}, {b}, acc)"
    return f"acc = acc + tl.sum({a}[:, :, None].to(acc.dtype) * {b}[None, :, :].to(acc.dtype), axis=1)"


def _tile(n: int, big: int) -> int:
    return big if n >= big else max(16, next_pow2(n))


def _tiles(m: int, n: int, dt: DType, sm: int, options: BuildOptions) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) from the operand sizes and type."""
    stages = 3 if sm >= 80 else 2
    if dt not in DOT_TYPES:
        return 16, 16, 16, 4, 1
    if dt is DType.f32 and options.precision != "bf16":  # ieee fp32 runs on FMA units: moderate tiles
        bm, bn = _tile(m, 64), _tile(n, 64)
        return bm, bn, 32, 4, stages
    bm, bn = _tile(m, 128), _tile(n, 128)
    bk = 64 if sm >= 80 else 32
    warps = 8 if bm * bn >= 128 * 128 else 4
    return bm, bn, bk, warps, stages


def matmul(prog: K.Program, k: K.Matmul, index_i64: bool, options: BuildOptions, sm: int) -> TritonKernel:
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_N"))
    if k.a.dtype is not k.b.dtype:
        raise CompileError(f"matmul {k.name!r}: operand types differ ({k.a.dtype.value}, {k.b.dtype.value})")
    bm, bn, bk, warps, stages = _tiles(hint(prog, k.m), hint(prog, k.n), k.a.dtype, sm, options)
    m, _ = g.index(k.m)
    n, _ = g.index(k.n)
    kk, _ = g.index(k.k)
    w = g.w
    w.line(f"pid = {g.pid()}")
    w.line(f"tiles_m = ({m} + BLOCK_M - 1) // BLOCK_M")
    w.line(f"tiles_n = ({n} + BLOCK_N - 1) // BLOCK_N")
    w.line("bidx = pid // (tiles_m * tiles_n)")
    w.line("tile = pid % (tiles_m * tiles_n)")
    w.line("group = tile // (GROUP_M * tiles_n)")
    w.line("first_m = group * GROUP_M")
    w.line("group_m = tl.minimum(tiles_m - first_m, GROUP_M)")
    w.line("pid_m = first_m + (tile % (GROUP_M * tiles_n)) % group_m")
    w.line("pid_n = (tile % (GROUP_M * tiles_n)) // group_m")
    nb = len(k.batch)
    g.decompose("bidx", k.batch, "i", NO_AXES)
    w.line("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    w.line("rk = tl.arange(0, BLOCK_K)")
    pa, pb = g.ptr(k.a.buf), g.ptr(k.b.buf)
    a_off, _ = g.index(k.a.offset)
    b_off, _ = g.index(k.b.offset)
    sam, sak = (g.index(s)[0] for s in k.a.strides)
    sbk, sbn = (g.index(s)[0] for s in k.b.strides)
    w.line(f"a_ptrs = {pa} + {a_off} + rm[:, None] * {sam} + rk[None, :] * {sak}")
    w.line(f"b_ptrs = {pb} + {b_off} + rk[:, None] * {sbk} + rn[None, :] * {sbn}")
    acc_dt = _acc_dtype(k.a.dtype, k.b.dtype)
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {TL[acc_dt]})")
    w.line(f"for k0 in range(0, {kk}, BLOCK_K):")
    with w.indent():
        w.line(f"a = tl.load(a_ptrs, mask=(rm[:, None] < {m}) & (rk[None, :] + k0 < {kk}), other=0)")
        w.line(f"b = tl.load(b_ptrs, mask=(rk[:, None] + k0 < {kk}) & (rn[None, :] < {n}), other=0)")
        w.line(_dot_line("a", "b", k.a.dtype, options))
        w.line(f"a_ptrs += BLOCK_K * {sak}")
        w.line(f"b_ptrs += BLOCK_K * {sbk}")
    _bind(g, f"i{nb}", "rm[:, None]", X)
    _bind(g, f"i{nb + 1}", "rn[None, :]", R)
    _masks(g, f"i{nb} < {m}", f"i{nb + 1} < {n}")
    g.acc = ("acc", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = _prod((sympy.ceiling(sympy.sympify(k.m) / bm), sympy.ceiling(sympy.sympify(k.n) / bn), *k.batch))
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    return g.finish(k.name, w, consts, (_grid(tiles), 1, 1), num_warps=warps, num_stages=stages)


def _bind(g: Gen, name: str, code: str, axes: frozenset[str]) -> None:
    g.w.line(f"{name} = {code}")
    g.loopvars[name] = (name, axes)
    g.axes[name] = axes


def _masks(g: Gen, rows: str, cols: str) -> None:
    """``omask`` over the output tile, with its row and column factors for loads that need only one."""
    g.w.line(f"mmask = {rows}")
    g.w.line(f"nmask = {cols}")
    g.w.line("omask = mmask & nmask")
    g.axes.update(mmask=X, nmask=R, omask=XR)
    g.narrow["omask"] = {X: "mmask", R: "nmask"}


def _grid(e: sympy.Expr | int) -> int | str:
    from ..symbolic import to_size

    return to_size(e)


def conv(prog: K.Program, k: K.Conv, index_i64: bool, options: BuildOptions, sm: int) -> TritonKernel:
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_N"))
    if k.x.dtype is not k.w.dtype:
        raise CompileError(f"conv {k.name!r}: operand types differ ({k.x.dtype.value}, {k.w.dtype.value})")
    if k.c_in % k.groups or k.c_out % k.groups:
        raise CompileError(f"conv {k.name!r}: channels {k.c_in}->{k.c_out} do not split into {k.groups} groups")
    cpg, opg = k.c_in // k.groups, k.c_out // k.groups
    kh, kw = k.kernel
    ktot = cpg * kh * kw
    oh_e, ow_e = k.out_hw
    m_e = sympy.sympify(k.batch) * oh_e * ow_e
    bm, bn, bk, warps, stages = _tiles(hint(prog, m_e), opg, k.x.dtype, sm, options)
    bk = min(bk, max(16, next_pow2(ktot)))
    w = g.w
    m, _ = g.index(m_e)
    oh, _ = g.index(oh_e)
    ow, _ = g.index(ow_e)
    h, _ = g.index(k.height)
    wd, _ = g.index(k.width)
    w.line(f"pid = {g.pid()}")
    w.line(f"tiles_m = ({m} + BLOCK_M - 1) // BLOCK_M")
    w.line(f"tiles_n = {-(-opg // bn)}")
    w.line("grp = pid // (tiles_m * tiles_n)")
    w.line("tile = pid % (tiles_m * tiles_n)")
    w.line("pid_m = tile // tiles_n")
    w.line("pid_n = tile % tiles_n")
    w.line("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    w.line(f"n_ = rm // ({oh} * {ow})")
    w.line(f"oh_ = (rm // {ow}) % {oh}")
    w.line(f"ow_ = rm % {ow}")
    px, pw = g.ptr(k.x.buf), g.ptr(k.w.buf)
    g.loopvars["i0"] = ("n_[:, None]", X)  # offsets may mention the batch variable
    x_off, _ = g.index(k.x.offset)
    w_off, _ = g.index(k.w.offset)
    del g.loopvars["i0"]
    xs = [g.index(s)[0] for s in k.x.strides]
    ws = [g.index(s)[0] for s in k.w.strides]
    sh, sw = k.stride
    ph, pw_ = k.padding
    dh, dw = k.dilation
    acc_dt = _acc_dtype(k.x.dtype, k.w.dtype)
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {TL[acc_dt]})")
    w.line(f"for k0 in range(0, {ktot}, BLOCK_K):")
    with w.indent():
        w.line("rk = k0 + tl.arange(0, BLOCK_K)")
        w.line(f"c_ = rk // {kh * kw}")
        w.line(f"kh_ = (rk // {kw}) % {kh}")
        w.line(f"kw_ = rk % {kw}")
        w.line(f"hi = oh_[:, None] * {sh} - {ph} + kh_[None, :] * {dh}")
        w.line(f"wi = ow_[:, None] * {sw} - {pw_} + kw_[None, :] * {dw}")
        w.line(f"amask = (rm[:, None] < {m}) & (rk[None, :] < {ktot}) & (hi >= 0) & (hi < {h}) & (wi >= 0) & (wi < {wd})")
        w.line(
            f"a = tl.load({px} + {x_off} + n_[:, None] * {xs[0]} + (grp * {cpg} + c_[None, :]) * {xs[1]}"
            f" + hi * {xs[2]} + wi * {xs[3]}, mask=amask, other=0)"
        )
        w.line(f"bmask = (rk[:, None] < {ktot}) & (rn[None, :] < {opg})")
        w.line(
            f"b = tl.load({pw} + {w_off} + (grp * {opg} + rn[None, :]) * {ws[0]} + c_[:, None] * {ws[1]}"
            f" + kh_[:, None] * {ws[2]} + kw_[:, None] * {ws[3]}, mask=bmask, other=0)"
        )
        w.line(_dot_line("a", "b", k.x.dtype, options))
    _bind(g, "i0", "n_[:, None]", X)
    _bind(g, "i1", f"grp * {opg} + rn[None, :]", R)
    _bind(g, "i2", "oh_[:, None]", X)
    _bind(g, "i3", "ow_[:, None]", X)
    _masks(g, f"rm[:, None] < {m}", f"rn[None, :] < {opg}")
    g.acc = ("acc", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = sympy.ceiling(m_e / bm) * (-(-opg // bn)) * k.groups
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    return g.finish(k.name, w, consts, (_grid(tiles), 1, 1), num_warps=warps, num_stages=stages)
