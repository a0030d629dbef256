"""Hand-made kernel Programs with numpy references: the cases the Triton backend is checked on.

Each case is a ``kernel.Program`` built by hand (what fusion would produce), a numpy reference for its
outputs, the symbol values to run it at, and a tolerance. ``tests/test_codegen_triton.py`` compiles them
(no GPU needed); ``tests/gpu/build_artifacts.py`` turns them into cubins plus test vectors that
``tests/gpu/run_cases.py`` runs on a GPU with nothing but numpy and cffi.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import sympy
from aotc_build import kernel as K
from aotc_build.ir import DType, Op, Symbol

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)
i0, i1, i2, i3 = K.loop_vars("i", 4)
r0, r1 = K.loop_vars("r", 2)
F32 = DType.f32


@dataclass
class Case:
    name: str
    prog: K.Plan
    ref: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], dict[str, np.ndarray]]
    trials: list[dict[str, int]]  # symbol values, two per case
    rtol: float = 1e-5
    atol: float = 1e-5
    precision: str = "fp32"
    int_inputs: dict[str, int] = field(default_factory=dict)  # input name → exclusive upper bound of values


def data(case: Case, env: dict[str, int], seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs and weights for ``case`` at symbol values ``env``: integers below ``int_inputs`` where given,
    else standard normal values rounded to each buffer's dtype."""
    from aotc_build.kernel_interp import eval_index

    rng = np.random.default_rng(seed)

    def shape(b: K.Buffer) -> tuple[int, ...]:
        return tuple(int(eval_index(d, env)) for d in b.shape)

    ins = {}
    for b in case.prog.inputs:
        hi = case.int_inputs.get(b.name)
        a = rng.integers(0, hi, shape(b)) if hi else rng.standard_normal(shape(b))
        ins[b.name] = a.astype(b.dtype.numpy())
    ws = {b.name: rng.standard_normal(shape(b)).astype(np.float32).astype(b.dtype.numpy()) for b in case.prog.weights}
    return ins, ws


def sym(name: str = "s0", lo: int = 1, hi: int | None = 64) -> Symbol:
    return Symbol(name, name, lo, hi)


def buf(name: str, dtype: DType, shape: tuple, kind: str) -> K.Buffer:
    return K.Buffer(name, dtype, tuple(shape), kind)


def ld(b: str, index: sympy.Expr | K.Value, dtype: DType = F32) -> K.Load:
    return K.Load(b, index if isinstance(index, K.Index | K.Load | K.Binary) else K.Index(index), dtype)


def c(v: float | int | bool, dtype: DType = F32) -> K.Const:
    return K.Const(v, dtype)


def bin_(op: Op, a: K.Value, b: K.Value, dtype: DType | None = None) -> K.Binary:
    if dtype is None:
        dtype = DType.bool if op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR) else a.dtype
    return K.Binary(op, a, b, dtype)


def un(op: Op, x: K.Value, dtype: DType | None = None) -> K.Unary:
    return K.Unary(op, x, dtype or x.dtype)


def program(symbols, inputs, outputs, weights, kernels, *, arena=(), offsets=None, size=0) -> K.Plan:
    return K.Plan(list(symbols), list(inputs), list(outputs), list(weights), list(arena), list(kernels), {}, offsets or {}, size)


# ---- the cases -----------------------------------------------------------------------------------


def pointwise_permute() -> Case:
    """y[a, b, c] = exp(x[a, c, b]) + w[b]; z = x > 0 (bool); one kernel, broadcast + permute."""
    x = buf("x", F32, (S0, 4, 8), "input")
    w = buf("w", F32, (8,), "weight")
    y = buf("y", F32, (S0, 8, 4), "output")
    z = buf("z", DType.bool, (S0, 4, 8), "output")
    xv = ld("x", i0 * 32 + i2 * 8 + i1)
    k = K.Pointwise(
        "pw_permute",
        (S0, 8, 4),
        (
            K.Store("y", i0 * 32 + i1 * 4 + i2, bin_(Op.ADD, un(Op.EXP, xv), ld("w", i1))),
            K.Store("z", i0 * 32 + i2 * 8 + i1, bin_(Op.GT, xv, c(0.0))),
        ),
    )
    prog = program([sym()], [x], [y, z], [w], [k])

    def ref(inp, wt):
        xx = inp["x"]
        return {
            "y": np.exp(xx.transpose(0, 2, 1)) + wt["w"][None, :, None],
            "z": xx.transpose(0, 2, 1).transpose(0, 2, 1) > 0,
        }

    return Case("pointwise_permute", prog, ref, [{"s0": 3}, {"s0": 37}])


