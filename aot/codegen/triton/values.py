"""Triton spelling of kernel values: types, the op table, and ``Gen``, which prints one kernel's value trees,
loads and stores as CSE'd temporaries and assembles the ``@triton.jit`` module.

What it is: the floor every Triton kernel writer stands on (loops.py and templates/ print through ``Gen``).
What it is not: a loop writer. Tiles, grids and loop structure are chosen by loops.py and the templates.

Note: every generated expression carries the set of tile axes it varies over ("x", "r"). Loads and stores
broadcast their offsets to the union of the offset's and the mask's axes, so a mask never has a larger shape
than the pointer it guards (Triton only broadcasts masks and values *to* the pointer's shape).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import sympy
from aotc.errors import CompileError
from aotc.shapes import Size, render

from ... import kernel as K
from ...ir import DType, Family, Op
from ...symbolic import to_size
from ..writer import Writer

Axes = frozenset[str]
NO_AXES: Axes = frozenset()
X: Axes = frozenset({"x"})
R: Axes = frozenset({"r"})
XR: Axes = frozenset({"x", "r"})

TL = {
    DType.f32: "tl.float32", DType.f64: "tl.float64", DType.f16: "tl.float16", DType.bf16: "tl.bfloat16",
    DType.i64: "tl.int64", DType.i32: "tl.int32", DType.i16: "tl.int16", DType.i8: "tl.int8",
    DType.u8: "tl.uint8", DType.bool: "tl.int1",
}  # fmt: skip
SIG = {
    DType.f32: "fp32", DType.f64: "fp64", DType.f16: "fp16", DType.bf16: "bf16", DType.i64: "i64",
    DType.i32: "i32", DType.i16: "i16", DType.i8: "i8", DType.u8: "u8", DType.bool: "i1",
}  # fmt: skip

HEADER = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"


# ---- op tables: one op → one short function --------------------------------------------------------
# tl.log/sin/cos/erf lower to libdevice's accurate forms; tanh and pow have no tl op, so they call libdevice.

UNARY: dict[Op, Callable[[str], str]] = {
    Op.NEG: lambda x: f"(-{x})",
    Op.ABS: lambda x: f"tl.abs({x})",
    Op.EXP: lambda x: f"tl.exp({x})",
    Op.LOG: lambda x: f"tl.log({x})",
    Op.SQRT: lambda x: f"tl.sqrt_rn({x})",
    Op.RSQRT: lambda x: f"tl.rsqrt({x})",
    Op.TANH: lambda x: f"libdevice.tanh({x})",
    Op.SIGMOID: lambda x: f"tl.sigmoid({x})",
    Op.ERF: lambda x: f"tl.math.erf({x})",
    Op.SIN: lambda x: f"tl.sin({x})",
    Op.COS: lambda x: f"tl.cos({x})",
    Op.RELU: lambda x: f"tl.where({x} < 0, 0, {x})",  # keeps NaN, like torch.relu
    Op.RECIP: lambda x: f"(1.0 / {x})",
    Op.FLOOR: lambda x: f"tl.floor({x})",
    Op.NOT: lambda x: f"({x} == 0)",
}

BINARY: dict[Op, Callable[[str, str], str]] = {
    Op.ADD: lambda a, b: f"({a} + {b})",
    Op.SUB: lambda a, b: f"({a} - {b})",
    Op.MUL: lambda a, b: f"({a} * {b})",
    Op.DIV: lambda a, b: f"tl.div_rn({a}, {b})",
    Op.MOD: lambda a, b: f"({a} - {b} * tl.floor({a} / {b}))",
    Op.MAX: lambda a, b: f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    Op.MIN: lambda a, b: f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    Op.POW: lambda a, b: f"libdevice.pow({a}, {b})",
    Op.EQ: lambda a, b: f"({a} == {b})",
    Op.NE: lambda a, b: f"({a} != {b})",
    Op.LT: lambda a, b: f"({a} < {b})",
    Op.LE: lambda a, b: f"({a} <= {b})",
    Op.GT: lambda a, b: f"({a} > {b})",
    Op.GE: lambda a, b: f"({a} >= {b})",
    Op.AND: lambda a, b: f"({a} & {b})",
    Op.OR: lambda a, b: f"({a} | {b})",
}

# Integer forms where the float form above does not apply (IR: DIV floors, MOD is Python's).
INT_BINARY: dict[Op, Callable[[str, str], str]] = {
    Op.DIV: lambda a, b: f"tl.where((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0)), {a} // {b} - 1, {a} // {b})",
    Op.MOD: lambda a, b: f"tl.where((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0)), {a} % {b} + {b}, {a} % {b})",
    Op.MAX: lambda a, b: f"tl.maximum({a}, {b})",
    Op.MIN: lambda a, b: f"tl.minimum({a}, {b})",
}
# Ops computed in fp32 when their operands are fp16/bf16, rounded once to the result type (as numpy does).
UPCAST = Family.FLOAT_ONLY | {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MOD, Op.FLOOR}


def literal(value: float | int | bool, dtype: DType) -> str:
    """A Python literal Triton accepts inside a jit function."""
    if dtype is DType.bool:
        return "1" if value else "0"
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ---- results -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One runtime argument of a generated kernel, in signature order."""

    name: str  # the argument's name in the source
    sig: str  # Triton signature type: "*fp32", "i64", "i32", ...
    source: tuple[str, str | Size]  # ("buffer", name) or ("expr", size)


