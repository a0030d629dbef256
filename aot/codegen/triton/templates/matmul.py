"""The Matmul template: C[b..., m, n] = A @ B tiled over (BLOCK_M, BLOCK_N) with grouped tile order, the
kernel's stores as its epilogue. The tile ``Config`` comes from the caller (``--tune``) or ``configs.choose``;
it is printed as the function's first line so ``aotc inspect`` and reviewers see what ran.
"""

from __future__ import annotations

import sympy
from aotc.errors import CompileError

from .... import kernel as K
from ....options import BuildOptions
from ..configs import Config, Shape, choose, matmul_shape
from ..sizes import example, grid_size, prod
from ..values import NO_AXES, TL, XR, Gen, R, TritonKernel, X
from .dot import acc_dtype, bind, dot_line, masks


def shape(prog: K.Program, k: K.Matmul, options: BuildOptions) -> Shape:
    """The problem ``k`` is at the example sizes (sizes.example), as the config chooser and the tuner key it."""
    batch = example(prog, prod(k.batch)) if k.batch else 1
    return matmul_shape(example(prog, k.m), example(prog, k.n), example(prog, k.k), batch, k.a.dtype, options)


def matmul(
    prog: K.Program, k: K.Matmul, index_i64: bool, options: BuildOptions, sm: int, config: Config | None = None
) -> TritonKernel:
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_N"))
    if k.a.dtype is not k.b.dtype:
        raise CompileError(f"matmul {k.name!r}: operand types differ ({k.a.dtype.value}, {k.b.dtype.value})")
    cfg, why = (config, "tuned") if config is not None else choose(shape(prog, k, options), sm)
    bm, bn, bk, warps, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    m, _ = g.index(k.m)
    n, _ = g.index(k.n)
    kk, _ = g.index(k.k)
    w = g.w
    w.line(f"# tile config: {cfg} ({why}, sm_{sm})")
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
    acc_dt = acc_dtype(k.a.dtype, k.b.dtype)
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {TL[acc_dt]})")
    w.line(f"for k0 in range(0, {kk}, BLOCK_K):")
    with w.indent():
        w.line(f"a = tl.load(a_ptrs, mask=(rm[:, None] < {m}) & (rk[None, :] + k0 < {kk}), other=0)")
        w.line(f"b = tl.load(b_ptrs, mask=(rk[:, None] + k0 < {kk}) & (rn[None, :] < {n}), other=0)")
        w.line(dot_line("a", "b", k.a.dtype, options, sm))
        w.line(f"a_ptrs += BLOCK_K * {sak}")
        w.line(f"b_ptrs += BLOCK_K * {sbk}")
    bind(g, f"i{nb}", "rm[:, None]", X)
    bind(g, f"i{nb + 1}", "rn[None, :]", R)
    masks(g, f"i{nb} < {m}", f"i{nb + 1} < {n}")
    g.acc = ("acc", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = prod((sympy.ceiling(sympy.sympify(k.m) / bm), sympy.ceiling(sympy.sympify(k.n) / bn), *k.batch))
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m}
    return g.finish(k.name, w, consts, (grid_size(tiles), 1, 1), num_warps=warps, num_stages=stages)
