"""Rules for the ``com.microsoft`` fused ops that ONNX Runtime's transformer optimizer writes into files:
FastGelu, BiasGelu, Gelu, QuickGelu, BiasAdd, FusedMatMul, SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, EmbedLayerNormalization, Attention and
MultiHeadAttention (without past/present key-value caches).

Each is spelled out in IR ops with ONNX Runtime's meaning (its contrib-op documentation): attention becomes
the IR's ATTENTION op with an additive mask of ``mask_filter_value`` where ORT adds one.
What it is not: a kernel for them; fusion regroups the pieces.
"""

from __future__ import annotations

import math
from typing import Any

from ..ir import ArangeAttr, AttentionAttr, AxisAttr, Dim, DType, Node, Op, ReduceAttr, as_dim
from ..lower.movement import _slice
from ..lower.nn import matmul
from .ops_math import gelu
from .ops_nn import matmul_nd, norm
from .table import Ctx, Value, axis_of, exact_div, op

MS = "com.microsoft"


@op("FastGelu", domain=MS)
def _fast_gelu(c: Ctx) -> Value:
    x = c.t(0)
    bias = c.opt(1)
    return gelu(c, c.b.ew(Op.ADD, x, bias) if bias is not None else x, tanh=True)


@op("BiasGelu", domain=MS)
def _bias_gelu(c: Ctx) -> Value:
    return gelu(c, c.b.ew(Op.ADD, c.t(0), c.t(1)), tanh=False)


@op("Gelu", domain=MS)
def _ms_gelu(c: Ctx) -> Value:
    return gelu(c, c.t(0), tanh=False)


@op("QuickGelu", domain=MS)
def _quick_gelu(c: Ctx) -> Value:
    x = c.t(0)
    return c.b.ew(Op.MUL, x, c.b.ew(Op.SIGMOID, c.b.ew(Op.MUL, x, float(c.attr("alpha", 1.702)))))


@op("BiasAdd", domain=MS)
def _bias_add(c: Ctx) -> Value:
    return c.b.ew(Op.ADD, c.b.ew(Op.ADD, c.t(0), c.t(1)), c.t(2))


@op("FusedMatMul", domain=MS, check=lambda n, a: "transBatchA/transBatchB" if a.get("transBatchA", 0) or a.get("transBatchB", 0) else None)
def _fused_matmul(c: Ctx) -> Value:
    x, y = c.t(0), c.t(1)
    if c.attr("transA", 0):
        x = c.b.permute(x, (*range(x.type.rank - 2), x.type.rank - 1, x.type.rank - 2))
    if c.attr("transB", 0):
        y = c.b.permute(y, (*range(y.type.rank - 2), y.type.rank - 1, y.type.rank - 2))
    out = matmul_nd(c, x, y)
    alpha = float(c.attr("alpha", 1.0))
    return out if alpha == 1.0 else c.b.ew(Op.MUL, out, alpha)


def _skip_sum(c: Ctx, bias_input: int) -> Node:
    s = c.b.ew(Op.ADD, c.t(0), c.t(1))
    bias = c.opt(bias_input)
    return c.b.ew(Op.ADD, s, bias) if bias is not None else s


@op("SkipLayerNormalization", domain=MS)
def _skip_ln(c: Ctx) -> Any:
    """input + skip (+ bias), layer-normalised: outputs (y, mean, inv_std_var, the sum)."""
    s = _skip_sum(c, 4)
    y, m, rstd = norm(c, s, (s.type.rank - 1,), float(c.attr("epsilon", 1e-12)), c.t(2), c.opt(3))
    return y, m, rstd, s


@op("SkipSimplifiedLayerNormalization", domain=MS)
def _skip_rms(c: Ctx) -> Any:
    s = _skip_sum(c, 3)
    y, m, rstd = norm(c, s, (s.type.rank - 1,), float(c.attr("epsilon", 1e-12)), c.t(2), None, rms=True)
    return y, m, rstd, s


@op("SimplifiedLayerNormalization", domain=MS)
def _ms_rms(c: Ctx) -> Any:
    x = c.t(0)
    axis = axis_of(int(c.attr("axis", -1)), x.type.rank)
    y, _, rstd = norm(c, x, tuple(range(axis, x.type.rank)), float(c.attr("epsilon", 1e-5)), c.t(1), None, rms=True)
    return y, rstd


