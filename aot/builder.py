"""A small helper that appends typed IR nodes: explicit broadcasting and dtype casts in one place.

What it is not: a graph. It only appends nodes to a list that lowering turns into a ``Graph``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .ir import (
    Attr,
    Dim,
    DType,
    Family,
    FullAttr,
    Node,
    Op,
    PermuteAttr,
    Shape,
    TensorType,
    as_dim,
    dims_equal,
)


def broadcast_shapes(*shapes: Shape) -> Shape:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for k in range(rank):
        dim: Dim = 1
        for s in shapes:
            d = s[k - rank + len(s)] if k - rank + len(s) >= 0 else 1
            if isinstance(d, int) and d == 1:
                continue
            dim = d
        out.append(dim)
    return tuple(out)


@dataclass(frozen=True)
class Builder:
    """Appends nodes to ``nodes``, each stamped with ``source`` (the user's line they lower)."""

    nodes: list[Node] = field(default_factory=list)
    source: str | None = None

    def at(self, source: str | None) -> Builder:
        """A builder onto the same node list whose nodes carry ``source``: lowering makes one per FX node."""
        return Builder(self.nodes, source)

    def add(self, op: Op, inputs: Sequence[Node], dtype: DType, shape: Shape, attr: Attr = None) -> Node:
        n = Node(op, tuple(inputs), TensorType(dtype, tuple(as_dim(d) for d in shape)), attr, self.source)
        self.nodes.append(n)
        return n

    def full(self, value: float | int | bool | Dim, dtype: DType, shape: Shape = ()) -> Node:
        """A constant; an integer ``value`` may be a symbolic size (a sympy expression over the symbols)."""
        if dtype.is_int and not isinstance(value, int | float | bool):
            return self.add(Op.FULL, (), dtype, shape, FullAttr(value))
        if dtype is DType.bool:
            value = bool(value)
        elif dtype.is_int:
            value = int(value)
        else:
            value = float(value)
        return self.add(Op.FULL, (), dtype, shape, FullAttr(value))

    def cast(self, x: Node, dtype: DType) -> Node:
        return x if x.dtype is dtype else self.add(Op.CAST, (x,), dtype, x.shape)

    def reshape(self, x: Node, shape: Shape) -> Node:
        shape = tuple(as_dim(d) for d in shape)
        if len(shape) == x.type.rank and all(dims_equal(a, b) for a, b in zip(shape, x.shape, strict=True)):
            return x
        return self.add(Op.RESHAPE, (x,), x.dtype, shape)

    def permute(self, x: Node, perm: Sequence[int]) -> Node:
        perm = tuple(p % max(x.type.rank, 1) for p in perm)
        if perm == tuple(range(x.type.rank)):
            return x
        return self.add(Op.PERMUTE, (x,), x.dtype, tuple(x.shape[p] for p in perm), PermuteAttr(perm))

    def broadcast_to(self, x: Node, shape: Shape) -> Node:
        """Rank-extend with a RESHAPE, then EXPAND size-1 dims: broadcasting made explicit."""
        if len(shape) > x.type.rank:
            x = self.reshape(x, (1,) * (len(shape) - x.type.rank) + tuple(x.shape))
        if all(dims_equal(a, b) for a, b in zip(x.shape, shape, strict=True)):
            return x
        return self.add(Op.EXPAND, (x,), x.dtype, shape)

    def ew(self, op: Op, *args: Node | float | int | bool, dtype: DType | None = None) -> Node:
        """An elementwise op; python scalars become FULL nodes, operands are cast to ``dtype``
        (default: the first node operand's dtype) and broadcast to a common shape."""
        nodes = [a for a in args if isinstance(a, Node)]
        assert nodes, "elementwise op needs a tensor operand"
        compute = dtype or nodes[0].dtype
        if op in Family.LOGICAL:
            compute = DType.bool
        shape = broadcast_shapes(*(n.shape for n in nodes))
        ins = []
        for a in args:
            n = a if isinstance(a, Node) else self.full(a, compute)
            n = self.broadcast_to(self.cast(n, compute), shape)
            ins.append(n)
        out_dtype = DType.bool if op in Family.COMPARE else compute
        return self.add(op, ins, out_dtype, shape)

    def where(self, cond: Node, a: Node | float | int | bool, b: Node | float | int | bool, dtype: DType) -> Node:
        shapes = [x.shape for x in (cond, a, b) if isinstance(x, Node)]
        shape = broadcast_shapes(*shapes)
        c = self.broadcast_to(self.cast(cond, DType.bool), shape)
        ab = [
            self.broadcast_to(self.cast(x if isinstance(x, Node) else self.full(x, dtype), dtype), shape)
            for x in (a, b)
        ]
        return self.add(Op.WHERE, (c, *ab), dtype, shape)


def unique_name(name: str, used: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``... the first not in ``used``; recorded there."""
    out, k = name, 1
    while out in used:
        out, k = f"{name}_{k}", k + 1
    used.add(out)
    return out
