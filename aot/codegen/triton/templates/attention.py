"""The Attention template: flash-attention forward. One program per (block of BLOCK_M query rows, batch
position); it walks the keys in BLOCK_N blocks with an online softmax in fp32 (exp2, the scale folded into
log2(e)), so the L x S scores never reach memory, and stores through the kernel's epilogue.

Note: the key loop is split in two. Full blocks (below the causal diagonal, inside S) run with no element
masks at all; the rest (the diagonal blocks, a ragged last block) apply the causal and length masks. Blocks
past the diagonal are never visited (the loop bound), and causal grids launch every head's heaviest row
blocks first (8x12x1024x64 on the H200: 0.0453 against 0.0492 ms head by head).
Masks (bool or additive) are loaded with their strides, 0 where broadcast, in both loops.
"""

from __future__ import annotations

import sympy
from aotc.errors import CompileError

from .... import kernel as K
from ....ir import DType
from ....options import BuildOptions
from ..configs import Config, Shape, choose, dot_mode
from ..sizes import example, grid_size, prod
from ..values import NO_AXES, TL, XR, Gen, R, TritonKernel, X, next_pow2
from .dot import DOT_TYPES, bind, dot_line, masks

LOG2E = 1.4426950408889634


def shape(prog: K.Program, k: K.Attention, options: BuildOptions) -> Shape:
    """The problem ``k`` is at the example sizes, as the config chooser and the tuner key it: m and n the
    query and key lengths, k the (larger) head dim, batch the batch x heads positions."""
    run_dt = DType.bf16 if k.q.dtype is DType.f32 and options.precision == "bf16" else k.q.dtype
    kind = "attention_causal" if k.causal else "attention"
    e = max(int(k.head_dim), int(k.v_dim))
    return Shape(kind, dot_mode(run_dt, options), example(prog, k.q_len), example(prog, k.kv_len), e, example(prog, prod(k.batch)))