def masked_pad() -> Case:
    """y = pad(x, (1, 1), value=-1.5) along the last axis, then * 2."""
    x = buf("x", F32, (S0, 8), "input")
    y = buf("y", F32, (S0, 10), "output")
    inside = bin_(Op.AND, bin_(Op.GE, K.Index(i1), c(1, DType.i64)), bin_(Op.LT, K.Index(i1), c(9, DType.i64)))
    body = ld("x", i0 * 8 + i1 - 1)
    k = K.Pointwise(
        "pad",
        (S0, 10),
        (K.Store("y", i0 * 10 + i1, bin_(Op.MUL, K.Masked(inside, body, -1.5, F32), c(2.0))),),
    )
    prog = program([sym()], [x], [y], [], [k])
    return Case(
        "masked_pad",
        prog,
        lambda inp, wt: {"y": 2 * np.pad(inp["x"], ((0, 0), (1, 1)), constant_values=-1.5)},
        [{"s0": 2}, {"s0": 50}],
    )


def gather() -> Case:
    """y[t, :] = emb[idx[t], :] (embedding lookup: a data-dependent load)."""
    idx = buf("idx", DType.i64, (S0,), "input")
    emb = buf("emb", F32, (16, 8), "weight")
    y = buf("y", F32, (S0, 8), "output")
    row = ld("idx", i0, DType.i64)
    index = bin_(Op.ADD, bin_(Op.MUL, row, c(8, DType.i64)), K.Index(i1))
    k = K.Pointwise("gather", (S0, 8), (K.Store("y", i0 * 8 + i1, ld("emb", index)),))
    prog = program([sym()], [idx], [y], [emb], [k])
    return Case(
        "gather",
        prog,
        lambda inp, wt: {"y": wt["emb"][inp["idx"]]},
        [{"s0": 5}, {"s0": 64}],
        int_inputs={"idx": 16},
    )


def _softmax(name: str, n: sympy.Expr | int, s: list[Symbol], trials: list[dict[str, int]]) -> Case:
    x = buf("x", F32, (S0, n), "input")
    y = buf("y", F32, (S0, n), "output")
    xv = ld("x", i0 * n + r0)
    ex = un(Op.EXP, bin_(Op.SUB, xv, K.ReduceRef(0, F32)))
    k = K.Reduce(
        name,
        (S0,),
        (n,),
        (K.Reduction(Op.RMAX, xv, F32), K.Reduction(Op.SUM, ex, F32)),
        (),
        (K.Store("y", i0 * n + r0, bin_(Op.DIV, ex, K.ReduceRef(1, F32))),),
    )
    prog = program(s, [x], [y], [], [k])

    def ref(inp, wt):
        xx = inp["x"].astype(np.float64)
        e = np.exp(xx - xx.max(axis=1, keepdims=True))
        return {"y": e / e.sum(axis=1, keepdims=True)}

    return Case(name, prog, ref, trials)


def softmax() -> Case:
    return _softmax("softmax", 37, [sym()], [{"s0": 3}, {"s0": 64}])


def softmax_long() -> Case:
    """A reduce length that is symbolic and may exceed the single-pass bound: the looped form."""
    return _softmax("softmax_long", S1, [sym(), sym("s1", 1, 20000)], [{"s0": 2, "s1": 5000}, {"s0": 3, "s1": 77}])


def layer_norm() -> Case:
    """y = (x - mean) * rsqrt(var + eps) * g + b over the last axis (64); mean also stored per row."""
    n = 64
    x = buf("x", F32, (S0, n), "input")
    g = buf("g", F32, (n,), "weight")
    b = buf("b", F32, (n,), "weight")
    y = buf("y", F32, (S0, n), "output")
    mu = buf("mu", F32, (S0,), "output")
    xv = ld("x", i0 * n + r0)
    mean = bin_(Op.MUL, K.ReduceRef(0, F32), c(1.0 / n))
    d = bin_(Op.SUB, xv, mean)
    var = bin_(Op.MUL, K.ReduceRef(1, F32), c(1.0 / n))
    inv = un(Op.RSQRT, bin_(Op.ADD, var, c(1e-5)))
    out = bin_(Op.ADD, bin_(Op.MUL, bin_(Op.MUL, d, inv), ld("g", r0)), ld("b", r0))
    k = K.Reduce(
        "layer_norm",
        (S0,),
        (n,),
        (K.Reduction(Op.SUM, xv, F32), K.Reduction(Op.SUM, bin_(Op.MUL, d, d), F32)),
        (K.Store("mu", i0, mean),),
        (K.Store("y", i0 * n + r0, out),),
    )
    prog = program([sym()], [x], [y, mu], [g, b], [k])

    def ref(inp, wt):
        xx = inp["x"].astype(np.float64)
        m = xx.mean(axis=1, keepdims=True)
        v = ((xx - m) ** 2).mean(axis=1, keepdims=True)
        return {"y": (xx - m) / np.sqrt(v + 1e-5) * wt["g"] + wt["b"], "mu": m[:, 0]}

    return Case("layer_norm", prog, ref, [{"s0": 1}, {"s0": 33}], rtol=1e-4, atol=1e-5)


