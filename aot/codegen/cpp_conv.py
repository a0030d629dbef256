"""C++ code generation for ``kernel.Conv``: the conv template calls (cpp_templates/conv.h, conv_pool.h) with
their generated epilogues, and the inverted-residual block's fused function around cpp_block.py.

What it is: the conv emitters of cpp.py's ``KernelWriter``, a mixin of their own as cpp_reduce.py's are,
printing with the writer's epilogue helpers (declared by ``_Host``) and values (cpp_values.py); and
``block_function``, which turns three conv kernels that cpp_block.py matched into one function.
What it is not: a second code generator. The kernel function around them, the thread pool and the
translation unit are cpp.py's; which conv takes which template is decided by the layout pass and
cpp_pack.py before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import sympy

from .. import kernel as K
from ..ir import DType, Op
from ..symbolic import to_c
from .cpp_block import ROW_DST, KernelWriter, clamp_of, depthwise_nhwc, in_place, row_store, row_value, write_block
from .cpp_pool import monotone
from .cpp_values import ACC_DTYPE, STORAGE, Kctx, Values, acc_type, operand_ptr
from .writer import Writer


class _Host(Protocol):
    """What the conv emitters use of the kernel writer they are mixed into."""

    prog: K.Program
    k: K.Kernel
    w: Writer
    vals: Values
    ctx: Kctx

    def _omp(self, text: str) -> str: ...
    def _direct_out(self) -> str | None: ...
    def _epilogue(self) -> None: ...
    def _checked_epilogue(self, emit: Callable[[], None]) -> None: ...
    def _conv_call(self, at: str) -> tuple[str, bool]: ...
    def _conv_pool(self, at: str) -> None: ...
    def _tile_nhwc(self) -> None: ...


class ConvEmitter:
    """The ``Conv`` kernel bodies: ``_conv`` prints the template call for the layout the conv has (NCHW,
    the channels-last implicit GEMM, depthwise, or with a pool fused after it) and its epilogue over tiles."""

    def _conv_call(self: _Host, at: str) -> tuple[str, bool]:
        """The conv template call up to its epilogue, and whether that epilogue gets channels-last tiles:
        packed weights (cpp_pack.py) take the implicit GEMM, a depthwise conv over channels-last fp32 input
        with its weight stored [kh][kw][C] (passes/layout.py) the direct kernel, anything else the NCHW one."""
        k = self.k
        assert isinstance(k, K.Conv)
        x, wt = operand_ptr(self.ctx.bufs[k.x.buf], k.x.dtype), operand_ptr(self.ctx.bufs[k.w.buf], k.w.dtype)
        if k.packed:
            nr = to_c(k.w.strides[0])
            self.w.line(f'static_assert({nr} * 4 % AOTC_VBYTES == 0, "conv weights packed for another vector width");')
            if k.wino:  # the weight's Winograd transform (cpp_pack.py's wino_choice): conv_wino.h
                return f"aotc_conv2d_wino<{at}, {k.wino}, {nr} * 4 / AOTC_VBYTES, {k.c_in}>(aotc_s, {x}, aotc_xs, {wt}, ", True
            step = k.stride[1] * k.c_in  # input elements between horizontally adjacent output pixels (NHWC)
            return f"aotc_conv2d_packed<{at}, {nr} * 4 / AOTC_VBYTES, {step}>(aotc_s, {x}, aotc_xs, {wt}, ", True
        if depthwise_nhwc(k):
            return f"aotc_conv2d_dw<{at}>(aotc_s, {x}, aotc_xs, {wt} + {to_c(k.w.offset)}, ", True
        return f"aotc_conv2d<{at}>(aotc_s, {x}, aotc_xs, {wt}, aotc_ws, ", False

    def _conv(self: _Host) -> None:
        k = self.k
        assert isinstance(k, K.Conv)
        at = acc_type(k.x.dtype, k.w.dtype)
        self.ctx.acc_dtype = ACC_DTYPE[at]
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k.kernel, k.stride, k.padding, k.dilation
        shape = [k.batch, k.c_in, k.height, k.width, k.c_out, kh, kw, *k.out_hw, sh, sw, ph, pw, dh, dw, k.groups]
        self.w.line(f"const aotc_conv_shape aotc_s = {{{', '.join(to_c(e) for e in shape)}}};")
        for name, op in (("xs", k.x), ("ws", k.w)):
            parts = ", ".join(to_c(e) for e in (op.offset, *op.strides))
            self.w.line(f"[[maybe_unused]] const aotc_conv_strides aotc_{name} = {{{parts}}};")
        self.w.line("[[maybe_unused]] int64_t aotc_bad_epi = 0;")
        if k.pool is not None:
            self._conv_pool(at)
            return
        call, nhwc = self._conv_call(at)
        direct = self._direct_out() if nhwc else None
        if direct is not None:
            self.w.line(f"{call}{direct});")
            return
        if nhwc:  # Acc(n, oc, p) = tile[(p - p0) * ldt + (oc - oc0)]
            args = "int64_t i0, int64_t aotc_p0, int64_t aotc_pb, int64_t aotc_oc0, int64_t aotc_ocb"
        else:  # Acc(n, oc, p) = tile[(oc - oc0) * ldt + (p - p0)]
            args = "int64_t i0, int64_t aotc_oc0, int64_t aotc_ocb, int64_t aotc_p0, int64_t aotc_pb"
        head = f"{call}[&]({args}, const {at}* aotc_tile, int64_t aotc_ldt)"

        def tile() -> None:
            with self.w.block("for (int64_t i1 = aotc_oc0; i1 < aotc_oc0 + aotc_ocb; ++i1)"):
                self.w.line(f"const {at}* aotc_row = aotc_tile + (i1 - aotc_oc0) * aotc_ldt;")
                loop = "for (int64_t i2 = aotc_p0 / aotc_ow; i2 * aotc_ow < aotc_p0 + aotc_pb; ++i2)"
                with self.w.block(loop):
                    self.w.line("const int64_t aotc_lo = aotc_max(aotc_p0 - i2 * aotc_ow, 0);")
                    self.w.line("const int64_t aotc_hi = aotc_min(aotc_p0 + aotc_pb - i2 * aotc_ow, aotc_ow);")
                    self.ctx.acc = "aotc_row[i2 * aotc_ow + i3 - aotc_p0]"
                    self.w.line(self._omp("simd"))
                    with self.w.block("for (int64_t i3 = aotc_lo; i3 < aotc_hi; ++i3)"):
                        self._epilogue()

        with self.w.block(head, "});"):
            self.w.line("const int64_t aotc_ow = aotc_s.OW;")
            self._checked_epilogue(self._tile_nhwc if nhwc else tile)
        if self.k.has_gather:
            self.w.line("if (aotc_bad_epi) aotc_bad = 1;")

    def _direct_out(self: _Host) -> str | None:
        """conv.h's ``aotc_conv_out`` epilogue, when this packed fp32 conv stores its output dense channels-last
        as a clamp of the accumulator (a folded batch-norm, ReLU or ReLU6: cpp_block.py's ``clamp_of``) and its
        channels are whole weight panels: the row kernel (or Winograd's output transform, conv_wino.h) then
        writes the output from its registers, with no tile and no epilogue pass; Winograd's also adds a skip
        connection (``skip_connection``) before the clamp. None for any other conv, and for a 1x1 conv at
        stride 1 (conv.h runs it as a matmul over tiles, which the lambda's vectorised epilogue serves
        better)."""
        k = self.k
        assert isinstance(k, K.Conv)
        if not k.packed or (k.kernel == (1, 1) and k.stride == (1, 1)) or k.c_out % int(k.w.strides[0]):
            return None
        # the row kernels' stores take no skip connection
        init = conv_out_init(k, self.ctx, {b.name for b in self.prog.weights}, "aotc_s", residual=bool(k.wino))
        return f"aotc_conv_out<float>{init}" if init is not None else None

    def _conv_pool(self: _Host, at: str) -> None:
        """A conv with a max/min pool fused after it (cpp_pool.py, conv_pool.h): ``pre`` as a lambda of the
        channel i1 and the conv's value, then the stores over pooled rows with the pooled value as aotc_red0."""
        k = self.k
        assert isinstance(k, K.Conv) and k.pool is not None
        pl = k.pool
        call, _ = self._conv_call(at)
        call = call.replace("aotc_conv2d_packed<", "aotc_conv2d_packed_pool<", 1)
        flags = f"{'true' if pl.op is Op.RMAX else 'false'}, {'true' if monotone(pl.pre) else 'false'}"
        call = call.replace(">(aotc_s,", f", {flags}>(aotc_s,", 1)
        parts = [*pl.kernel, *pl.stride, *pl.padding, *pl.out_hw]
        self.w.line(f"const aotc_conv_pool aotc_pl = {{{', '.join(to_c(e) for e in parts)}}};")
        with self.w.block(f"{call}aotc_pl, [&](int64_t i1, {at} aotc_v) -> {at}", "},"):
            self.w.line("(void)i1;")
            self.ctx.acc = "aotc_v"
            with self.vals.scope([pl.pre]):
                self.w.line(f"return {self.vals.expr(pl.pre)};")
        head = (f"[&](int64_t i0, int64_t i1, int64_t aotc_pw0, int64_t aotc_pwb, const {at}* aotc_tile, "
                "int64_t aotc_ldt)")  # fmt: skip
        pixels = "for (int64_t i2 = aotc_pw0; i2 < aotc_pw0 + aotc_pwb; ++i2)"
        with self.w.block(head, "});"), self.w.block(pixels):
            self.w.line(f"const {at}* aotc_row = aotc_tile + (i2 - aotc_pw0) * aotc_ldt;")
            self.w.line(self._omp("simd"))
            with self.w.block(f"for (int64_t i3 = 0; i3 < {k.c_out}; ++i3)"):
                self.w.line(f"const {at} aotc_red0 = aotc_row[i3];")
                self._epilogue()

    def _tile_nhwc(self: _Host) -> None:
        """A conv epilogue over a channels-last tile: Acc(n, oc, p) = tile[(p - p0) * ldt + (oc - oc0)]."""
        k = self.k
        assert isinstance(k, K.Conv)
        at = acc_type(k.x.dtype, k.w.dtype)
        loop = "for (int64_t i2 = aotc_p0 / aotc_ow; i2 * aotc_ow < aotc_p0 + aotc_pb; ++i2)"  # by rows: no division per pixel
        with self.w.block(loop):
            self.w.line("const int64_t aotc_lo = aotc_max(aotc_p0 - i2 * aotc_ow, 0);")
            self.w.line("const int64_t aotc_hi = aotc_min(aotc_p0 + aotc_pb - i2 * aotc_ow, aotc_ow);")
            with self.w.block("for (int64_t i3 = aotc_lo; i3 < aotc_hi; ++i3)"):
                self.w.line(f"const {at}* aotc_row = aotc_tile + (i2 * aotc_ow + i3 - aotc_p0) * aotc_ldt;")
                self.ctx.acc = "aotc_row[i1 - aotc_oc0]"
                self.w.line(self._omp("simd"))
                with self.w.block("for (int64_t i1 = aotc_oc0; i1 < aotc_oc0 + aotc_ocb; ++i1)"):
                    self._epilogue()

    def nhwc_epilogue(self: _Host, w: Writer, head: str, close: str, ow: str) -> None:
        """This conv's channels-last epilogue as a lambda printed into ``w`` (``head`` opens it, ``close`` ends
        it, ``ow``: the output width in C): a stage of cpp_block.py's fused block."""
        k = self.k
        assert isinstance(k, K.Conv)
        self.ctx.acc_dtype = ACC_DTYPE[acc_type(k.x.dtype, k.w.dtype)]
        saved = self.w
        self.w = self.vals.w = w
        try:
            with w.block(head, close):
                w.line(f"const int64_t aotc_ow = {ow};")
                self._checked_epilogue(self._tile_nhwc)
        finally:
            self.w = self.vals.w = saved


def skip_connection(k: K.Conv, weights: set[str]) -> tuple[K.Store, str] | None:
    """A conv's one store whose value is a clamp (cpp_block.py's ``clamp_of`` forms) of ``x + r`` or ``r + x``,
    ``r`` an fp32 activation read at the store's own index (a ResNet block's skip connection): the store
    with ``r`` taken out, and r's buffer. The residual is added after ``x`` (the accumulator plus the bias)
    as eager adds it, so taking it out and adding it back in the template rounds alike."""
    if len(k.stores) != 1 or k.has_gather:
        return None
    st = k.stores[0]
    wrappers: list[K.Binary | K.Unary] = []
    v = st.value
    while True:
        if isinstance(v, K.Binary) and v.op in (Op.MIN, Op.MAX) and isinstance(v.b, K.Const):
            wrappers.append(v)
            v = v.a
        elif isinstance(v, K.Unary) and v.op is Op.RELU:
            wrappers.append(v)
            v = v.x
        else:
            break
    if not (isinstance(v, K.Binary) and v.op is Op.ADD):
        return None
    for r, x in ((v.a, v.b), (v.b, v.a)):
        if (
            isinstance(r, K.Load) and r.buf not in weights and r.dtype is DType.f32 and isinstance(r.index, K.Index)
            and sympy.expand(sympy.sympify(r.index.expr) - sympy.sympify(st.index)) == 0
        ):  # fmt: skip
            inner: K.Value = x
            for w in reversed(wrappers):
                inner = replace(w, a=inner) if isinstance(w, K.Binary) else replace(w, x=inner)
            return replace(st, value=inner), r.buf
    return None


def block_function(
    prog: K.Program,
    convs: tuple[K.Conv, K.Conv, K.Conv],
    fname: str,
    ptrs: dict[str, str],
    touched: dict[str, tuple[list[str], set[str]]],
    stage: Callable[[K.Conv], KernelWriter],
) -> tuple[str, list[str]]:
    """An inverted-residual block's fused function (cpp_block.py) and the buffers it takes: the three
    kernels' buffers but the two row tensors that now stay in the template's row buffers. ``touched``: each
    kernel's buffers and the set it writes (cpp.py's kernel_buffers); ``stage``: cpp.py's writer of a kernel."""
    e, d, p = convs
    rows = {e.stores[0].buf, d.stores[0].buf}
    stages = []
    for k in convs:
        kw = stage(k if k is p else replace(k, stores=(in_place(row_value(k.stores[0])),)))
        if k.stores[0].buf in rows:
            kw.ctx.bufs[k.stores[0].buf] = ROW_DST
            kw.ctx.dtypes[k.stores[0].buf] = DType.f32  # the template's rows (float), whatever the tensor was
        stages.append(kw)
    bufs = [b for b in dict.fromkeys(b for k in convs for b in touched[k.name][0]) if b not in rows]
    written = touched[p.name][1]
    params = [f"[[maybe_unused]] const int64_t {s.name}" for s in prog.symbols]
    for b in bufs:
        t = STORAGE[prog.buffer(b).dtype]
        params.append(f"{'' if b in written else 'const '}{t}* {ptrs[b]}")
    weights = {b.name for b in prog.weights}
    clamps = (clamp_of(row_value(e.stores[0]), weights), clamp_of(row_value(d.stores[0]), weights))
    return write_block(fname, params, (stages[0], stages[1], stages[2]), clamps, _block_out(p, stages[2], weights)), bufs


def _block_out(p: K.Conv, st: KernelWriter, weights: set[str]) -> str | None:
    """The block's projection epilogue as an ``aotc_conv_out`` initializer (its bias, a skip connection, a
    clamp; fp32, dense channels-last), for conv_dw.h to write from the registers; None for any other."""
    return conv_out_init(p, st.ctx, weights, "aotc_sp", residual=True)


def conv_out_init(k: K.Conv, ctx: Kctx, weights: set[str], shape: str, residual: bool) -> str | None:
    """The braced initializer of conv.h's ``aotc_conv_out`` for ``k`` (``shape``: the C name of its
    aotc_conv_shape), when k's fp32 output is stored dense channels-last as a clamp of the accumulator (a folded
    batch-norm, ReLU or ReLU6: ``clamp_of``), after a skip connection where ``residual`` allows one
    (``skip_connection``, added after the bias as eager does); None otherwise."""
    if k.x.dtype is not DType.f32 or k.w.dtype is not DType.f32:
        return None
    res = skip_connection(k, weights) if residual else None
    if res is not None:
        if ctx.dtypes[res[1]] is not DType.f32:
            return None
        k = replace(k, stores=(res[0],))
    st = row_store(k, weights)
    clamp = clamp_of(st, weights) if st is not None else None
    if st is None or clamp is None or ctx.dtypes[st.buf] is not DType.f32:
        return None
    tail = f", {ctx.bufs[res[1]]}" if res is not None else ""
    return f"{{{ctx.bufs[st.buf]}, {clamp.c_init(ctx.bufs)}, {shape}.OH * {shape}.OW, {shape}.O{tail}}}"
