"""ONNX rules for the library-class and normalisation ops: MatMul, Gemm, Conv, ConvTranspose, pooling,
BatchNormalization, InstanceNormalization, GroupNormalization, LayerNormalization, Resize.

MatMul and Conv become the IR's MATMUL/CONV2D templates (``lower/nn.py``'s ``matmul`` makes batch broadcasts
explicit); ConvTranspose becomes a CONV2D over the zero-stuffed input with the flipped kernel; Resize reads
fixed source indices and weights computed here, at build time, for the static output size.
What it is not: the templates themselves (fusion and codegen pick those).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import AxisAttr, ConvAttr, Dim, DType, Node, Op, PadAttr, PoolAttr, as_dim, dims_equal
from ..lower.nn import matmul, mean, reduce
from .table import Ctx, Static, Value, axis_of, op

# ---- matmul --------------------------------------------------------------------------------------------


@op("MatMul")
def _matmul(c: Ctx) -> Value:
    return matmul_nd(c, c.t(0), c.t(1))


def matmul_nd(c: Ctx, x: Node, y: Node) -> Node:
    """numpy's matmul: a 1-d operand gains a unit dim that the result drops again."""
    b = c.b
    xs, ys = x.type.rank == 1, y.type.rank == 1
    if xs:
        x = b.reshape(x, (1, x.shape[0]))
    if ys:
        y = b.reshape(y, (y.shape[0], 1))
    out = matmul(b, x, y, x.dtype)
    if xs or ys:
        shape = list(out.shape)
        if ys:
            shape.pop(-1)
        if xs:
            shape.pop(-1 if ys else -2)
        out = b.reshape(out, tuple(shape))
    return out


@op("Gemm")
def _gemm(c: Ctx) -> Value:
    b = c.b
    x, w = c.t(0), c.t(1)
    if c.attr("transA", 0):
        x = b.permute(x, (1, 0))
    if c.attr("transB", 0):
        w = b.permute(w, (1, 0))
    out = matmul(b, x, w, x.dtype)
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    if alpha != 1.0:
        out = b.ew(Op.MUL, out, alpha)
    bias = c.opt(2)
    if bias is not None and beta != 0.0:
        out = b.ew(Op.ADD, out, bias if beta == 1.0 else b.ew(Op.MUL, bias, beta))
    return out


# ---- convolution and pooling ------------------------------------------------------------------------------