def _linear(name: str, dt: DType, precision: str, *, tol: float) -> Case:
    """y = relu(x @ w + b): Matmul with a bias + relu epilogue."""
    kd, nd = 96, 80
    x = buf("x", dt, (S0, kd), "input")
    w = buf("w", dt, (kd, nd), "weight")
    b = buf("b", dt, (nd,), "weight")
    y = buf("y", dt, (S0, nd), "output")
    acc = K.Acc(F32)
    bias = ld("b", i1, dt) if dt is F32 else un(Op.CAST, ld("b", i1, dt), F32)
    val = un(Op.RELU, bin_(Op.ADD, acc, bias))
    k = K.Matmul(
        name,
        (),
        S0,
        nd,
        kd,
        K.Strided("x", sympy.Integer(0), (kd, 1), dt),
        K.Strided("w", sympy.Integer(0), (nd, 1), dt),
        (K.Store("y", i0 * nd + i1, val if dt is F32 else un(Op.CAST, val, dt)),),
    )
    prog = program([sym("s0", 1, 512)], [x], [y], [w, b], [k])

    def ref(inp, wt):
        xx, ww, bb = (a.astype(np.float64) for a in (inp["x"], wt["w"], wt["b"]))
        return {"y": np.maximum(xx @ ww + bb, 0)}

    return Case(name, prog, ref, [{"s0": 7}, {"s0": 300}], rtol=tol, atol=tol, precision=precision)


def linear_relu() -> Case:
    return _linear("linear_relu", F32, "fp32", tol=1e-5)


def linear_relu_bf16() -> Case:
    return _linear("linear_relu_bf16", DType.bf16, "bf16", tol=1e-2)


def batched_matmul() -> Case:
    """y[b] = a[b] @ c[b]^T with c stored transposed (strided B operand), batch 3."""
    m, kd, nd = S0, 32, 24
    a = buf("a", F32, (3, S0, kd), "input")
    cw = buf("c", F32, (3, nd, kd), "weight")
    y = buf("y", F32, (3, S0, nd), "output")
    k = K.Matmul(
        "bmm",
        (3,),
        m,
        nd,
        kd,
        K.Strided("a", i0 * S0 * kd, (kd, 1), F32),
        K.Strided("c", i0 * nd * kd, (1, kd), F32),
        (K.Store("y", i0 * S0 * nd + i1 * nd + i2, K.Acc(F32)),),
    )
    prog = program([sym()], [a], [y], [cw], [k])
    return Case(
        "batched_matmul",
        prog,
        lambda inp, wt: {"y": inp["a"].astype(np.float64) @ wt["c"].transpose(0, 2, 1)},
        [{"s0": 5}, {"s0": 64}],
    )


def _conv_ref(x, w, b, *, stride, pad, groups):
    n, cin, h, wd = x.shape
    cout, cpg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    opg = cout // groups
    for o in range(cout):
        g = o // opg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cpg : (g + 1) * cpg, i : i + stride * oh : stride, j : j + stride * ow : stride]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return out + b[None, :, None, None]