@op("LayerNormalization", domain=MS)
def _ms_ln(c: Ctx) -> Any:
    x = c.t(0)
    axis = axis_of(int(c.attr("axis", -1)), x.type.rank)
    return norm(c, x, tuple(range(axis, x.type.rank)), float(c.attr("epsilon", 1e-5)), c.t(1), c.opt(2))


@op("EmbedLayerNormalization", domain=MS)
def _embed_ln(c: Ctx) -> Any:
    """word[ids] + position[pos] (+ segment[seg]), layer-normalised; the mask index is each row's mask sum."""
    b = c.b
    ids = c.t(0)
    batch, seq = ids.shape
    word, pos_table = c.t(2), c.t(3)

    def rows(table: Node, idx: Node) -> Node:
        flat = b.cast(b.reshape(idx, (as_dim(idx.type.numel()),)), DType.i64)
        sel = b.add(Op.INDEX_SELECT, (table, flat), table.dtype, (flat.shape[0], table.shape[1]), AxisAttr(0))
        return b.reshape(sel, (*idx.shape, table.shape[1]))

    x = rows(word, ids)
    pos_ids = c.opt(8)
    if pos_ids is None:
        pos_ids = b.reshape(b.add(Op.ARANGE, (), DType.i64, (seq,), ArangeAttr(0, 1)), (1, seq))
    x = b.ew(Op.ADD, x, rows(pos_table, pos_ids))
    if c.has(1) and c.has(4):
        x = b.ew(Op.ADD, x, rows(c.t(4), c.t(1)))
    y, _, _ = norm(c, x, (2,), float(c.attr("epsilon", 1e-12)), c.t(5), c.t(6))
    mask = c.opt(7)
    if mask is not None:
        idx = b.add(Op.SUM, (b.cast(mask, DType.i32),), DType.i32, (batch,), _reduce_attr((1,)))
    else:
        idx = b.full(0, DType.i32, (batch,))
    return y, idx, x


def _reduce_attr(axes: tuple[int, ...]) -> ReduceAttr:
    return ReduceAttr(axes, False)


def _heads(c: Ctx, t: Node, batch: Dim, seq: Dim, heads: int) -> Node:
    """[B, S, heads * d] -> [B, heads, S, d]."""
    d = exact_div(t.shape[-1], heads)
    return c.b.permute(c.b.reshape(t, (batch, seq, heads, d)), (0, 2, 1, 3))


def _attend(c: Ctx, q: Node, k: Node, v: Node, heads: int, mask: Node | None, causal: bool) -> Node:
    """q [B, L, H*d], k [B, S, H*d], v [B, S, H*dv], an additive mask broadcastable to [B, H, L, S]."""
    b = c.b
    batch, lq, sk = q.shape[0], q.shape[1], k.shape[1]
    qh, kh, vh = _heads(c, q, batch, lq, heads), _heads(c, k, batch, sk, heads), _heads(c, v, batch, sk, heads)
    hd = qh.shape[-1]
    if c.attr("scale") is not None and float(c.attr("scale")) != 0.0:
        scale = float(c.attr("scale"))
    elif isinstance(hd, int):
        scale = 1.0 / math.sqrt(hd)
    else:
        raise c.fail("a dynamic head size without a scale attribute")
    ins = [qh, kh, vh]
    kind = "none"
    if mask is not None:
        kind = "add"
        ins.append(b.broadcast_to(b.cast(mask, q.dtype), (batch, heads, lq, sk)))
    out = b.add(Op.ATTENTION, ins, q.dtype, (batch, heads, lq, vh.shape[-1]), AttentionAttr(scale, causal, kind))
    return b.reshape(b.permute(out, (0, 2, 1, 3)), (batch, lq, as_dim(heads * vh.shape[-1])))


