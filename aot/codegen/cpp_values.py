"""C++ spelling of kernel values: scalar types, the op table, casts and loads, and value trees printed as
CSE'd temporaries. cpp.py writes the loop nests and the translation unit around them.

Note: value trees are printed as CSE'd ``const`` temporaries, one per distinct node, in the scope of the
loop body. A ``Masked`` body gets its own ``if (mask) { ... }`` scope: its loads may be out of bounds
where the mask fails, so nothing from it is hoisted out -- only nodes that are needed unconditionally
anyway are emitted before the ``if``.

Note: float exp/tanh/erf/sigmoid print as ``aotc_*`` functions from ``aotc_cpu.h`` (inline polynomial
forms within 3 ulp, NaN/inf exact) rather than libm calls, because glibc's are opaque calls that keep a
loop scalar unless built with -ffast-math, which we refuse (see compile.py). log/sin/cos still call libm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import sympy

from .. import kernel as K
from ..ir import DType, Op
from ..symbolic import to_c
from .writer import Writer

# ---- types --------------------------------------------------------------------------------------------

STORAGE = {
    DType.f32: "float", DType.f64: "double", DType.f16: "uint16_t", DType.bf16: "uint16_t",
    DType.i64: "int64_t", DType.i32: "int32_t", DType.i16: "int16_t", DType.i8: "int8_t",
    DType.u8: "uint8_t", DType.bool: "bool",
}  # fmt: skip
HALF = {DType.f16: "f16", DType.bf16: "bf16"}


def vtype(dt: DType) -> str:
    """The C type values of ``dt`` are computed in (16-bit floats widen to float)."""
    return "float" if dt in HALF else STORAGE[dt]


def acc_type(*dts: DType) -> str:
    """The accumulator type of a matmul/conv over operands of these dtypes."""
    if any(d is DType.f64 for d in dts):
        return "double"
    return "float" if any(d.is_float for d in dts) else "int64_t"


ACC_DTYPE = {"float": DType.f32, "double": DType.f64, "int64_t": DType.i64}


def operand_ptr(name: str, dt: DType) -> str:
    """A library operand pointer: 16-bit floats travel as 2-byte tag types the templates widen."""
    if dt in HALF:
        return f"reinterpret_cast<const aotc_{HALF[dt]}_tag*>({name})"
    return name


def literal(value: float | int | bool, dt: DType) -> str:
    """``value`` as a C literal of compute type ``vtype(dt)``."""
    if dt is DType.bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        text = f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)
        return f"({text})" if v < 0 else text
    x = float(value)
    if dt in HALF:
        x = float(np.asarray(x, dtype=np.float32).astype(dt.numpy()).astype(np.float32))
    suffix = "" if dt is DType.f64 else "f"
    cast = "double" if dt is DType.f64 else "float"
    if math.isnan(x):
        return f"static_cast<{cast}>(NAN)"
    if math.isinf(x):
        return f"static_cast<{cast}>({'-' if x < 0 else ''}INFINITY)"
    text = repr(x) if dt is DType.f64 else str(np.float32(x))
    if not any(c in text for c in ".e"):
        text += ".0"
    return f"({text}{suffix})" if x < 0 else text + suffix


# ---- the op table: one op, one short C spelling --------------------------------------------------------


def _call(fn: str) -> Callable[[str, DType], str]:
    return lambda x, dt: f"{fn}({x})"


def _tcall(fn: str) -> Callable[[str, DType], str]:
    return lambda x, dt: f"{fn}<{vtype(dt)}>({x})"


UNARY: dict[Op, Callable[[str, DType], str]] = {
    Op.NEG: lambda x, dt: f"(-{x})",
    Op.ABS: _call("std::abs"),
    Op.EXP: _call("aotc_exp"),  # vectorisable for float (see aotc_cpu.h)
    Op.LOG: _call("std::log"),
    Op.SQRT: _call("std::sqrt"),
    Op.RSQRT: _tcall("aotc_rsqrt"),
    Op.TANH: _call("aotc_tanh"),
    Op.SIGMOID: _tcall("aotc_sigmoid"),
    Op.ERF: _call("aotc_erf"),
    Op.SIN: _call("std::sin"),
    Op.COS: _call("std::cos"),
    Op.RELU: _tcall("aotc_relu"),
    Op.RECIP: lambda x, dt: f"({literal(1, dt)} / {x})",
    Op.FLOOR: lambda x, dt: f"std::floor({x})" if dt.is_float else x,
    Op.NOT: lambda x, dt: f"(!{x})" if dt is DType.bool else f"(~{x})",
}


def _infix(sym: str) -> Callable[[str, str, DType], str]:
    return lambda a, b, dt: f"({a} {sym} {b})"


def _tcall2(fn: str) -> Callable[[str, str, DType], str]:
    return lambda a, b, dt: f"{fn}<{vtype(dt)}>({a}, {b})"


BINARY: dict[Op, Callable[[str, str, DType], str]] = {
    Op.ADD: _infix("+"),
    Op.SUB: _infix("-"),
    Op.MUL: _infix("*"),
    Op.DIV: lambda a, b, dt: f"({a} / {b})" if dt.is_float else f"aotc_floordiv<{vtype(dt)}>({a}, {b})",
    Op.MOD: _tcall2("aotc_pymod"),
    Op.MAX: _tcall2("aotc_maximum"),
    Op.MIN: _tcall2("aotc_minimum"),
    Op.POW: lambda a, b, dt: f"std::pow({a}, {b})",
    Op.EQ: _infix("=="),
    Op.NE: _infix("!="),
    Op.LT: _infix("<"),
    Op.LE: _infix("<="),
    Op.GT: _infix(">"),
    Op.GE: _infix(">="),
    Op.AND: lambda a, b, dt: f"({a} {'&&' if dt is DType.bool else '&'} {b})",
    Op.OR: lambda a, b, dt: f"({a} {'||' if dt is DType.bool else '|'} {b})",
}


def pow_by_constant(x: str, p: float, dt: DType) -> str | None:
    """``x ** p`` for the exponents eager torch special-cases (aten's pow_tensor_scalar kernel: squares,
    cubes, square roots and reciprocals, computed as multiplies, so the results match it bit for bit);
    None for any other exponent. Besides matching, these vectorise where ``std::pow`` is a libm call
    (GPT-2's tanh GELU cubes its input: the whole MLP activation ran scalar)."""
    one = literal(1, dt)
    spell = {
        2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})", 0.5: f"std::sqrt({x})",
        -0.5: f"({one} / std::sqrt({x}))", -1.0: f"({one} / {x})", -2.0: f"({one} / ({x} * {x}))",
    }  # fmt: skip
    return spell.get(p)


