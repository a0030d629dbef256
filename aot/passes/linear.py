"""Batched linear layers as one 2-D matmul: ``x @ W`` with ``W`` a weight broadcast over x's batch dims becomes
a matmul over x's rows flattened, so the tiles see every row at once.

``nn.MultiheadAttention`` applies its projections to a transposed input (sequence-first), which lowers to a
matmul batched over the sequence with M = the batch: at batch 8, a 16-row tile per token (ViT-B/16: 197 of
them, each re-reading the weight) where one matmul over 1576 rows fills the GPU. When x is a permute that
keeps its last axis, the matmul runs on the permute's input (contiguous rows) and the permute moves to the
output, so nothing is copied; the bias add of a linear layer moves with the matmul.

What it is not: merging of several linears over one input (``merge.py``).
"""

from __future__ import annotations

from ..ir import Graph, Node, Op, PermuteAttr, TensorType, WeightAttr
from .fold import dce
from .rewrite import rewrite


def _broadcast_weight(b: Node) -> Node | None:
    """The weight under ``b`` when ``b`` is a [1, ..., 1, K, N] weight broadcast over batch dims."""
    src = b.inputs[0] if b.op is Op.EXPAND else None
    if src is None or not isinstance(src.attr, WeightAttr) or len(src.shape) < 3:
        return None
    return src if all(d == 1 for d in src.shape[:-2]) else None


def _bias(add: Node, mm: Node) -> Node | None:
    other = add.inputs[1] if add.inputs[0] is mm else add.inputs[0]
    src = other.inputs[0] if other.op is Op.EXPAND else other
    if isinstance(src.attr, WeightAttr) and src.dtype is mm.dtype and all(d == 1 for d in src.shape[:-1]):
        return src if src.shape[-1] == mm.shape[-1] else None
    return None


def _rows(shape: tuple) -> object:
    n: object = 1
    for d in shape:
        n = n * d
    return n


def flatten_linear(g: Graph) -> Graph:
    users = g.users()
    plan: dict[Node, Node] = {}  # the node to replace (the bias add, else the matmul) -> its matmul
    for n in g.nodes:
        if n.op is not Op.MATMUL or len(n.shape) < 3 or _broadcast_weight(n.inputs[1]) is None:
            continue
        us = users[n]
        add = us[0] if len(us) == 1 and us[0].op is Op.ADD and n not in g.outputs else None
        plan[add if add is not None and _bias(add, n) is not None else n] = n

    def fn(n: Node, old: Node) -> Node | None:
        if old not in plan:
            return None
        mm = n if n.op is Op.MATMUL else next(i for i in n.inputs if i.op is Op.MATMUL)
        a, b = mm.inputs
        w = _broadcast_weight(b)
        assert w is not None
        k, nn_ = w.shape[-2], w.shape[-1]
        x, perm = a, None
        if a.op is Op.PERMUTE and isinstance(a.attr, PermuteAttr) and a.attr.perm[-1] == len(a.shape) - 1:
            x, perm = a.inputs[0], a.attr.perm
        dt = mm.dtype
        rows = _rows(x.shape[:-1])
        x2 = Node(Op.RESHAPE, (x,), TensorType(x.dtype, (rows, k)), None, a.source)
        w2 = Node(Op.RESHAPE, (w,), TensorType(w.dtype, (k, nn_)), None, w.source)
        y: Node = Node(Op.MATMUL, (x2, w2), TensorType(dt, (rows, nn_)), mm.attr, mm.source)
        if n.op is Op.ADD:
            bias = _bias(n, mm)
            assert bias is not None
            b2 = Node(Op.RESHAPE, (bias,), TensorType(bias.dtype, (1, nn_)), None, bias.source)
            bx = Node(Op.EXPAND, (b2,), y.type, None, bias.source)
            y = Node(Op.ADD, (y, bx), TensorType(n.dtype, y.shape), n.attr, n.source)
        y = Node(Op.RESHAPE, (y,), TensorType(y.dtype, (*x.shape[:-1], nn_)), None, mm.source)
        if perm is not None:
            y = Node(Op.PERMUTE, (y,), TensorType(y.dtype, tuple(y.shape[p] for p in perm)), PermuteAttr(perm), mm.source)
        return y

    return dce(rewrite(g, fn))
