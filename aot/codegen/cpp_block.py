"""The inverted-residual block on CPUs: three conv kernels (expand 1x1 -> depthwise -> project 1x1) printed
as one C++ function over ``aotc_conv_block`` (cpp_templates/conv_dw.h), which keeps the expanded rows in
cache instead of writing and re-reading the 6x tensor twice.

What it is: a pattern over the kernel program (``find_blocks``) and the printer of the fused function
(``write_block``); each stage's epilogue is its own kernel's, printed by its ``KernelWriter``. The first two
epilogues store in place into the template's row buffers (``in_place``) instead of their arena buffers.
What it is not: a fusion pass. The three kernels stay in the program -- the reference interpreter, the GPU
path and the memory plan see them as before -- and a chain that does not match exactly stays three calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import sympy

from .. import kernel as K
from ..ir import DType, Op
from ..symbolic import to_c
from .cpp_values import operand_ptr
from .writer import Writer

if TYPE_CHECKING:
    from .cpp_values import Kctx


class KernelWriter(Protocol):
    """What a block stage needs of aot/codegen/cpp.py's KernelWriter (a Protocol: cpp.py imports this module)."""

    @property
    def k(self) -> K.Kernel: ...

    @property
    def ctx(self) -> Kctx: ...

    def nhwc_epilogue(self, w: Writer, head: str, close: str, ow: str) -> None: ...


ROW_PITCH = sympy.Symbol("aotc_ldt", integer=True, positive=True)  # the row buffer's pitch (the tile's ldt)
ROW_DST = "aotc_dst"  # the row buffer an in-place epilogue stores into
# Bytes of one image's expanded tensor (H x W x hidden fp32) from which the block runs fused. Measured on
# MobileNetV2's blocks at 1 thread (AVX-512), fused against three kernels: 1.3-1.9x at 112x112 and 56x56,
# 1.1x at 28x28, 1.03-1.07x at 14x14 and 7x7 (188-451 KiB, where the tensor stays in L2 between the kernels
# anyway); at 2 threads the small three-kernel chains split worse (their depthwise takes tens of
# microseconds, less than a worker's wake-up). Below this size nothing was measured: three kernels stay.
MIN_BYTES = 128 * 1024


def depthwise_nhwc(k: K.Conv) -> bool:
    """A depthwise fp32 (or bf16: conv_depthwise.h widens it) conv over channels-last input with its weight
    stored [kh][kw][C]; input and weight may differ (a bf16 model's weight widened by cpp_widen.py)."""
    c = k.c_in
    if not (k.groups == c == k.c_out and {k.x.dtype, k.w.dtype} <= {DType.f32, DType.bf16}):
        return False
    xs, ws = [sympy.sympify(e) for e in k.x.strides], [sympy.sympify(e) for e in k.w.strides]
    return xs[1] == 1 and ws[0] == 1 and ws[2] == k.kernel[1] * c and ws[3] == c


def _same(a: Sequence[sympy.Expr | int], b: Sequence[sympy.Expr | int]) -> bool:
    return len(a) == len(b) and all(sympy.simplify(sympy.sympify(x) - sympy.sympify(y)) == 0 for x, y in zip(a, b, strict=True))


