"""Loop-level kernels: what fusion produces and both code generators (C++ and Triton) consume.

A kernel is a loop nest over symbolic ranges with loads, a small expression tree per stored value,
and stores. Index math is sympy over the loop variables (``i0, i1, ...`` for the output space,
``r0, r1, ...`` for reduction space) and the shape symbols; codegen prints it to C or Triton.

Value trees are frozen dataclasses, so equal subtrees compare and hash equal: codegen CSEs by value.
Operands of Binary share one dtype (IR rule); comparisons give bool; DIV on ints floors; MOD is Python's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union, cast

import sympy

from .ir import DType, Op, Symbol


def loop_var(prefix: str, k: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True)


def loop_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(loop_var(prefix, k) for k in range(n))


# ---- value trees --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Index:
    """The value of an integer index expression (loop variables and shape symbols)."""

    expr: sympy.Expr
    dtype: DType = DType.i64


@dataclass(frozen=True)
class Load:
    """``buf[index]`` in elements. ``index`` is an i64 tree: usually ``Index``, data-dependent for gathers."""

    buf: str
    index: Value
    dtype: DType


@dataclass(frozen=True)
class Unary:
    op: Op  # a member of ir.Family.UNARY; CAST converts to ``dtype``
    x: Value
    dtype: DType


@dataclass(frozen=True)
class Binary:
    op: Op  # a member of ir.Family.BINARY
    a: Value
    b: Value
    dtype: DType


@dataclass(frozen=True)
class Where:
    cond: Value
    a: Value
    b: Value
    dtype: DType


@dataclass(frozen=True)
class Masked:
    """``body`` where ``mask`` holds, else ``other``. Loads inside ``body`` must not run where it fails."""

    mask: Value
    body: Value
    other: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Acc:
    """The accumulator of a Matmul or Conv at the current output position (fp32 for float inputs)."""

    dtype: DType = DType.f32


@dataclass(frozen=True)
class ReduceRef:
    """The result of step ``step`` of the enclosing Reduce kernel, for the current outer position."""

    step: int
    dtype: DType


@dataclass(frozen=True)
class Prefix:
    """The inclusive prefix sum of the enclosing Scan at the current position, in the scan's dtype."""

    dtype: DType


Value = Union[Const, Index, Load, Unary, Binary, Where, Masked, Acc, ReduceRef, Prefix]  # noqa: UP007


def children(v: Value) -> tuple[Value, ...]:
    if isinstance(v, Load):
        return (v.index,)
    if isinstance(v, Unary):
        return (v.x,)
    if isinstance(v, Binary):
        return (v.a, v.b)
    if isinstance(v, Where):
        return (v.cond, v.a, v.b)
    if isinstance(v, Masked):
        return (v.mask, v.body)
    return ()


def walk(v: Value) -> list[Value]:
    """Every node of a tree once, children before parents."""
    seen: dict[Value, None] = {}

    def go(x: Value) -> None:
        if x in seen:
            return
        for c in children(x):
            go(c)
        seen[x] = None

    go(v)
    return list(seen)


# ---- kernels ------------------------------------------------------------------------------------


class _Facts:
    """What codegen asks of any kernel, derived from its structure (never from names)."""

    @property
    def gathers(self) -> tuple[str, ...]:
        """Buffers read through a data-dependent index (a gather), in first-found order."""
        roots = values(cast(Kernel, self))
        found = (v.buf for r in roots for v in walk(r) if isinstance(v, Load) and not isinstance(v.index, Index))
        return tuple(dict.fromkeys(found))

    @property
    def has_gather(self) -> bool:
        """Some index comes from data, so the generated code checks it against the buffer at run time."""
        return bool(self.gathers)


@dataclass(frozen=True)
class Store:
    """``buf[index] = value``; ``index`` is sympy over the kernel's loop variables."""

    buf: str
    index: sympy.Expr
    value: Value


@dataclass(frozen=True)
class Strided:
    """A library operand: element ``(a, b, ...)`` is at ``buf[offset + a*strides[0] + b*strides[1] + ...]``.
    ``offset`` may depend on the kernel's batch variables ``i0..``."""

    buf: str
    offset: sympy.Expr
    strides: tuple[sympy.Expr, ...]
    dtype: DType