def _conv(name: str, *, cin: int, cout: int, hw: int, ksz: int, stride: int, pad: int, groups: int) -> Case:
    oh = (hw + 2 * pad - ksz) // stride + 1
    x = buf("x", F32, (S0, cin, hw, hw), "input")
    w = buf("w", F32, (cout, cin // groups, ksz, ksz), "weight")
    b = buf("b", F32, (cout,), "weight")
    y = buf("y", F32, (S0, cout, oh, oh), "output")
    k = K.Conv(
        name,
        K.Strided("x", sympy.Integer(0), (cin * hw * hw, hw * hw, hw, 1), F32),
        K.Strided("w", sympy.Integer(0), ((cin // groups) * ksz * ksz, ksz * ksz, ksz, 1), F32),
        S0,
        cin,
        hw,
        hw,
        cout,
        (ksz, ksz),
        (oh, oh),
        (stride, stride),
        (pad, pad),
        (1, 1),
        groups,
        (K.Store("y", ((i0 * cout + i1) * oh + i2) * oh + i3, bin_(Op.ADD, K.Acc(F32), ld("b", i1))),),
    )
    prog = program([sym("s0", 1, 16)], [x], [y], [w, b], [k])
    return Case(
        name,
        prog,
        lambda inp, wt: {"y": _conv_ref(inp["x"], wt["w"], wt["b"], stride=stride, pad=pad, groups=groups)},
        [{"s0": 1}, {"s0": 3}],
        rtol=1e-5,
        atol=1e-5,
    )


def conv3x3() -> Case:
    return _conv("conv3x3", cin=3, cout=8, hw=10, ksz=3, stride=1, pad=1, groups=1)


def conv_grouped() -> Case:
    return _conv("conv_grouped", cin=4, cout=6, hw=9, ksz=3, stride=2, pad=1, groups=2)


def _cumsum(name: str, n: sympy.Expr | int, s: list[Symbol], trials: list[dict[str, int]]) -> Case:
    x = buf("x", F32, (S0, n), "input")
    y = buf("y", F32, (S0, n), "output")
    k = K.Scan(name, (S0,), n, ld("x", i0 * n + r0), F32, (K.Store("y", i0 * n + r0, K.Prefix(F32)),))
    prog = program(s, [x], [y], [], [k])
    return Case(
        name,
        prog,
        lambda inp, wt: {"y": np.cumsum(inp["x"].astype(np.float64), axis=1)},
        trials,
        rtol=1e-4,
        atol=1e-4,
    )


def cumsum() -> Case:
    return _cumsum("cumsum", 50, [sym()], [{"s0": 2}, {"s0": 40}])


def cumsum_long() -> Case:
    return _cumsum("cumsum_long", S1, [sym(), sym("s1", 1, 10000)], [{"s0": 2, "s1": 3000}, {"s0": 5, "s1": 9}])


def two_kernels_arena() -> Case:
    """t = x * 2 (arena), y = sum(t, axis=1): a launch sequence through an arena buffer."""
    x = buf("x", F32, (S0, 16), "input")
    t = buf("t", F32, (S0, 16), "arena")
    y = buf("y", F32, (S0,), "output")
    k1 = K.Pointwise("scale", (S0, 16), (K.Store("t", i0 * 16 + i1, bin_(Op.MUL, ld("x", i0 * 16 + i1), c(2.0))),))
    k2 = K.Reduce(
        "rowsum",
        (S0,),
        (16,),
        (K.Reduction(Op.SUM, ld("t", i0 * 16 + r0), F32),),
        (K.Store("y", i0, K.ReduceRef(0, F32)),),
    )
    prog = program([sym()], [x], [y], [], [k1, k2], arena=[t], offsets={"t": 0}, size=64 * S0)
    return Case(
        "two_kernels_arena",
        prog,
        lambda inp, wt: {"y": 2 * inp["x"].astype(np.float64).sum(axis=1)},
        [{"s0": 1}, {"s0": 50}],
    )


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x.astype(np.float64))


FLOAT_UNARY: list[tuple[Op, Callable[[np.ndarray], np.ndarray]]] = [
    (Op.NEG, np.negative), (Op.ABS, np.abs), (Op.EXP, np.exp), (Op.LOG, np.log), (Op.SQRT, np.sqrt),
    (Op.RSQRT, lambda a: 1 / np.sqrt(a)), (Op.TANH, np.tanh), (Op.SIGMOID, lambda a: 1 / (1 + np.exp(-a))),
    (Op.ERF, _erf), (Op.SIN, np.sin), (Op.COS, np.cos), (Op.RELU, lambda a: np.maximum(a, 0)),
    (Op.RECIP, lambda a: 1 / a), (Op.FLOOR, np.floor),
]  # fmt: skip
FLOAT_BINARY: list[tuple[Op, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
    (Op.ADD, np.add), (Op.SUB, np.subtract), (Op.MUL, np.multiply), (Op.DIV, np.divide),
    (Op.MOD, lambda a, b: a - b * np.floor(a / b)), (Op.MAX, np.maximum), (Op.MIN, np.minimum), (Op.POW, np.power),
]  # fmt: skip


def elementwise_ops() -> Case:
    """Every float unary and binary op of the IR, one slice of the output each (x > 0 keeps logs defined)."""
    n = 64
    ops = len(FLOAT_UNARY) + len(FLOAT_BINARY)
    x = buf("x", F32, (S0, n), "input")
    z = buf("z", F32, (S0, n), "input")
    y = buf("y", F32, (ops, S0, n), "output")
    xv = bin_(Op.ADD, un(Op.ABS, ld("x", i0 * n + i1)), c(0.25))  # in [0.25, ...)
    zv = ld("z", i0 * n + i1)
    stores = []
    for k, (op, _) in enumerate(FLOAT_UNARY):
        arg = xv if op in (Op.LOG, Op.SQRT, Op.RSQRT) else zv
        stores.append(K.Store("y", k * S0 * n + i0 * n + i1, un(op, arg)))
    for k, (op, _) in enumerate(FLOAT_BINARY, start=len(FLOAT_UNARY)):
        v = bin_(op, xv, c(1.5)) if op is Op.POW else bin_(op, zv, xv)
        stores.append(K.Store("y", k * S0 * n + i0 * n + i1, v))
    prog = program([sym()], [x, z], [y], [], [K.Pointwise("elementwise", (S0, n), tuple(stores))])

    def ref(inp, wt):
        xa, za = np.abs(inp["x"].astype(np.float64)) + 0.25, inp["z"].astype(np.float64)
        out = [f(xa if op in (Op.LOG, Op.SQRT, Op.RSQRT) else za) for op, f in FLOAT_UNARY]
        out += [f(xa, 1.5) if op is Op.POW else f(za, xa) for op, f in FLOAT_BINARY]
        return {"y": np.stack(out)}

    return Case("elementwise_ops", prog, ref, [{"s0": 3}, {"s0": 20}], rtol=2e-6, atol=1e-6)


def integer_ops() -> Case:
    """Python semantics of integer DIV and MOD (floor), comparisons into bool, casts to and from float."""
    i64 = DType.i64
    a = buf("a", i64, (S0,), "input")
    b = buf("b", i64, (S0,), "input")
    y = buf("y", i64, (6, S0), "output")
    q = buf("q", DType.bool, (S0,), "output")
    f = buf("f", F32, (S0,), "output")
    av = bin_(Op.SUB, ld("a", i0, i64), c(20, i64))  # [-20, 20)
    bv = bin_(Op.ADD, ld("b", i0, i64), c(1, i64))  # [1, 10]
    nb = un(Op.NEG, bv)
    vals = [bin_(Op.DIV, av, bv), bin_(Op.MOD, av, bv), bin_(Op.DIV, av, nb), bin_(Op.MOD, av, nb),
            bin_(Op.MAX, av, nb), un(Op.CAST, un(Op.CAST, bin_(Op.MUL, av, c(3, i64)), F32), i64)]  # fmt: skip
    stores = [K.Store("y", k * S0 + i0, v) for k, v in enumerate(vals)]
    stores.append(K.Store("q", i0, bin_(Op.OR, bin_(Op.LT, av, nb), bin_(Op.EQ, av, c(0, i64)))))
    stores.append(K.Store("f", i0, un(Op.CAST, bin_(Op.DIV, av, bv), F32)))
    prog = program([sym()], [a, b], [y, q, f], [], [K.Pointwise("int_ops", (S0,), tuple(stores))])

    def ref(inp, wt):
        av, bv = inp["a"] - 20, inp["b"] + 1
        return {"y": np.stack([av // bv, av % bv, av // -bv, av % -bv, np.maximum(av, -bv), av * 3]),
                "q": (av < -bv) | (av == 0), "f": (av // bv).astype(np.float32)}  # fmt: skip

    return Case("integer_ops", prog, ref, [{"s0": 7}, {"s0": 300}], rtol=0, atol=0, int_inputs={"a": 40, "b": 10})


CASES: list[Callable[[], Case]] = [
    pointwise_permute,
    masked_pad,
    gather,
    softmax,
    softmax_long,
    layer_norm,
    linear_relu,
    linear_relu_bf16,
    batched_matmul,
    conv3x3,
    conv_grouped,
    cumsum,
    cumsum_long,
    two_kernels_arena,
    elementwise_ops,
    integer_ops,
]


def all_cases() -> list[Case]:
    return [f() for f in CASES]
