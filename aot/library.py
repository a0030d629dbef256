"""The library kernels of fusion: Matmul, Conv and Attention, each a template over strided operands read
straight from memory, with the root's pointwise chain above it as the epilogue.

What it is not: the choice of roots (``fusion.py``) or the epilogue's value tree (``values.py``); the templates
themselves live in codegen. Every function here raises ``Realize`` for an operand that is not in memory.
"""

from __future__ import annotations

import sympy

from . import kernel as K
from .buffers import Buffers, View
from .indexing import flat_index, reshape_index
from .ir import AttentionAttr, ConvAttr, DType, Family, Node, Op, PermuteAttr, dims_equal
from .values import Realize, ValueBuilder


def operands(f: Buffers, lib: Node) -> list[View]:
    """Each input of a library op as (buffer, offset, strides); raises Realize for one not in memory."""
    ops = []
    for x in lib.inputs:
        v = f.strided(x)
        if v is None:
            # Prefer a buffer under the views (q/k/v heads split from one projection stay views of it)
            # over a copy of the viewed operand; but attention under the views gets its own store index
            # (``attention``), so the viewed operand is realized as the attention kernel's output.
            base = x
            while base.op in Family.VIEW and base not in f.realized:
                base = base.inputs[0]
            under = base is not x and base not in f.realized and base.op is not Op.ATTENTION
            raise Realize(base if under else x, f"{lib.op.name} reads its operands from memory")
        ops.append(v)
    return ops


def rows_reshaped(lib: Node, root: Node) -> bool:
    """``root`` has a matmul's shape but for its rows, reshaped: nn.Linear over [B, L, K] is a [B * L, N]
    matmul whose bias and activation apply to [B, L, N]; the epilogue then runs over the matmul's rows."""
    if lib.op is not Op.MATMUL or len(lib.shape) != 2 or len(root.shape) < 2 or not dims_equal(lib.shape[-1], root.shape[-1]):
        return False
    rows = sympy.Mul(*(sympy.sympify(d) for d in root.shape[:-1]))
    return sympy.expand(rows - sympy.sympify(lib.shape[0])) == 0


def _epilogue(f: Buffers, root: Node, lib: Node, vars_: tuple[sympy.Symbol, ...]) -> tuple[K.Store, set[Node]]:
    """The store of ``root`` over ``lib``'s output space, reading lib's result as the accumulator (``root``
    at the same position of its own shape when only the rows are reshaped)."""
    ranges = dict(zip(vars_, lib.shape, strict=True))
    idx = vars_ if len(root.shape) == len(lib.shape) else reshape_index(vars_, root.shape, lib.shape, ranges)
    b = ValueBuilder(f, root, ranges, library=lib, library_vars=vars_)
    store = K.Store(f.realized[root], f.store_index(root, idx), b.value(root, idx))
    b.region.add(lib)
    return store, b.region


