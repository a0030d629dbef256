"""Weights packed at build time for the CPU matmul micro-kernel (cpp_templates/matmul.h, conv.h).

What it is: ``pack_plan`` (a pure rewrite of a Plan for one CPU level: every matmul whose B operand is a
weight seen through a constant view, and every fp32 conv with one group over a constant weight, reads a
new packed weight instead; a 3x3 stride-1 conv that ``wino_choice`` picks reads its weight's Winograd
transform, for conv_wino.h) and ``pack_array`` (the packed
values, computed from the weight's values by the builder, or by tests from random weights). The packed
tensors go into the CPU target's own safetensors member; the library takes them after the manifest's
weights, so loading them is a mmap like any weight, and no call repacks a panel.
What it is not: a layout pass for activations (they stream), nor anything a CUDA target sees. A package
with CPU targets only leaves out the original of a weight that only packed matmuls read (``packed_only``).

Note: the panel is [ceil(N / NR)][K][NR] in fp32 (a bf16/f16 weight is widened once here rather than on
every call), zero past N, with NR two vectors of the level's width, or three (AVX-512, many rows:
``matmul_panel``); the generated code static_asserts that its header agrees. A conv's weight is the B
operand of an implicit GEMM, K = (kh, kw, c) and N = output channels, packed the same way with a panel of
one vector when the conv has at most one vector of output channels (a ResNet stem's 16 channels would
waste half of a two-vector panel), else two.
Note (bf16): at AVX-512 a matmul of two bf16 operands (``--precision bf16``) keeps its weight in bf16, as
pairs of consecutive k (``pairs``: [ceil(N / NR)][ceil(K / 2)][NR][2], the even k first) that matmul_bf16.h's
VDPBF16PS kernel reads: twice the fp32 rate where the CPU has AVX512_BF16 (2 cores of Zen 4: 440 against 220
GFLOP/s at 512 x 3072 x 768), half the bytes; an AVX-512 CPU without it widens the pairs at the fp32 rate.
Lower levels widen the weight here to fp32 panels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
import sympy

from .. import kernel as K
from ..ir import DType

log = logging.getLogger("aotc.pack")
PANEL = {"x86-64-v2": 8, "x86-64-v3": 16, "x86-64-v4": 32}  # AOTC_MM_NR_F32 at each level


@dataclass(frozen=True)
class Packing:
    """One packed weight: buffer ``name`` holds B[k, n] = source[offset + k*sk + n*sn] as panels of ``nr``."""

    name: str
    source: str
    offset: int
    sk: int
    sn: int
    k: int
    n: int
    nr: int
    # a conv's k = (kh * KW + kw) * C + c walks several strides: (size, stride) pairs, outermost first,
    # that replace ``sk`` when given
    kdims: tuple[tuple[int, int], ...] = ()
    # 2 or 4: a 3x3 conv's weight as its Winograd transform for F(wino x wino, 3x3) (``wino_weight``), whose
    # k = pos * C + c over the (wino + 2)^2 positions replaces the kernel's taps
    wino: int = 0
    # bf16 pairs of consecutive k (see the Note above), zero past K
    pairs: bool = False

    @staticmethod
    def widened(name: str, source: str, numel: int) -> Packing:
        """The weight itself widened to fp32, in its own layout: one panel, one column wide (cpp_widen.py)."""
        return Packing(name, source, 0, 1, 0, numel, 1, 1)

    @property
    def panels(self) -> int:
        return -(-self.n // self.nr)

    @property
    def rows(self) -> int:
        """A panel's rows of k: K, or the Winograd transform's positions x channels."""
        return self.k // 9 * (self.wino + 2) ** 2 if self.wino else self.k

    @property
    def shape(self) -> tuple[int, ...]:
        if self.pairs:
            return (self.panels, -(-self.rows // 2), self.nr, 2)
        return (self.panels, self.rows, self.nr)

    @property
    def dtype(self) -> DType:
        return DType.bf16 if self.pairs else DType.f32


# Winograd weight transforms G (points 0, 1, -1, 2, -2 and infinity; conv_wino.h has the matching B and A)
WINO_G = {
    2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
    4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                 [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
}  # fmt: skip
WINO_MIN_CHANNELS = 16  # input and output channels below which the direct kernel stays (see wino_choice)
WINO_REUSE = 1024  # tiles per image x this must exceed C_in x C_out (see wino_choice)


def wino_choice(k: K.Conv) -> tuple[int, str]:
    """The Winograd tile (4 or 2; 0: the direct kernel) for a packable fp32 conv, and why.

    Note: F(4x4, 3x3) does a quarter of the direct conv's multiplies, F(2x2, 3x3) 1/2.25, but the
    transformed weight is 4x (36 positions) or 1.8x (16) the size of the direct one and is read once per
    group of tiles: with few tiles per image and many channels (ResNet's 7x7 and 14x14 stages) the GEMMs
    stream weights rather than compute. Rule, measured with conv_wino.h against conv.h's direct kernel (2
    threads, batch 1 and 4, AVX-512 and AVX2): F(4x4) when an image's 4x4 tiles x 1024 exceed C_in x C_out
    (the CNN's 16, 32 and 64 channels at 112, 56 and 28 pixels: 1.6-2.6x faster; 28x28 at 128: 1.5-2.4x;
    14x14 at 256: 0.8x), else F(2x2) when its 2x2 tiles x 2304 (1024 x 36 / 16) do (14x14 at 128 and 256
    channels: 1.0-1.8x), else direct (7x7 at 512: F(2x2) 0.3-0.9x). Fewer than 16 channels keep the direct
    kernel (a stem's 3 would fill 3 of the transforms' 16 lanes; not measured)."""
    if k.kernel != (3, 3) or k.stride != (1, 1) or k.dilation != (1, 1) or k.groups != 1:
        return 0, "direct: not a 3x3 conv at stride 1"
    if k.c_in < WINO_MIN_CHANNELS or k.c_out < WINO_MIN_CHANNELS:
        return 0, f"direct: {k.c_in} -> {k.c_out} channels, fewer than {WINO_MIN_CHANNELS}"
    oh, ow = (_int(e) for e in k.out_hw)
    if oh is None or ow is None:
        return 0, "direct: the output size is not known at build time"
    pairs = k.c_in * k.c_out
    for m, per in ((4, WINO_REUSE), (2, WINO_REUSE * 36 // 16)):
        tiles = -(-oh // m) * -(-ow // m)
        if tiles * per > pairs:
            return m, f"F({m}x{m}, 3x3): {tiles} tiles an image at {k.c_in} -> {k.c_out} channels"
    return 0, f"direct: {oh} x {ow} outputs too few for {k.c_in} -> {k.c_out} channels' transformed weights"


def wino_weight(g: np.ndarray, m: int) -> np.ndarray:
    """U[a, b, c, o] = (G g[:, :, c, o] G^T)[a, b] of a weight g[kh, kw, c, o], in float64."""
    gm = WINO_G[m]
    return np.einsum("ai,ijco,bj->abco", gm, g.astype(np.float64), gm)


def _int(e: sympy.Expr | int) -> int | None:
    return int(e) if isinstance(e, int) or (isinstance(e, sympy.Expr) and e.is_Integer) else None


def _packable(k: K.Kernel, weights: set[str]) -> tuple[int, int, int, int, int] | None:
    """(offset, sk, sn, K, N) when ``k`` is a float matmul over a constant view of a weight."""
    if not isinstance(k, K.Matmul) or k.packed or k.b.buf not in weights:
        return None
    dts = (k.a.dtype, k.b.dtype)
    if DType.f64 in dts or not any(d.is_float for d in dts) or not k.b.dtype.is_float:
        return None
    got = [_int(e) for e in (k.b.offset, *k.b.strides, k.k, k.n)]
    ints = [v for v in got if v is not None]
    if len(ints) != 5 or ints[3] == 0 or ints[4] == 0:
        return None
    offset, sk, sn, kk, n = ints
    return offset, sk, sn, kk, n


WIDE_PANEL = {"x86-64-v4": 48}  # the wide block's panel (matmul.h: aotc_mm_tiles<3>), where it pays
WIDE_MIN_ROWS = 128


def matmul_panel(k: K.Matmul, n: int, level: str, symbols: dict[str, int]) -> int:
    """The panel width of a packed matmul weight with ``n`` columns: the wide block's when the matmul has
    WIDE_MIN_ROWS rows or more (at the example sizes, ``symbols``) and 48-column panels waste at most 1%
    more than the default's, else the level's default (see the Note in matmul.h at aotc_mm_tiles)."""
    nr, wide = PANEL[level], WIDE_PANEL.get(level)
    if wide is None:
        return nr
    rows = sympy.Mul(k.m, *k.batch)
    rows = rows.subs({x: symbols[x.name] for x in rows.free_symbols if x.name in symbols})
    if not rows.is_Integer or int(rows) < WIDE_MIN_ROWS:
        return nr

    def padded(w: int) -> float:
        return -(-n // w) * w / n

    return wide if padded(wide) <= padded(nr) + 0.01 else nr


def bf16_pairs(k: K.Matmul, level: str) -> bool:
    """Whether a packed matmul runs on bf16 pairs (matmul_bf16.h): both operands bf16, at AVX-512."""
    return level == "x86-64-v4" and k.a.dtype is DType.bf16 and k.b.dtype is DType.bf16


def conv_panel(k: K.Conv, level: str) -> int:
    """The panel width of a packed conv weight: one vector, or two when there are more output channels."""
    vec = PANEL[level] // 2
    return vec if k.c_out <= vec else 2 * vec


def _conv_packable(k: K.Kernel, weights: set[str]) -> tuple[int, int, tuple[tuple[int, int], ...]] | None:
    """(offset, stride of o, k's (size, stride) dims) when ``k`` is an fp32 or bf16 conv, one group, over a
    weight (a bf16 one is widened here; conv.h converts its bf16 input to fp32 channels-last as it reads it)."""
    if not isinstance(k, K.Conv) or k.packed or k.w.buf not in weights or k.groups != 1:
        return None
    if not {k.x.dtype, k.w.dtype} <= {DType.f32, DType.bf16}:
        return None
    got = [_int(e) for e in (k.w.offset, *k.w.strides)]
    if any(v is None for v in got):
        return None
    off, so, si, sh, sw = (int(v) for v in got)  # type: ignore[arg-type]
    return off, so, ((k.kernel[0], sh), (k.kernel[1], sw), (k.c_in, si))


def pack_plan(plan: K.Plan, level: str, winograd: bool = True) -> tuple[K.Plan, list[Packing]]:
    """``plan`` with weight matmuls reading packed weights (appended to its weights), and the packings; with
    ``winograd`` False every conv keeps the direct kernel (BuildOptions.winograd)."""
    examples = {s.name: s.example if s.example is not None else s.min for s in plan.symbols}
    names = {b.name for b in plan.weights}
    taken = {b.name for b in (*plan.inputs, *plan.outputs, *plan.weights, *plan.arena)}
    labels_taken = set(plan.labels.values())
    found: dict[tuple, Packing] = {}
    kernels: list[K.Kernel] = []
    labels = dict(plan.labels)

    def packing(key: tuple, proto: Packing) -> Packing:
        """The packing ``key`` names, made from ``proto`` (all but its name) the first time."""
        if key not in found:
            source = proto.source
            name, label, j = f"{source}_packed", f"{plan.labels.get(source, source)}.packed{proto.nr}", 1
            while name in taken or label in labels_taken:
                name, label, j = f"{source}_packed{j}", f"{plan.labels.get(source, source)}.packed{proto.nr}.{j}", j + 1
            taken.add(name)
            labels_taken.add(label)
            labels[name] = label
            found[key] = replace(proto, name=name)
        return found[key]

    for k in plan.kernels:
        view = _packable(k, names)
        cview = _conv_packable(k, names)
        if isinstance(k, K.Matmul) and view is not None:
            nr = matmul_panel(k, view[4], level, examples)
            pairs = bf16_pairs(k, level)
            p = packing((k.b.buf, *view, nr, pairs), Packing("", k.b.buf, *view, nr, pairs=pairs))
            b = K.Strided(p.name, sympy.Integer(0), (sympy.Integer(nr), sympy.Integer(1)), p.dtype)
            kernels.append(replace(k, b=b, packed=True))
        elif isinstance(k, K.Conv) and cview is not None:
            cnr = conv_panel(k, level)
            off, so, kdims = cview
            kk = k.kernel[0] * k.kernel[1] * k.c_in
            m, why = wino_choice(k) if winograd else (0, "direct: Winograd turned off (--no-winograd)")
            log.info("conv %s: %s", k.name, why)
            proto = Packing("", k.w.buf, off, 0, so, kk, k.c_out, cnr, kdims, m)
            p = packing((k.w.buf, off, so, kdims, k.c_out, cnr, m), proto)
            zero = sympy.Integer(0)
            w = K.Strided(p.name, zero, (sympy.Integer(cnr), sympy.Integer(1), zero, zero), DType.f32)
            kernels.append(replace(k, w=w, packed=True, wino=m))
        else:
            kernels.append(k)
    if not found:
        return plan, []
    packs = list(found.values())
    extra = [K.Buffer(p.name, p.dtype, p.shape, "weight") for p in packs]
    prog = K.Program(plan.symbols, plan.inputs, plan.outputs, [*plan.weights, *extra], plan.arena, kernels, labels)
    return K.Plan.of(prog, plan.arena_offsets, plan.arena_size), packs


def pack_array(p: Packing, weight: np.ndarray) -> np.ndarray:
    """The packed values of ``p`` from its source weight's values (any float dtype, C-contiguous)."""
    flat = np.ascontiguousarray(weight).reshape(-1).astype(np.float32)
    kidx = np.arange(p.k) * p.sk
    if p.kdims:  # k walks (size, stride) dims, outermost first
        kidx = np.zeros(1, np.int64)
        for size, stride in p.kdims:
            kidx = (kidx[:, None] + np.arange(size)[None, :] * stride).reshape(-1)
        assert kidx.size == p.k
    idx = p.offset + kidx[:, None] + np.arange(p.n)[None, :] * p.sn
    if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
        raise ValueError(f"packing {p.source}: the matmul's view reaches outside the weight")
    b = flat[idx]  # [K, N]
    panels, kk, nr = p.panels, p.rows, p.nr
    if p.wino:  # k = (kh * 3 + kw) * C + c becomes pos * C + c
        b = wino_weight(b.reshape(3, 3, -1, p.n), p.wino).reshape(kk, p.n).astype(np.float32)
    if p.pairs:  # [panels][K / 2][NR][2]: k = 2 * pair + half; the weight's own bf16 values, exact
        out = np.zeros((2 * -(-kk // 2), panels * nr), np.float32)
        out[:kk, : p.n] = b
        pairs = out.reshape(-1, 2, panels, nr).transpose(2, 0, 3, 1)
        return np.ascontiguousarray(pairs).astype(ml_dtypes.bfloat16)
    out = np.zeros((kk, panels * nr), np.float32)
    out[:, : p.n] = b
    return np.ascontiguousarray(out.reshape(kk, panels, nr).transpose(1, 0, 2))


def without(plan: K.Plan, names: set[str]) -> K.Plan:
    """``plan`` without the weights ``names`` (which no kernel of it reads)."""
    assert not any(names & K.reads(k) for k in plan.kernels), "dropping a weight a kernel reads"
    prog = K.Program(plan.symbols, plan.inputs, plan.outputs, [w for w in plan.weights if w.name not in names],
                     plan.arena, plan.kernels, plan.labels)  # fmt: skip
    return K.Plan.of(prog, plan.arena_offsets, plan.arena_size)


def packed_only(packed: list[tuple[K.Plan, list[Packing]]]) -> set[str]:
    """Weights that every given plan reads only through their packed copies: a package whose every target
    is one of these plans need not carry them (for a CUDA target, pass nothing: it reads them all)."""
    sources = {p.source for _, packs in packed for p in packs}
    read = {b for plan, _ in packed for k in plan.kernels for b in K.reads(k)}
    return sources - read