def _nhwc(c: int, h: sympy.Expr, w: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """Strides (n, c, h, w) of a dense channels-last tensor."""
    return (sympy.sympify(h * w * c), sympy.Integer(1), sympy.sympify(w * c), sympy.Integer(c))


def _pointwise(k: K.Kernel) -> bool:
    """A packed 1x1 conv (its weight fp32 panels, cpp_pack.py) over fp32 or bf16 input, stride 1, unpadded,
    channels-last."""
    return (
        isinstance(k, K.Conv) and k.packed and k.groups == 1 and k.kernel == (1, 1) and k.stride == (1, 1)
        and k.padding == (0, 0) and k.w.dtype is DType.f32 and k.x.dtype in (DType.f32, DType.bf16)
        and sympy.sympify(k.x.strides[1]) == 1 and not k.has_gather
    )  # fmt: skip


def row_value(st: K.Store) -> K.Store:
    """``st`` as a block's row stage stores it: the rows are fp32 (conv_dw.h), so a bf16 model's rounding of
    the stage's output to bf16 is left out (the next stage reads the fp32 value)."""
    v = st.value
    if isinstance(v, K.Unary) and v.op is Op.CAST and v.dtype is DType.bf16:
        return K.Store(st.buf, st.index, v.x)
    return st


def row_store(k: K.Conv, weights: set[str]) -> K.Store | None:
    """The kernel's one store when it writes its output dense channels-last and reads nothing but weights
    besides the accumulator (a bias, a clamp): then it can run in place on a row of the block."""
    if len(k.stores) != 1 or k.has_gather:
        return None
    st = k.stores[0]
    if any(isinstance(v, K.Load) and v.buf not in weights for v in K.walk(st.value)):
        return None
    i0, i1, i2, i3 = K.loop_vars("i", 4)
    oh, ow = k.out_hw
    want = i0 * oh * ow * k.c_out + i2 * ow * k.c_out + i3 * k.c_out + i1
    return st if sympy.expand(sympy.sympify(st.index) - want) == 0 else None


@dataclass(frozen=True)
class Clamp:
    """An epilogue min(max(acc + bias[per_n * i0 + i1 + offset], lo), hi): conv_depthwise.h's ``aotc_conv_clamp``."""

    bias: str | None  # a weight buffer, or None
    offset: int
    per_n: int
    lo: float
    hi: float

    def c_init(self, ptrs: dict[str, str]) -> str:
        bias = f"{ptrs[self.bias]} + {self.offset}, {self.per_n}" if self.bias is not None else "NULL, 0"
        return f"{{{bias}, {_c_float(self.lo)}, {_c_float(self.hi)}}}"


def _c_float(x: float) -> str:
    return repr(x) + "f" if math.isfinite(x) else ("INFINITY" if x > 0 else "-INFINITY")


def clamp_of(st: K.Store, weights: set[str]) -> Clamp | None:
    """``st``'s value as a Clamp (a folded batch-norm and a ReLU6 or ReLU, each part optional), for the block
    to apply in registers; None for any other epilogue."""
    v, lo, hi = st.value, -math.inf, math.inf
    if isinstance(v, K.Binary) and v.op is Op.MIN and isinstance(v.b, K.Const):
        hi = float(v.b.value)
        v = v.a
    if isinstance(v, K.Binary) and v.op is Op.MAX and isinstance(v.b, K.Const):
        lo = float(v.b.value)
        v = v.a
    elif isinstance(v, K.Unary) and v.op is Op.RELU:
        v, lo = v.x, 0.0
    if math.isnan(lo) or math.isnan(hi) or any(x.dtype is not DType.f32 for x in K.walk(st.value) if not isinstance(x, K.Index)):
        return None
    if isinstance(v, K.Acc):
        return Clamp(None, 0, 0, lo, hi)
    if not (isinstance(v, K.Binary) and v.op is Op.ADD):
        return None
    acc, load = (v.b, v.a) if isinstance(v.a, K.Load) else (v.a, v.b)
    if not (isinstance(acc, K.Acc) and isinstance(load, K.Load) and load.buf in weights and isinstance(load.index, K.Index)):
        return None
    i0, i1 = K.loop_var("i", 0), K.loop_var("i", 1)
    idx = sympy.expand(sympy.sympify(load.index.expr))
    per_n = idx.coeff(i0)
    rest = sympy.expand(idx - per_n * i0 - i1)
    if not (per_n.is_Integer and rest.is_Integer):
        return None
    return Clamp(load.buf, int(rest), int(per_n), lo, hi)


def in_place(st: K.Store) -> K.Store:
    """``st`` storing pixel p = i2 * OW + i3, channel i1 of a run of pixels from p0 at ROW_DST[(p - p0) * ldt + i1]
    (``aotc_ow`` and ``aotc_p0`` are the epilogue's output width and first pixel)."""
    i1, i2, i3 = (K.loop_var("i", j) for j in (1, 2, 3))
    ow, p0 = sympy.Symbol("aotc_ow", integer=True, positive=True), sympy.Symbol("aotc_p0", integer=True, nonnegative=True)
    return K.Store(st.buf, (i2 * ow + i3 - p0) * ROW_PITCH + i1, st.value)


def find_blocks(prog: K.Plan) -> dict[int, tuple[K.Conv, K.Conv, K.Conv]]:
    """Kernel index -> the (expand, depthwise, project) convs starting there that ``aotc_conv_block`` runs:
    the expand's and the depthwise's outputs are dense channels-last, read by the next stage alone, and
    their epilogues read only weights; the depthwise has dilation 1; the block's output does not share
    arena bytes with its input (fused, the expand reads the input until the project's last row is written;
    aot/memory.py keeps a chain's input alive that long, and this check stays for any other plan)."""
    weights = {b.name for b in prog.weights}
    outputs = {b.name for b in prog.outputs}
    readers: dict[str, int] = {}
    for k in prog.kernels:
        for b in K.reads(k):
            readers[b] = readers.get(b, 0) + 1
    found: dict[int, tuple[K.Conv, K.Conv, K.Conv]] = {}
    ks = prog.kernels
    j = 0
    while j + 2 < len(ks):
        e, d, p = ks[j], ks[j + 1], ks[j + 2]
        if _chain(e, d, p, weights, outputs, readers):
            assert isinstance(e, K.Conv) and isinstance(d, K.Conv) and isinstance(p, K.Conv)
            if all(_disjoint(prog, e.x.buf, st.buf) for st in p.stores):
                found[j] = (e, d, p)
                j += 3
                continue
        j += 1
    return found


def _chain(e: K.Kernel, d: K.Kernel, p: K.Kernel, weights: set[str], outputs: set[str], readers: dict[str, int]) -> bool:
    if not (_pointwise(e) and _pointwise(p) and isinstance(d, K.Conv) and depthwise_nhwc(d)):
        return False
    assert isinstance(e, K.Conv) and isinstance(p, K.Conv)
    se, sd = row_store(e, weights), row_store(d, weights)
    if se is None or sd is None or d.has_gather or d.dilation != (1, 1) or d.kernel[0] > 16:
        return False
    hid = e.c_out
    size = sympy.sympify(e.height * e.width * hid * 4)
    if not size.is_Integer or int(size) < MIN_BYTES:
        return False
    if d.c_in != hid or p.c_in != hid or not _same((e.batch, e.height, e.width), (d.batch, d.height, d.width)):
        return False
    if not _same((d.batch, *d.out_hw), (p.batch, p.height, p.width)):
        return False
    if d.x.buf != se.buf or p.x.buf != sd.buf or se.buf in outputs or sd.buf in outputs:
        return False
    if readers.get(se.buf) != 1 or readers.get(sd.buf) != 1:
        return False
    if not (_same((d.x.offset,), (0,)) and _same(d.x.strides, _nhwc(hid, d.height, d.width))):
        return False
    return _same((p.x.offset,), (0,)) and _same(p.x.strides, _nhwc(hid, *d.out_hw))


def _disjoint(prog: K.Plan, a: str, b: str) -> bool:
    """Buffers ``a`` and ``b`` share no byte (only arena buffers can)."""
    ba, bb = prog.buffer(a), prog.buffer(b)
    if ba.kind != "arena" or bb.kind != "arena":
        return a != b
    ends = [sympy.sympify(x) for x in (prog.arena_offsets.get(a, 0), ba.nbytes(), prog.arena_offsets.get(b, 0), bb.nbytes())]
    if not all(x.is_Integer for x in ends):
        return False
    oa, na, ob, nb = (int(x) for x in ends)
    return oa + na <= ob or ob + nb <= oa


def _shape(k: K.Conv) -> str:
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k.kernel, k.stride, k.padding, k.dilation
    dims = [k.batch, k.c_in, k.height, k.width, k.c_out, kh, kw, *k.out_hw, sh, sw, ph, pw, dh, dw, k.groups]
    return "{" + ", ".join(to_c(e) for e in dims) + "}"


def write_block(
    fname: str, params: list[str], stages: tuple[KernelWriter, KernelWriter, KernelWriter], clamps: tuple[Clamp | None, Clamp | None],
    out_p: str | None = None,
) -> str:  # fmt: skip
    """The fused function: the three shapes, each stage's epilogue (the first two an ``aotc_conv_clamp`` where
    ``clamps`` has one, else a lambda storing in place; the projection's ``out_p``, an ``aotc_conv_out``
    initializer, where given, else a lambda), and the ``aotc_conv_block`` call. ``stages``: the expand's and
    the depthwise's writers hold kernels whose store is ``in_place`` and whose output buffer prints as
    ROW_DST."""
    e, d, p = stages
    ke, kd, kp = e.k, d.k, p.k
    assert isinstance(ke, K.Conv) and isinstance(kd, K.Conv) and isinstance(kp, K.Conv)
    w = Writer("  ")
    body = Writer("  ", depth=1)
    for name, k in (("se", ke), ("sd", kd), ("sp", kp)):
        body.line(f"const aotc_conv_shape aotc_{name} = {_shape(k)};")
    body.line(f"const aotc_conv_strides aotc_xs = {{{', '.join(to_c(x) for x in (ke.x.offset, *ke.x.strides))}}};")
    nve, nvp = to_c(ke.w.strides[0]), to_c(kp.w.strides[0])
    for nr in (nve, nvp):
        body.line(f'static_assert({nr} * 4 % AOTC_VBYTES == 0, "conv weights packed for another vector width");')
    rows = "int64_t i0, int64_t aotc_p0, int64_t aotc_pb, int64_t aotc_oc0, int64_t aotc_ocb, const float* aotc_tile, int64_t aotc_ldt"
    for name, st, shape, clamp in (("e", e, "aotc_se", clamps[0]), ("d", d, "aotc_sd", clamps[1])):
        if clamp is not None:  # applied in registers
            body.line(f"const aotc_conv_clamp<float> aotc_epi_{name} = {clamp.c_init(st.ctx.bufs)};")
        else:
            st.nhwc_epilogue(body, f"auto aotc_epi_{name} = [&]({rows}, float* {ROW_DST})", "};", f"{shape}.OW")
    if out_p is not None:  # conv_dw.h writes the output from the projection's registers
        body.line(f"const aotc_conv_out<float> aotc_epi_p = {out_p};")
    else:
        p.nhwc_epilogue(body, f"auto aotc_epi_p = [&]({rows})", "};", "aotc_sp.OW")
    # the input and the depthwise weight as the template reads them (bf16 ones as tags: conv_dw.h widens them)
    x, we = operand_ptr(e.ctx.bufs[ke.x.buf], ke.x.dtype), e.ctx.bufs[ke.w.buf]
    wd, wp = operand_ptr(d.ctx.bufs[kd.w.buf], kd.w.dtype), p.ctx.bufs[kp.w.buf]
    # the 1x1 convs' input channels: their pixel strides at compile time (conv_dw.h's CE, CH)
    ce, ch = ke.c_in, kd.c_in
    body.line(
        f"aotc_conv_block<float, {nve} * 4 / AOTC_VBYTES, {nvp} * 4 / AOTC_VBYTES, {ce}, {ch}>(aotc_se, {x}, aotc_xs, {we}, "
        f"aotc_sd, {wd} + {to_c(kd.w.offset)}, aotc_sp, {wp}, aotc_epi_e, aotc_epi_d, aotc_epi_p);"
    )
    with w.block(f"static void {fname}({', '.join(params)})"):
        w.extend(body.lines)
    return w.text()
