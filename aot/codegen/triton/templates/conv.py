"""The Conv template: 2-D convolution as an implicit GEMM. Rows are output pixels (n, oh, ow), columns output
channels of one group, and the reduction runs over (kh, kw, input channel), channel innermost, with padding
handled by load masks. Depthwise convs go to their own direct kernel (depthwise.py).

Note: the reduction order. Over channels-last activations (fusion's NHWC buffers) and [O, kh, kw, I] weights
(passes/layout.py) the innermost channel axis is contiguous in both operands, so each (kh, kw) tap is a plain
GEMM step: one block of channels per iteration, the tap's pixel offsets and padding mask computed once per
iteration from scalars (no per-element div/mod), and the whole (tap, channel block) space is one loop so Triton
pipelines it even when a tap has a single block. A 1x1 stride-1 unpadded conv is then exactly a GEMM over
[pixels, C] x [C, O]. Groups with fewer than 16 channels (a stem over RGB, small grouped convs) cannot fill
a dot's K: their reduction is flattened over (kh, kw, c) with index math per element, as before.
The template reads any strides, so NCHW operands stay correct (only slower).
"""

from __future__ import annotations

import sympy
from aotc.errors import CompileError

from .... import kernel as K
from ....options import BuildOptions
from ..configs import Config, Shape, choose, conv_shape
from ..sizes import example, grid_size
from ..values import TL, XR, Gen, R, TritonKernel, X, next_pow2
from .depthwise import depthwise, is_depthwise
from .dot import acc_dtype, bind, dot_line, masks

MIN_CHANNEL_BLOCK = 16  # tl.dot's smallest K


def shape(prog: K.Program, k: K.Conv, options: BuildOptions) -> Shape:
    """The implicit GEMM ``k`` runs, at the example sizes (sizes.example), as the config chooser and the tuner key it."""
    m = example(prog, sympy.sympify(k.batch) * k.out_hw[0] * k.out_hw[1])
    return conv_shape(m, k.c_out // k.groups, k.c_in // k.groups * k.kernel[0] * k.kernel[1], k.groups, k.x.dtype, options)


def conv(prog: K.Program, k: K.Conv, index_i64: bool, options: BuildOptions, sm: int, config: Config | None = None) -> TritonKernel:
    if k.x.dtype is not k.w.dtype:
        raise CompileError(f"conv {k.name!r}: operand types differ ({k.x.dtype.value}, {k.w.dtype.value})")
    if k.c_in % k.groups or k.c_out % k.groups:
        raise CompileError(f"conv {k.name!r}: channels {k.c_in}->{k.c_out} do not split into {k.groups} groups")
    if is_depthwise(k):
        return depthwise(prog, k, index_i64, options, sm)
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_N"))
    cpg, opg = k.c_in // k.groups, k.c_out // k.groups
    kh, kw = k.kernel
    oh_e, ow_e = k.out_hw
    m_e = sympy.sympify(k.batch) * oh_e * ow_e
    cfg, why = (config, "tuned") if config is not None else choose(shape(prog, k, options), sm)
    bm, bn, bk, warps, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
    w = g.w
    w.line(f"# tile config: {bm}x{bn}x{bk} w{warps} s{stages} ({why}, sm_{sm})")
    m, _ = g.index(m_e)
    oh, _ = g.index(oh_e)
    ow, _ = g.index(ow_e)
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
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {TL[acc_dtype(k.x.dtype, k.w.dtype)]})")
    if cpg >= MIN_CHANNEL_BLOCK:
        bk = max(MIN_CHANNEL_BLOCK, min(bk, next_pow2(cpg)))
        _channel_blocks(g, k, m, bk, options, sm)
    else:
        bk = min(bk, max(MIN_CHANNEL_BLOCK, next_pow2(cpg * kh * kw)))
        _flat(g, k, m, options, sm)
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


def _operands(g: Gen, k: K.Conv, batch: str) -> tuple[str, str, str, str, list[str], list[str]]:
    """(x pointer, w pointer, x offset, w offset, x strides, w strides) as Triton text; ``batch`` stands for i0."""
    px, pw = g.ptr(k.x.buf), g.ptr(k.w.buf)
    g.loopvars["i0"] = (batch, X)  # offsets may mention the batch variable
    x_off, _ = g.index(k.x.offset)
    w_off, _ = g.index(k.w.offset)
    del g.loopvars["i0"]
    return px, pw, x_off, w_off, [g.index(s)[0] for s in k.x.strides], [g.index(s)[0] for s in k.w.strides]


def _spatial_mask(k: K.Conv, hi: str, wi: str) -> list[str]:
    """The padding conditions on input row/column ``hi``/``wi``; none when unpadded (every tap of a valid
    output pixel is then inside the input by the definition of the output size)."""
    if k.padding == (0, 0):
        return []
    return [f"({hi} >= 0)", f"({hi} < HEIGHT)", f"({wi} >= 0)", f"({wi} < WIDTH)"]