def cast(x: str, src: DType, dst: DType) -> str:
    """Convert a computed value of ``src`` to a computed value of ``dst``."""
    if dst is DType.bool:
        return f"({x} != 0)"
    if dst in HALF:
        return f"aotc_round_{HALF[dst]}(static_cast<float>({x}))"
    if vtype(src) == vtype(dst):
        return x
    return f"static_cast<{vtype(dst)}>({x})"


def load(buf: str, index: str, dt: DType) -> str:
    if dt in HALF:
        return f"aotc_{HALF[dt]}_to_f32({buf}[{index}])"
    return f"{buf}[{index}]"


def store_value(x: str, src: DType, dst: DType) -> str:
    """A computed value of ``src`` as the storage representation of ``dst``."""
    if dst in HALF:
        return f"aotc_f32_to_{HALF[dst]}(static_cast<float>({x}))"
    if dst is DType.bool:
        return x if src is DType.bool else f"({x} != 0)"
    return x if vtype(src) == STORAGE[dst] else f"static_cast<{STORAGE[dst]}>({x})"


# ---- value trees -> CSE'd temporaries ------------------------------------------------------------------


def _unmasked(roots: Sequence[K.Value]) -> set[K.Value]:
    """Nodes evaluated whatever any mask says: reachable from ``roots`` without entering a Masked body."""
    seen: set[K.Value] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        stack.extend((v.mask,) if isinstance(v, K.Masked) else K.children(v))
    return seen


