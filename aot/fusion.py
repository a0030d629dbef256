"""Graph -> kernels: decide which values live in memory, and fuse everything else into their consumers.

Note: the scheme. A *realized* node gets a buffer; every other node is recomputed inside the kernels
that read it. Each realized node (a *root*) becomes one kernel whose stored value is the root's
expression tree, built by ``_Build.value``: it walks producers until it meets realized buffers (loads),
folds views (permute/expand/slice/reshape) into index math, absorbs one matmul/conv as the kernel's
template (its pointwise consumers become the epilogue), and turns reductions over the kernel's reduce
space into reduction steps (softmax and layer-norm become one kernel each).
When a root cannot absorb something (a reduction over another space, two matmuls, a gather from a
computed table, a value several kernels would recompute), the builder raises ``Realize(node)``; the
node gets a buffer of its own and only the kernels that touched it are rebuilt. Every such decision is
logged with its reason (``Fusion.log``), like Inductor's fusion logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from . import kernel as K
from .indexing import Idx, contiguous_strides, flat_index, is_one, reshape_index, view_strides
from .ir import (
    ArangeAttr,
    AttentionAttr,
    AxisAttr,
    ConvAttr,
    Dim,
    DType,
    Family,
    FullAttr,
    Graph,
    InputAttr,
    Node,
    Op,
    PadAttr,
    PermuteAttr,
    PoolAttr,
    ReduceAttr,
    SliceAttr,
    StridedAttr,
    WeightAttr,
    dims_equal,
)
from .passes.layout import NHWC, channels_last_nodes

__all__ = ["Fusion", "Realize", "contiguous_strides", "fuse", "reshape_index", "view_strides"]


class Realize(Exception):
    def __init__(self, node: Node, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


# ---- the builder of one kernel ----------------------------------------------------------------------


def _const(v: object, dtype: DType) -> K.Const:
    if dtype is DType.bool:
        return K.Const(bool(v), dtype)
    return K.Const(int(v) if dtype.is_int else float(v), dtype)  # type: ignore[call-overload, arg-type]


def _idx(e: sympy.Expr | int) -> K.Value:
    return K.Index(sympy.sympify(e))


def _cmp(op: Op, a: sympy.Expr | int, b: sympy.Expr | int) -> K.Value:
    return K.Binary(op, _idx(a), _idx(b), DType.bool)


def _and(conds: list[K.Value]) -> K.Value:
    out = conds[0]
    for c in conds[1:]:
        out = K.Binary(Op.AND, out, c, DType.bool)
    return out


@dataclass
class _Build:
    fusion: Fusion
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
        view = self.fusion.strided(node)
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
            return _const(a.value, dt)
        if op is Op.ARANGE:
            assert isinstance(a, ArangeAttr)
            if dt.is_int and isinstance(a.start, int) and isinstance(a.step, int):
                v: K.Value = K.Index(a.start + idx[0] * a.step)
                return v if dt is DType.i64 else K.Unary(Op.CAST, v, dt)
            pos = K.Unary(Op.CAST, K.Index(idx[0]), dt)
            return K.Binary(Op.ADD, K.Binary(Op.MUL, pos, _const(a.step, dt), dt), _const(a.start, dt), dt)
        if op in Family.UNARY:
            return K.Unary(op, self.value(ins[0], idx), dt)
        if op in Family.BINARY:
            return K.Binary(op, self.value(ins[0], idx), self.value(ins[1], idx), dt)
        if op is Op.WHERE:
            c, a1, b1 = (self.value(x, idx) for x in ins)
            return K.Where(c, a1, b1, dt)
        if op is Op.PERMUTE:
            assert isinstance(a, PermuteAttr)
            src = [sympy.Integer(0)] * len(idx)
            for d, p in enumerate(a.perm):
                src[p] = idx[d]
            return self.value(ins[0], tuple(src))
        if op is Op.EXPAND:
            src_shape = ins[0].shape
            return self.value(
                ins[0],
                tuple(sympy.Integer(0) if is_one(s) and not is_one(d) else i
                      for i, s, d in zip(idx, src_shape, node.shape, strict=True)),
            )  # fmt: skip
        if op is Op.SLICE:
            assert isinstance(a, SliceAttr)
            src = list(idx)
            src[a.axis] = a.start + idx[a.axis] * a.step
            return self.value(ins[0], tuple(src))
        if op is Op.RESHAPE:
            return self.value(ins[0], reshape_index(idx, ins[0].shape, node.shape, self.ranges))
        if op is Op.AS_STRIDED:
            assert isinstance(a, StridedAttr)
            return self.value(ins[0], (a.offset + sympy.Add(*(i * st for i, st in zip(idx, a.strides, strict=True))),))
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
        out: K.Value = K.Masked(_cmp(Op.GE, idx[ax], starts[last]), part(last), 0, node.dtype)
        for k in range(last - 1, -1, -1):
            cond = _cmp(Op.LT, idx[ax], starts[k + 1])
            conds = [cond] if k == 0 else [_cmp(Op.GE, idx[ax], starts[k]), cond]
            out = K.Where(cond, K.Masked(_and(conds), part(k), 0, node.dtype), out, node.dtype)
        return out

    def pad(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, PadAttr)
        x = node.inputs[0]
        src, conds = [], []
        for i, (lo, hi), d in zip(idx, node.attr.pads, x.shape, strict=True):
            src.append(i - lo)
            if lo > 0:
                conds.append(_cmp(Op.GE, i, lo))
            if hi > 0:
                conds.append(_cmp(Op.LT, i - lo, d))
        body = self.value(x, tuple(src))
        if not conds:
            return body
        return K.Masked(_and(conds), body, node.attr.value, node.dtype)

    def index_select(self, node: Node, idx: Idx) -> K.Value:
        assert isinstance(node.attr, AxisAttr)
        x, ids = node.inputs
        ax = node.attr.axis
        view = self.fusion.strided(x)
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


# ---- the scheduler -------------------------------------------------------------------------------------


class Fusion:
    def __init__(self, graph: Graph, channels_last: bool = False) -> None:
        self.graph = graph
        # realized activations stored NHWC (passes/layout.py says why this lives on buffers, not in the graph)
        self.layout = channels_last_nodes(graph) if channels_last else frozenset()
        self.order: dict[Node, tuple[int, ...]] = {}
        self.ids = graph.ids()  # node numbers name kernels and buffers: same graph, same package bytes
        self.users = graph.users()
        self.realized: dict[Node, str] = {}
        self.log: list[str] = []
        self._strided: dict[Node, tuple | None] = {}
        self.buffers: dict[Node, K.Buffer] = {}
        for k, n in enumerate(graph.inputs):
            self._realize(n, f"in{k}", "input")
        for k, n in enumerate(sorted((n for n in graph.nodes if n.op is Op.WEIGHT), key=lambda n: self.ids[n])):
            self._realize(n, f"w{k}", "weight")
        for k, n in enumerate(graph.outputs):
            self._realize(n, f"out{k}", "output")
        for n in graph.nodes:
            if n.op in (Op.POOL2D, Op.CUMSUM) and n not in self.realized:
                self.realize(n, f"{n.op.name} runs as its own kernel")

    # -- buffers
    def _realize(self, n: Node, name: str, kind: str) -> None:
        self.realized[n] = name
        self.buffers[n] = K.Buffer(name, n.dtype, n.shape, kind)
        if kind == "arena" and n in self.layout:
            self.order[n] = NHWC
        self._strided.clear()

    def strides(self, n: Node) -> tuple[sympy.Expr, ...]:
        """A realized node's strides in logical (NCHW) order: row-major, or row-major over its storage order."""
        perm = self.order.get(n)
        if perm is None:
            return contiguous_strides(n.shape)
        st = contiguous_strides(tuple(n.shape[p] for p in perm))
        out = [sympy.Integer(0)] * len(perm)
        for k, p in enumerate(perm):
            out[p] = st[k]
        return tuple(out)

    def store_index(self, n: Node, idx: tuple[sympy.Expr, ...]) -> sympy.Expr:
        return sympy.Add(*(i * s for i, s in zip(idx, self.strides(n), strict=True)))

    def loop_order(self, n: Node, vars_: tuple[sympy.Symbol, ...]) -> tuple[tuple[sympy.Symbol, ...], tuple[Dim, ...]]:
        """(the logical index, the loop ranges) for loop variables ``vars_`` over a root: loops run in its
        storage order, so a channels-last root's stores (and its NHWC reads) are contiguous along the last loop."""
        perm = self.order.get(n, tuple(range(len(vars_))))
        idx: list[sympy.Symbol] = list(vars_)
        for k, p in enumerate(perm):
            idx[p] = vars_[k]
        return tuple(idx), tuple(n.shape[p] for p in perm)

    def realize(self, n: Node, reason: str) -> None:
        assert n not in self.realized, n
        self._realize(n, f"buf{self.ids[n]}", "arena")
        self.log.append(f"realize %{self.ids[n]}:{n.op.name} ({n.op.name}, {n.source or 'no source'}): {reason}")

    def strided(self, n: Node) -> tuple | None:
        if n in self._strided:
            return self._strided[n]
        out: tuple | None = None
        if n in self.realized:
            out = (self.realized[n], sympy.Integer(0), self.strides(n))
        elif n.op in Family.VIEW:
            src = self.strided(n.inputs[0])
            if src is not None:
                buf, off, st = src
                a = n.attr
                if n.op is Op.PERMUTE:
                    assert isinstance(a, PermuteAttr)
                    out = (buf, off, tuple(st[p] for p in a.perm))
                elif n.op is Op.EXPAND:
                    shp = n.inputs[0].shape
                    out = (buf, off, tuple(sympy.Integer(0) if is_one(s) and not is_one(d) else t
                                           for s, d, t in zip(shp, n.shape, st, strict=True)))  # fmt: skip
                elif n.op is Op.AS_STRIDED:
                    assert isinstance(a, StridedAttr)
                    out = (buf, off + a.offset * st[0], tuple(t * st[0] for t in a.strides))
                elif n.op is Op.SLICE:
                    assert isinstance(a, SliceAttr)
                    st2 = list(st)
                    st2[a.axis] = st[a.axis] * a.step
                    out = (buf, off + a.start * st[a.axis], tuple(st2))
                else:
                    new = view_strides(n.inputs[0].shape, st, n.shape)
                    out = None if new is None else (buf, off, new)
        self._strided[n] = out
        return out

    # -- kernels
    def roots(self) -> list[Node]:
        return [n for n in self.graph.nodes if n in self.realized and n.op not in (Op.INPUT, Op.WEIGHT)]

    def build(self, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        n = root
        if n.op is Op.POOL2D:
            return self._pool(n, name)
        if n.op is Op.CUMSUM:
            return self._scan(n, name)
        libs, reds = self._region_kinds(n)
        if libs and reds:
            raise Realize(libs[0], "a reduction cannot be a matmul/conv epilogue")
        if libs:
            lib = libs[0]
            if len(libs) > 1:
                raise Realize(libs[1], "one matmul/conv per kernel")
            if lib.op is Op.ATTENTION:
                return self._attention(n, lib, name)
            if not (len(lib.shape) == len(n.shape) and all(dims_equal(a, b) for a, b in zip(lib.shape, n.shape, strict=True))):
                raise Realize(lib, "its epilogue has another shape")
            return self._library(n, lib, name)
        if reds:
            return self._reduce(n, reds[0], name)
        vars_ = K.loop_vars("i", len(n.shape))
        idx, ranges = self.loop_order(n, vars_)
        b = _Build(self, n, dict(zip(vars_, ranges, strict=True)))
        store = K.Store(self.realized[n], self.store_index(n, idx), b.value(n, idx))
        return K.Pointwise(name, tuple(sympy.sympify(d) for d in ranges), (store,)), b.region

    def _region_kinds(self, root: Node) -> tuple[list[Node], list[Node]]:
        libs, reds, seen = [], [], set()
        stack = [root]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n is not root and self.strided(n) is not None:
                continue
            if n.op in (Op.MATMUL, Op.CONV2D, Op.ATTENTION):
                libs.append(n)
                continue
            if n.op in Family.REDUCE:
                reds.append(n)
            if n.op in (Op.INDEX_SELECT, Op.GATHER):
                stack.append(n.inputs[1])
                continue
            stack.extend(n.inputs)
        return sorted(libs, key=lambda x: -self.ids[x]), sorted(reds, key=lambda x: self.ids[x])

    def _library(self, root: Node, lib: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        vars_ = K.loop_vars("i", len(lib.shape))
        b = _Build(self, root, dict(zip(vars_, lib.shape, strict=True)), library=lib, library_vars=vars_)
        ops = self._operands(lib)
        store = K.Store(self.realized[root], self.store_index(root, vars_), b.value(root, vars_))
        b.region.add(lib)
        if lib.op is Op.MATMUL:
            nb = len(lib.shape) - 2
            (ba, oa, sa), (bb, ob, sb) = ops
            off_a = oa + sympy.Add(*(vars_[d] * sa[d] for d in range(nb)))
            off_b = ob + sympy.Add(*(vars_[d] * sb[d] for d in range(nb)))
            x, y = lib.inputs
            kern: K.Kernel = K.Matmul(
                name, tuple(sympy.sympify(d) for d in lib.shape[:nb]), sympy.sympify(lib.shape[-2]),
                sympy.sympify(lib.shape[-1]), sympy.sympify(x.shape[-1]),
                K.Strided(ba, off_a, (sa[nb], sa[nb + 1]), x.dtype), K.Strided(bb, off_b, (sb[nb], sb[nb + 1]), y.dtype),
                (store,),
            )  # fmt: skip
            return kern, b.region
        a = lib.attr
        assert isinstance(a, ConvAttr)
        (bx, ox, sx), (bw, ow, sw) = ops
        x, w = lib.inputs
        kern = K.Conv(
            name, K.Strided(bx, ox, sx, x.dtype), K.Strided(bw, ow, sw, w.dtype), sympy.sympify(x.shape[0]),
            int(x.shape[1]), sympy.sympify(x.shape[2]), sympy.sympify(x.shape[3]), int(lib.shape[1]),
            (int(w.shape[2]), int(w.shape[3])), (sympy.sympify(lib.shape[2]), sympy.sympify(lib.shape[3])),
            a.stride, a.padding, a.dilation, a.groups, (store,),
        )  # fmt: skip
        return kern, b.region

    def _operands(self, lib: Node) -> list[tuple]:
        """Each input of a library op as (buffer, offset, strides); raises Realize for one not in memory."""
        ops = []
        for x in lib.inputs:
            v = self.strided(x)
            if v is None:
                # Prefer a buffer under the views (q/k/v heads split from one projection stay views of it)
                # over a copy of the viewed operand; but attention under the views gets its own store index
                # (``_attention``), so the viewed operand is realized as the attention kernel's output.
                base = x
                while base.op in Family.VIEW and base not in self.realized:
                    base = base.inputs[0]
                under = base is not x and base not in self.realized and base.op is not Op.ATTENTION
                raise Realize(base if under else x, f"{lib.op.name} reads its operands from memory")
            ops.append(v)
        return ops

    def _attention(self, root: Node, lib: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        """The Attention kernel of ``lib`` stored through ``root``: a chain of permutes, reshapes and unary ops
        above it (attn.transpose(1, 2).reshape(B, L, H * E)) becomes the store index, anything else of the
        same shape an epilogue as for a matmul."""
        a = lib.attr
        assert isinstance(a, AttentionAttr)
        ops = self._operands(lib)
        nb = len(lib.shape) - 2
        vars_ = K.loop_vars("i", len(lib.shape))
        store = self._through_views(root, lib, vars_)
        region = {lib}
        if store is None:
            if not (len(lib.shape) == len(root.shape) and all(dims_equal(x, y) for x, y in zip(lib.shape, root.shape, strict=True))):
                raise Realize(lib, "its epilogue views it in a way the store index cannot follow")
            b = _Build(self, root, dict(zip(vars_, lib.shape, strict=True)), library=lib, library_vars=vars_)
            store = K.Store(self.realized[root], self.store_index(root, vars_), b.value(root, vars_))
            region |= b.region
        else:
            node = root
            while node is not lib:
                region.add(node)
                node = node.inputs[0]

        def operand(k: int, rows: int) -> K.Strided:
            buf, off, st = ops[k]
            off = off + sympy.Add(*(vars_[d] * st[d] for d in range(nb)))
            return K.Strided(buf, off, (st[rows], st[rows + 1]), lib.inputs[k].dtype)

        q, k, v = lib.inputs[:3]
        sym = sympy.sympify
        kern = K.Attention(
            name, tuple(sym(d) for d in lib.shape[:nb]), int(q.shape[-3]) // int(k.shape[-3]), sym(q.shape[-2]),
            sym(k.shape[-2]), sym(q.shape[-1]), sym(v.shape[-1]), operand(0, nb), operand(1, nb), operand(2, nb),
            operand(3, nb) if len(ops) > 3 else None, a.scale, a.causal, a.mask, (store,),
        )  # fmt: skip
        return kern, region

    def _through_views(self, root: Node, lib: Node, vars_: tuple[sympy.Symbol, ...]) -> K.Store | None:
        """The store of ``lib``'s value at ``vars_`` when ``root`` is lib under permutes, reshapes and unary ops
        (a reshape after a permute keeps the flat position of the permuted tensor); None otherwise."""
        chain: list[Node] = []
        node = root
        while node is not lib:
            if node is not root and node in self.realized:
                return None
            if not (node.op in (Op.PERMUTE, Op.RESHAPE) or node.op in Family.UNARY):
                return None
            chain.append(node)
            node = node.inputs[0]
        idx: tuple = vars_
        flat = None
        acc: K.Value = K.Acc(DType.f32)
        value = acc if lib.dtype is DType.f32 else K.Unary(Op.CAST, acc, lib.dtype)
        for n in reversed(chain):
            if n.op is Op.PERMUTE:
                assert isinstance(n.attr, PermuteAttr)
                if flat is not None:
                    return None
                idx = tuple(idx[p] for p in n.attr.perm)
            elif n.op is Op.RESHAPE:
                flat = flat if flat is not None else flat_index(idx, n.inputs[0].shape)
            else:
                value = K.Unary(n.op, value, n.dtype)
        return K.Store(self.realized[root], flat if flat is not None else flat_index(idx, root.shape), value)

    def _reduce(self, root: Node, red: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        assert isinstance(red.attr, ReduceAttr)
        x = red.inputs[0]
        axes = red.attr.axes
        sizes = tuple(x.shape[k] for k in axes)
        rvars = K.loop_vars("r", len(sizes))
        numel = root.type.numel()
        k = len(axes)
        trailing = axes == tuple(range(x.type.rank - k, x.type.rank))
        if dims_equal(numel, red.type.numel()):  # the root lives in the reduced space: one store per row
            outer = root.shape
            vars_ = K.loop_vars("i", len(outer))
            b = _Build(self, root, dict(zip((*vars_, *rvars), (*outer, *sizes), strict=True)), rvars, sizes)
            store_idx, val_idx = self.store_index(root, vars_), vars_
        elif trailing and len(root.shape) >= k and all(
            dims_equal(a, s) for a, s in zip(root.shape[-k:], sizes, strict=True)
        ):  # the root has the rows' shape: reductions, then a second pass over each row
            outer = root.shape[:-k]
            vars_ = K.loop_vars("i", len(outer))
            b = _Build(self, root, dict(zip((*vars_, *rvars), (*outer, *sizes), strict=True)), rvars, sizes)
            val_idx = (*vars_, *rvars)
            store_idx = self.store_index(root, val_idx)
        else:
            raise Realize(red, "its result is broadcast into a shape the kernel cannot loop over")
        store = K.Store(self.realized[root], store_idx, b.value(root, val_idx))
        per_row = len(val_idx) > len(vars_)  # the root has the rows' shape: written after the steps, per element
        kern = K.Reduce(
            name, tuple(sympy.sympify(d) for d in outer), tuple(sympy.sympify(d) for d in sizes), tuple(b.steps),
            () if per_row else (store,), (store,) if per_row else (),
        )  # fmt: skip
        return kern, b.region

    def _pool(self, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        a = root.attr
        assert isinstance(a, PoolAttr)
        x = root.inputs[0]
        loop_vars = K.loop_vars("i", 4)
        vars_, shape = self.loop_order(root, loop_vars)
        r = K.loop_vars("r", 2)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
        h0, w0 = vars_[2] * sh - ph, vars_[3] * sw - pw
        ih, iw = h0 + r[0] * dh, w0 + r[1] * dw
        H, W = x.shape[2], x.shape[3]
        ranges = dict(zip((*loop_vars, *r), (*shape, kh, kw), strict=True))
        b = _Build(self, root, ranges, r, (kh, kw))
        mask = _and([_cmp(Op.GE, ih, 0), _cmp(Op.LT, ih, H), _cmp(Op.GE, iw, 0), _cmp(Op.LT, iw, W)])
        dt = root.dtype
        body = b.value(x, (vars_[0], vars_[1], ih, iw))
        b.region.add(root)
        if a.kind == "max":
            steps = (K.Reduction(Op.RMAX, K.Masked(mask, body, float("-inf"), dt), dt),)
            value: K.Value = K.ReduceRef(0, dt)
        else:
            steps = (K.Reduction(Op.SUM, K.Masked(mask, body, 0.0, dt), dt),)
            if a.divisor:
                count: K.Value = _const(a.divisor, dt)
            elif a.count_include_pad:
                hh = sympy.Min(h0 + kh, H + ph) - h0
                ww = sympy.Min(w0 + kw, W + pw) - w0
                count = K.Unary(Op.CAST, K.Index(hh * ww), dt)
            else:
                hh = sympy.Min(h0 + kh, H) - sympy.Max(h0, 0)
                ww = sympy.Min(w0 + kw, W) - sympy.Max(w0, 0)
                count = K.Unary(Op.CAST, K.Index(hh * ww), dt)
            value = K.Binary(Op.DIV, K.ReduceRef(0, dt), count, dt)
        store = K.Store(self.realized[root], self.store_index(root, vars_), value)
        return K.Reduce(name, tuple(sympy.sympify(d) for d in shape), (sympy.Integer(kh), sympy.Integer(kw)), steps, (store,)), b.region

    def _scan(self, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        assert isinstance(root.attr, AxisAttr)
        ax = root.attr.axis
        outer = tuple(d for k, d in enumerate(root.shape) if k != ax)
        vars_ = K.loop_vars("i", len(outer))
        r0 = K.loop_var("r", 0)
        full = (*vars_[:ax], r0, *vars_[ax:])
        b = _Build(self, root, dict(zip(full, root.shape, strict=True)))
        body = b.value(root.inputs[0], full)
        b.region.add(root)
        return K.Scan(
            name, tuple(sympy.sympify(d) for d in outer), sympy.sympify(root.shape[ax]), body, root.dtype,
            (K.Store(self.realized[root], self.store_index(root, full), K.Prefix(root.dtype)),),
        ), b.region  # fmt: skip

    def duplicable(self, n: Node, budget: int = 6) -> bool:
        """Cheap enough to recompute in every kernel that reads it."""
        if n in self.realized or self.strided(n) is not None or n.op in (Op.FULL, Op.ARANGE):
            return True
        if n.op not in Family.ELEMENTWISE and n.op not in Family.VIEW or budget <= 0:
            return False
        return all(self.duplicable(i, budget - 1) for i in n.inputs)

    def schedule(self) -> list[tuple[Node, K.Kernel]]:
        built: dict[Node, tuple[K.Kernel, set[Node]]] = {}
        for _ in range(100000):
            try:
                for root in self.roots():
                    if root not in built:
                        built[root] = self.build(root, f"k{self.ids[root]}")
            except Realize as r:
                self.realize(r.node, r.reason)
                built = {k: v for k, v in built.items() if r.node not in v[1]}
                continue
            owners: dict[Node, list[Node]] = {}
            for root, (_, region) in built.items():
                for n in region:
                    if n is not root:
                        owners.setdefault(n, []).append(root)
            shared = [n for n, rs in owners.items() if len(rs) > 1 and not self.duplicable(n)]
            if not shared:
                break
            n = min(shared, key=lambda x: self.ids[x])
            self.realize(n, f"read by {len(owners[n])} kernels")
            built = {k: v for k, v in built.items() if n not in v[1]}
        order = self.roots()
        return [(root, built[root][0]) for root in order]


def _own_outputs(g: Graph) -> Graph:
    """Give every output its own computed node: an output that is an input, a weight, or another output
    gets an identity view, which becomes a copy kernel into the output buffer."""
    seen: set[Node] = set()
    outputs, nodes = [], list(g.nodes)
    for out in g.outputs:
        o = out
        if o.op in (Op.INPUT, Op.WEIGHT) or o in seen:
            o = Node(Op.RESHAPE, (o,), o.type, None, o.source)
            nodes.append(o)
        seen.add(o)
        outputs.append(o)
    return Graph(nodes, g.inputs, outputs, g.weights, g.symbols)


def fuse(graph: Graph, channels_last: bool = False) -> tuple[K.Program, list[str]]:
    """The kernels in launch order over named buffers (arena not yet planned), and the fusion log.
    ``channels_last``: store the activations between convolutions NHWC (``passes/layout.py``)."""
    graph = _own_outputs(graph)
    f = Fusion(graph, channels_last)
    sched = f.schedule()
    kernels = []
    for t, (_, kern) in enumerate(sched):
        kind = type(kern).__name__.lower()
        kernels.append(replace(kern, name=f"k{t:03d}_{kind}"))
    inputs = [f.buffers[n] for n in graph.inputs]
    outputs = [f.buffers[n] for n in graph.outputs]
    arena = [f.buffers[root] for root, _ in sched if f.buffers[root].kind == "arena"]
    used = set().union(*(K.reads(k) for k in kernels)) if kernels else set()
    # graph order is the w0, w1, ... naming order, so the ABI order follows the graph
    weights = [f.buffers[n] for n in graph.nodes if n.op is Op.WEIGHT and f.buffers[n].name in used]
    labels = {f.buffers[n].name: n.attr.name for n in graph.nodes if isinstance(n.attr, InputAttr | WeightAttr) and n in f.buffers}
    labels.update({b.name: f"output{k}" for k, b in enumerate(outputs)})
    prog = K.Program(graph.symbols, inputs, outputs, weights, arena, kernels, labels=labels)
    return prog, f.log