def _channel_blocks(g: Gen, k: K.Conv, m: str, bk: int, options: BuildOptions, sm: int) -> None:
    w = g.w
    cpg, opg = k.c_in // k.groups, k.c_out // k.groups
    kh, kw = k.kernel
    (sh, sw), (ph, pw_), (dh, dw) = k.stride, k.padding, k.dilation
    px, pw, x_off, w_off, xs, ws = _operands(g, k, "n_")
    cblocks = -(-cpg // bk)
    h, _ = g.index(k.height)
    wd, _ = g.index(k.width)
    w.line(f"HEIGHT = {h}")
    w.line(f"WIDTH = {wd}")
    w.line(f"x_row = {px} + {x_off} + n_ * {xs[0]} + grp * {cpg} * {xs[1]}")
    w.line(f"w_col = {pw} + {w_off} + (grp * {opg} + rn) * {ws[0]}")
    w.line(f"h0 = oh_ * {sh} - {ph}")
    w.line(f"w0 = ow_ * {sw} - {pw_}")
    w.line(f"mrow = rm < {m}")
    w.line(f"ncol = rn < {opg}")
    w.line("rc = tl.arange(0, BLOCK_K)")
    w.line(f"for t in range(0, {kh * kw * cblocks}):")
    with w.indent():
        w.line(f"tap = t // {cblocks}")
        w.line(f"c_ = (t % {cblocks}) * BLOCK_K + rc")
        w.line(f"hi = h0 + (tap // {kw}) * {dh}")
        w.line(f"wi = w0 + (tap % {kw}) * {dw}")
        rows = " & ".join(["mrow", *_spatial_mask(k, "hi", "wi")])
        chan = cpg % bk != 0
        amask = f"({rows})[:, None]" + (f" & (c_[None, :] < {cpg})" if chan else "")
        bmask = "ncol[None, :]" + (f" & (c_[:, None] < {cpg})" if chan else "")
        w.line(
            f"a = tl.load(x_row[:, None] + (hi * {xs[2]} + wi * {xs[3]})[:, None] + c_[None, :] * {xs[1]},"
            f" mask={amask}, other=0)"
        )
        w.line(
            f"b = tl.load(w_col[None, :] + ((tap // {kw}) * {ws[2]} + (tap % {kw}) * {ws[3]})"
            f" + c_[:, None] * {ws[1]}, mask={bmask}, other=0)"
        )
        w.line(dot_line("a", "b", k.x.dtype, options, sm, "conv"))


def _flat(g: Gen, k: K.Conv, m: str, options: BuildOptions, sm: int) -> None:
    w = g.w
    cpg, opg = k.c_in // k.groups, k.c_out // k.groups
    kh, kw = k.kernel
    ktot = cpg * kh * kw
    (sh, sw), (ph, pw_), (dh, dw) = k.stride, k.padding, k.dilation
    px, pw, x_off, w_off, xs, ws = _operands(g, k, "n_[:, None]")
    h, _ = g.index(k.height)
    wd, _ = g.index(k.width)
    w.line(f"HEIGHT = {h}")
    w.line(f"WIDTH = {wd}")
    w.line(f"for k0 in range(0, {ktot}, BLOCK_K):")
    with w.indent():
        w.line("rk = k0 + tl.arange(0, BLOCK_K)")
        w.line(f"tap = rk // {cpg}")
        w.line(f"c_ = rk % {cpg}")
        w.line(f"kh_ = tap // {kw}")
        w.line(f"kw_ = tap % {kw}")
        w.line(f"hi = oh_[:, None] * {sh} - {ph} + kh_[None, :] * {dh}")
        w.line(f"wi = ow_[:, None] * {sw} - {pw_} + kw_[None, :] * {dw}")
        amask = " & ".join([f"(rm[:, None] < {m})", f"(rk[None, :] < {ktot})", *_spatial_mask(k, "hi", "wi")])
        w.line(
            f"a = tl.load({px} + {x_off} + n_[:, None] * {xs[0]} + (grp * {cpg} + c_[None, :]) * {xs[1]}"
            f" + hi * {xs[2]} + wi * {xs[3]}, mask={amask}, other=0)"
        )
        w.line(f"bmask = (rk[:, None] < {ktot}) & (rn[None, :] < {opg})")
        w.line(
            f"b = tl.load({pw} + {w_off} + (grp * {opg} + rn[None, :]) * {ws[0]} + c_[:, None] * {ws[1]}"
            f" + kh_[:, None] * {ws[2]} + kw_[:, None] * {ws[3]}, mask=bmask, other=0)"
        )
        w.line(dot_line("a", "b", k.x.dtype, options, sm, "conv"))
