"""The kernel interpreter against plain numpy/torch, on hand-built Programs with a symbolic batch.

The Programs here (``CASES``) are shared with test_codegen_cpp.py, which checks compiled C++ against
this interpreter and the same numpy references.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import sympy
from aotc_build import kernel as K
from aotc_build.ir import DType, Op, Symbol
from aotc_build.kernel_interp import eval_index, run_program

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs  # the Triton backend's cases (tests/gpu/programs.py)

S0 = sympy.Symbol("s0", integer=True, positive=True)
SYMBOLS = [Symbol("s0", "batch", 1, 64)]
i0, i1, i2, i3 = K.loop_vars("i", 4)
r0, r1 = K.loop_vars("r", 2)
f32, f64, i64, b1 = DType.f32, DType.f64, DType.i64, DType.bool
S0_VALUES = (2, 5)

Array = np.ndarray


# ---- builders ------------------------------------------------------------------------------------------


def ld(buf: str, index: object, dt: DType = f32) -> K.Load:
    return K.Load(buf, K.Index(sympy.sympify(index)), dt)


def idx(e: object, dt: DType = i64) -> K.Index:
    return K.Index(sympy.sympify(e), dt)


def c(v: float | int | bool, dt: DType = f32) -> K.Const:
    return K.Const(v, dt)


def un(op: Op, x: K.Value, dt: DType | None = None) -> K.Unary:
    return K.Unary(op, x, dt or x.dtype)


def bn(op: Op, a: K.Value, b: K.Value) -> K.Binary:
    return K.Binary(op, a, b, b1 if op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE) else a.dtype)


def buf(name: str, dt: DType, shape: tuple, kind: str) -> K.Buffer:
    return K.Buffer(name, dt, tuple(shape), kind)


def st(b: str, index: object, value: K.Value) -> K.Store:
    return K.Store(b, sympy.sympify(index), value)


@dataclass
class Case:
    name: str
    prog: K.Plan
    make: Callable[[int, np.random.Generator], tuple[list[Array], list[Array]]]  # -> inputs, weights
    ref: Callable[[list[Array], list[Array]], list[Array]]  # plain numpy/torch outputs
    rtol: float = 1e-5
    atol: float = 1e-6


def program(
    inputs: list,
    outputs: list,
    weights: list,
    kernels: list,
    *,
    arena: list | None = None,
    offsets: dict | None = None,
    size: object = 0,
) -> K.Plan:
    return K.Plan(SYMBOLS, inputs, outputs, weights, arena or [], kernels, {}, offsets or {}, size)


def rnd(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0) -> Array:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# ---- the cases ------------------------------------------------------------------------------------------


def _pointwise() -> Case:
    xv, bv = ld("x", i0 * 15 + i2 * 5 + i1), ld("b", i1)
    y = bn(Op.ADD, bn(Op.MUL, un(Op.EXP, xv), bv), c(1.0))
    z = bn(Op.DIV, un(Op.CAST, xv, f64), un(Op.CAST, bv, f64))
    k = K.Pointwise("pw", (S0, 5, 3), (st("y", i0 * 15 + i1 * 3 + i2, y), st("z", i0 * 15 + i1 * 3 + i2, z)))
    prog = program(
        [buf("x", f32, (S0, 3, 5), "input")],
        [buf("y", f32, (S0, 5, 3), "output"), buf("z", f64, (S0, 5, 3), "output")],
        [buf("b", f32, (5,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        xt, b = ins[0].transpose(0, 2, 1), ws[0]
        return [np.exp(xt) * b[:, None] + 1, xt.astype(np.float64) / b.astype(np.float64)[:, None]]

    return Case("pointwise_permute", prog, lambda n, g: ([rnd(g, n, 3, 5)], [rnd(g, 5, lo=0.5, hi=1.5)]), ref)


def _pad() -> Case:
    inside = bn(
        Op.AND,
        bn(Op.AND, bn(Op.GE, idx(i1), idx(1)), bn(Op.LT, idx(i1), idx(5))),
        bn(Op.AND, bn(Op.GE, idx(i2), idx(2)), bn(Op.LT, idx(i2), idx(8))),
    )
    body = bn(Op.MUL, ld("x", i0 * 24 + (i1 - 1) * 6 + (i2 - 2)), c(2.0))
    v = bn(Op.ADD, K.Masked(inside, body, -1.5, f32), c(0.25))
    k = K.Pointwise(
        "pad",
        (S0, 7, 9),
        (st("y", i0 * 63 + i1 * 9 + i2, v), st("iota", i0 * 63 + i1 * 9 + i2, idx(i1 * 9 + i2))),
    )
    prog = program(
        [buf("x", f32, (S0, 4, 6), "input")],
        [buf("y", f32, (S0, 7, 9), "output"), buf("iota", i64, (S0, 7, 9), "output")],
        [],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        n = ins[0].shape[0]
        pad = np.pad(ins[0] * 2, ((0, 0), (1, 2), (2, 1)), constant_values=-1.5) + np.float32(0.25)
        return [pad, np.broadcast_to(np.arange(63).reshape(7, 9), (n, 7, 9))]

    return Case("masked_pad", prog, lambda n, g: ([rnd(g, n, 4, 6)], []), ref)


def _gather() -> Case:
    row = K.Load("ids", idx(i0 * 5 + i1), i64)
    v = K.Load("emb", bn(Op.ADD, bn(Op.MUL, row, c(8, i64)), idx(i2)), f32)
    k = K.Pointwise("embed", (S0, 5, 8), (st("y", i0 * 40 + i1 * 8 + i2, bn(Op.MUL, v, c(3.0))),))
    prog = program(
        [buf("ids", i64, (S0, 5), "input")],
        [buf("y", f32, (S0, 5, 8), "output")],
        [buf("emb", f32, (10, 8), "weight")],
        [k],
    )
    return Case(
        "gather",
        prog,
        lambda n, g: ([g.integers(0, 10, size=(n, 5))], [rnd(g, 10, 8)]),
        lambda ins, ws: [ws[0][ins[0]] * 3],
    )


def _softmax() -> Case:
    x = ld("x", i0 * 37 + r0)
    e = un(Op.EXP, bn(Op.SUB, x, K.ReduceRef(0, f32)))
    k = K.Reduce(
        "softmax",
        (S0,),
        (37,),
        (K.Reduction(Op.RMAX, x, f32), K.Reduction(Op.SUM, e, f32)),
        (st("m", i0, K.ReduceRef(0, f32)),),
        (st("y", i0 * 37 + r0, bn(Op.DIV, e, K.ReduceRef(1, f32))),),
    )
    prog = program(
        [buf("x", f32, (S0, 37), "input")],
        [buf("y", f32, (S0, 37), "output"), buf("m", f32, (S0,), "output")],
        [],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x = ins[0].astype(np.float64)
        e = np.exp(x - x.max(1, keepdims=True))
        return [e / e.sum(1, keepdims=True), x.max(1)]

    return Case("softmax", prog, lambda n, g: ([rnd(g, n, 37, lo=-5, hi=5)], []), ref)


def _layernorm() -> Case:
    x = ld("x", i0 * 64 + r0)
    mean = bn(Op.DIV, K.ReduceRef(0, f32), c(64.0))
    d = bn(Op.SUB, x, mean)
    inv = un(Op.RSQRT, bn(Op.ADD, bn(Op.DIV, K.ReduceRef(1, f32), c(64.0)), c(1e-5)))
    y = bn(Op.ADD, bn(Op.MUL, bn(Op.MUL, d, inv), ld("w", r0)), ld("b", r0))
    k = K.Reduce(
        "layernorm",
        (S0,),
        (64,),
        (K.Reduction(Op.SUM, x, f32), K.Reduction(Op.SUM, bn(Op.MUL, d, d), f32)),
        (st("mean", i0, mean),),
        (st("y", i0 * 64 + r0, y),),
    )
    prog = program(
        [buf("x", f32, (S0, 64), "input")],
        [buf("y", f32, (S0, 64), "output"), buf("mean", f32, (S0,), "output")],
        [buf("w", f32, (64,), "weight"), buf("b", f32, (64,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x = ins[0].astype(np.float64)
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return [(x - mu) / np.sqrt(var + 1e-5) * ws[0] + ws[1], mu[:, 0]]

    return Case("layernorm", prog, lambda n, g: ([rnd(g, n, 64) + 3], [rnd(g, 64), rnd(g, 64)]), ref, 1e-4, 1e-5)


def _maxpool() -> Case:
    ih, iw = i2 * 2 - 1 + r0, i3 * 2 - 1 + r1
    ok = bn(
        Op.AND,
        bn(Op.AND, bn(Op.GE, idx(ih), idx(0)), bn(Op.LT, idx(ih), idx(7))),
        bn(Op.AND, bn(Op.GE, idx(iw), idx(0)), bn(Op.LT, idx(iw), idx(7))),
    )
    v = K.Masked(ok, ld("x", i0 * 98 + i1 * 49 + ih * 7 + iw), -math.inf, f32)
    k = K.Reduce(
        "maxpool",
        (S0, 2, 4, 4),
        (3, 3),
        (K.Reduction(Op.RMAX, v, f32),),
        (st("y", i0 * 32 + i1 * 16 + i2 * 4 + i3, K.ReduceRef(0, f32)),),
    )
    prog = program([buf("x", f32, (S0, 2, 7, 7), "input")], [buf("y", f32, (S0, 2, 4, 4), "output")], [], [k])

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        import torch

        return [torch.nn.functional.max_pool2d(torch.from_numpy(ins[0]), 3, 2, 1).numpy()]

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        x = rnd(g, n, 2, 7, 7)
        x[0, 0, 3, 3] = np.nan  # NaN propagates through max pooling
        return [x], []

    return Case("maxpool", prog, make, ref)


def _matmul() -> Case:
    a = K.Strided("a", i0 * 1920 + i1 * 640, (40, 1), f32)
    b = K.Strided("w", i1 * 960, (1, 40), f32)  # transposed weight: B[k, n] = w[i1, n, k]
    v = un(Op.RELU, bn(Op.ADD, K.Acc(), ld("bias", i3)))
    k = K.Matmul("bmm", (S0, 3), 16, 24, 40, a, b, (st("y", i0 * 1152 + i1 * 384 + i2 * 24 + i3, v),))
    prog = program(
        [buf("a", f32, (S0, 3, 16, 40), "input")],
        [buf("y", f32, (S0, 3, 16, 24), "output")],
        [buf("w", f32, (3, 24, 40), "weight"), buf("bias", f32, (24,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        acc = ins[0].astype(np.float64) @ ws[0].astype(np.float64).transpose(0, 2, 1)
        return [np.maximum(acc + ws[1], 0)]

    return Case(
        "matmul_bias_relu",
        prog,
        lambda n, g: ([rnd(g, n, 3, 16, 40)], [rnd(g, 3, 24, 40), rnd(g, 24)]),
        ref,
        1e-5,
        1e-5,
    )


def _linear_chain() -> Case:
    m = 7 * S0
    a = K.Strided("x", 0, (300, 1), f32)
    b = K.Strided("w", 0, (1, 300), f32)
    pre = bn(Op.ADD, K.Acc(), ld("b", i1))
    gelu = bn(
        Op.MUL,
        bn(Op.MUL, pre, c(0.5)),
        bn(Op.ADD, c(1.0), un(Op.ERF, bn(Op.MUL, pre, c(0.7071067811865476)))),
    )
    mm = K.Matmul("linear", (), m, 270, 300, a, b, (st("h", i0 * 270 + i1, pre), st("y", i0 * 270 + i1, gelu)))
    red = K.Reduce(
        "rowsum",
        (m,),
        (270,),
        (K.Reduction(Op.SUM, ld("h", i0 * 270 + r0), f32),),
        (st("s", i0, K.ReduceRef(0, f32)),),
    )
    prog = program(
        [buf("x", f32, (m, 300), "input")],
        [buf("y", f32, (m, 270), "output"), buf("s", f32, (m,), "output")],
        [buf("w", f32, (270, 300), "weight"), buf("b", f32, (270,), "weight")],
        [mm, red],
        arena=[buf("h", f32, (m, 270), "arena")],
        offsets={"h": 64},
        size=64 + m * 270 * 4,
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        pre = ins[0].astype(np.float64) @ ws[0].T.astype(np.float64) + ws[1]
        erf = np.vectorize(math.erf)(pre / math.sqrt(2))
        return [0.5 * pre * (1 + erf), pre.sum(1)]

    return Case(
        "linear_gelu_rowsum",
        prog,
        lambda n, g: ([rnd(g, 7 * n, 300)], [rnd(g, 270, 300), rnd(g, 270)]),
        ref,
        1e-4,
        1e-4,
    )


ConvSpec = tuple[tuple[int, int, int], int, int, int, int, tuple[int, int], int, tuple[int, int], str]


def _conv(name: str, spec: ConvSpec) -> K.Conv:
    """spec: input (C, H, W), out channels, kernel size, stride, padding, dilation, groups, out (H, W),
    epilogue ("bias", "relu" or "none")."""
    x, o, ksz, stride, pad, dil, groups, out_hw, epi = spec
    cin, h, w = x
    oh, ow = out_hw
    xs = K.Strided(f"x_{name}", 0, (cin * h * w, h * w, w, 1), f32)
    ws = K.Strided(f"w_{name}", 0, ((cin // groups) * ksz * ksz, ksz * ksz, ksz, 1), f32)
    out = i0 * (o * oh * ow) + i1 * (oh * ow) + i2 * ow + i3
    v: K.Value = K.Acc()
    if epi == "bias":
        v = bn(Op.MUL, bn(Op.ADD, v, ld(f"bias_{name}", i1)), c(0.5))
    elif epi == "relu":
        v = un(Op.RELU, v)
    return K.Conv(
        name,
        xs,
        ws,
        S0,
        cin,
        h,
        w,
        o,
        (ksz, ksz),
        (oh, ow),
        (stride, stride),
        (pad, pad),
        dil,
        groups,
        (st(f"y_{name}", out, v),),
    )


def _convs() -> Case:
    specs: dict[str, ConvSpec] = {
        "grouped": ((4, 9, 10), 6, 3, 2, 1, (1, 2), 2, (5, 4), "bias"),
        "depthwise": ((4, 8, 8), 4, 3, 1, 1, (1, 1), 4, (8, 8), "relu"),
        "pointwise": ((8, 5, 5), 3, 1, 1, 0, (1, 1), 1, (5, 5), "none"),
    }
    kernels, ins, outs, wts = [], [], [], []
    for name, spec in specs.items():
        x, o, ksz, _, _, _, g, ohw, epi = spec
        kernels.append(_conv(name, spec))
        ins.append(buf(f"x_{name}", f32, (S0, *x), "input"))
        outs.append(buf(f"y_{name}", f32, (S0, o, *ohw), "output"))
        wts.append(buf(f"w_{name}", f32, (o, x[0] // g, ksz, ksz), "weight"))
        if epi == "bias":
            wts.append(buf(f"bias_{name}", f32, (o,), "weight"))
    prog = program(ins, outs, wts, kernels)

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        xs = [rnd(g, n, *x) for x, *_ in specs.values()]
        ws = [rnd(g, *tuple(int(d) for d in b.shape)) for b in prog.weights]
        return xs, ws

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        import torch

        F = torch.nn.functional
        t = lambda a: torch.from_numpy(a).double()  # noqa: E731
        y0 = (F.conv2d(t(ins[0]), t(ws[0]), t(ws[1]), 2, 1, (1, 2), 2) * 0.5).numpy()
        y1 = F.relu(F.conv2d(t(ins[1]), t(ws[2]), None, 1, 1, 1, 4)).numpy()
        y2 = F.conv2d(t(ins[2]), t(ws[3])).numpy()
        return [y0, y1, y2]

    return Case("convs", prog, make, ref, 1e-5, 1e-5)


def _scan() -> Case:
    k = K.Scan("cumsum", (S0,), 50, ld("x", i0 * 50 + r0), f32, (st("y", i0 * 50 + r0, K.Prefix(f32)),))
    xi = un(Op.CAST, ld("n", i0 * 6 + r0, DType.i32), i64)
    ki = K.Scan("cumsum_i", (S0,), 6, xi, i64, (st("yi", i0 * 6 + r0, K.Prefix(i64)),))
    prog = program(
        [buf("x", f32, (S0, 50), "input"), buf("n", DType.i32, (S0, 6), "input")],
        [buf("y", f32, (S0, 50), "output"), buf("yi", i64, (S0, 6), "output")],
        [],
        [k, ki],
    )
    return Case(
        "scan",
        prog,
        lambda n, g: ([rnd(g, n, 50, lo=0.1, hi=1), g.integers(-9, 9, (n, 6)).astype(np.int32)], []),
        lambda ins, ws: [np.cumsum(ins[0].astype(np.float64), 1), np.cumsum(ins[1].astype(np.int64), 1)],
    )


def _intops() -> Case:
    x, y = ld("x", i0 * 6 + i1, i64), ld("y", i1, i64)
    o = i0 * 6 + i1
    logic = bn(Op.OR, bn(Op.AND, bn(Op.LT, x, c(3, i64)), bn(Op.NE, x, y)), un(Op.NOT, bn(Op.GT, x, c(10, i64))))
    stores = (
        st("div", o, bn(Op.DIV, x, y)),
        st("mod", o, bn(Op.MOD, x, y)),
        st("logic", o, logic),
        st("i32", o, bn(Op.SUB, bn(Op.MUL, un(Op.CAST, x, DType.i32), c(3, DType.i32)), c(7, DType.i32))),
        st("f", o, K.Where(bn(Op.GT, x, c(0, i64)), un(Op.CAST, x, f32), c(-1.0), f32)),
        st("i8", o, un(Op.CAST, bn(Op.MUL, x, c(13, i64)), DType.i8)),
        st("u8", o, bn(Op.ADD, un(Op.CAST, x, DType.u8), c(200, DType.u8))),
        st("mx", o, bn(Op.MAX, bn(Op.MIN, x, c(7, i64)), un(Op.NEG, y))),
    )
    dts = {
        "div": i64,
        "mod": i64,
        "logic": b1,
        "i32": DType.i32,
        "f": f32,
        "i8": DType.i8,
        "u8": DType.u8,
        "mx": i64,
    }
    prog = program(
        [buf("x", i64, (S0, 6), "input")],
        [buf(n, dt, (S0, 6), "output") for n, dt in dts.items()],
        [buf("y", i64, (6,), "weight")],
        [K.Pointwise("intops", (S0, 6), stores)],
    )

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        return [g.integers(-20, 20, (n, 6))], [np.array([3, -4, 5, -2, 7, 1], np.int64)]

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x, y = ins[0], ws[0]
        return [
            x // y,
            x % y,
            ((x < 3) & (x != y)) | ~(x > 10),
            x.astype(np.int32) * 3 - 7,
            np.where(x > 0, x.astype(np.float32), -1.0),
            (x * 13).astype(np.int8),
            x.astype(np.uint8) + np.uint8(200),
            np.maximum(np.minimum(x, 7), -y),
        ]

    return Case("intops", prog, make, ref)


UNARY_REF: dict[Op, Callable[[Array], Array]] = {
    Op.NEG: np.negative,
    Op.ABS: np.abs,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.SQRT: np.sqrt,
    Op.RSQRT: lambda x: 1 / np.sqrt(x),
    Op.TANH: np.tanh,
    Op.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    Op.ERF: np.vectorize(math.erf),
    Op.SIN: np.sin,
    Op.COS: np.cos,
    Op.RELU: lambda x: np.maximum(x, 0),
    Op.RECIP: lambda x: 1 / x,
    Op.FLOOR: np.floor,
}
BINARY_REF: dict[Op, Callable[[Array, Array], Array]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MOD: lambda a, b: np.asarray(__import__("torch").remainder(__import__("torch").from_numpy(a), __import__("torch").from_numpy(b))),
    Op.MAX: np.maximum,
    Op.MIN: np.minimum,
    Op.POW: np.power,
}


def _floatops() -> Case:
    """Every float unary and binary op in one kernel: out[k, i0, i1] = op_k(x, y)."""
    x, y = ld("x", i0 * 33 + i1), ld("y", i0 * 33 + i1)
    n = len(UNARY_REF) + len(BINARY_REF)
    stores = []
    for k, op in enumerate(UNARY_REF):
        stores.append(st("u", k * S0 * 33 + i0 * 33 + i1, un(op, x)))
    for k, op in enumerate(BINARY_REF):
        stores.append(st("u", (k + len(UNARY_REF)) * S0 * 33 + i0 * 33 + i1, bn(op, y, x)))
    prog = program(
        [buf("x", f32, (S0, 33), "input"), buf("y", f32, (S0, 33), "input")],
        [buf("u", f32, (n, S0, 33), "output")],
        [],
        [K.Pointwise("floatops", (S0, 33), tuple(stores))],
    )

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        y = rnd(g, n, 33, lo=-3, hi=3)
        y[0, 5] = np.nan  # NaN through max/min
        return [rnd(g, n, 33, lo=0.2, hi=2.0), y], []

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x, y = ins
        with np.errstate(invalid="ignore"):  # negative ** fraction is NaN, as in C
            outs = [f(x) for f in UNARY_REF.values()] + [f(y, x) for f in BINARY_REF.values()]
        return [np.stack([o.astype(np.float32) for o in outs])]

    return Case("floatops", prog, make, ref, 2e-6, 1e-6)


def _half() -> Case:
    bf, hf = DType.bf16, DType.f16
    x = ld("x", i0 * 40 + i1, bf)
    v = bn(Op.ADD, bn(Op.MUL, x, c(1.5, bf)), un(Op.EXP, x))
    k = K.Pointwise("half", (S0, 40), (st("y", i0 * 40 + i1, v), st("h", i0 * 40 + i1, un(Op.CAST, v, hf))))
    a = K.Strided("x", 0, (40, 1), bf)
    b = K.Strided("w", 0, (8, 1), bf)
    mm = K.Matmul("mm_bf16", (), S0, 8, 40, a, b, (st("z", i0 * 8 + i1, un(Op.CAST, K.Acc(), bf)),))
    prog = program(
        [buf("x", bf, (S0, 40), "input")],
        [buf("y", bf, (S0, 40), "output"), buf("h", hf, (S0, 40), "output"), buf("z", bf, (S0, 8), "output")],
        [buf("w", bf, (40, 8), "weight")],
        [k, mm],
    )
    bf16 = np.dtype(bf.numpy())

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        return [rnd(g, n, 40).astype(bf16)], [rnd(g, 40, 8).astype(bf16)]

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x, w = ins[0].astype(np.float32), ws[0].astype(np.float32)
        v = x * 1.5 + np.exp(x)
        return [v.astype(bf16), v.astype(np.float16), (x.astype(np.float64) @ w).astype(bf16)]

    return Case("half", prog, make, ref, 1e-2, 1e-2)


def _gathers_in_reduce_and_epilogue() -> Case:
    tok = K.Load("ids", idx(i0), i64)
    e = K.Load("emb", bn(Op.ADD, bn(Op.MUL, tok, c(16, i64)), idx(r0)), f32)
    red = K.Reduce(
        "embed_norm",
        (S0,),
        (16,),
        (K.Reduction(Op.SUM, bn(Op.MUL, e, e), f32),),
        (),
        (st("n", i0 * 16 + r0, bn(Op.MUL, e, un(Op.RSQRT, K.ReduceRef(0, f32)))),),
    )
    col = K.Load("emb", bn(Op.MUL, K.Load("ids", idx(i1), i64), c(16, i64)), f32)
    mm = K.Matmul(
        "mm_gather",
        (),
        S0,
        S0,
        16,
        K.Strided("n", 0, (16, 1), f32),
        K.Strided("n", 0, (1, 16), f32),
        (st("g", i0 * S0 + i1, bn(Op.ADD, K.Acc(), col)),),
    )
    prog = program(
        [buf("ids", i64, (S0,), "input")],
        [buf("n", f32, (S0, 16), "output"), buf("g", f32, (S0, S0), "output")],
        [buf("emb", f32, (7, 16), "weight")],
        [red, mm],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        e = ws[0][ins[0]].astype(np.float64)
        n = e / np.sqrt((e * e).sum(1, keepdims=True))
        return [n, n @ n.T + ws[0][ins[0], 0][None, :]]

    return Case(
        "gathers_reduce_epilogue",
        prog,
        lambda n, g: ([g.integers(0, 7, n)], [rnd(g, 7, 16)]),
        ref,
        1e-5,
        1e-6,
    )


def _index_math() -> Case:
    """Floor/mod index math over a symbolic size, a reduction with no outer loop, a 0-d kernel."""
    j = i0
    view = K.Pointwise("view", (3 * S0,), (st("y", j, ld("x", sympy.Mod(j, S0) * 3 + sympy.floor(j / S0))),))
    total = K.Reduce(
        "total",
        (),
        (S0, 3),
        (K.Reduction(Op.SUM, ld("x", r0 * 3 + r1), f32),),
        (st("t", 0, K.ReduceRef(0, f32)),),
    )
    scalar = K.Pointwise("scalar", (), (st("z", 0, bn(Op.MUL, ld("t", 0), c(2.0))),))
    prog = program(
        [buf("x", f32, (S0, 3), "input")],
        [buf("y", f32, (3 * S0,), "output"), buf("z", f32, (), "output")],
        [],
        [view, total, scalar],
        arena=[buf("t", f32, (), "arena")],
        offsets={"t": 0},
        size=4,
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        return [ins[0].T.reshape(-1), np.asarray(ins[0].astype(np.float64).sum() * 2)]

    return Case("index_math", prog, lambda n, g: ([rnd(g, n, 3)], []), ref)


CASES = [
    _pointwise(),
    _pad(),
    _gather(),
    _softmax(),
    _layernorm(),
    _maxpool(),
    _matmul(),
    _linear_chain(),
    _convs(),
    _scan(),
    _intops(),
    _floatops(),
    _half(),
    _gathers_in_reduce_and_epilogue(),
    _index_math(),
]


def case_data(case: Case, s0: int) -> tuple[list[Array], list[Array]]:
    rng = np.random.default_rng(1000 * s0 + sum(map(ord, case.name)))
    return case.make(s0, rng)


def assert_close(got: Array, want: Array, case: Case, what: str) -> None:
    got_f = np.asarray(got).astype(np.float64) if got.dtype.kind in "fV" or got.dtype.itemsize == 2 else got
    want_f = np.asarray(want).astype(np.float64) if got.dtype.kind in "fV" or got.dtype.itemsize == 2 else want
    assert got.shape == tuple(want.shape), f"{case.name} {what}: shape {got.shape} vs {want.shape}"
    if np.asarray(got_f).dtype.kind == "f":
        np.testing.assert_allclose(got_f, want_f, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} {what}")
    else:
        np.testing.assert_array_equal(got_f, want_f, err_msg=f"{case.name} {what}")


# ---- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("s0", S0_VALUES)
def test_interp_matches_numpy(case: Case, s0: int) -> None:
    ins, ws = case_data(case, s0)
    got = run_program(case.prog, ins, ws, {"s0": s0})
    want = case.ref(ins, ws)
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, np.asarray(w), case, f"output {j} ({case.prog.outputs[j].name}) at s0={s0}")


@pytest.mark.parametrize("name", [c.__name__ for c in programs.CASES])
def test_interp_matches_numpy_on_gpu_programs(name: str) -> None:
    """The hand-made Programs the Triton backend is checked on, through the same oracle as the C++ ones."""
    case = next(f() for f in programs.CASES if f.__name__ == name)
    for env in case.trials:
        ins, ws = programs.data(case, env, seed=sum(env.values()))
        got = run_program(case.prog, list(ins.values()), list(ws.values()), env)
        want = case.ref(ins, ws)
        assert sorted(want) == sorted(b.name for b in case.prog.outputs), f"{name}: reference outputs"
        for b, g in zip(case.prog.outputs, got, strict=True):
            w = np.asarray(want[b.name])
            if g.dtype.kind == "f" or g.dtype.itemsize == 2 and g.dtype.kind == "V":
                g64 = g.astype(np.float32).astype(np.float64)
                np.testing.assert_allclose(g64, w.astype(np.float64), rtol=case.rtol, atol=case.atol, err_msg=f"{name} {b.name} {env}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{name} {b.name} {env}")


def test_eval_index_floor_mod() -> None:
    i = np.arange(-5, 6)
    x = sympy.Symbol("x", integer=True)
    np.testing.assert_array_equal(eval_index(sympy.floor(x / 3), {"x": i}), i // 3)
    np.testing.assert_array_equal(eval_index(sympy.Mod(x, 4), {"x": i}), i % 4)
    np.testing.assert_array_equal(eval_index(sympy.ceiling(x / 2), {"x": i}), -((-i) // 2))
    np.testing.assert_array_equal(eval_index(sympy.Max(x, 2) * 2, {"x": i}), np.maximum(i, 2) * 2)


def test_unmasked_out_of_range_load_is_an_error() -> None:
    k = K.Pointwise("oob", (S0,), (st("y", i0, ld("x", i0 + 1)),))
    prog = program([buf("x", f32, (S0,), "input")], [buf("y", f32, (S0,), "output")], [], [k])
    with pytest.raises(IndexError, match="oob"):
        run_program(prog, [np.ones(3, np.float32)], [], {"s0": 3})