@dataclass(frozen=True)
class Pointwise(_Facts):
    """for i in ranges: stores."""

    name: str
    ranges: tuple[sympy.Expr, ...]
    stores: tuple[Store, ...]


@dataclass(frozen=True)
class Reduction:
    op: Op  # SUM, RMAX or RMIN
    value: Value  # over i*, r* and earlier ReduceRefs
    dtype: DType


@dataclass(frozen=True)
class Reduce(_Facts):
    """for i in ranges: steps[0..] each reduce over r in reduce_ranges (in order); then ``stores`` once per
    outer position (over i*), then ``row_stores`` over the whole reduce space (over i*, r*: softmax and
    layer-norm outputs, which need every step's result before the row is written)."""

    name: str
    ranges: tuple[sympy.Expr, ...]
    reduce_ranges: tuple[sympy.Expr, ...]
    steps: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    row_stores: tuple[Store, ...] = ()


@dataclass(frozen=True)
class Matmul(_Facts):
    """C[b..., m, n] = sum_k A[m, k] * B[k, n], then stores over (i0.. batch, i{nb} = m, i{nb+1} = n).

    ``a.strides`` = (stride of m, stride of k); ``b.strides`` = (stride of k, stride of n); their offsets
    are expressions over the batch variables. Stores use ``Acc`` plus any other loads (epilogue)."""

    name: str
    batch: tuple[sympy.Expr, ...]
    m: sympy.Expr
    n: sympy.Expr
    k: sympy.Expr
    a: Strided
    b: Strided
    stores: tuple[Store, ...]
    # CPU targets only (codegen/cpp_pack.py): ``b`` is a weight packed at build time into panels
    # [ceil(n / NR)][k][NR] of fp32 for the micro-kernel, and ``b.strides`` are (NR, 1).
    packed: bool = False


@dataclass(frozen=True)
class Pool:
    """A max or min pool fused after a Conv (CPU targets only: codegen/cpp_pool.py). Each conv output becomes
    ``pre`` (over ``Acc`` and the channel i1), ``op`` (RMAX/RMIN) reduces it over the windows (``kernel``,
    ``stride``, ``padding`` over oh, ow; positions outside never win) into ``out_hw``, and the Conv's
    ``stores`` then run over (i0 = n, i1 = pooled row, i2 = pooled column, i3 = channel) with ``ReduceRef(0)``
    the pooled value: the index space of the Reduce kernel it replaces."""

    op: Op
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    out_hw: tuple[sympy.Expr, sympy.Expr]
    pre: Value


@dataclass(frozen=True)
class Conv(_Facts):
    """2-D convolution, NCHW input ``x`` (strides n, c, h, w) and OIHW weight ``w`` (strides o, i, kh, kw).
    Stores over (i0 = n, i1 = output channel, i2 = oh, i3 = ow) with ``Acc``."""

    name: str
    x: Strided
    w: Strided
    batch: sympy.Expr
    c_in: int
    height: sympy.Expr
    width: sympy.Expr
    c_out: int
    kernel: tuple[int, int]
    out_hw: tuple[sympy.Expr, sympy.Expr]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    stores: tuple[Store, ...]
    # CPU targets only (codegen/cpp_pack.py): ``w`` is the weight packed at build time into panels
    # [ceil(c_out / NR)][kh * kw * c_in][NR] of fp32 (k = (kh * KW + kw) * c_in + c), ``w.strides`` (NR, 1, 0, 0).
    packed: bool = False
    pool: Pool | None = None
    # With ``packed``: 2 or 4 when ``w`` holds the Winograd transform of the weight for F(wino x wino, 3x3)
    # instead (cpp_pack.py; panels [ceil(c_out / NR)][(wino + 2)^2 * c_in][NR]), 0 for the direct conv.
    wino: int = 0


@dataclass(frozen=True)
class Scan(_Facts):
    """Inclusive prefix sum along r0: for i in ranges: acc = 0; for r0 in length: acc += value; stores.
    The stores run at every (i*, r0) and read the running sum as ``Prefix``."""

    name: str
    ranges: tuple[sympy.Expr, ...]
    length: sympy.Expr
    value: Value  # over i*, r0
    dtype: DType
    stores: tuple[Store, ...]


