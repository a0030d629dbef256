"""Horizontal matmul merging: linear layers that read the same input become one matmul over their
concatenated weights (and biases), each old output a slice of the new one.

Attention's query, key and value projections are the common case (BERT, Llama, ViT in transformers): three
launches of an N=768 matmul leave most of a large GPU idle, where one N=2304 matmul fills it; on the CPU one
pass over the input serves all three. Slices are views, so their readers load from the merged buffer.

What it is not: a general CSE. Inputs count as the same when they are the same node or equal views of it
(each linear layer reshapes its input afresh).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Family, Graph, Node, Op, SliceAttr, TensorType, WeightAttr, dims_equal
from .fold import dce, fresh_name
from .rewrite import rewrite


@dataclass(frozen=True)
class _Linear:
    matmul: Node
    bias_add: Node | None  # the add of a bias row the matmul feeds alone, when there is one
    bias: Node | None  # that bias's WEIGHT node ([1, N] or [N])

    @property
    def last(self) -> Node:
        return self.bias_add or self.matmul


def _input_key(n: Node) -> object:
    """Equal for the same node and for equal views of equal inputs."""
    if n.op in Family.VIEW:
        return (n.op, _input_key(n.inputs[0]), tuple(str(d) for d in n.shape), n.attr)
    return n


def _bias(add: Node, mm: Node) -> Node | None:
    other = add.inputs[1] if add.inputs[0] is mm else add.inputs[0]
    src = other.inputs[0] if other.op is Op.EXPAND else other
    n = mm.shape[-1]
    if isinstance(src.attr, WeightAttr) and src.dtype is mm.dtype and tuple(src.shape) in ((1, n), (n,)):
        return src
    return None


def _linears(g: Graph) -> list[list[_Linear]]:
    """Groups of two or more linear layers over the same input, same weight dtype and the same bias-ness."""
    users = g.users()
    groups: dict[tuple[object, object, bool], list[_Linear]] = {}
    for n in g.nodes:
        if n.op is not Op.MATMUL or len(n.shape) != 2:
            continue
        a, w = n.inputs
        if not isinstance(w.attr, WeightAttr) or len(w.shape) != 2 or not isinstance(w.shape[1], int):
            continue
        add = users[n][0] if len(users[n]) == 1 and users[n][0].op is Op.ADD and n not in g.outputs else None
        bias = _bias(add, n) if add is not None else None
        lin = _Linear(n, add if bias is not None else None, bias)
        groups.setdefault((_input_key(a), w.dtype, bias is not None), []).append(lin)
    return [grp for grp in groups.values() if len(grp) > 1 and all(dims_equal(x.matmul.shape[0], grp[0].matmul.shape[0]) for x in grp)]


def merge_matmuls(g: Graph) -> Graph:
    weights = dict(g.weights)
    plan: dict[Node, tuple[list[_Linear], int]] = {}  # a group member's last node -> (group, its column offset)
    for grp in _linears(g):
        off = 0
        for lin in grp:
            plan[lin.last] = (grp, off)
            off += int(lin.matmul.shape[1])
    merged: dict[int, Node] = {}  # id(group) -> the merged (matmul [+ bias]) node

    def build(grp: list[_Linear], a: Node) -> Node:
        first = grp[0].matmul
        mats = [weights[lin.matmul.inputs[1].attr.name] for lin in grp]  # type: ignore[union-attr]
        wname = fresh_name(f"{first.inputs[1].attr.name}.merged", weights)  # type: ignore[union-attr]
        weights[wname] = np.ascontiguousarray(np.concatenate(mats, axis=1))
        total = weights[wname].shape[1]
        w = Node(Op.WEIGHT, (), TensorType(first.inputs[1].dtype, (first.inputs[1].shape[0], total)), WeightAttr(wname), first.source)
        out = Node(Op.MATMUL, (a, w), TensorType(first.dtype, (first.shape[0], total)), first.attr, first.source)
        if grp[0].bias is None:
            return out
        rows = [weights[lin.bias.attr.name].reshape(1, -1) for lin in grp]  # type: ignore[union-attr]
        bname = fresh_name(f"{grp[0].bias.attr.name}.merged", weights)  # type: ignore[union-attr]
        weights[bname] = np.ascontiguousarray(np.concatenate(rows, axis=1))
        b = Node(Op.WEIGHT, (), TensorType(first.dtype, (1, total)), WeightAttr(bname), first.source)
        bx = Node(Op.EXPAND, (b,), out.type, None, first.source)
        add = grp[0].bias_add
        assert add is not None
        return Node(Op.ADD, (out, bx), TensorType(add.dtype, out.shape), add.attr, add.source)

    def fn(n: Node, old: Node) -> Node | None:
        if old not in plan:
            return None
        grp, off = plan[old]
        if id(grp) not in merged:
            mm = n.inputs[0] if n.op is Op.ADD and n.inputs[0].op is Op.MATMUL else n
            if mm.op is not Op.MATMUL:
                mm = n.inputs[1]
            merged[id(grp)] = build(grp, mm.inputs[0])
        return Node(Op.SLICE, (merged[id(grp)],), n.type, SliceAttr(1, off, 1), n.source)

    return dce(rewrite(g, fn, weights))
