"""Graph -> kernels: decide which values live in memory, and fuse everything else into their consumers.

Note: the scheme. A *realized* node gets a buffer; every other node is recomputed inside the kernels
that read it. Each realized node (a *root*) becomes one kernel whose stored value is the root's
expression tree, built by ``ValueBuilder.value`` (``values.py``): it walks producers until it meets realized
buffers (loads), folds views (permute/expand/slice/reshape) into index math, absorbs one matmul/conv/attention
as the kernel's template (``library.py``; its pointwise consumers become the epilogue), and turns reductions
over the kernel's reduce space into reduction steps (``reductions.py``: softmax and layer-norm become one
kernel each).
When a root cannot absorb something (a reduction over another space, two matmuls, a gather from a
computed table, a value several kernels would recompute), the builder raises ``Realize(node)``; the
node gets a buffer of its own and only the kernels that touched it are rebuilt. Every such decision is
logged with its reason (``Fusion.log``), like Inductor's fusion logs.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from . import kernel as K
from . import library, reductions
from .buffers import Buffers
from .indexing import contiguous_strides, reshape_index, view_strides
from .ir import Family, Graph, InputAttr, Node, Op, WeightAttr, dims_equal
from .values import Realize, ValueBuilder

__all__ = ["Fusion", "Realize", "contiguous_strides", "fuse", "reshape_index", "view_strides"]


class Fusion(Buffers):
    """The scheduler: realizes nodes until every root's kernel builds (``Buffers`` holds what is realized)."""

    def __init__(self, graph: Graph, channels_last: bool = False) -> None:
        super().__init__(graph, channels_last)
        for n in graph.nodes:
            if n.op in (Op.POOL2D, Op.CUMSUM) and n not in self.realized:
                self.realize(n, f"{n.op.name} runs as its own kernel")

    # -- kernels
    def roots(self) -> list[Node]:
        return [n for n in self.graph.nodes if n in self.realized and n.op not in (Op.INPUT, Op.WEIGHT)]

    def build(self, root: Node, name: str) -> tuple[K.Kernel, set[Node]]:
        n = root
        if n.op is Op.POOL2D:
            return reductions.pool(self, n, name)
        if n.op is Op.CUMSUM:
            return reductions.scan(self, n, name)
        libs, reds = self._region_kinds(n)
        if libs and reds:
            raise Realize(libs[0], "a reduction cannot be a matmul/conv epilogue")
        if libs:
            lib = libs[0]
            if len(libs) > 1:
                raise Realize(self._epilogue_head(libs[1], n), "one matmul/conv per kernel")
            if lib.op is Op.ATTENTION:
                return library.attention(self, n, lib, name)
            same = len(lib.shape) == len(n.shape) and all(dims_equal(a, b) for a, b in zip(lib.shape, n.shape, strict=True))
            if not same and not library.rows_reshaped(lib, n):
                raise Realize(lib, "its epilogue has another shape")
            template = library.matmul if lib.op is Op.MATMUL else library.conv
            return template(self, n, lib, name)
        if reds:
            return reductions.reduce(self, n, reds[0], name)
        vars_ = K.loop_vars("i", len(n.shape))
        idx, ranges = self.loop_order(n, vars_)
        b = ValueBuilder(self, n, dict(zip(vars_, ranges, strict=True)))
        store = K.Store(self.realized[n], self.store_index(n, idx), b.value(n, idx))
        return K.Pointwise(name, tuple(sympy.sympify(d) for d in ranges), (store,)), b.region

    def _epilogue_head(self, lib: Node, root: Node) -> Node:
        """The last node of ``lib``'s single-use elementwise chain below ``root`` (its bias, a residual add):
        realized there, the chain stays in lib's epilogue instead of becoming a pointwise kernel of its own
        (an operand of the chain that other kernels read too gets realized in turn)."""
        node = lib
        while len(self.users.get(node, ())) == 1:
            user = self.users[node][0]
            if user is root or user in self.realized or user.op not in Family.ELEMENTWISE or not dims_equal_all(user, lib):
                break
            # an operand computed for this chain alone (the other conv of a ResNet block's skip) would bring
            # a second template into the kernel: stop before it
            if any(i is not node and not self.duplicable(i) and len(self.users.get(i, ())) < 2 for i in user.inputs):
                break
            node = user
        return node

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


def dims_equal_all(a: Node, b: Node) -> bool:
    return len(a.shape) == len(b.shape) and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape, strict=True))


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