@dataclass(frozen=True)
class Attention(_Facts):
    """Fused attention, never holding the L x S scores: for each batch position (i0.., the query head last)
    and query row l, out[l, :] = softmax_j(q[l, :] . k[j, :] * scale (+ mask[l, j])) @ v[j, :].

    Operand strides: ``q`` (l, e), ``k`` (j, e), ``v`` (j, ev), ``mask`` (l, j) (0 where broadcast). Offsets
    are over the batch variables i0..i{nb-1}; in ``k``'s and ``v``'s offsets the head variable i{nb-1} stands
    for the kv head, h // ``group``. ``mask_kind``: "none", "bool" (True attends) or "add" (added to the
    scaled scores). ``causal``: row l attends to j <= l. Rows that attend to nothing give zeros.
    Stores run over (i0.. batch, i{nb} = l, i{nb+1} = ev) and read the fp32 result as ``Acc``."""

    name: str
    batch: tuple[sympy.Expr, ...]
    group: int  # query heads per kv head
    q_len: sympy.Expr
    kv_len: sympy.Expr
    head_dim: sympy.Expr
    v_dim: sympy.Expr
    q: Strided
    k: Strided
    v: Strided
    mask: Strided | None
    scale: float
    causal: bool
    mask_kind: str
    stores: tuple[Store, ...]

    @property
    def operands(self) -> tuple[Strided, ...]:
        return (self.q, self.k, self.v) if self.mask is None else (self.q, self.k, self.v, self.mask)


Kernel = Union[Pointwise, Reduce, Matmul, Conv, Scan, Attention]  # noqa: UP007


# ---- the whole program ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[sympy.Expr | int, ...]
    kind: str  # "input" | "output" | "weight" | "arena"

    def numel(self) -> sympy.Expr | int:
        n: sympy.Expr | int = 1
        for d in self.shape:
            n = n * d
        return n

    def nbytes(self) -> sympy.Expr | int:
        return self.numel() * self.dtype.itemsize


@dataclass(frozen=True)
class Program:
    """Kernels in launch order over named buffers: what fusion makes, before memory is planned."""

    symbols: list[Symbol]
    inputs: list[Buffer]
    outputs: list[Buffer]
    weights: list[Buffer]
    arena: list[Buffer]
    kernels: list[Kernel]
    labels: dict[str, str] = field(default_factory=dict)  # buffer -> user-facing name (inputs, outputs, weights)

    def buffer(self, name: str) -> Buffer:
        for b in (*self.inputs, *self.outputs, *self.weights, *self.arena):
            if b.name == name:
                return b
        raise KeyError(name)


@dataclass(frozen=True)
class Plan(Program):
    """A Program with its memory plan: each arena buffer's byte offset in one arena, and the arena's size.
    Codegen takes a Plan, so no kernel is written before every buffer has a place."""

    arena_offsets: dict[str, sympy.Expr | int] = field(default_factory=dict)
    arena_size: sympy.Expr | int = 0

    @staticmethod
    def of(prog: Program, offsets: dict[str, sympy.Expr | int], size: sympy.Expr | int) -> Plan:
        return Plan(prog.symbols, prog.inputs, prog.outputs, prog.weights, prog.arena, prog.kernels, prog.labels, offsets, size)


def values(k: Kernel) -> list[Value]:
    """The root value trees of a kernel (stores, reduction steps, scan body)."""
    out = [s.value for s in stores(k)]
    if isinstance(k, Scan):
        out.append(k.value)
    if isinstance(k, Reduce):
        out += [s.value for s in k.steps]
    if isinstance(k, Conv) and k.pool is not None:
        out.append(k.pool.pre)
    return out


def stores(k: Kernel) -> tuple[Store, ...]:
    """Every store of a kernel (a Reduce's row stores first)."""
    return (*k.row_stores, *k.stores) if isinstance(k, Reduce) else k.stores


def reads(k: Kernel) -> set[str]:
    """Names of the buffers a kernel reads."""
    out = {v.buf for root in values(k) for v in walk(root) if isinstance(v, Load)}
    if isinstance(k, Matmul):
        out |= {k.a.buf, k.b.buf}
    if isinstance(k, Conv):
        out |= {k.x.buf, k.w.buf}
    if isinstance(k, Attention):
        out |= {op.buf for op in k.operands}
    return out


def writes(k: Kernel) -> set[str]:
    return {s.buf for s in stores(k)}