def _key_mask(c: Ctx, m: Node, batch: Dim, lq: Dim, sk: Dim) -> Node:
    """ORT's mask_index forms as an additive fp32 mask broadcastable to [B, H, L, S]: raw 0/1 masks of shape
    [B, S] or [B, L, S] (0 masks with mask_filter_value), or [B] right-padded lengths."""
    b = c.b
    fill = float(c.attr("mask_filter_value", -10000.0))
    if m.type.rank == 1:
        j = b.reshape(b.add(Op.ARANGE, (), DType.i64, (sk,), ArangeAttr(0, 1)), (1, sk))
        keep = b.ew(Op.LT, j, b.reshape(b.cast(m, DType.i64), (batch, 1)))
        return b.reshape(b.where(keep, 0.0, fill, DType.f32), (batch, 1, 1, sk))
    if m.type.rank not in (2, 3):
        raise c.fail(f"a rank-{m.type.rank} mask_index (only [B], [B, S] and [B, L, S] are supported)")
    add = b.ew(Op.MUL, b.ew(Op.SUB, b.full(1.0, DType.f32), b.cast(m, DType.f32)), fill)
    return b.reshape(add, (batch, 1, 1, sk) if m.type.rank == 2 else (batch, 1, lq, sk))


def _no_cache(n: Any, a: dict[str, Any]) -> str | None:
    if len(n.input) > 4 and n.input[4] and n.op_type == "Attention":
        return "a past key/value input"
    if any(o for o in n.output[1:]):
        return "present key/value outputs"
    if a.get("do_rotary", 0):
        return "do_rotary=1"
    return None


@op("Attention", domain=MS, check=_no_cache)
def _attention(c: Ctx) -> Value:
    b = c.b
    x, w = c.t(0), c.t(1)
    heads = int(c.attr("num_heads"))
    batch, seq = x.shape[0], x.shape[1]
    qkv = _linear(c, x, w)
    if c.has(2):
        qkv = b.ew(Op.ADD, qkv, c.t(2))
    sizes = [int(s) for s in c.attr("qkv_hidden_sizes", [])] or [exact_div(qkv.shape[-1], 3)] * 3
    parts, start = [], 0
    for s in sizes:
        parts.append(_slice(b, qkv, 2, start, s, 1))
        start = as_dim(start + s)
    mask = _key_mask(c, c.t(3), batch, seq, seq) if c.has(3) else None
    if c.has(5):
        bias = b.cast(c.t(5), DType.f32)
        mask = bias if mask is None else b.ew(Op.ADD, b.broadcast_to(mask, (batch, heads, seq, seq)), bias)
    return _attend(c, parts[0], parts[1], parts[2], heads, mask, bool(c.attr("unidirectional", 0)))


def _linear(c: Ctx, x: Node, w: Node) -> Node:
    """[B, S, K] @ [K, N] as one 2-d matmul over the flattened rows."""
    b = c.b
    rows = b.reshape(x, (as_dim(x.shape[0] * x.shape[1]), x.shape[2]))
    out = matmul(b, rows, w, x.dtype)
    return b.reshape(out, (x.shape[0], x.shape[1], w.shape[1]))


def _mha_check(n: Any, a: dict[str, Any]) -> str | None:
    if any(i for i in n.input[6:]):
        return "past key/value inputs"
    if any(o for o in n.output[1:]):
        return "present key/value outputs"
    return None


@op("MultiHeadAttention", domain=MS, check=_mha_check)
def _mha(c: Ctx) -> Value:
    b = c.b
    q = c.t(0)
    if q.type.rank != 3 or not c.has(1) or not c.has(2) or c.t(1).type.rank != 3:
        raise c.fail("packed query/key/value layouts (only separate [B, S, D] query, key and value are supported)")
    k, v = c.t(1), c.t(2)
    heads = int(c.attr("num_heads"))
    if c.has(3):
        bias = c.t(3)
        dq, dk = q.shape[2], k.shape[2]
        q = b.ew(Op.ADD, q, _slice(b, bias, 0, 0, dq, 1))
        k = b.ew(Op.ADD, k, _slice(b, bias, 0, dq, dk, 1))
        v = b.ew(Op.ADD, v, _slice(b, bias, 0, as_dim(dq + dk), v.shape[2], 1))
    batch, lq, sk = q.shape[0], q.shape[1], k.shape[1]
    mask = _key_mask(c, c.t(4), batch, lq, sk) if c.has(4) else None
    if c.has(5):
        bias5 = b.cast(c.t(5), DType.f32)
        mask = bias5 if mask is None else b.ew(Op.ADD, b.broadcast_to(mask, (batch, heads, lq, sk)), bias5)
    return _attend(c, q, k, v, heads, mask, bool(c.attr("unidirectional", 0)))