@dataclass
class Kctx:
    """What value printing needs from the enclosing kernel."""

    kernel: str
    bufs: dict[str, str]  # buffer name -> C pointer name
    numel: dict[str, str]  # buffer name -> C element count (for checked gathers)
    dtypes: dict[str, DType]  # buffer name -> storage dtype
    acc: str | None = None  # C expression of Acc at the current position
    acc_dtype: DType = DType.f32
    prefix: str | None = None  # C expression of a Scan's running sum, already in the scan's dtype
    checked: list[str] = field(default_factory=list)  # gathered buffers, in the order printed (for the error)


class Values:
    """Prints value trees into a Writer as ``const`` temporaries, CSE'd per scope."""

    def __init__(self, w: Writer, ctx: Kctx) -> None:
        self.w = w
        self.ctx = ctx
        self.scopes: list[dict[K.Value, str]] = []
        self.safe: set[K.Value] = set()
        self.span: tuple[sympy.Symbol, str] | None = None
        self.rows: dict[K.Load, tuple[str, sympy.Symbol, int]] = {}  # hoist_rows: name, loop variable, depth
        self.count = 0

    @contextmanager
    def scope(self, roots: Sequence[K.Value], span: tuple[sympy.Symbol, str] | None = None) -> Iterator[None]:
        """A loop body evaluating ``roots``: temporaries made inside are not visible after it. ``span``: the
        body's innermost loop variable and its trip count (C) when the loop runs from 0 over every position
        (a gather along it is range-checked once per row: ``_gather_index``)."""
        saved = self.safe, self.span
        self.safe = _unmasked(roots)
        self.span = span
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()
            self.safe, self.span = saved
            self.rows = {v: at for v, at in self.rows.items() if at[2] <= len(self.scopes)}

    def _temp(self, v: K.Value, code: str, const: bool = True) -> str:
        name = f"t{self.count}"
        self.count += 1
        self.w.line(f"{'const ' if const else ''}{vtype(v.dtype)} {name} = {code};")
        self.scopes[-1][v] = name
        return name

    def expr(self, v: K.Value) -> str:
        """A C expression for ``v`` (a temporary's name, or an inline literal)."""
        if isinstance(v, K.Const):
            return literal(v.value, v.dtype)
        if isinstance(v, K.Index) and sympy.sympify(v.expr).is_Atom:
            return cast(to_c(v.expr), DType.i64, v.dtype)
        if isinstance(v, K.ReduceRef):
            return f"aotc_red{v.step}"
        if isinstance(v, K.Acc):
            assert self.ctx.acc is not None, f"kernel {self.ctx.kernel}: Acc outside a Matmul/Conv"
            return cast(self.ctx.acc, self.ctx.acc_dtype, v.dtype)
        if isinstance(v, K.Prefix):
            assert self.ctx.prefix is not None, f"kernel {self.ctx.kernel}: Prefix outside a Scan"
            return self.ctx.prefix
        for s in reversed(self.scopes):
            if v in s:
                return s[v]
        if isinstance(v, K.Masked):
            return self._masked(v)
        return self._temp(v, self._code(v))

    def _code(self, v: K.Value) -> str:
        if isinstance(v, K.Index):
            return cast(to_c(v.expr), DType.i64, v.dtype)
        if isinstance(v, K.Load):
            ptr = self.ctx.bufs[v.buf]
            dt = v.dtype
            if isinstance(v.index, K.Index):
                return load(ptr, to_c(v.index.expr), dt)
            if v.buf not in self.ctx.checked:
                self.ctx.checked.append(v.buf)
            return load(ptr, self._gather_index(v), dt)
        if isinstance(v, K.Unary):
            x = self.expr(v.x)
            if v.op is Op.CAST:
                return cast(x, v.x.dtype, v.dtype)
            return UNARY[v.op](x, v.dtype)
        if isinstance(v, K.Binary):
            if v.op is Op.POW and isinstance(v.b, K.Const) and v.a.dtype.is_float:
                short = pow_by_constant(self.expr(v.a), float(v.b.value), v.a.dtype)
                if short is not None:
                    return short
            return BINARY[v.op](self.expr(v.a), self.expr(v.b), v.a.dtype)
        if isinstance(v, K.Where):
            return f"({self.expr(v.cond)} ? {self.expr(v.a)} : {self.expr(v.b)})"
        raise TypeError(f"kernel {self.ctx.kernel}: cannot print value node {v!r}")

    def hoist_rows(self, roots: Sequence[K.Value], span: tuple[sympy.Symbol, str] | None) -> None:
        """Before a loop over ``span`` evaluating ``roots``: range-check the rows its gathers read (see
        ``_gather_index``) here, outside the loop, so that the loop reads them with plain vector loads."""
        if span is None:
            return
        r, n = span
        safe = _unmasked(roots)  # a masked gather may be out of range where its mask fails: not hoisted
        for v in [x for root in roots for x in K.walk(root)]:
            if not isinstance(v, K.Load) or isinstance(v.index, K.Index) or v in self.rows or v not in safe:
                continue
            split = _row_split(v.index, r)
            if split is None:
                continue
            other, off = split
            base = self.expr(other) if off == 0 else f"({self.expr(other)} + {to_c(off)})"
            name = f"t{self.count}"
            self.count += 1
            self.w.line(f"const int64_t {name} = aotc_checked_span({base}, {n}, {self.ctx.numel[v.buf]}, aotc_bad);")
            self.rows[v] = (name, r, len(self.scopes))

    def _gather_index(self, v: K.Load) -> str:
        """A gather's checked index. One of the form ``base + r`` along the loop variable ``r`` of a span
        hoisted by ``hoist_rows`` (an embedding row: ``table[token * H + r]``) had its whole row ``[base,
        base + n)`` checked once before the loop; any other index is checked element by element, which keeps
        the loop to gathers and selects. A row that fails is read from element 0 and sets ``aotc_bad`` (the
        kernel then throws, as for one bad element)."""
        if v in self.rows and self.span is not None and self.rows[v][1] == self.span[0]:
            name, r, _ = self.rows[v]
            return f"{name} + {to_c(r)}"
        return f"aotc_checked({self.expr(v.index)}, {self.ctx.numel[v.buf]}, aotc_bad)"

    def _masked(self, v: K.Masked) -> str:
        mask = self.expr(v.mask)
        for node in K.walk(v.body):  # what the body shares with unmasked code is computed outside
            if node in self.safe and node is not v.body and not isinstance(node, K.Masked):
                self.expr(node)
        name = self._temp(v, literal(v.other, v.dtype), const=False)
        with self.w.block(f"if ({mask})"), self.scope([]):
            self.w.line(f"{name} = {self.expr(v.body)};")
        return name

    def store(self, st: K.Store) -> None:
        buf = self.ctx.bufs[st.buf]
        val = self.expr(st.value)
        dst = self.ctx.dtypes[st.buf]
        self.w.line(f"{buf}[{to_c(st.index)}] = {store_value(val, st.value.dtype, dst)};")


def _row_split(index: K.Value, r: sympy.Symbol) -> tuple[K.Value, sympy.Expr] | None:
    """``index`` as ``other + off + r`` with ``other`` a value tree and ``off`` an expression, neither
    varying with ``r``; None when it is not of that form."""
    if not isinstance(index, K.Binary) or index.op is not Op.ADD:
        return None
    for along, other in ((index.a, index.b), (index.b, index.a)):
        if isinstance(along, K.Index) and _invariant(other, r):
            off = sympy.expand(sympy.sympify(along.expr) - r)
            if r not in off.free_symbols:
                return other, off
    return None


def _invariant(v: K.Value, r: sympy.Symbol) -> bool:
    """``v`` has one value for every position of the loop over ``r`` (no index along it, nothing masked)."""
    for n in K.walk(v):
        if isinstance(n, K.Masked | K.Acc | K.Prefix):
            return False
        if isinstance(n, K.Index) and r in sympy.sympify(n.expr).free_symbols:
            return False
    return True
