"""Which graph nodes live in memory during fusion, under which buffer names and layouts, and how any other node
reads as a strided view of one of them.

What it is: the state fusion's scheduler (``fusion.py``) grows as it realizes nodes, and the one place that
answers "is this node a buffer in disguise?" (``strided``), which the kernel builders ask of every operand.
What it is not: the scheduler: deciding what to realize is ``fusion.Fusion``'s job.
"""

from __future__ import annotations

import sympy

from . import kernel as K
from .indexing import Idx, contiguous_strides, is_one, reshape_index, view_strides
from .ir import Dim, Family, Graph, Node, Op, PermuteAttr, SliceAttr, StridedAttr
from .passes.layout import NHWC, channels_last_nodes

# (buffer name, element offset, per-dimension strides in elements): where element (a, b, ...) of a node lives
View = tuple[str, sympy.Expr, tuple[sympy.Expr, ...]]


class Buffers:
    def __init__(self, graph: Graph, channels_last: bool = False) -> None:
        self.graph = graph
        # realized activations stored NHWC (passes/layout.py says why this lives on buffers, not in the graph)
        self.layout = channels_last_nodes(graph) if channels_last else frozenset()
        self.order: dict[Node, tuple[int, ...]] = {}
        self.ids = graph.ids()  # node numbers name kernels and buffers: same graph, same package bytes
        self.users = graph.users()
        self.realized: dict[Node, str] = {}
        self.log: list[str] = []
        self._strided: dict[Node, View | None] = {}
        self._compositions: dict[tuple[Node, Node, View], View | None] = {}
        self.buffers: dict[Node, K.Buffer] = {}
        for k, n in enumerate(graph.inputs):
            self._realize(n, f"in{k}", "input")
        for k, n in enumerate(sorted((n for n in graph.nodes if n.op is Op.WEIGHT), key=lambda n: self.ids[n])):
            self._realize(n, f"w{k}", "weight")
        for k, n in enumerate(graph.outputs):
            self._realize(n, f"out{k}", "output")

    def _realize(self, n: Node, name: str, kind: str) -> None:
        self.realized[n] = name
        self.buffers[n] = K.Buffer(name, n.dtype, n.shape, kind)
        if kind == "arena" and n in self.layout:
            self.order[n] = NHWC
        self._strided.clear()

    def realize(self, n: Node, reason: str) -> None:
        assert n not in self.realized, n
        self._realize(n, f"buf{self.ids[n]}", "arena")
        self.log.append(f"realize %{self.ids[n]}:{n.op.name} ({n.op.name}, {n.source or 'no source'}): {reason}")

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

    def strided(self, n: Node) -> View | None:
        """``n`` as a strided view of a realized buffer, or None when it is computed (or its views cannot be
        expressed with strides)."""
        if n in self._strided:
            return self._strided[n]
        out: View | None = None
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
            if out is None:
                out = self._composed(n)
        self._strided[n] = out
        return out

    def _composed(self, n: Node) -> View | None:
        """``n`` as a strided view through its whole chain of views, when the composed index is affine though
        a view on the way has no strides of its own.

        Note: nn.MultiheadAttention splits heads as proj.view(L, B * H, E).transpose(0, 1).view(B, H, L, E)
        after a ``.contiguous()`` (dropped by lowering). Over the projection's buffer the middle view merges
        the batch (stride L * 3D) with the head (stride E): no single stride, so a view-by-view walk gives up
        and the operand became a copy kernel. The last view splits them apart again, and the whole chain,
        (b, h, l, e) -> (b * L + l) * 3D + h * E + e, is affine: the reader takes those strides instead."""
        chain, node = [n], n.inputs[0]
        while (view := self.strided(node)) is None:
            if node.op not in Family.VIEW:
                return None  # views of a computed value: the common case, settled without index math
            chain.append(node)
            node = node.inputs[0]
        # the composition depends only on the chain and the view under it: kept across realizations
        key = (n, node, view)
        if key not in self._compositions:
            self._compositions[key] = _compose(chain, view)
        return self._compositions[key]


def _compose(chain: list[Node], view: View) -> View | None:
    """The strides of ``chain[0]`` read through the views ``chain`` (top first) over ``view``, or None when
    the composed index is not affine."""
    n = chain[0]
    vars_ = K.loop_vars("v", len(n.shape))
    ranges: dict[sympy.Symbol, Dim] = dict(zip(vars_, n.shape, strict=True))
    idx: Idx = vars_
    for node in chain:
        idx = view_index(node, idx, ranges)
    buf, off, st = view
    flat = sympy.expand(off + sympy.Add(*(i * s for i, s in zip(idx, st, strict=True))))
    if flat.has(sympy.floor, sympy.Mod, sympy.Min, sympy.Max):
        return None
    strides = tuple(sympy.diff(flat, v) for v in vars_)
    if any(s.free_symbols & set(vars_) for s in strides):
        return None
    return buf, flat.subs(dict.fromkeys(vars_, 0)), strides


def view_index(n: Node, idx: Idx, ranges: dict[sympy.Symbol, Dim]) -> Idx:
    """The index into view ``n``'s input for position ``idx`` of ``n`` (``ranges``: the loop variables' sizes,
    which keep split/merge reshapes affine)."""
    a, src_shape = n.attr, n.inputs[0].shape
    if n.op is Op.PERMUTE:
        assert isinstance(a, PermuteAttr)
        src = [sympy.Integer(0)] * len(idx)
        for d, p in enumerate(a.perm):
            src[p] = idx[d]
        return tuple(src)
    if n.op is Op.EXPAND:
        return tuple(sympy.Integer(0) if is_one(s) and not is_one(d) else i
                     for i, s, d in zip(idx, src_shape, n.shape, strict=True))  # fmt: skip
    if n.op is Op.SLICE:
        assert isinstance(a, SliceAttr)
        src = list(idx)
        src[a.axis] = a.start + idx[a.axis] * a.step
        return tuple(src)
    if n.op is Op.RESHAPE:
        return reshape_index(idx, src_shape, n.shape, ranges)
    assert n.op is Op.AS_STRIDED and isinstance(a, StridedAttr), n.op
    return (a.offset + sympy.Add(*(i * st for i, st in zip(idx, a.strides, strict=True))),)