def _spatial(c: Ctx, x: Node, kernel: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """strides, dilations, and pads split into (begin, end) lists, auto_pad resolved (static sizes only)."""
    n = len(kernel)
    strides = [int(s) for s in c.attr("strides", [1] * n)]
    dil = [int(d) for d in c.attr("dilations", [1] * n)]
    pads = [int(p) for p in c.attr("pads", [0] * (2 * n))]
    lo, hi = pads[:n], pads[n:]
    auto = c.attr("auto_pad", "NOTSET")
    if auto == "VALID":
        lo, hi = [0] * n, [0] * n
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for k in range(n):
            size = x.shape[2 + k]
            if not isinstance(size, int):
                raise c.fail(f"auto_pad={auto} over a dynamic spatial size")
            out = -(-size // strides[k])
            total = max((out - 1) * strides[k] + (kernel[k] - 1) * dil[k] + 1 - size, 0)
            small, big = total // 2, total - total // 2
            lo.append(small if auto == "SAME_UPPER" else big)
            hi.append(big if auto == "SAME_UPPER" else small)
    return strides, dil, lo, hi


def _to_2d(c: Ctx, x: Node) -> Node:
    if x.type.rank == 3:
        return c.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    if x.type.rank != 4:
        raise c.fail(f"on a rank-{x.type.rank} input (1-d and 2-d only)")
    return x


def _explicit_pad(c: Ctx, x: Node, lo: list[int], hi: list[int], value: float) -> Node:
    per = ((0, 0), (0, 0), *zip(lo, hi, strict=True))
    shape = tuple(as_dim(d + a + z) for d, (a, z) in zip(x.shape, per, strict=True))
    return c.b.add(Op.PAD, (x,), x.dtype, shape, PadAttr(tuple(per), value))


def _conv_out(size: Dim, k: int, s: int, p: int, d: int) -> Dim:
    return as_dim((size + 2 * p - d * (k - 1) - 1) // s + 1)


def conv2d(c: Ctx, x: Node, w: Node, bias: Node | None, strides: list[int], dil: list[int], lo: list[int], hi: list[int],
           groups: int) -> Node:  # fmt: skip
    b = c.b
    one_d = x.type.rank == 3
    x, w = _to_2d(c, x), _to_2d(c, w)
    if one_d:
        strides, dil, lo, hi = [1, *strides], [1, *dil], [0, *lo], [0, *hi]
    if lo != hi:  # the template pads symmetrically: pad the input itself first
        x = _explicit_pad(c, x, lo, hi, 0.0)
        lo = hi = [0, 0]
    kh, kw = w.shape[2], w.shape[3]
    oh, ow = _conv_out(x.shape[2], kh, strides[0], lo[0], dil[0]), _conv_out(x.shape[3], kw, strides[1], lo[1], dil[1])
    shape = (x.shape[0], w.shape[0], oh, ow)
    attr = ConvAttr((strides[0], strides[1]), (lo[0], lo[1]), (dil[0], dil[1]), groups)
    y = b.add(Op.CONV2D, (x, b.cast(w, x.dtype)), x.dtype, shape, attr)
    if bias is not None:
        y = b.ew(Op.ADD, y, b.reshape(bias, (1, bias.shape[0], 1, 1)))
    return b.reshape(y, (shape[0], shape[1], shape[3])) if one_d else y


@op("Conv")
def _conv(c: Ctx) -> Value:
    x, w = c.t(0), c.t(1)
    kernel = [int(k) for k in c.attr("kernel_shape", list(w.shape[2:]))]
    strides, dil, lo, hi = _spatial(c, x, kernel)
    return conv2d(c, x, w, c.opt(2), strides, dil, lo, hi, int(c.attr("group", 1)))


def _check_conv_transpose(n: Any, a: dict[str, Any]) -> str | None:
    if "output_shape" in a:
        return "output_shape (give pads and output_padding instead)"
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"auto_pad={a['auto_pad']!r}"
    return None


@op("ConvTranspose", check=_check_conv_transpose)
def _conv_transpose(c: Ctx) -> Value:
    """A strided transposed convolution is a stride-1 convolution over the input with (stride - 1) zeros
    between neighbours, padded by dilation * (kernel - 1) - pad, with the kernel flipped and its in/out
    channels swapped per group."""
    ws = c.static(1)
    if ws is None or ws.symbolic:
        raise c.fail("its weight is computed at run time; aotc needs ConvTranspose weights as initializers")
    x = c.t(0)
    one_d = x.type.rank == 3
    x = _to_2d(c, x)
    wv = ws.value if not one_d else ws.value[:, :, None, :]
    groups = int(c.attr("group", 1))
    cin, cout_g, kh, kw = wv.shape
    kernel = [kh, kw]
    n = 1 if one_d else 2
    strides = [int(s) for s in c.attr("strides", [1] * n)]
    dil = [int(d) for d in c.attr("dilations", [1] * n)]
    pads = [int(p) for p in c.attr("pads", [0] * (2 * n))]
    outpad = [int(p) for p in c.attr("output_padding", [0] * n)]
    if c.attr("auto_pad", "NOTSET") == "VALID":
        pads = [0] * (2 * n)
    lo, hi = pads[:n], pads[n:]
    if one_d:
        strides, dil, lo, hi, outpad = [1, *strides], [1, *dil], [0, *lo], [0, *hi], [0, *outpad]
    flipped = wv[:, :, ::-1, ::-1].reshape(groups, cin // groups, cout_g, kh, kw).transpose(0, 2, 1, 3, 4)
    w = c.imp.tensor(Static(np.ascontiguousarray(flipped.reshape(groups * cout_g, cin // groups, kh, kw)), ws.dtype,
                            f"{ws.name or 'weight'}.flipped"), c.b)  # fmt: skip
    b = c.b
    nb, ch, h, wd = x.shape
    sh, sw = strides
    if sh > 1 or sw > 1:  # zero-stuff: [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw], then merged
        y = b.reshape(x, (nb, ch, h, 1, wd, 1))
        per = ((0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1))
        y = b.add(Op.PAD, (y,), x.dtype, (nb, ch, h, sh, wd, sw), PadAttr(per, 0.0))
        x = b.reshape(y, (nb, ch, as_dim(h * sh), as_dim(wd * sw)))
    before = [dil[k] * (kernel[k] - 1) - lo[k] for k in range(2)]
    after = [dil[k] * (kernel[k] - 1) - hi[k] + outpad[k] - (strides[k] - 1) for k in range(2)]
    x = _explicit_pad(c, x, before, after, 0.0)
    out = conv2d(c, x, w, c.opt(2), [1, 1], dil, [0, 0], [0, 0], groups)
    return b.reshape(out, (out.shape[0], out.shape[1], out.shape[3])) if one_d else out


def _pool_out(c: Ctx, size: Dim, k: int, s: int, p: int, d: int, ceil: bool) -> Dim:
    eff = d * (k - 1) + 1
    if not isinstance(size, int):
        if ceil:
            raise c.fail("ceil_mode over a dynamic spatial size")
        return as_dim((size + 2 * p - eff) // s + 1)
    num = size + 2 * p - eff
    o = (-(-num // s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= size + p:  # the last window must start inside the input or its left padding
        o -= 1
    return o


def _check_pool(n: Any, a: dict[str, Any]) -> str | None:
    if n.op_type == "MaxPool" and len(n.output) > 1 and n.output[1]:
        return "its Indices output"
    if a.get("storage_order", 0):
        return "storage_order=1"
    return None


@op("MaxPool", "AveragePool", check=_check_pool)
def _pool(c: Ctx) -> Value:
    x = c.t(0)
    one_d = x.type.rank == 3
    kernel = [int(k) for k in c.attr("kernel_shape")]
    strides, dil, lo, hi = _spatial(c, x, kernel)
    x = _to_2d(c, x)
    if one_d:
        kernel, strides, dil, lo, hi = [1, *kernel], [1, *strides], [1, *dil], [0, *lo], [0, *hi]
    is_max = c.node.op_type == "MaxPool"
    include = bool(c.attr("count_include_pad", 0))
    if lo != hi:
        if not is_max and not include:
            raise c.fail("asymmetric pads with count_include_pad=0")
        x = _explicit_pad(c, x, lo, hi, float(np.finfo(np.float32).min) if is_max else 0.0)
        lo = hi = [0, 0]
    ceil = bool(c.attr("ceil_mode", 0))
    shape = (x.shape[0], x.shape[1], *(_pool_out(c, x.shape[2 + k], kernel[k], strides[k], lo[k], dil[k], ceil) for k in range(2)))
    attr = PoolAttr("max" if is_max else "avg", (kernel[0], kernel[1]), (strides[0], strides[1]), (lo[0], lo[1]),
                    (dil[0], dil[1]), ceil, include)  # fmt: skip
    y = c.b.add(Op.POOL2D, (x,), x.dtype, shape, attr)
    return c.b.reshape(y, (shape[0], shape[1], shape[3])) if one_d else y


@op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: Ctx) -> Value:
    x = c.t(0)
    axes = tuple(range(2, x.type.rank))
    if c.node.op_type == "GlobalAveragePool":
        return mean(c.b, x, axes, True, x.dtype)
    return reduce(c.b, Op.RMAX, x, axes, True)


# ---- normalisation ------------------------------------------------------------------------------------


def norm(
    c: Ctx, x: Node, axes: tuple[int, ...], eps: float, scale: Node | None, bias: Node | None, rms: bool = False
) -> tuple[Node, Node, Node]:
    """(y, mean, 1/std) over ``axes`` kept as unit dims; ``rms``: no centring (SimplifiedLayerNormalization)."""
    b = c.b
    m = mean(b, x, axes, True, x.dtype)
    d = x if rms else b.ew(Op.SUB, x, m)
    var = mean(b, b.ew(Op.MUL, d, d), axes, True, x.dtype)
    rstd = b.ew(Op.RSQRT, b.ew(Op.ADD, var, eps))
    y = b.ew(Op.MUL, d, rstd)
    if scale is not None:
        y = b.ew(Op.MUL, y, b.cast(scale, y.dtype))
    if bias is not None:
        y = b.ew(Op.ADD, y, b.cast(bias, y.dtype))
    return y, m, rstd


@op("LayerNormalization")
def _layer_norm(c: Ctx) -> Any:
    x = c.t(0)
    axis = axis_of(int(c.attr("axis", -1)), x.type.rank)
    y, m, rstd = norm(c, x, tuple(range(axis, x.type.rank)), float(c.attr("epsilon", 1e-5)), c.t(1), c.opt(2))
    return y, m, rstd


@op("SimplifiedLayerNormalization")
def _rms_norm(c: Ctx) -> Any:
    x = c.t(0)
    axis = axis_of(int(c.attr("axis", -1)), x.type.rank)
    y, _, rstd = norm(c, x, tuple(range(axis, x.type.rank)), float(c.attr("epsilon", 1e-5)), c.t(1), None, rms=True)
    return y, rstd


@op("BatchNormalization", check=lambda n, a: "training_mode=1" if a.get("training_mode", 0) else None)
def _batch_norm(c: Ctx) -> Value:
    x, w, bias, m, var = (c.t(i) for i in range(5))
    b = c.b
    cshape = (1, x.shape[1]) + (1,) * (x.type.rank - 2)
    rs = b.ew(Op.RSQRT, b.ew(Op.ADD, b.reshape(var, cshape), float(c.attr("epsilon", 1e-5))))
    scale = b.ew(Op.MUL, rs, b.reshape(w, cshape))
    shift = b.ew(Op.SUB, b.reshape(bias, cshape), b.ew(Op.MUL, b.reshape(m, cshape), scale))
    return b.ew(Op.ADD, b.ew(Op.MUL, x, scale), shift)


@op("InstanceNormalization")
def _instance_norm(c: Ctx) -> Value:
    x = c.t(0)
    cshape = (1, x.shape[1]) + (1,) * (x.type.rank - 2)
    y, _, _ = norm(c, x, tuple(range(2, x.type.rank)), float(c.attr("epsilon", 1e-5)), c.b.reshape(c.t(1), cshape),
                   c.b.reshape(c.t(2), cshape))  # fmt: skip
    return y


@op("GroupNormalization")
def _group_norm(c: Ctx) -> Value:
    x = c.t(0)
    groups = int(c.attr("num_groups"))
    n, ch = x.shape[0], x.shape[1]
    if not isinstance(ch, int) or ch % groups:
        raise c.fail(f"{ch} channels in {groups} groups")
    if any(not isinstance(d, int) for d in x.shape[2:]):
        raise c.fail("over a dynamic spatial size")
    b = c.b
    g = b.reshape(x, (n, groups, ch // groups * math.prod(x.shape[2:])))
    y, _, _ = norm(c, g, (2,), float(c.attr("epsilon", 1e-5)), None, None)
    y = b.reshape(y, x.shape)
    scale, bias = c.t(1), c.t(2)
    if scale.shape[0] == groups and groups != ch:  # opset 18: one scale per group
        scale = b.reshape(b.broadcast_to(b.reshape(scale, (groups, 1)), (groups, ch // groups)), (ch,))
        bias = b.reshape(b.broadcast_to(b.reshape(bias, (groups, 1)), (groups, ch // groups)), (ch,))
    cshape = (1, ch) + (1,) * (x.type.rank - 2)
    return b.ew(Op.ADD, b.ew(Op.MUL, y, b.reshape(scale, cshape)), b.reshape(bias, cshape))


# ---- resize ----------------------------------------------------------------------------------------


def _check_resize(n: Any, a: dict[str, Any]) -> str | None:
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"mode={mode!r}"
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        return f"coordinate_transformation_mode={ctm!r}"
    if a.get("antialias", 0):
        return "antialias=1"
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return f"keep_aspect_ratio_policy={a['keep_aspect_ratio_policy']!r}"
    return None


def _source(ctm: str, size_in: int, size_out: int, scale: float) -> np.ndarray:
    i = np.arange(size_out, dtype=np.float64)
    if ctm == "align_corners":
        return i * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros(size_out)
    if ctm == "asymmetric":
        return i / scale
    if ctm == "pytorch_half_pixel" and size_out == 1:
        return np.zeros(1)
    return (i + 0.5) / scale - 0.5


def _nearest(src: np.ndarray, mode: str, size_in: int) -> np.ndarray:
    if mode == "floor":
        idx = np.floor(src)
    elif mode == "ceil":
        idx = np.ceil(src)
    elif mode == "round_prefer_ceil":
        idx = np.floor(src + 0.5)
    else:  # round_prefer_floor
        idx = np.ceil(src - 0.5)
    return np.clip(idx, 0, size_in - 1).astype(np.int64)


@op("Resize", check=_check_resize)
def _resize(c: Ctx) -> Value:
    x = c.t(0)
    rank = x.type.rank
    axes = [axis_of(int(a), rank) for a in c.attr("axes", list(range(rank)))]
    sizes: list[Any] | None = None
    scales: list[float] | None = None
    if c.has(3):
        sizes = c.ints(3, "sizes")
    elif c.has(2) and c.need(2, "scales").size:
        scales = [float(v) for v in c.need(2, "scales").ravel().tolist()]
    else:
        raise c.fail("neither scales nor sizes given")
    mode = c.attr("mode", "nearest")
    ctm = c.attr("coordinate_transformation_mode", "half_pixel")
    y = c.b.cast(x, DType.f32) if mode == "linear" and x.dtype is not DType.f32 and x.dtype is not DType.f64 else x
    for k, axis in enumerate(axes):
        size_in = x.shape[axis]
        if sizes is not None:
            size_out = sizes[k]
            if dims_equal(size_out, size_in):
                continue
            scale = size_out / size_in if isinstance(size_in, int) and isinstance(size_out, int) else 1.0
        else:
            assert scales is not None
            scale = scales[k]
            if scale == 1.0:
                continue
            size_out = int(math.floor(size_in * scale)) if isinstance(size_in, int) else -1
        if not isinstance(size_in, int) or not isinstance(size_out, int):
            raise c.fail(f"resizing dynamic axis {axis}")
        src = _source(ctm, size_in, size_out, scale)
        out_shape = tuple(size_out if j == axis else d for j, d in enumerate(y.shape))
        if mode == "nearest":
            idx = _nearest(src, c.attr("nearest_mode", "round_prefer_floor"), size_in)
            sel = c.imp.tensor(Static(idx, DType.i64, "resize_index"), c.b)
            y = c.b.add(Op.INDEX_SELECT, (y, sel), y.dtype, out_shape, AxisAttr(axis))
            continue
        src = np.clip(src, 0, size_in - 1)
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, size_in - 1)
        frac = (src - lo).astype(np.float32)
        wshape = [1] * rank
        wshape[axis] = size_out
        i0 = c.imp.tensor(Static(lo, DType.i64, "resize_index"), c.b)
        i1 = c.imp.tensor(Static(hi, DType.i64, "resize_index"), c.b)
        w1 = c.imp.tensor(Static(frac.reshape(wshape).astype(y.dtype.numpy()), y.dtype, "resize_weight"), c.b)
        x0 = c.b.add(Op.INDEX_SELECT, (y, i0), y.dtype, out_shape, AxisAttr(axis))
        x1 = c.b.add(Op.INDEX_SELECT, (y, i1), y.dtype, out_shape, AxisAttr(axis))
        y = c.b.ew(Op.ADD, x0, c.b.ew(Op.MUL, c.b.ew(Op.SUB, x1, x0), w1))
    return c.b.cast(y, x.dtype)