def attention(
    prog: K.Program, k: K.Attention, index_i64: bool, options: BuildOptions, sm: int, config: Config | None = None
) -> TritonKernel:
    dt = k.q.dtype
    if not (k.q.dtype is k.k.dtype is k.v.dtype) or dt not in DOT_TYPES:
        raise CompileError(f"attention {k.name!r}: operands must share one of fp32/fp16/bf16, got "
                           f"{k.q.dtype.value}, {k.k.dtype.value}, {k.v.dtype.value}")  # fmt: skip
    if not isinstance(k.head_dim, int | sympy.Integer) or not isinstance(k.v_dim, int | sympy.Integer):
        raise CompileError(f"attention {k.name!r}: head dims must be static, got {k.head_dim}, {k.v_dim}")
    e, ev = int(k.head_dim), int(k.v_dim)
    g = Gen(prog, index_i64, ("BLOCK_M", "BLOCK_DV"))
    cfg, why = (config, "tuned") if config is not None else choose(shape(prog, k, options), sm)
    bm, bn, warps, stages = cfg.block_m, min(cfg.block_n, cfg.block_m), cfg.num_warps, cfg.num_stages
    bd, bdv = max(16, next_pow2(e)), max(16, next_pow2(ev))
    w = g.w
    w.line(f"# tile config: {bm}x{bn} w{warps} s{stages} ({why}, sm_{sm})")
    L, _ = g.index(k.q_len)
    S, _ = g.index(k.kv_len)
    nb = len(k.batch)
    w.line(f"pid = {g.pid()}")
    w.line(f"tiles_m = ({L} + BLOCK_M - 1) // BLOCK_M")
    if k.causal:  # every head's longest row blocks first, then shorter ones: the tail of the grid is short
        nbh, _ = g.index(prod(k.batch))
        w.line(f"bidx = pid % ({nbh})")
        w.line(f"pid_m = tiles_m - 1 - pid // ({nbh})")
    else:  # a head's row blocks side by side: they share its keys and values in L2
        w.line("bidx = pid // tiles_m")
        w.line("pid_m = pid % tiles_m")
    g.decompose("bidx", k.batch, "i", NO_AXES)
    w.line("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line("rd = tl.arange(0, BLOCK_D)")
    w.line("rv = tl.arange(0, BLOCK_DV)")
    q_off, _ = g.index(k.q.offset)
    head = f"i{nb - 1}"
    w.line(f"kvh = {head} // {k.group}")
    saved = g.loopvars[head]
    g.loopvars[head] = ("kvh", NO_AXES)  # k's and v's offsets name the kv head with the head variable
    k_off, _ = g.index(k.k.offset)
    v_off, _ = g.index(k.v.offset)
    g.loopvars[head] = saved
    sql, sqe = (g.index(s)[0] for s in k.q.strides)
    sks, ske = (g.index(s)[0] for s in k.k.strides)
    svs, sve = (g.index(s)[0] for s in k.v.strides)
    pq, pk, pv = g.ptr(k.q.buf), g.ptr(k.k.buf), g.ptr(k.v.buf)
    dmask = f" & (rd[None, :] < {e})" if bd != e else ""
    w.line(f"q = tl.load({pq} + {q_off} + rm[:, None] * {sql} + rd[None, :] * {sqe}, mask=(rm[:, None] < {L}){dmask}, other=0)")
    w.line(f"m_i = tl.full([BLOCK_M], float(\"-inf\"), {TL[DType.f32]})")
    w.line("l_i = tl.zeros([BLOCK_M], tl.float32)")
    w.line("o = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)")
    mask_load = ""
    if k.mask is not None:
        m_off, _ = g.index(k.mask.offset)
        sml, sms = (g.index(s)[0] for s in k.mask.strides)
        pm = g.ptr(k.mask.buf)
        mask_at = f"{pm} + {m_off} + rm[:, None] * {sml} + rn[None, :] * {sms}"
        mask_load = f"tl.load({mask_at}, mask=(rm[:, None] < {L}) & (rn[None, :] < {S}), other=0)"
    # full key blocks end at S rounded down to BLOCK_N (and, causal, at this row block's first row)
    full = f"{S} // BLOCK_N * BLOCK_N"
    hi = f"tl.minimum({S}, (pid_m + 1) * BLOCK_M)" if k.causal else S
    if k.causal:
        full = f"tl.minimum(pid_m * BLOCK_M, {full})"

    def body(edge: bool) -> None:
        w.line("rn = n0 + tl.arange(0, BLOCK_N)")
        kd = f"(rd[:, None] < {e})" if bd != e else ""
        kn = f"(rn[None, :] < {S})" if edge else ""
        kmask = " & ".join(x for x in (kn, kd) if x)
        w.line(f"kt = tl.load({pk} + {k_off} + rn[None, :] * {sks} + rd[:, None] * {ske}{_masked(kmask)})")
        w.line("acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
        w.line(dot_line("q", "kt", dt, options, sm))
        scale = k.scale * LOG2E
        if not edge and k.mask_kind == "none" and scale > 0:  # unmasked: the scale folds into one FMA per score
            w.line(f"m_new = tl.maximum(m_i, tl.max(acc, 1) * {scale!r})")
            w.line(f"p = tl.exp2(acc * {scale!r} - m_new[:, None])")
            w.line("alpha = tl.exp2(m_i - m_new)")
            finish(edge)
            return
        w.line(f"qk = acc * {scale!r}")
        keep = []
        if edge:
            keep.append(f"(rn[None, :] < {S})")
            if k.causal:
                keep.append("(rm[:, None] >= rn[None, :])")
        if k.mask_kind == "bool":
            keep.append(f"({mask_load} != 0)")
        elif k.mask_kind == "add":
            w.line(f"qk = qk + {mask_load}.to(tl.float32) * {LOG2E!r}")
        if keep:
            w.line(f"qk = tl.where({' & '.join(keep)}, qk, float(\"-inf\"))")
        w.line("m_new = tl.maximum(m_i, tl.max(qk, 1))")
        if keep or k.mask_kind == "add":  # a row may have no key yet: keep exp2's argument finite
            w.line("m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)")
        else:
            w.line("m_use = m_new")
        w.line("alpha = tl.exp2(m_i - m_use)")
        w.line("p = tl.exp2(qk - m_use[:, None])")
        finish(edge)

    def finish(edge: bool) -> None:
        w.line("l_i = l_i * alpha + tl.sum(p, 1)")
        vd = f"(rv[None, :] < {ev})" if bdv != ev else ""
        vn = f"(rn[:, None] < {S})" if edge else ""
        vmask = " & ".join(x for x in (vn, vd) if x)
        w.line(f"vv = tl.load({pv} + {v_off} + rn[:, None] * {svs} + rv[None, :] * {sve}{_masked(vmask)})")
        w.line("acc = o * alpha[:, None]")
        w.line(dot_line("p" if dt is DType.f32 else f"p.to({TL[dt]})", "vv", dt, options, sm))
        w.line("o = acc")
        w.line("m_i = m_new")

    w.line(f"for n0 in range(0, {full}, BLOCK_N):")
    with w.indent():
        body(edge=False)
    ragged = not (isinstance(k.kv_len, int | sympy.Integer) and int(k.kv_len) % bn == 0)
    if k.causal or ragged:
        w.line(f"for n0 in range({full}, {hi}, BLOCK_N):")
        with w.indent():
            body(edge=True)
    w.line("out = o / tl.where(l_i > 0, l_i, 1.0)[:, None]")  # a row with no key left: o is 0, so zeros
    bind(g, f"i{nb}", "rm[:, None]", X)
    bind(g, f"i{nb + 1}", "rv[None, :]", R)
    masks(g, f"i{nb} < {L}", f"i{nb + 1} < {ev}")
    g.acc = ("out", XR)
    for st in k.stores:
        g.store(st, "omask")
    tiles = prod((sympy.ceiling(sympy.sympify(k.q_len) / bm), *k.batch))
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_DV": bdv}
    return g.finish(k.name, w, consts, (grid_size(tiles), 1, 1), num_warps=warps, num_stages=stages)


def _masked(mask: str) -> str:
    return f", mask={mask}, other=0" if mask else ""


__all__ = ["LOG2E", "attention", "shape"]
