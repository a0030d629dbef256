"""Which integer inputs index a table, and its size: token ids into an embedding, indices into a weight.

What it is: ``index_ranges(graph, names)``: for each INDEX_SELECT or GATHER whose index is a model input
(through casts and views only) into a table of static size on that axis, the manifest's ``IndexRange``.
The runtime then refuses an out-of-range id before the call (``InputMismatch``, exit 5).
What it is not: a value-range analysis. An index computed from an input (``ids + 1``, a negative index
wrapped by ``where``) is not tracked; the kernels' own bounds handling covers those.
"""

from __future__ import annotations

from aotc.schema import IndexRange

from .ir import AxisAttr, Graph, InputAttr, Node, Op, WeightAttr

# Ops that keep every value of the input (a slice would drop some, so the whole input would be over-checked)
_PASS_THROUGH = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.CAST})


def _source(n: Node) -> Node:
    while n.op in _PASS_THROUGH and n.inputs:
        n = n.inputs[0]
    return n


def index_ranges(graph: Graph, labels: dict[str, str] | None = None) -> tuple[IndexRange, ...]:
    """``labels``: input name in the graph -> name in the manifest (default: the same)."""
    best: dict[str, IndexRange] = {}
    for n in graph.nodes:
        if n.op not in (Op.INDEX_SELECT, Op.GATHER) or not isinstance(n.attr, AxisAttr):
            continue
        table, index = n.inputs[0], _source(n.inputs[1])
        if index.op is not Op.INPUT or not isinstance(index.attr, InputAttr) or not index.dtype.value.startswith(("int", "uint")):
            continue
        size = table.shape[n.attr.axis]
        if not isinstance(size, int):
            continue
        src = _source(table)
        what = f"weight {src.attr.name!r}" if isinstance(src.attr, WeightAttr) else "indexed tensor"
        kind = "embedding" if n.op is Op.INDEX_SELECT and n.attr.axis == 0 and isinstance(src.attr, WeightAttr) else "table"
        name = (labels or {}).get(index.attr.name, index.attr.name)
        if name not in best or size < best[name].size:
            best[name] = IndexRange(name, size, f"{kind} {what}")
    return tuple(best[k] for k in sorted(best))
