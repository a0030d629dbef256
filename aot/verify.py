"""The IR verifier: typing and shape rules every graph must satisfy after every pass.

What it is not: a fixer; it names the first broken node (its number in the printed graph) and the stage.
"""

from __future__ import annotations

from .ir import (
    AttentionAttr,
    AxisAttr,
    ConvAttr,
    DType,
    Family,
    Graph,
    Node,
    Op,
    PermuteAttr,
    ReduceAttr,
    SliceAttr,
    dims_equal,
    shapes_equal,
)


class VerifyError(AssertionError):
    pass


def _fail(n: Node, msg: str, where: str) -> None:
    raise VerifyError(f"{where} = {n} ({n.source or 'no source'}): {msg}")


def verify(g: Graph, where: str = "graph") -> None:
    """Raise VerifyError at the first rule ``g`` breaks; ``where`` names the stage that made it."""
    seen: set[Node] = set()
    for k, n in enumerate(g.nodes):
        at = f"{where}: %{k}"  # the node's number in print_graph's text
        for i in n.inputs:
            if i not in seen:
                _fail(n, f"input {i} is not defined before use", at)
        seen.add(n)
        _check(n, at)
        if n.op is Op.WEIGHT and n.attr.name not in g.weights:  # type: ignore[union-attr]
            _fail(n, "weight data missing", at)
    for o in g.outputs:
        if o not in seen:
            raise VerifyError(f"{where}: output {o} is not a node of the graph")


def _check(n: Node, where: str) -> None:
    op, ins, a = n.op, n.inputs, n.attr
    if op in Family.ELEMENTWISE:
        for i in ins:
            if not shapes_equal(i.shape, n.shape):
                _fail(n, f"operand {i} has shape {i.shape}, expected {n.shape} (broadcasts are explicit)", where)
        if op is Op.WHERE:
            if ins[0].dtype is not DType.bool or ins[1].dtype is not n.dtype or ins[2].dtype is not n.dtype:
                _fail(n, "where(cond: bool, a, b) with a, b of the result dtype", where)
        elif op in Family.BINARY:
            if ins[0].dtype is not ins[1].dtype:
                _fail(n, f"operand dtypes differ: {ins[0].dtype.value} vs {ins[1].dtype.value}", where)
            want = DType.bool if op in Family.COMPARE else ins[0].dtype
            if n.dtype is not want:
                _fail(n, f"result dtype {n.dtype.value}, expected {want.value}", where)
        elif op is not Op.CAST and ins[0].dtype is not n.dtype:
            _fail(n, "unary ops keep the dtype (use CAST)", where)
        if op in Family.FLOAT_ONLY and not n.dtype.is_float:
            _fail(n, f"{op.name} needs a float dtype", where)
    elif op in Family.REDUCE:
        assert isinstance(a, ReduceAttr)
        if any(not 0 <= x < ins[0].type.rank for x in a.axes):
            _fail(n, f"axes {a.axes} out of range", where)
    elif op is Op.PERMUTE:
        assert isinstance(a, PermuteAttr)
        if sorted(a.perm) != list(range(ins[0].type.rank)):
            _fail(n, f"{a.perm} is not a permutation", where)
    elif op is Op.RESHAPE:
        if not dims_equal(ins[0].type.numel(), n.type.numel()):
            _fail(n, f"reshape changes the element count {ins[0].shape} -> {n.shape}", where)
    elif op is Op.EXPAND:
        if ins[0].type.rank != n.type.rank:
            _fail(n, "expand keeps the rank (rank changes are explicit reshapes)", where)
        for s, d in zip(ins[0].shape, n.shape, strict=True):
            if not (dims_equal(s, d) or (isinstance(s, int) and s == 1)):
                _fail(n, f"cannot expand {ins[0].shape} to {n.shape}", where)
    elif op is Op.SLICE:
        assert isinstance(a, SliceAttr)
        if a.step < 1:
            _fail(n, "slice step must be positive", where)
    elif op is Op.CAT:
        assert isinstance(a, AxisAttr)
        total = sum((i.shape[a.axis] for i in ins), start=0)
        if not dims_equal(total, n.shape[a.axis]):
            _fail(n, "cat sizes do not add up", where)
    elif op is Op.MATMUL:
        x, y = ins
        if not (dims_equal(x.shape[-1], y.shape[-2]) and x.dtype is y.dtype is n.dtype):
            _fail(n, f"matmul {x.shape} @ {y.shape}", where)
        if not shapes_equal(x.shape[:-2], y.shape[:-2]):
            _fail(n, "matmul batch dims must be equal (broadcasts are explicit)", where)
    elif op is Op.ATTENTION:
        assert isinstance(a, AttentionAttr)
        _check_attention(n, a, where)
    elif op is Op.CONV2D:
        assert isinstance(a, ConvAttr)
        x, w = ins
        if x.type.rank != 4 or w.type.rank != 4 or x.shape[1] != w.shape[1] * a.groups:
            _fail(n, f"conv2d input {x.shape} weight {w.shape} groups {a.groups}", where)
    elif op is Op.GATHER:
        if ins[1].dtype is not DType.i64 or not shapes_equal(ins[1].shape, n.shape):
            _fail(n, "gather takes an int64 index of the output's shape", where)
    elif op is Op.INDEX_SELECT and (ins[1].dtype is not DType.i64 or ins[1].type.rank != 1):
        _fail(n, "index_select takes a 1-d int64 index", where)


def _check_attention(n: Node, a: AttentionAttr, where: str) -> None:
    q, k, v, *rest = n.inputs
    if q.type.rank < 3 or not (q.type.rank == k.type.rank == v.type.rank == n.type.rank):
        _fail(n, "attention takes q, k, v of one rank >= 3 ([batch..., heads, seq, dim])", where)
    if not (q.dtype is k.dtype is v.dtype is n.dtype and q.dtype.is_float):
        _fail(n, "attention takes q, k, v and gives a result of one float dtype", where)
    if not (shapes_equal(q.shape[:-3], k.shape[:-3]) and shapes_equal(k.shape[:-1], v.shape[:-1])):
        _fail(n, f"attention q {q.shape}, k {k.shape}, v {v.shape}: batch dims or kv lengths differ", where)
    hq, hk = q.shape[-3], k.shape[-3]
    if not dims_equal(q.shape[-1], k.shape[-1]) or not isinstance(hq, int) or not isinstance(hk, int) or hq % hk:
        _fail(n, f"attention q {q.shape}, k {k.shape}: head dims differ or {hq} heads do not split over {hk}", where)
    if not shapes_equal(n.shape, (*q.shape[:-1], v.shape[-1])):
        _fail(n, f"attention result {n.shape}, expected {(*q.shape[:-1], v.shape[-1])}", where)
    if a.mask not in ("none", "bool", "add") or len(rest) != (a.mask != "none"):
        _fail(n, f"attention mask kind {a.mask!r} with {len(rest)} mask inputs", where)
    if rest:
        m = rest[0]
        want = DType.bool if a.mask == "bool" else q.dtype
        if m.dtype is not want or not shapes_equal(m.shape, (*q.shape[:-1], k.shape[-2])):
            _fail(n, f"attention mask {m} must be {want.value}{[*q.shape[:-1], k.shape[-2]]} (broadcasts are explicit)", where)