@dataclass(frozen=True)
class TritonKernel:
    name: str
    source: str  # the whole module text
    params: tuple[Param, ...]
    constexprs: tuple[tuple[str, int], ...]
    grid: tuple[Size, Size, Size]
    num_warps: int
    num_stages: int = 3

    def signature(self) -> dict[str, str]:
        sig = {p.name: p.sig for p in self.params}
        sig.update({c: "constexpr" for c, _ in self.constexprs})
        return sig


# ---- the per-kernel generator ------------------------------------------------------------------------


@dataclass
class Gen:
    """State for printing one kernel: pointer and symbol arguments met so far, loop variables, CSE scopes."""

    prog: K.Program
    index_i64: bool
    block_names: tuple[str, ...] = ("XBLOCK",)  # one per tile axis: ("XBLOCK",) or ("XBLOCK", "RBLOCK")
    w: Writer = field(default_factory=Writer)
    ptrs: dict[str, str] = field(default_factory=dict)  # buffer name → argument name
    syms: set[str] = field(default_factory=set)
    loopvars: dict[str, tuple[str, Axes]] = field(default_factory=dict)
    axes: dict[str, Axes] = field(default_factory=dict)  # variable → axes
    scopes: list[dict[tuple[K.Value, str | None], str]] = field(default_factory=lambda: [{}])
    refs: dict[int, str] = field(default_factory=dict)  # ReduceRef step → variable
    narrow: dict[str, dict[Axes, str]] = field(default_factory=dict)  # a mask → its factor over fewer axes
    acc: tuple[str, Axes] | None = None  # a Matmul/Conv accumulator tile
    prefix: tuple[str, Axes] | None = None  # a Scan's running sum over the current tile
    ntmp: int = 0

    # -- names and shapes

    @property
    def idx_tl(self) -> str:
        return "tl.int64" if self.index_i64 else "tl.int32"

    def ptr(self, buf: str) -> str:
        if buf not in self.ptrs:
            self.prog.buffer(buf)  # KeyError for unknown buffers, before any text is written
            self.ptrs[buf] = f"p{len(self.ptrs)}"
        return self.ptrs[buf]

    def tmp(self, code: str, axes: Axes) -> str:
        name = f"t{self.ntmp}"
        self.ntmp += 1
        self.w.line(f"{name} = {code}")
        self.axes[name] = axes
        return name

    def shape(self, axes: Axes) -> str:
        if len(self.block_names) == 1:
            return f"[{self.block_names[0]}]" if axes else "[]"
        x, r = self.block_names
        return f"[{x if 'x' in axes else 1}, {r if 'r' in axes else 1}]"

    def bcast(self, code: str, have: Axes, want: Axes, int_index: bool = False) -> str:
        if have == want:
            return code
        if int_index or not have:
            return f"({code} + tl.zeros({self.shape(want)}, {self.idx_tl if int_index else 'tl.int32'}))"
        return f"tl.broadcast_to({code}, {self.shape(want)})"

    @contextmanager
    def scope(self) -> Iterator[None]:
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()

    # -- index expressions (sympy → grammar → Triton)

    def index(self, expr: sympy.Expr | int) -> tuple[str, Axes]:
        code, axes, _, _ = self._index(expr)
        return code, axes

    def _index(self, expr: sympy.Expr | int) -> tuple[str, Axes, bool, bool]:
        """(code, axes, a constant?, mentions a shape symbol?)"""
        size = to_size(expr)
        if isinstance(size, int):
            return str(size), NO_AXES, True, False
        axes: set[str] = set()
        shaped = False

        def name(n: str) -> str:
            nonlocal shaped
            if n in self.loopvars:
                code, ax = self.loopvars[n]
                axes.update(ax)
                return code
            self.syms.add(n)
            shaped = True
            return f"ks_{n}"

        code = render(
            size, name=name, div="//", ceildiv=lambda a, b: f"(({a} + {b} - 1) // {b})",
            minmax=lambda fn, a, b: f"tl.{'maximum' if fn == 'Max' else 'minimum'}({a}, {b})",
        )  # fmt: skip
        return code, frozenset(axes), False, shaped

    def decompose(self, flat: str, ranges: tuple[sympy.Expr, ...], prefix: str, axes: Axes) -> None:
        """Bind ``{prefix}0..`` to the row-major digits of ``flat`` over ``ranges``."""
        rest = flat
        for k in reversed(range(len(ranges))):
            name = f"{prefix}{k}"
            size, _ = self.index(ranges[k])
            if k == 0:
                code = rest
            elif size == "1":
                code = f"tl.zeros_like({flat})"
            else:
                code = f"{rest} % {size}"
            self.w.line(f"{name} = {code}")
            self.axes[name] = axes
            self.loopvars[name] = (name, axes)
            if k > 0 and size != "1":
                nxt = f"{prefix}q{k}"
                self.w.line(f"{nxt} = {rest} // {size}")
                rest = nxt

    # -- value trees

    def value(self, v: K.Value, mask: str | None) -> tuple[str, Axes]:
        key = (v, mask if _has_load(v) else None)
        for sc in reversed(self.scopes):
            if key in sc:
                name = sc[key]
                return name, self.axes[name]
        code, axes = self._value(v, mask)
        if isinstance(v, K.Acc | K.ReduceRef | K.Prefix) or code in self.loopvars:
            return code, axes
        name = self.tmp(code, axes)
        self.scopes[-1][key] = name
        return name, axes

    def _value(self, v: K.Value, mask: str | None) -> tuple[str, Axes]:
        if isinstance(v, K.Const):
            return f"tl.full([], {literal(v.value, v.dtype)}, {TL[v.dtype]})", NO_AXES
        if isinstance(v, K.Index):
            code, axes, const, shaped = self._index(v.expr)
            if const:
                return f"tl.full([], {code}, {TL[v.dtype]})", NO_AXES
            want = "tl.int64" if v.dtype is DType.i64 else TL[v.dtype]
            if want != self.idx_tl or not axes:  # a kernel argument converts; a scalar loop variable is made a tensor
                code = f"({code}).to({want})" if axes or shaped else f"tl.full([], {code}, {want})"
            return code, axes
        if isinstance(v, K.Load):
            return self._load(v, mask)
        if isinstance(v, K.Unary):
            x, ax = self.value(v.x, mask)
            return self._unary(v, x), ax
        if isinstance(v, K.Binary):
            a, aa = self.value(v.a, mask)
            b, ba = self.value(v.b, mask)
            return self._binary(v, a, b), aa | ba
        if isinstance(v, K.Where):
            c, ca = self.value(v.cond, mask)
            a, aa = self.value(v.a, mask)
            b, ba = self.value(v.b, mask)
            return f"tl.where({c}, {a}, {b})", ca | aa | ba
        if isinstance(v, K.Masked):
            m, ma = self.value(v.mask, mask)
            inner = self.tmp(f"{mask} & {m}" if mask else m, (self.axes.get(mask, NO_AXES) if mask else NO_AXES) | ma)
            body, ba = self.value(v.body, inner)
            return f"tl.where({m}, {body}, {literal(v.other, v.dtype)})", ma | ba
        if isinstance(v, K.Acc):
            if self.acc is None:
                raise CompileError("Acc used outside a Matmul/Conv epilogue")
            return self.acc
        if isinstance(v, K.Prefix):
            if self.prefix is None:
                raise CompileError("Prefix used outside a Scan")
            return self.prefix
        if isinstance(v, K.ReduceRef):
            if v.step not in self.refs:
                raise CompileError(f"ReduceRef to step {v.step} before that step is reduced")
            return self.refs[v.step], self.axes[self.refs[v.step]]
        raise CompileError(f"unknown value node {type(v).__name__}")

    def _load(self, v: K.Load, mask: str | None) -> tuple[str, Axes]:
        p = self.ptr(v.buf)
        buf = self.prog.buffer(v.buf)
        if isinstance(v.index, K.Index):  # plain index math stays in the kernel's index type
            idx, ia = self.index(v.index.expr)
            m = self.narrow.get(mask or "", {}).get(ia, mask)
        else:
            idx, ia = self.value(v.index, mask)
            m = mask
        if not isinstance(v.index, K.Index):  # data-dependent: keep the address inside the buffer
            n, _ = self.index(buf.numel())
            guard = f"({idx} >= 0) & ({idx} < {n})"
            m = self.tmp(f"{mask} & {guard}" if mask else guard, ia | (self.axes[mask] if mask else NO_AXES))
        ma = self.axes.get(m, NO_AXES) if m else NO_AXES
        want = ia | ma
        idx = self.bcast(idx, ia, want, int_index=True)
        code = f"tl.load({p} + {idx}, mask={m}, other=0)" if m else f"tl.load({p} + {idx})"
        if buf.dtype is not v.dtype:
            code = self.cast(code, buf.dtype, v.dtype)
        return code, want

    def cast(self, x: str, src: DType, dst: DType) -> str:
        if src is dst:
            return x
        if dst is DType.bool:
            return f"({x} != 0)"
        return f"{x}.to({TL[dst]})"

    def _unary(self, v: K.Unary, x: str) -> str:
        src = v.x.dtype
        if v.op is Op.CAST:
            return self.cast(x, src, v.dtype)
        if v.op in (Op.ABS, Op.FLOOR, Op.RELU) and (src is DType.bool or src is DType.u8):
            return x
        if v.op is Op.FLOOR and not src.is_float:
            return x
        if v.op in UPCAST and src in (DType.f16, DType.bf16):
            return f"{UNARY[v.op](f'{x}.to(tl.float32)')}.to({TL[v.dtype]})"
        return UNARY[v.op](x)

    def _binary(self, v: K.Binary, a: str, b: str) -> str:
        src = v.a.dtype
        if not src.is_float and v.op in INT_BINARY:
            return INT_BINARY[v.op](a, b)
        if not src.is_float and v.op is Op.POW:
            raise CompileError("POW on integer operands is not supported by the Triton backend")
        if v.op in UPCAST and src in (DType.f16, DType.bf16):
            return f"{BINARY[v.op](f'{a}.to(tl.float32)', f'{b}.to(tl.float32)')}.to({TL[v.dtype]})"
        if v.op is Op.DIV and src is DType.f64:
            return f"({a} / {b})"
        return BINARY[v.op](a, b)

    def store(self, st: K.Store, mask: str) -> None:
        p = self.ptr(st.buf)
        buf = self.prog.buffer(st.buf)
        val, va = self.value(st.value, mask)
        idx, ia = self.index(st.index)
        want = va | ia | self.axes[mask]
        idx = self.bcast(idx, ia, want, int_index=True)
        val = self.cast(val, st.value.dtype, buf.dtype)
        self.w.line(f"tl.store({p} + {idx}, {val}, mask={mask})")

    def pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.index_i64 else "tl.program_id(0)"

    # -- assembling the module

    def finish(self, name: str, body: Writer, constexprs: dict[str, int], grid: tuple[Size, Size, Size], *,
               num_warps: int, num_stages: int = 3) -> TritonKernel:  # fmt: skip
        params: list[Param] = []
        for buf, arg in self.ptrs.items():
            params.append(Param(arg, "*" + SIG[self.prog.buffer(buf).dtype], ("buffer", buf)))
        sym_sig = "i64" if self.index_i64 else "i32"
        for s in sorted(self.syms):
            params.append(Param(f"ks_{s}", sym_sig, ("expr", s)))
        out = Writer()
        for line in HEADER.splitlines():
            out.line(line)
        out.line()
        out.line()
        out.line("@triton.jit")
        args = [p.name for p in params] + [f"{c}: tl.constexpr" for c in constexprs]
        out.line(f"def {name}({', '.join(args)}):")
        with out.indent():
            for line in body.lines:
                out.line(line)
        return TritonKernel(
            name=name,
            source=out.text(),
            params=tuple(params),
            constexprs=tuple(constexprs.items()),
            grid=grid,
            num_warps=num_warps,
            num_stages=num_stages,
        )


def _has_load(v: K.Value) -> bool:
    return any(isinstance(n, K.Load) for n in K.walk(v))