def matmul(f: Buffers, root: Node, lib: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    vars_ = K.loop_vars("i", len(lib.shape))
    (ba, oa, sa), (bb, ob, sb) = operands(f, lib)
    store, region = _epilogue(f, root, lib, vars_)
    nb = len(lib.shape) - 2
    off_a = oa + sympy.Add(*(vars_[d] * sa[d] for d in range(nb)))
    off_b = ob + sympy.Add(*(vars_[d] * sb[d] for d in range(nb)))
    x, y = lib.inputs
    kern = K.Matmul(
        name, tuple(sympy.sympify(d) for d in lib.shape[:nb]), sympy.sympify(lib.shape[-2]),
        sympy.sympify(lib.shape[-1]), sympy.sympify(x.shape[-1]),
        K.Strided(ba, off_a, (sa[nb], sa[nb + 1]), x.dtype), K.Strided(bb, off_b, (sb[nb], sb[nb + 1]), y.dtype),
        (store,),
    )  # fmt: skip
    return kern, region


def conv(f: Buffers, root: Node, lib: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    a = lib.attr
    assert isinstance(a, ConvAttr)
    vars_ = K.loop_vars("i", len(lib.shape))
    (bx, ox, sx), (bw, ow, sw) = operands(f, lib)
    store, region = _epilogue(f, root, lib, vars_)
    x, w = lib.inputs
    kern = K.Conv(
        name, K.Strided(bx, ox, sx, x.dtype), K.Strided(bw, ow, sw, w.dtype), sympy.sympify(x.shape[0]),
        int(x.shape[1]), sympy.sympify(x.shape[2]), sympy.sympify(x.shape[3]), int(lib.shape[1]),
        (int(w.shape[2]), int(w.shape[3])), (sympy.sympify(lib.shape[2]), sympy.sympify(lib.shape[3])),
        a.stride, a.padding, a.dilation, a.groups, (store,),
    )  # fmt: skip
    return kern, region


def attention(f: Buffers, root: Node, lib: Node, name: str) -> tuple[K.Kernel, set[Node]]:
    """The Attention kernel of ``lib`` stored through ``root``: a chain of permutes, reshapes and unary ops
    above it (attn.transpose(1, 2).reshape(B, L, H * E)) becomes the store index, anything else of the
    same shape an epilogue as for a matmul."""
    a = lib.attr
    assert isinstance(a, AttentionAttr)
    ops = operands(f, lib)
    nb = len(lib.shape) - 2
    vars_ = K.loop_vars("i", len(lib.shape))
    store = _through_views(f, root, lib, vars_)
    region = {lib}
    if store is None:
        if not (len(lib.shape) == len(root.shape) and all(dims_equal(x, y) for x, y in zip(lib.shape, root.shape, strict=True))):
            raise Realize(lib, "its epilogue views it in a way the store index cannot follow")
        store, epilogue = _epilogue(f, root, lib, vars_)
        region |= epilogue
    else:
        node = root
        while node is not lib:
            region.add(node)
            node = node.inputs[0]

    def operand(k: int, rows: int) -> K.Strided:
        buf, off, st = ops[k]
        off = off + sympy.Add(*(vars_[d] * st[d] for d in range(nb)))
        return K.Strided(buf, off, (st[rows], st[rows + 1]), lib.inputs[k].dtype)

    q, k, v = lib.inputs[:3]
    sym = sympy.sympify
    kern = K.Attention(
        name, tuple(sym(d) for d in lib.shape[:nb]), int(q.shape[-3]) // int(k.shape[-3]), sym(q.shape[-2]),
        sym(k.shape[-2]), sym(q.shape[-1]), sym(v.shape[-1]), operand(0, nb), operand(1, nb), operand(2, nb),
        operand(3, nb) if len(ops) > 3 else None, a.scale, a.causal, a.mask, (store,),
    )  # fmt: skip
    return kern, region


def _through_views(f: Buffers, root: Node, lib: Node, vars_: tuple[sympy.Symbol, ...]) -> K.Store | None:
    """The store of ``lib``'s value at ``vars_`` when ``root`` is lib under permutes, reshapes and unary ops
    (a reshape after a permute keeps the flat position of the permuted tensor); None otherwise."""
    chain: list[Node] = []
    node = root
    while node is not lib:
        if node is not root and node in f.realized:
            return None
        if not (node.op in (Op.PERMUTE, Op.RESHAPE) or node.op in Family.UNARY):
            return None
        chain.append(node)
        node = node.inputs[0]
    idx: tuple = vars_
    flat = None
    acc: K.Value = K.Acc(DType.f32)
    value = acc if lib.dtype is DType.f32 else K.Unary(Op.CAST, acc, lib.dtype)
    for n in reversed(chain):
        if n.op is Op.PERMUTE:
            assert isinstance(n.attr, PermuteAttr)
            if flat is not None:
                return None
            idx = tuple(idx[p] for p in n.attr.perm)
        elif n.op is Op.RESHAPE:
            flat = flat if flat is not None else flat_index(idx, n.inputs[0].shape)
        else:
            value = K.Unary(n.op, value, n.dtype)
    return K.Store(f.realized[root], flat if flat is not None else flat_index(idx, root.shape), value)
