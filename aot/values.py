"""The value trees of one kernel, built from the graph: ``ValueBuilder.value(node, index)`` walks producers
until it meets realized buffers (loads), folds views (permute/expand/slice/reshape) into index math, stands
the kernel's one matmul/conv/attention in as its accumulator, and turns reductions over the kernel's reduce
space into reduction steps.

What it is not: the scheduler (``fusion.py``) or the kernel shapes (``library.py``, ``reductions.py``). When
a node cannot be built into this kernel, the builder raises ``Realize`` and the scheduler gives it a buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from . import kernel as K
from .buffers import Buffers, view_index
from .indexing import Idx, flat_index
from .ir import (
    ArangeAttr,
    AxisAttr,
    Dim,
    DType,
    Family,
    FullAttr,
    Node,
    Op,
    PadAttr,
    ReduceAttr,
    dims_equal,
)


class Realize(Exception):
    def __init__(self, node: Node, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


def const(v: object, dtype: DType) -> K.Const:
    if dtype is DType.bool:
        return K.Const(bool(v), dtype)
    return K.Const(int(v) if dtype.is_int else float(v), dtype)  # type: ignore[call-overload, arg-type]


def _index(e: sympy.Expr | int) -> K.Value:
    return K.Index(sympy.sympify(e))


def cmp(op: Op, a: sympy.Expr | int, b: sympy.Expr | int) -> K.Value:
    return K.Binary(op, _index(a), _index(b), DType.bool)


def all_of(conds: list[K.Value]) -> K.Value:
    out = conds[0]
    for c in conds[1:]:
        out = K.Binary(Op.AND, out, c, DType.bool)
    return out


@dataclass
class ValueBuilder:
    buffers: Buffers
    root: Node
    ranges: dict[sympy.Symbol, Dim]
    reduce_vars: tuple[sympy.Symbol, ...] = ()
    reduce_sizes: tuple[Dim, ...] = ()
    library: Node | None = None
    library_vars: Idx = ()
    steps: list[K.Reduction] = field(default_factory=list)
    step_memo: dict[tuple[Node, Idx], int] = field(default_factory=dict)
    region: set[Node] = field(default_factory=set)
    memo: dict[tuple[Node, Idx], K.Value] = field(default_factory=dict)

    def load(self, node: Node, idx: Idx) -> K.Value | None:
        view = self.buffers.strided(node)
        if view is None:
            return None
        buf, offset, strides = view
        index = offset + sympy.Add(*(i * s for i, s in zip(idx, strides, strict=True)))
        return K.Load(buf, K.Index(index), node.dtype)

    def value(self, node: Node, idx: Idx) -> K.Value:
        if node is self.library:
            return self.acc(node, idx)
        key = (node, idx)
        if key in self.memo:  # a DAG, not a tree: shared producers are built once per position
            return self.memo[key]
        if node is not self.root:
            ld = self.load(node, idx)
            if ld is not None:
                self.memo[key] = ld
                return ld
        self.region.add(node)
        out = self.memo[key] = self.define(node, idx)
        return out

    def acc(self, node: Node, idx: Idx) -> K.Value:
        if len(idx) != len(self.library_vars) or any(
            sympy.expand(a - b) != 0 for a, b in zip(idx, self.library_vars, strict=True)
        ):
            # a reshape and its inverse between template and epilogue leave the flat position unchanged
            flat = flat_index(idx, node.shape) - flat_index(self.library_vars, node.shape)
            if sympy.expand(flat.rewrite(sympy.floor)) != 0:
                raise Realize(node, "its epilogue reads it at another position (a view between them)")
        v: K.Value = K.Acc(DType.f32 if node.dtype.is_float else DType.i64)
        return v if node.dtype is v.dtype else K.Unary(Op.CAST, v, node.dtype)

    def define(self, node: Node, idx: Idx) -> K.Value:
        op, a, dt = node.op, node.attr, node.dtype
        ins = node.inputs
        if op in (Op.INPUT, Op.WEIGHT):
            raise AssertionError("sources are always realized")
        if op is Op.FULL:
            assert isinstance(a, FullAttr)
            if isinstance(a.value, sympy.Basic):
                return K.Index(a.value) if dt is DType.i64 else K.Unary(Op.CAST, K.Index(a.value), dt)
            return const(a.value, dt)
        if op is Op.ARANGE:
            assert isinstance(a, ArangeAttr)
            if dt.is_int and isinstance(a.start, int) and isinstance(a.step, int):
                v: K.Value = K.Index(a.start + idx[0] * a.step)
                return v if dt is DType.i64 else K.Unary(Op.CAST, v, dt)
            pos = K.Unary(Op.CAST, K.Index(idx[0]), dt)
            return K.Binary(Op.ADD, K.Binary(Op.MUL, pos, const(a.step, dt), dt), const(a.start, dt), dt)
        if op in Family.UNARY:
            return K.Unary(op, self.value(ins[0], idx), dt)
        if op in Family.BINARY:
            return K.Binary(op, self.value(ins[0], idx), self.value(ins[1], idx), dt)
        if op is Op.WHERE:
            c, a1, b1 = (self.value(x, idx) for x in ins)
            return K.Where(c, a1, b1, dt)
        if op in Family.VIEW:
            return self.value(ins[0], view_index(node, idx, self.ranges))
        if op is Op.CAT:
            return self.cat(node, idx)
        if op is Op.PAD:
            return self.pad(node, idx)
        if op in (Op.INDEX_SELECT, Op.GATHER):
            return self.index_select(node, idx)
        if op in Family.REDUCE:
            return self.reduction(node, idx)
        if op in (Op.MATMUL, Op.CONV2D):
            raise Realize(node, "a second matmul/conv in one kernel")
        raise Realize(node, f"{op.name} is computed by its own kernel")

    def cat(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, AxisAttr)
        ax = node.attr.axis
        starts: list[Dim] = [0]
        for x in node.inputs:
            starts.append(starts[-1] + x.shape[ax])

        def part(k: int) -> K.Value:
            src = list(idx)
            src[ax] = idx[ax] - starts[k]
            return self.value(node.inputs[k], tuple(src))

        last = len(node.inputs) - 1
        out: K.Value = K.Masked(cmp(Op.GE, idx[ax], starts[last]), part(last), 0, node.dtype)
        for k in range(last - 1, -1, -1):
            cond = cmp(Op.LT, idx[ax], starts[k + 1])
            conds = [cond] if k == 0 else [cmp(Op.GE, idx[ax], starts[k]), cond]
            out = K.Where(cond, K.Masked(all_of(conds), part(k), 0, node.dtype), out, node.dtype)
        return out

    def pad(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, PadAttr)
        x = node.inputs[0]
        src, conds = [], []
        for i, (lo, hi), d in zip(idx, node.attr.pads, x.shape, strict=True):
            src.append(i - lo)
            if lo > 0:
                conds.append(cmp(Op.GE, i, lo))
            if hi > 0:
                conds.append(cmp(Op.LT, i - lo, d))
        body = self.value(x, tuple(src))
        if not conds:
            return body
        return K.Masked(all_of(conds), body, node.attr.value, node.dtype)

    def index_select(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, AxisAttr)
        x, ids = node.inputs
        ax = node.attr.axis
        view = self.buffers.strided(x)
        if view is None:
            raise Realize(x, "a gather reads it through data-dependent indices")
        buf, offset, strides = view
        row = self.value(ids, (idx[ax],) if node.op is Op.INDEX_SELECT else idx)
        base = offset + sympy.Add(*(i * s for k, (i, s) in enumerate(zip(idx, strides, strict=True)) if k != ax))
        index = K.Binary(Op.ADD, K.Index(base), K.Binary(Op.MUL, row, K.Index(strides[ax]), DType.i64), DType.i64)
        return K.Load(buf, index, node.dtype)

    def reduction(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, ReduceAttr)
        x = node.inputs[0]
        axes = node.attr.axes
        sizes = tuple(x.shape[k] for k in axes)
        kept = [k for k in range(x.type.rank) if k not in axes]
        kept_idx = [idx[k] for k in kept] if node.attr.keepdim else list(idx)
        fits = len(sizes) == len(self.reduce_sizes) and all(
            dims_equal(a, b) for a, b in zip(sizes, self.reduce_sizes, strict=True)
        )
        if not fits or any(e.free_symbols & set(self.reduce_vars) for e in kept_idx):
            raise Realize(node, "its reduction space differs from the kernel's")
        key = (node, tuple(kept_idx))
        if key in self.step_memo:
            k = self.step_memo[key]
            return K.ReduceRef(k, self.steps[k].dtype)
        src: list[sympy.Expr] = [sympy.Integer(0)] * x.type.rank
        for k, i in zip(kept, kept_idx, strict=True):
            src[k] = i
        for k, r in zip(axes, self.reduce_vars, strict=True):
            src[k] = r
        body = self.value(x, tuple(src))
        self.steps.append(K.Reduction(node.op, body, node.dtype))
        self.step_memo[key] = len(self.steps) - 1
        return K.ReduceRef(len(self.steps) - 1, node.dtype)
