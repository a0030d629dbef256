"""Loop-level kernels (``kernel.py``) → Triton source, one ``@triton.jit`` function per kernel.

What it is: a printer. Each kernel becomes a module text whose function takes buffer pointers and the shape
symbols it needs as arguments, so one cubin serves every symbol value; the launch grid is a size expression
in the package grammar. Pointwise kernels use flat 1-D blocks over the output space; Reduce and Scan use
[XBLOCK, RBLOCK] tiles (single pass in registers when the reduce length is bounded, else a loop per step);
Matmul and Conv are ``tl.dot`` templates (``triton_templates.py``) whose epilogue is the kernel's stores.
What it is not: a compiler driver. ``cubin.py`` turns the text into cubins and the manifest's CUDA target.

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

from .. import kernel as K
from ..ir import DType, Family, Op
from ..options import BuildOptions
from ..symbolic import to_size

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

SINGLE_PASS_MAX = 4096  # longest reduce/scan kept whole in registers
LOOP_RBLOCK = 1024
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
REDUCE_FN = {Op.SUM: "tl.sum", Op.RMAX: "tl.max", Op.RMIN: "tl.min"}


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


def identity(op: Op, dtype: DType) -> str:
    if op is Op.SUM:
        return literal(0, dtype)
    big = {DType.i64: 2**63 - 1, DType.i32: 2**31 - 1, DType.i16: 2**15 - 1, DType.i8: 127, DType.u8: 255}
    if dtype.is_float:
        return literal(-math.inf if op is Op.RMAX else math.inf, dtype)
    if dtype is DType.bool:
        return "0" if op is Op.RMAX else "1"
    lo = 0 if dtype is DType.u8 else -big[dtype] - 1
    return str(lo if op is Op.RMAX else big[dtype])


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


class Writer:
    """Lines with an indent level: the structure of generated code comes from here, not from f-strings."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def line(self, text: str = "") -> None:
        self.lines.append("    " * self.level + text if text else "")

    @contextmanager
    def indent(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


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
    acc: tuple[str, Axes] | None = None
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
        size = to_size(expr)
        if isinstance(size, int):
            return str(size), NO_AXES
        axes: set[str] = set()

        def name(n: str) -> str:
            if n in self.loopvars:
                code, ax = self.loopvars[n]
                axes.update(ax)
                return code
            self.syms.add(n)
            return f"ks_{n}"

        code = render(
            size, name=name, div="//", ceildiv=lambda a, b: f"(({a} + {b} - 1) // {b})",
            minmax=lambda fn, a, b: f"tl.{'maximum' if fn == 'Max' else 'minimum'}({a}, {b})",
        )  # fmt: skip
        return code, frozenset(axes)

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
        if isinstance(v, K.Acc | K.ReduceRef) or code in self.loopvars:
            return code, axes
        name = self.tmp(code, axes)
        self.scopes[-1][key] = name
        return name, axes

    def _value(self, v: K.Value, mask: str | None) -> tuple[str, Axes]:
        if isinstance(v, K.Const):
            return f"tl.full([], {literal(v.value, v.dtype)}, {TL[v.dtype]})", NO_AXES
        if isinstance(v, K.Index):
            code, axes = self.index(v.expr)
            if not axes and code.lstrip("-").isdigit():
                return f"tl.full([], {code}, {TL[v.dtype]})", NO_AXES
            want = "tl.int64" if v.dtype is DType.i64 else TL[v.dtype]
            if want != self.idx_tl or not axes:
                code = f"({code}).to({want})" if axes or "ks_" in code else f"tl.full([], {code}, {want})"
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
            code = self._cast(code, buf.dtype, v.dtype)
        return code, want

    def _cast(self, x: str, src: DType, dst: DType) -> str:
        if src is dst:
            return x
        if dst is DType.bool:
            return f"({x} != 0)"
        return f"{x}.to({TL[dst]})"

    def _unary(self, v: K.Unary, x: str) -> str:
        src = _dtype_of(v.x)
        if v.op is Op.CAST:
            return self._cast(x, src, v.dtype)
        if v.op in (Op.ABS, Op.FLOOR, Op.RELU) and (src is DType.bool or src is DType.u8):
            return x
        if v.op is Op.FLOOR and not src.is_float:
            return x
        if v.op in UPCAST and src in (DType.f16, DType.bf16):
            return f"{UNARY[v.op](f'{x}.to(tl.float32)')}.to({TL[v.dtype]})"
        return UNARY[v.op](x)

    def _binary(self, v: K.Binary, a: str, b: str) -> str:
        src = _dtype_of(v.a)
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
        val = self._cast(val, _dtype_of(st.value), buf.dtype)
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


def _dtype_of(v: K.Value) -> DType:
    return v.dtype


# ---- size hints for tile choice (no GPU here to autotune) -------------------------------------------


def _subs(prog: K.Program, e: sympy.Expr | int, pick: Callable[[int, int | None], int]) -> int | None:
    e = sympy.sympify(e)
    env = {}
    for s in e.free_symbols:
        sym = next((x for x in prog.symbols if x.name == str(s)), None)
        if sym is None:
            return None
        env[s] = pick(sym.min, sym.max)
    try:
        return int(e.subs(env))
    except (TypeError, ValueError):
        return None


def upper(prog: K.Program, e: sympy.Expr | int) -> int | None:
    """An upper bound of a size over the symbols' ranges, or None when a symbol is unbounded."""
    if any(x.max is None for x in prog.symbols if x.name in {str(s) for s in sympy.sympify(e).free_symbols}):
        return None
    return _subs(prog, e, lambda lo, hi: hi if hi is not None else lo)


def hint(prog: K.Program, e: sympy.Expr | int) -> int:
    """A representative value of a size, for choosing tiles."""
    v = _subs(prog, e, lambda lo, hi: max(lo, min(hi if hi is not None else 1024, 1024)))
    return max(1, v if v is not None else 1024)


def index_is_i64(prog: K.Program) -> bool:
    """Index math in i64 unless every buffer provably has fewer than 2**31 elements."""
    for b in (*prog.inputs, *prog.outputs, *prog.weights, *prog.arena):
        n = upper(prog, b.numel())
        if n is None or n >= 2**31 - 1:
            return True
    return False


def _prod(xs: tuple[sympy.Expr | int, ...]) -> sympy.Expr | int:
    out: sympy.Expr | int = 1
    for x in xs:
        out = out * x
    return out


def _cdiv(a: sympy.Expr | int, b: int) -> Size:
    s = to_size(a)
    if isinstance(s, int):
        return -(-s // b)
    return f"CeilDiv({s}, {b})"


# ---- kernels -----------------------------------------------------------------------------------------


def pointwise(prog: K.Program, k: K.Pointwise, index_i64: bool) -> TritonKernel:
    g = Gen(prog, index_i64)
    numel = _prod(k.ranges)
    n_hint = upper(prog, numel) or hint(prog, numel)
    block = min(1024, max(128, next_pow2(n_hint)))
    warps = max(1, min(4, block // 256))
    n, _ = g.index(numel)
    g.w.line(f"xindex = {g.pid()} * XBLOCK + tl.arange(0, XBLOCK)")
    g.w.line(f"xmask = xindex < {n}")
    g.axes["xindex"] = g.axes["xmask"] = X
    g.decompose("xindex", k.ranges, "i", X)
    for st in k.stores:
        g.store(st, "xmask")
    return g.finish(k.name, g.w, {"XBLOCK": block}, (_cdiv(numel, block), 1, 1), num_warps=warps)


def _tiles(prog: K.Program, outer: sympy.Expr | int, rlen: sympy.Expr | int) -> tuple[bool, int, int, int]:
    """(single pass?, XBLOCK, RBLOCK, num_warps) for a reduce/scan over ``rlen`` per outer position."""
    r_max = upper(prog, rlen)
    if r_max is not None and r_max <= SINGLE_PASS_MAX:
        rb = next_pow2(max(1, r_max))
        single = True
    else:
        rb = LOOP_RBLOCK
        single = False
    # rows per program: enough programs to fill the GPU first (~128), then up to 4096 elements per program
    rows = hint(prog, outer) // 128
    xb = max(1, min(1 << max(0, rows.bit_length() - 1), 64, SINGLE_PASS_MAX // rb))
    n = xb * rb
    warps = 8 if n >= 4096 else 4 if n >= 256 else 2 if n >= 64 else 1
    return single, xb, rb, warps


def _outer(g: Gen, ranges: tuple[sympy.Expr, ...]) -> sympy.Expr | int:
    outer = _prod(ranges)
    n, _ = g.index(outer)
    g.w.line(f"xindex = {g.pid()} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    g.w.line(f"xmask = xindex < {n}")
    g.axes["xindex"] = g.axes["xmask"] = X
    g.decompose("xindex", ranges, "i", X)
    return outer


def _rindex(g: Gen, ranges: tuple[sympy.Expr, ...], start: str | None) -> None:
    rn, _ = g.index(_prod(ranges))
    base = "tl.arange(0, RBLOCK)[None, :]"
    g.w.line(f"rindex = {start} + {base}" if start else f"rindex = {base}")
    g.w.line(f"rmask = rindex < {rn}")
    g.w.line("xrmask = xmask & rmask")
    g.axes["rindex"] = g.axes["rmask"] = R
    g.axes["xrmask"] = XR
    g.narrow["xrmask"] = {X: "xmask", R: "rmask"}
    g.decompose("rindex", ranges, "r", R)


def _mentions_r(expr: sympy.Expr | int) -> bool:
    return any(str(s).startswith("r") and str(s)[1:].isdigit() for s in sympy.sympify(expr).free_symbols)


def reduce(prog: K.Program, k: K.Reduce, index_i64: bool) -> TritonKernel:
    g = Gen(prog, index_i64, ("XBLOCK", "RBLOCK"))
    rlen = _prod(k.reduce_ranges)
    outer = _prod(k.ranges)
    single, xb, rb, warps = _tiles(prog, outer, rlen)
    _outer(g, k.ranges)
    rn, _ = g.index(rlen)

    def step_value(s: K.Reduction) -> str:
        v, va = g.value(s.value, "xrmask")
        v = g._cast(v, _dtype_of(s.value), _red_dtype(s.dtype))
        return g.bcast(v, va, XR)

    r_stores = [st for st in k.stores if _mentions_r(st.index)]
    x_stores = [st for st in k.stores if not _mentions_r(st.index)]
    if single:
        _rindex(g, k.reduce_ranges, None)
        for i, s in enumerate(k.steps):
            v = step_value(s)
            masked = g.tmp(f"tl.where(xrmask, {v}, {identity(s.op, s.dtype)})", XR)
            g.refs[i] = g.tmp(_finish_reduce(s, masked), X)
        for st in k.stores:
            g.store(st, "xrmask" if _mentions_r(st.index) else "xmask")
        return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (_cdiv(outer, xb), 1, 1), num_warps=warps)
    for i, s in enumerate(k.steps):
        acc = f"acc{i}"
        rdt = _red_dtype(s.dtype)
        g.w.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity(s.op, s.dtype)}, {TL[rdt]})")
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, k.reduce_ranges, "roffset")
            v = step_value(s)
            v = g.tmp(f"tl.where(xrmask, {v}, {identity(s.op, s.dtype)})", XR)
            combine = {
                Op.SUM: f"{acc} + {v}",
                Op.RMAX: f"tl.maximum({acc}, {v})",
                Op.RMIN: f"tl.minimum({acc}, {v})",
            }
            g.w.line(f"{acc} = {combine[s.op]}")
        g.axes[acc] = XR
        g.refs[i] = g.tmp(_finish_reduce(s, acc), X)
    for st in x_stores:
        g.store(st, "xmask")
    if r_stores:
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, k.reduce_ranges, "roffset")
            for st in r_stores:
                g.store(st, "xrmask")
    return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (_cdiv(outer, xb), 1, 1), num_warps=warps)


def _red_dtype(d: DType) -> DType:
    return DType.i32 if d is DType.bool else d  # tl.max/min/sum on i1 are not defined


def _finish_reduce(s: K.Reduction, x: str) -> str:
    out = f"{REDUCE_FN[s.op]}({x}, axis=1, keep_dims=True)"
    return f"({out} != 0)" if s.dtype is DType.bool else out


def scan(prog: K.Program, k: K.Scan, index_i64: bool) -> TritonKernel:
    g = Gen(prog, index_i64, ("XBLOCK", "RBLOCK"))
    outer = _prod(k.ranges)
    single, xb, rb, warps = _tiles(prog, outer, k.length)
    _outer(g, k.ranges)
    rn, _ = g.index(k.length)
    store = K.Store(k.store_buf, k.store_index, K.ReduceRef(-1, k.dtype))
    dt = TL[k.dtype]

    def body() -> str:
        v, va = g.value(k.value, "xrmask")
        v = g._cast(v, _dtype_of(k.value), k.dtype)
        return g.tmp(f"tl.where(xrmask, {g.bcast(v, va, XR)}, 0).to({dt})", XR)

    if single:
        _rindex(g, (k.length,), None)
        g.refs[-1] = g.tmp(f"tl.cumsum({body()}, axis=1)", XR)
        g.store(store, "xrmask")
    else:
        g.w.line(f"carry = tl.zeros([XBLOCK, 1], {dt})")
        g.w.line(f"for roffset in range(0, {rn}, RBLOCK):")
        with g.w.indent(), g.scope():
            _rindex(g, (k.length,), "roffset")
            v = body()
            g.refs[-1] = g.tmp(f"tl.cumsum({v}, axis=1) + carry", XR)
            g.store(store, "xrmask")
            g.w.line(f"carry = carry + tl.sum({v}, axis=1, keep_dims=True)")
    return g.finish(k.name, g.w, {"XBLOCK": xb, "RBLOCK": rb}, (_cdiv(outer, xb), 1, 1), num_warps=warps)


def generate(prog: K.Program, k: K.Kernel, options: BuildOptions, sm: int, index_i64: bool | None = None) -> TritonKernel:
    """The Triton module for one kernel of ``prog`` (for GPU ``sm``, which only shapes tile choice).
    ``index_i64``: ``index_is_i64(prog)``, which callers generating every kernel compute once."""
    from .triton_templates import conv, matmul

    index_i64 = index_is_i64(prog) if index_i64 is None else index_i64
    try:
        if isinstance(k, K.Pointwise):
            return pointwise(prog, k, index_i64)
        if isinstance(k, K.Reduce):
            return reduce(prog, k, index_i64)
        if isinstance(k, K.Scan):
            return scan(prog, k, index_i64)
        if isinstance(k, K.Matmul):
            return matmul(prog, k, index_i64, options, sm)
        if isinstance(k, K.Conv):
            return conv(prog, k, index_i64, options, sm)
    except (KeyError, ValueError) as e:
        raise CompileError(f"Triton codegen for kernel {k.name!r} failed: {e}") from e
    raise CompileError(f"kernel {getattr(k, 'name', k)!r}: unknown kernel type {type(k).__name__}")
