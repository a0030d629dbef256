"""Constant folding: evaluate weight-only subgraphs at build time; fold per-channel scales into convs.

Both are ``rewrite`` passes: they return a new graph (and a new weight dict) and leave their input as it was.
"""

from __future__ import annotations

import numpy as np

from ..interp import eval_node
from ..ir import Family, Graph, Node, Op, TensorType, WeightAttr
from .rewrite import rewrite

# Folding a broadcast would store the broadcast copy: leave EXPAND (and what needs it) to the kernels.
_NO_FOLD = {Op.EXPAND, Op.INPUT, Op.WEIGHT}
MAX_GROWTH = 1


def fresh_name(name: str, weights: dict[str, np.ndarray]) -> str:
    """``name``, made unique among ``weights`` (the passes that add weights share it)."""
    while name in weights:
        name += "_"
    return name


def _static(n: Node) -> bool:
    return all(isinstance(d, int) for d in n.shape)


def _literal(n: Node) -> bool:
    """A scalar fill seen through views (``expand(reshape(full eps))``, how a literal operand of an
    elementwise op is spelled): cheap to evaluate, never stored as a weight on its own."""
    while n.op in (Op.EXPAND, Op.RESHAPE) and _static(n):
        n = n.inputs[0]
    return n.op is Op.FULL and _static(n)


def _literal_value(n: Node, g: Graph) -> np.ndarray:
    if n.op is Op.FULL:
        return eval_node(n, [], {}, g)
    return eval_node(n, [_literal_value(n.inputs[0], g)], {}, g)


def fold_constants(g: Graph) -> Graph:
    """Replace every node computed only from weights and literals by a new weight (BN scales,
    transposed weights, casts of weights)."""
    weights = dict(g.weights)
    consts: dict[Node, np.ndarray] = {n: g.weights[n.attr.name] for n in g.nodes if isinstance(n.attr, WeightAttr)}

    def fold(n: Node, _old: Node) -> Node | None:
        foldable = (
            n.op not in _NO_FOLD
            and _static(n)
            and (n.inputs or n.op in (Op.FULL, Op.ARANGE))
            and all(i in consts or _literal(i) for i in n.inputs)
            and any(i in consts for i in n.inputs)
            and n.op not in Family.LIBRARY
        )
        if not foldable:
            return None
        vals = [consts[i] if i in consts else _literal_value(i, g) for i in n.inputs]
        limit = max(v.size for v in vals) * MAX_GROWTH
        out = eval_node(n, vals, {}, g)
        if out.size > max(limit, 1):
            return None
        name = fresh_name(f"const.{len(weights)}", weights)
        weights[name] = np.ascontiguousarray(out)
        w = Node(Op.WEIGHT, (), TensorType(n.dtype, n.shape), WeightAttr(name), n.source)
        consts[w] = weights[name]
        return w

    return dce(rewrite(g, fold, weights))


def fold_conv_scale(g: Graph) -> Graph:
    """conv(x, W) * c  ->  conv(x, W * c[:, None, None, None]) for a per-output-channel constant c:
    batch-norm after folding is exactly this multiply followed by an add."""
    users = g.users()
    weights = dict(g.weights)

    def fold(n: Node, old: Node) -> Node | None:
        if n.op is not Op.MUL:
            return None
        k = 0 if n.inputs[0].op is Op.CONV2D else 1
        conv, scale = n.inputs[k], n.inputs[1 - k]
        if conv.op is not Op.CONV2D or len(users[old.inputs[k]]) != 1:  # users of the input graph's conv
            return None
        src = scale.inputs[0] if scale.op is Op.EXPAND else scale
        w = conv.inputs[1]
        if not (isinstance(src.attr, WeightAttr) and isinstance(w.attr, WeightAttr)):
            return None
        c = weights[src.attr.name]
        cout = w.shape[0]
        if c.size != cout or tuple(src.shape) not in ((1, cout, 1, 1), (cout, 1, 1)):
            return None
        name = fresh_name(f"{w.attr.name}.scaled", weights)
        weights[name] = np.ascontiguousarray(weights[w.attr.name] * c.reshape(cout, 1, 1, 1)).astype(weights[w.attr.name].dtype)
        scaled = Node(Op.WEIGHT, (), w.type, WeightAttr(name), w.source)
        return Node(Op.CONV2D, (conv.inputs[0], scaled), conv.type, conv.attr, conv.source)

    return dce(rewrite(g, fold, weights))


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
    return Graph(nodes, list(g.inputs), list(g.outputs), weights, list(g.symbols))
