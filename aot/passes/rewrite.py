"""The one way a pass changes a graph: ``rewrite`` walks it in order and builds a new one.

What it is: the replacement bookkeeping every pass would otherwise repeat (inputs mapped through a table,
nodes rebuilt when their inputs changed, outputs remapped, new nodes placed before their users).
What it is not: a pattern matcher or a fixpoint driver; a pass is a function that looks at one node.
Nothing here changes the input graph or its nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..ir import Graph, Node

# fn(n, old): ``n`` is the node over its inputs' replacements (build any replacement from it); ``old`` is
# the same node in the input graph, the key for facts computed on that graph (its users, say).
Fn = Callable[[Node, Node], Node | None]


def rewrite(g: Graph, fn: Fn, weights: dict[str, np.ndarray] | None = None) -> Graph:
    """A new graph: each node of ``g``, in order, rebuilt over its inputs' replacements, then replaced by what
    ``fn`` returns (None keeps it). Nodes a replacement reaches that ``g`` does not hold yet are placed just
    before it, inputs first. ``weights`` (default ``g.weights``) is the new graph's weight data."""
    table: dict[Node, Node] = {}
    placed: set[Node] = set()
    nodes: list[Node] = []

    def place(n: Node) -> None:
        if n in placed:
            return
        for i in n.inputs:
            place(i)
        placed.add(n)
        nodes.append(n)

    for old in g.nodes:
        ins = tuple(table.get(i, i) for i in old.inputs)
        n = old if all(a is b for a, b in zip(ins, old.inputs, strict=True)) else replace(old, inputs=ins)
        new = fn(n, old) or n
        if new is not old:
            table[old] = new
        place(new)
    return Graph(
        nodes,
        [table.get(i, i) for i in g.inputs],
        [table.get(o, o) for o in g.outputs],
        dict(g.weights) if weights is None else weights,
        list(g.symbols),
    )
