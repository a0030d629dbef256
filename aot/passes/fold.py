"""Constant folding: evaluate weight-only subgraphs at build time; fold per-channel scales into convs."""

from __future__ import annotations

import numpy as np

from ..interp import eval_node
from ..ir import Family, Graph, Node, Op, TensorType, WeightAttr

# Folding a broadcast would store the broadcast copy: leave EXPAND (and what needs it) to the kernels.
_NO_FOLD = {Op.EXPAND, Op.INPUT, Op.WEIGHT}
MAX_GROWTH = 1


def _const(n: Node, consts: dict[Node, np.ndarray]) -> bool:
    return n in consts


def fold_constants(g: Graph) -> Graph:
    """Replace every node computed only from weights and literals by a new weight (BN scales,
    transposed weights, casts of weights)."""
    consts: dict[Node, np.ndarray] = {n: g.weights[n.attr.name] for n in g.nodes if isinstance(n.attr, WeightAttr)}
    replace: dict[Node, Node] = {}
    weights = dict(g.weights)
    nodes: list[Node] = []
    for n in g.nodes:
        ins = tuple(replace.get(i, i) for i in n.inputs)
        if ins != n.inputs:
            n.inputs = ins
        foldable = (
            n.op not in _NO_FOLD
            and all(isinstance(d, int) for d in n.shape)
            and (n.inputs or n.op in (Op.FULL, Op.ARANGE))
            and all(i in consts or (i.op is Op.FULL and all(isinstance(d, int) for d in i.shape)) for i in n.inputs)
            and any(i in consts for i in n.inputs)
            and n.op not in Family.LIBRARY
        )
        if foldable:
            vals = [consts[i] if i in consts else eval_node(i, [], {}, g) for i in n.inputs]
            limit = max(v.size for v in vals) * MAX_GROWTH
            out = eval_node(n, vals, {}, g)
            if out.size <= max(limit, 1):
                name = f"const.{len(weights)}"
                while name in weights:
                    name += "_"
                weights[name] = np.ascontiguousarray(out)
                w = Node(Op.WEIGHT, (), TensorType(n.dtype, n.shape), WeightAttr(name), n.source)
                consts[w] = weights[name]
                replace[n] = w
                nodes.append(w)
                continue
        nodes.append(n)
    outputs = [replace.get(o, o) for o in g.outputs]
    return dce(Graph(nodes, g.inputs, outputs, weights, g.symbols))


def fold_conv_scale(g: Graph) -> Graph:
    """conv(x, W) * c  ->  conv(x, W * c[:, None, None, None]) for a per-output-channel constant c:
    batch-norm after folding is exactly this multiply followed by an add."""
    users = g.users()
    weights = dict(g.weights)
    replace: dict[Node, Node] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        n.inputs = tuple(replace.get(i, i) for i in n.inputs)
        nodes.append(n)
        if n.op is not Op.MUL:
            continue
        conv, scale = n.inputs
        if conv.op is not Op.CONV2D:
            conv, scale = scale, conv
        if conv.op is not Op.CONV2D or len(users[conv]) != 1:
            continue
        src = scale.inputs[0] if scale.op is Op.EXPAND else scale
        w = conv.inputs[1]
        if not (isinstance(src.attr, WeightAttr) and isinstance(w.attr, WeightAttr)):
            continue
        c = weights[src.attr.name]
        cout = w.shape[0]
        if c.size != cout or tuple(src.shape) not in ((1, cout, 1, 1), (cout, 1, 1)):
            continue
        name = f"{w.attr.name}.scaled"
        while name in weights:
            name += "_"
        weights[name] = np.ascontiguousarray(weights[w.attr.name] * c.reshape(cout, 1, 1, 1)).astype(weights[w.attr.name].dtype)
        neww = Node(Op.WEIGHT, (), w.type, WeightAttr(name), w.source)
        newconv = Node(Op.CONV2D, (conv.inputs[0], neww), conv.type, conv.attr, conv.source)
        replace[n] = newconv
        nodes += [neww, newconv]
    outputs = [replace.get(o, o) for o in g.outputs]
    return dce(Graph(nodes, g.inputs, outputs, weights, g.symbols))


def dce(g: Graph) -> Graph:
    """Drop nodes no output depends on, and weights no node reads."""
    live: set[Node] = set()
    stack = list(g.outputs)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.inputs)
    nodes = [n for n in g.nodes if n in live or n.op is Op.INPUT]
    used = {n.attr.name for n in nodes if isinstance(n.attr, WeightAttr)}
    weights = {k: v for k, v in g.weights.items() if k in used}
    return Graph(nodes, g.inputs, g.outputs, weights, g.symbols)
