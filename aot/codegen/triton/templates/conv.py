"""The Conv template: 2-D convolution as an implicit GEMM. Rows are output pixels (n, oh, ow), columns output
channels of one group, and the reduction runs over (input channel, kh, kw) with padding handled by load masks.
"""

from __future__ import annotations

import sympy
from aotc.errors import CompileError

from .... import kernel as K
from ....options import BuildOptions
from ..configs import Config, Shape, choose, conv_shape
from ..sizes import example, grid_size
from ..values import TL, XR, Gen, R, TritonKernel, X, next_pow2
from .dot import acc_dtype, bind, dot_line, masks


def shape(prog: K.Program, k: K.Conv, options: BuildOptions) -> Shape:
    """The implicit GEMM ``k`` runs, at the example sizes (sizes.example), as the config chooser and the tuner key it."""
    m = example(prog, sympy.sympify(k.batch) * k.out_hw[0] * k.out_hw[1])
    return conv_shape(m, k.c_out // k.groups, k.c_in // k.groups * k.kernel[0] * k.kernel[1], k.groups, k.x.dtype, options)


def conv(prog: K.Program, k: K.Conv, index_i64: bool, options: BuildOptions, sm: int, config: Config | None = None) -> TritonKernel:
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
    cfg, why = (config, "tuned") if config is not None else choose(shape(prog, k, options), sm)
    bm, bn, bk, warps, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    bk = min(bk, max(16, next_pow2(ktot)))
    w = g.w
    w.line(f"# tile config: {cfg} ({why}, sm_{sm})")
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
    acc_dt = acc_dtype(k.x.dtype, k.w.dtype)
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
        w.line(dot_line("a", "b", k.x.dtype, options))
    bind(g, "i0", "n_[:, None]", X)
    bind(g, "i1", f"grp * {opg} + rn[None, :]", R)
    bind(g, "i2", "oh_[:, None]", X)
    bind(g, "i3", "ow_[:, None]", X)
    masks(g, f"rm[:, None] < {m}", f"rn[None, :] < {opg}")
    g.acc = ("acc", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = sympy.ceiling(m_e / bm) * (-(-opg // bn)) * k.groups
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    return g.finish(k.name, w, consts, (grid_size(tiles), 1, 1), num_warps=warps, num_stages=stages)
