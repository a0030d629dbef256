"""The depthwise Conv template (groups == C_in == C_out: MobileNet's 3x3, ConvNeXt's 7x7): a direct kernel.

A tile is (BLOCK_M output pixels) x (BLOCK_N channels); it loops over the kh x kw taps (unrolled), loading one
[pixels, channels] block of the input per tap and one [channels] row of the weight, and accumulates in fp32
(the operand type for fp64). Over NHWC activations and [kh, kw, C] weights (passes/layout.py) both loads are
contiguous along channels, so they vectorize. There is no reduction over channels to hand to ``tl.dot``: an
implicit GEMM with one channel per group would waste all but one column of every tile.
The kernel's stores are the epilogue, as in the implicit-GEMM template.
"""

from __future__ import annotations

import sympy

from .... import kernel as K
from ....options import BuildOptions
from ..sizes import grid_size, hint
from ..values import TL, XR, Gen, R, TritonKernel, X, next_pow2
from .dot import acc_dtype, bind, masks


def is_depthwise(k: K.Conv) -> bool:
    return k.groups > 1 and k.c_in == k.groups and k.c_out == k.groups and k.x.dtype is k.w.dtype


def depthwise(prog: K.Program, k: K.Conv, index_i64: bool, options: BuildOptions, sm: int) -> TritonKernel:
    del options, sm  # fp32 accumulation regardless of the build's precision; no tile depends on the GPU yet
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_N"))
    c = k.c_out
    kh, kw = k.kernel
    (sh, sw), (ph, pw_), (dh, dw) = k.stride, k.padding, k.dilation
    oh_e, ow_e = k.out_hw
    p_e = sympy.sympify(k.batch) * oh_e * ow_e
    bn = min(64, max(16, next_pow2(c)))
    bm = max(16, min(64, next_pow2(hint(prog, p_e)), 4096 // bn))
    acc_dt = acc_dtype(k.x.dtype, k.w.dtype)
    w = g.w
    m, _ = g.index(p_e)
    oh, _ = g.index(oh_e)
    ow, _ = g.index(ow_e)
    h, _ = g.index(k.height)
    wd, _ = g.index(k.width)
    px, pw = g.ptr(k.x.buf), g.ptr(k.w.buf)
    w.line(f"pid = {g.pid()}")
    w.line(f"tiles_n = {-(-c // bn)}")
    w.line("pid_m = pid // tiles_n")
    w.line("pid_n = pid % tiles_n")
    w.line("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    w.line(f"n_ = rm // ({oh} * {ow})")
    w.line(f"oh_ = (rm // {ow}) % {oh}")
    w.line(f"ow_ = rm % {ow}")
    g.loopvars["i0"] = ("n_", X)  # offsets may mention the batch variable
    x_off, _ = g.index(k.x.offset)
    w_off, _ = g.index(k.w.offset)
    del g.loopvars["i0"]
    xs = [g.index(s)[0] for s in k.x.strides]
    ws = [g.index(s)[0] for s in k.w.strides]
    w.line(f"mrow = rm < {m}")
    w.line(f"ncol = rn < {c}")
    w.line(f"x_row = {px} + {x_off} + n_ * {xs[0]}")
    w.line(f"x_col = rn * {xs[1]}")
    w.line(f"w_col = {pw} + {w_off} + rn * {ws[0]}")
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], {TL[acc_dt]})")
    w.line(f"for ki in tl.static_range({kh}):")
    with w.indent():
        w.line(f"hi = oh_ * {sh} - {ph} + ki * {dh}")
        w.line(f"hmask = mrow & (hi >= 0) & (hi < {h})")
        w.line(f"for kj in tl.static_range({kw}):")
        with w.indent():
            w.line(f"wi = ow_ * {sw} - {pw_} + kj * {dw}")
            w.line(f"pmask = hmask & (wi >= 0) & (wi < {wd})")
            w.line(
                f"a = tl.load(x_row[:, None] + (hi * {xs[2]} + wi * {xs[3]})[:, None] + x_col[None, :],"
                " mask=pmask[:, None] & ncol[None, :], other=0)"
            )
            w.line(f"b = tl.load(w_col + ki * {ws[2]} + kj * {ws[3]}, mask=ncol, other=0)")
            w.line(f"acc += a.to({TL[acc_dt]}) * b.to({TL[acc_dt]})[None, :]")
    bind(g, "i0", "n_[:, None]", X)
    bind(g, "i1", "rn[None, :]", R)
    bind(g, "i2", "oh_[:, None]", X)
    bind(g, "i3", "ow_[:, None]", X)
    masks(g, f"rm[:, None] < {m}", f"rn[None, :] < {c}")
    g.acc = ("acc", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = sympy.ceiling(p_e / bm) * (-(-c // bn))
    consts = {"BLOCK_M": bm, "BLOCK_N": bn}
    return g.finish(k.name, w, consts, (grid_size(tiles), 1, 1), num_warps=4, num_stages=1)
