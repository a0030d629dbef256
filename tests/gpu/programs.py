"""The hand-made kernel Programs every backend is checked on, with numpy references: one table.

Each case is a ``kernel.Program`` built by hand (what fusion would produce), a numpy reference for its
outputs, the symbol values to run it at (``trials``), a tolerance and, where plain random inputs are wrong
for it (NaN injection, positive-only values, non-zero divisors), its own input maker (``make``).

Every case runs through the kernel interpreter (``tests/test_kernel_interp.py``), generated C++
(``tests/test_codegen_cpp.py``) and the Triton code generator and cross-compiler
(``tests/test_codegen_triton.py``, ``tests/triton_interpret.py``). ``GPU_CASES``, the ones verified on a
GPU, are what ``tests/gpu/build_artifacts.py`` turns into cubins plus test vectors that
``tests/gpu/run_cases.py`` runs with nothing but numpy and cffi; that list and its data stay fixed.
"""

from __future__ import annotations

import math
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
F32, F64, I64, BOOL = DType.f32, DType.f64, DType.i64, DType.bool
BATCH = [Symbol("s0", "batch", 1, 64)]  # the symbol of the CPU-first cases (``listed``)

Array = np.ndarray
Arrays = dict[str, np.ndarray]


@dataclass
class Case:
    name: str
    prog: K.Plan
    ref: Callable[[Arrays, Arrays], Arrays]  # (inputs, weights) by name -> outputs by name
    trials: list[dict[str, int]]  # symbol values, two per case
    rtol: float = 1e-5
    atol: float = 1e-5
    precision: str = "fp32"
    int_inputs: dict[str, int] = field(default_factory=dict)  # input name → exclusive upper bound of values
    make: Callable[[dict[str, int], np.random.Generator], tuple[Arrays, Arrays]] | None = None  # own inputs, weights


def data(case: Case, env: dict[str, int], seed: int = 0) -> tuple[Arrays, Arrays]:
    """Inputs and weights for ``case`` at symbol values ``env``: the case's own ``make`` where it has one,
    else integers below ``int_inputs`` where given, else standard normal values rounded to each buffer's dtype."""
    from aotc_build.kernel_interp import eval_index

    rng = np.random.default_rng(seed)
    if case.make is not None:
        return case.make(env, rng)

    def shape(b: K.Buffer) -> tuple[int, ...]:
        return tuple(int(eval_index(d, env)) for d in b.shape)

    ins = {}
    for b in case.prog.inputs:
        hi = case.int_inputs.get(b.name)
        a = rng.integers(0, hi, shape(b)) if hi else rng.standard_normal(shape(b))
        ins[b.name] = a.astype(b.dtype.numpy())
    ws = {b.name: rng.standard_normal(shape(b)).astype(np.float32).astype(b.dtype.numpy()) for b in case.prog.weights}
    return ins, ws


def listed(
    name: str,
    prog: K.Plan,
    make: Callable[[int, np.random.Generator], tuple[list[Array], list[Array]]],
    ref: Callable[[list[Array], list[Array]], list[Array]],
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> Case:
    """A case over ``BATCH`` run at s0 = 2 and 5 whose ``make(s0, rng)`` and ``ref`` take and give arrays in
    buffer order (inputs, weights; outputs)."""

    def named(bufs: list[K.Buffer], arrays: list[Array]) -> Arrays:
        assert len(bufs) == len(arrays), f"{name}: {len(arrays)} arrays for {len(bufs)} buffers"
        return {b.name: a for b, a in zip(bufs, arrays, strict=True)}

    def make_named(env: dict[str, int], rng: np.random.Generator) -> tuple[Arrays, Arrays]:
        ins, ws = make(env["s0"], rng)
        return named(prog.inputs, ins), named(prog.weights, ws)

    def ref_named(ins: Arrays, ws: Arrays) -> Arrays:
        outs = ref([ins[b.name] for b in prog.inputs], [ws[b.name] for b in prog.weights])
        return named(prog.outputs, outs)

    return Case(name, prog, ref_named, [{"s0": 2}, {"s0": 5}], rtol, atol, make=make_named)


# ---- builders ------------------------------------------------------------------------------------------


def sym(name: str = "s0", lo: int = 1, hi: int | None = 64) -> Symbol:
    return Symbol(name, name, lo, hi)


def buf(name: str, dtype: DType, shape: tuple, kind: str) -> K.Buffer:
    return K.Buffer(name, dtype, tuple(shape), kind)


def ld(b: str, index: object, dtype: DType = F32) -> K.Load:
    """``b[index]``: a sympy index expression, or an i64 value tree for a data-dependent load."""
    return K.Load(b, index if isinstance(index, K.Index | K.Load | K.Binary) else K.Index(sympy.sympify(index)), dtype)


def idx(e: object, dtype: DType = I64) -> K.Index:
    return K.Index(sympy.sympify(e), dtype)


def c(v: float | int | bool, dtype: DType = F32) -> K.Const:
    return K.Const(v, dtype)


def bin_(op: Op, a: K.Value, b: K.Value, dtype: DType | None = None) -> K.Binary:
    if dtype is None:
        dtype = DType.bool if op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR) else a.dtype
    return K.Binary(op, a, b, dtype)


def un(op: Op, x: K.Value, dtype: DType | None = None) -> K.Unary:
    return K.Unary(op, x, dtype or x.dtype)


def st(b: str, index: object, value: K.Value) -> K.Store:
    return K.Store(b, sympy.sympify(index), value)


def program(symbols, inputs, outputs, weights, kernels, *, arena=(), offsets=None, size=0) -> K.Plan:
    return K.Plan(list(symbols), list(inputs), list(outputs), list(weights), list(arena), list(kernels), {}, offsets or {}, size)


def rnd(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0) -> Array:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# ---- the GPU cases (verified on a GPU: their list, programs and data stay fixed) -------------------------


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


def _linear(name: str, dt: DType, precision: str, *, tol: float, kd: int = 96) -> Case:
    """y = relu(x @ w + b): Matmul with a bias + relu epilogue."""
    nd = 80
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


def linear_split_k() -> Case:
    """linear_relu with K = 512 split into 4 slices (the split-K rewrite of GPU targets): a batched Matmul
    of partial sums into an arena workspace, then a Pointwise sum that runs the bias + relu epilogue."""
    from aotc_build.codegen.triton.splitk import split_k
    from aotc_build.memory import plan_memory
    from aotc_build.options import BuildOptions

    case = _linear("linear_split_k", F32, "fp32", tol=1e-4, kd=512)
    split = split_k(case.prog, 90, BuildOptions(), decide=lambda s, sm: 4)
    assert [type(k).__name__ for k in split.kernels] == ["Matmul", "Pointwise"]
    return Case(case.name, plan_memory(split), case.ref, case.trials, case.rtol, case.atol)


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


# ---- channels-last convolutions (what fusion emits for GPU builds: passes/layout.py) ----------------------

# name: (C_in, H, W), C_out, kernel, stride, padding, dilation, groups; every kernel's epilogue is
# relu((acc + bias) * scale + residual) (in fp32) stored NHWC, the residual read NHWC (batch-norm + skip connection).
ClSpec = tuple[tuple[int, int, int], int, int, int, int, int, int]
CL_SPECS: dict[str, ClSpec] = {
    "block3x3": ((32, 6, 5), 32, 3, 1, 1, 1, 1),  # channel blocks, padded
    "pw1x1": ((24, 5, 4), 40, 1, 1, 0, 1, 1),  # a GEMM; 24 channels: a partial channel block
    "down": ((16, 7, 7), 24, 3, 2, 1, 2, 1),  # strided, dilated
    "stem": ((3, 9, 9), 16, 7, 2, 3, 1, 1),  # 3 channels: the flattened (kh, kw, c) reduction
    "grouped": ((8, 6, 6), 12, 3, 1, 1, 1, 2),  # 4 channels a group
    "dw3x3": ((20, 7, 6), 20, 3, 2, 1, 1, 20),  # depthwise: the direct kernel
    "dw7x7": ((24, 8, 8), 24, 7, 1, 3, 1, 24),  # ConvNeXt's depthwise 7x7
}


def _cl_out(spec: ClSpec) -> tuple[int, int]:
    (_, h, w), _, k, s, p, d, _ = spec
    return (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1


def _cl_weight_order(spec: ClSpec) -> tuple[int, int, int, int]:
    (cin, _, _), cout, _, _, _, _, groups = spec
    return (2, 3, 0, 1) if groups == cin == cout and groups > 1 else (0, 2, 3, 1)


def _strides_of(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides in logical order of a tensor of ``shape`` stored as ``transpose(order)`` (row-major)."""
    stored = [shape[p] for p in order]
    st = [int(np.prod(stored[k + 1 :])) for k in range(len(stored))]
    out = [0] * len(shape)
    for k, p in enumerate(order):
        out[p] = st[k]
    return tuple(out)


def _conv_cl(name: str, specs: dict[str, ClSpec], dtype: DType, tol: float) -> Case:
    kernels, ins, outs, wts = [], [], [], []
    for key, spec in specs.items():
        (cin, h, w), cout, k, s, p, d, groups = spec
        oh, ow = _cl_out(spec)
        xs = _strides_of((1, cin, h, w), (0, 2, 3, 1))
        ws = _strides_of((cout, cin // groups, k, k), _cl_weight_order(spec))
        ys = _strides_of((1, cout, oh, ow), (0, 2, 3, 1))
        out = i0 * (oh * ow * cout) + i1 * ys[1] + i2 * ys[2] + i3 * ys[3]
        f32 = (lambda e: e) if dtype is F32 else (lambda e: un(Op.CAST, e, F32))
        v = bin_(Op.MUL, bin_(Op.ADD, K.Acc(), f32(ld(f"b_{key}", i1, dtype))), f32(ld(f"g_{key}", i1, dtype)))
        v = un(Op.RELU, bin_(Op.ADD, v, f32(ld(f"r_{key}", out, dtype))))
        v = v if dtype is F32 else un(Op.CAST, v, dtype)
        kernels.append(K.Conv(
            f"{name}_{key}", K.Strided(f"x_{key}", 0, (h * w * cin, *xs[1:]), dtype), K.Strided(f"w_{key}", 0, ws, dtype),
            S0, cin, h, w, cout, (k, k), (oh, ow), (s, s), (p, p), (d, d), groups, (st(f"y_{key}", out, v),),
        ))  # fmt: skip
        ins += [buf(f"x_{key}", dtype, (S0, h, w, cin), "input"), buf(f"r_{key}", dtype, (S0, oh, ow, cout), "input")]
        outs.append(buf(f"y_{key}", dtype, (S0, oh, ow, cout), "output"))
        stored = tuple((cout, cin // groups, k, k)[q] for q in _cl_weight_order(spec))
        wts += [buf(f"w_{key}", dtype, stored, "weight"), buf(f"b_{key}", dtype, (cout,), "weight"),
                buf(f"g_{key}", dtype, (cout,), "weight")]  # fmt: skip
    prog = program([sym("s0", 1, 16)], ins, outs, wts, kernels)

    def ref(inp: Arrays, wt: Arrays) -> Arrays:
        import torch

        F = torch.nn.functional
        out = {}
        for key, spec in specs.items():
            _, _, _, s, p, d, groups = spec
            t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))  # noqa: E731
            x = t(inp[f"x_{key}"].astype(np.float32)).permute(0, 3, 1, 2)
            wgt = t(wt[f"w_{key}"].astype(np.float32)).permute(*np.argsort(_cl_weight_order(spec)).tolist())
            y = F.conv2d(x, wgt, None, s, p, d, groups).permute(0, 2, 3, 1)
            b, gm = (t(wt[f"{q}_{key}"].astype(np.float32)) for q in "bg")
            y = torch.relu((y + b) * gm + t(inp[f"r_{key}"].astype(np.float32)))
            out[f"y_{key}"] = y.numpy()
        return out

    return Case(name, prog, ref, [{"s0": 1}, {"s0": 3}], rtol=tol, atol=tol,
                precision="bf16" if dtype is DType.bf16 else "fp32")  # fmt: skip


def conv_channels_last() -> Case:
    return _conv_cl("conv_cl", CL_SPECS, F32, 1e-4)


def conv_channels_last_bf16() -> Case:
    keys = ("block3x3", "pw1x1", "stem", "dw3x3")
    return _conv_cl("conv_cl_bf16", {k: CL_SPECS[k] for k in keys}, DType.bf16, 5e-2)


# ---- attention (flash-style kernels: the L x S scores never reach memory) -------------------------------


def attention_ref(q: Array, k: Array, v: Array, keep: Array | None = None, add: Array | None = None, *,
                  scale: float, causal: bool = False) -> Array:  # fmt: skip
    """softmax(q k^T * scale + add, where keep) @ v in float64 over [..., H, L, E]; kv heads repeat for GQA;
    a row with no key left gives zeros."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if add is not None:
        s = s + add
    ok = np.ones(s.shape, bool)
    if keep is not None:
        ok &= keep
    if causal:
        ok &= np.tril(np.ones(s.shape[-2:], bool))
    s = np.where(ok, s, -np.inf)
    top = s.max(-1, keepdims=True)
    p = np.where(ok, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    total = p.sum(-1, keepdims=True)
    return (p / np.where(total > 0, total, 1)) @ v


def attention_causal_gqa() -> Case:
    """Causal GQA (4 query heads over 2 kv heads) with a dynamic length; the epilogue stores through
    attn.transpose(1, 2).reshape(B, L, H * E), as transformers do."""
    L = S0
    q = K.Strided("q", i0 * 4 * L * 32 + i1 * L * 32, (32, 1), F32)
    kk = K.Strided("k", i0 * 2 * L * 32 + i1 * L * 32, (32, 1), F32)  # i1 names the kv head here
    v = K.Strided("v", i0 * 2 * L * 32 + i1 * L * 32, (32, 1), F32)
    store = st("y", i0 * L * 128 + i2 * 128 + i1 * 32 + i3, K.Acc())
    k = K.Attention("attn_causal_gqa", (2, 4), 2, L, L, 32, 32, q, kk, v, None, 32**-0.5, True, "none", (store,))
    prog = program(
        [sym("s0", 1, 256)],
        [buf("q", F32, (2, 4, L, 32), "input"), buf("k", F32, (2, 2, L, 32), "input"), buf("v", F32, (2, 2, L, 32), "input")],
        [buf("y", F32, (2, L, 128), "output")],
        [],
        [k],
    )

    def ref(inp: Arrays, wt: Arrays) -> Arrays:
        o = attention_ref(inp["q"], inp["k"], inp["v"], scale=32**-0.5, causal=True)
        return {"y": o.transpose(0, 2, 1, 3).reshape(2, -1, 128)}

    return Case("attention_causal_gqa", prog, ref, [{"s0": 5}, {"s0": 70}], rtol=1e-4, atol=1e-4)


def attention_mask_bf16() -> Case:
    """bf16, L != S (two symbols), a bool mask [B, L, S] broadcast over heads (head stride 0) with one row
    masked everywhere (zeros), the result rounded to bf16 by the epilogue."""
    L, S = S0, S1
    bf = DType.bf16
    q = K.Strided("q", i0 * 3 * L * 64 + i1 * L * 64, (64, 1), bf)
    kk = K.Strided("k", i0 * 3 * S * 64 + i1 * S * 64, (64, 1), bf)
    v = K.Strided("v", i0 * 3 * S * 64 + i1 * S * 64, (64, 1), bf)
    m = K.Strided("m", i0 * L * S, (S, 1), BOOL)
    store = st("y", i0 * 3 * L * 64 + i1 * L * 64 + i2 * 64 + i3, un(Op.CAST, K.Acc(), bf))
    k = K.Attention("attn_mask_bf16", (2, 3), 1, L, S, 64, 64, q, kk, v, m, 0.125, False, "bool", (store,))
    prog = program(
        [sym("s0", 1, 256), sym("s1", 1, 256)],
        [buf("q", bf, (2, 3, L, 64), "input"), buf("k", bf, (2, 3, S, 64), "input"), buf("v", bf, (2, 3, S, 64), "input"),
         buf("m", BOOL, (2, L, S), "input")],  # fmt: skip
        [buf("y", bf, (2, 3, L, 64), "output")],
        [],
        [k],
    )
    bf16 = np.dtype(bf.numpy())

    def make(env: dict[str, int], g: np.random.Generator) -> tuple[Arrays, Arrays]:
        lq, lk = env["s0"], env["s1"]
        mask = g.uniform(size=(2, lq, lk)) > 0.3
        mask[1, min(3, lq - 1), :] = False
        ins = {n: rnd(g, 2, 3, n_, 64).astype(bf16) for n, n_ in (("q", lq), ("k", lk), ("v", lk))}
        return {**ins, "m": mask}, {}

    def ref(inp: Arrays, wt: Arrays) -> Arrays:
        return {"y": attention_ref(inp["q"], inp["k"], inp["v"], inp["m"][:, None], scale=0.125)}

    return Case("attention_mask_bf16", prog, ref, [{"s0": 7, "s1": 19}, {"s0": 130, "s1": 67}], rtol=2e-2, atol=2e-2,
                precision="bf16", make=make)  # fmt: skip


def attention_additive() -> Case:
    """Causal with L > S (rows past S see every key), an additive mask [B, 1, L, S] (head stride 0), Ev != E,
    an explicit scale and a bias epilogue."""
    q = K.Strided("q", i0 * 2 * 9 * 16 + i1 * 9 * 16, (16, 1), F32)
    kk = K.Strided("k", i0 * 2 * 6 * 16 + i1 * 6 * 16, (16, 1), F32)
    v = K.Strided("v", i0 * 2 * 6 * 24 + i1 * 6 * 24, (24, 1), F32)
    m = K.Strided("m", i0 * 9 * 6, (6, 1), F32)
    val = bin_(Op.ADD, K.Acc(), ld("bias", i3))
    store = st("y", i0 * 2 * 9 * 24 + i1 * 9 * 24 + i2 * 24 + i3, val)
    k = K.Attention("attn_additive", (S0, 2), 1, 9, 6, 16, 24, q, kk, v, m, 0.3, True, "add", (store,))
    prog = program(
        BATCH,
        [buf("q", F32, (S0, 2, 9, 16), "input"), buf("k", F32, (S0, 2, 6, 16), "input"),
         buf("v", F32, (S0, 2, 6, 24), "input"), buf("m", F32, (S0, 1, 9, 6), "input")],  # fmt: skip
        [buf("y", F32, (S0, 2, 9, 24), "output")],
        [buf("bias", F32, (24,), "weight")],
        [k],
    )

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        return [rnd(g, n, 2, 9, 16), rnd(g, n, 2, 6, 16), rnd(g, n, 2, 6, 24), rnd(g, n, 1, 9, 6)], [rnd(g, 24)]

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        return [attention_ref(ins[0], ins[1], ins[2], add=ins[3], scale=0.3, causal=True) + ws[0]]

    return listed("attention_additive", prog, make, ref, 1e-5, 1e-5)


def attention_packed_qkv() -> Case:
    """q, k and v read straight from one packed projection [B, L, 3 * H * E] (offsets 0, H*E, 2*H*E; row stride
    3*H*E): what fusion makes of nn.MultiheadAttention's head split (buffers.py); dynamic length, output stored
    batch-first as attn.transpose(1, 2).reshape(B, L, H * E)."""
    L, D = S0, 3 * 16

    def part(k: int) -> K.Strided:
        return K.Strided("qkv", i0 * L * 3 * D + i1 * 16 + k * D, (3 * D, 1), F32)

    store = st("y", i0 * L * D + i2 * D + i1 * 16 + i3, K.Acc())
    k = K.Attention("attn_packed_qkv", (2, 3), 1, L, L, 16, 16, part(0), part(1), part(2), None, 0.25, False, "none", (store,))
    prog = program([sym("s0", 1, 256)], [buf("qkv", F32, (2, L, 3 * D), "input")], [buf("y", F32, (2, L, D), "output")], [], [k])

    def ref(inp: Arrays, wt: Arrays) -> Arrays:
        b, n = inp["qkv"].shape[:2]
        q, kk, v = inp["qkv"].reshape(b, n, 3, 3, 16).transpose(2, 0, 3, 1, 4)  # [3][B, H, L, E]
        return {"y": attention_ref(q, kk, v, scale=0.25).transpose(0, 2, 1, 3).reshape(b, n, D)}

    return Case("attention_packed_qkv", prog, ref, [{"s0": 5}, {"s0": 70}], rtol=1e-4, atol=1e-4)


GPU_CASES: list[Callable[[], Case]] = [
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
    conv_channels_last,
    conv_channels_last_bf16,
    attention_causal_gqa,
    attention_mask_bf16,
]


# ---- the CPU-first cases (NaN, dtypes, dilation, gathers in epilogues, 0-d kernels, ...) -----------------


def pointwise_cast_f64() -> Case:
    xv, bv = ld("x", i0 * 15 + i2 * 5 + i1), ld("b", i1)
    y = bin_(Op.ADD, bin_(Op.MUL, un(Op.EXP, xv), bv), c(1.0))
    z = bin_(Op.DIV, un(Op.CAST, xv, F64), un(Op.CAST, bv, F64))
    k = K.Pointwise("pw", (S0, 5, 3), (st("y", i0 * 15 + i1 * 3 + i2, y), st("z", i0 * 15 + i1 * 3 + i2, z)))
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 3, 5), "input")],
        [buf("y", F32, (S0, 5, 3), "output"), buf("z", F64, (S0, 5, 3), "output")],
        [buf("b", F32, (5,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        xt, b = ins[0].transpose(0, 2, 1), ws[0]
        return [np.exp(xt) * b[:, None] + 1, xt.astype(np.float64) / b.astype(np.float64)[:, None]]

    return listed("pointwise_cast_f64", prog, lambda n, g: ([rnd(g, n, 3, 5)], [rnd(g, 5, lo=0.5, hi=1.5)]), ref)


def masked_pad_2d() -> Case:
    inside = bin_(
        Op.AND,
        bin_(Op.AND, bin_(Op.GE, idx(i1), idx(1)), bin_(Op.LT, idx(i1), idx(5))),
        bin_(Op.AND, bin_(Op.GE, idx(i2), idx(2)), bin_(Op.LT, idx(i2), idx(8))),
    )
    body = bin_(Op.MUL, ld("x", i0 * 24 + (i1 - 1) * 6 + (i2 - 2)), c(2.0))
    v = bin_(Op.ADD, K.Masked(inside, body, -1.5, F32), c(0.25))
    k = K.Pointwise(
        "pad",
        (S0, 7, 9),
        (st("y", i0 * 63 + i1 * 9 + i2, v), st("iota", i0 * 63 + i1 * 9 + i2, idx(i1 * 9 + i2))),
    )
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 4, 6), "input")],
        [buf("y", F32, (S0, 7, 9), "output"), buf("iota", I64, (S0, 7, 9), "output")],
        [],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        n = ins[0].shape[0]
        pad = np.pad(ins[0] * 2, ((0, 0), (1, 2), (2, 1)), constant_values=-1.5) + np.float32(0.25)
        return [pad, np.broadcast_to(np.arange(63).reshape(7, 9), (n, 7, 9))]

    return listed("masked_pad_2d", prog, lambda n, g: ([rnd(g, n, 4, 6)], []), ref)


def gather_scaled() -> Case:
    row = K.Load("ids", idx(i0 * 5 + i1), I64)
    v = K.Load("emb", bin_(Op.ADD, bin_(Op.MUL, row, c(8, I64)), idx(i2)), F32)
    k = K.Pointwise("embed", (S0, 5, 8), (st("y", i0 * 40 + i1 * 8 + i2, bin_(Op.MUL, v, c(3.0))),))
    prog = program(
        BATCH,
        [buf("ids", I64, (S0, 5), "input")],
        [buf("y", F32, (S0, 5, 8), "output")],
        [buf("emb", F32, (10, 8), "weight")],
        [k],
    )
    return listed(
        "gather_scaled",
        prog,
        lambda n, g: ([g.integers(0, 10, size=(n, 5))], [rnd(g, 10, 8)]),
        lambda ins, ws: [ws[0][ins[0]] * 3],
    )


def softmax_rowmax() -> Case:
    x = ld("x", i0 * 37 + r0)
    e = un(Op.EXP, bin_(Op.SUB, x, K.ReduceRef(0, F32)))
    k = K.Reduce(
        "softmax",
        (S0,),
        (37,),
        (K.Reduction(Op.RMAX, x, F32), K.Reduction(Op.SUM, e, F32)),
        (st("m", i0, K.ReduceRef(0, F32)),),
        (st("y", i0 * 37 + r0, bin_(Op.DIV, e, K.ReduceRef(1, F32))),),
    )
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 37), "input")],
        [buf("y", F32, (S0, 37), "output"), buf("m", F32, (S0,), "output")],
        [],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x = ins[0].astype(np.float64)
        e = np.exp(x - x.max(1, keepdims=True))
        return [e / e.sum(1, keepdims=True), x.max(1)]

    return listed("softmax_rowmax", prog, lambda n, g: ([rnd(g, n, 37, lo=-5, hi=5)], []), ref)


def layernorm() -> Case:
    x = ld("x", i0 * 64 + r0)
    mean = bin_(Op.DIV, K.ReduceRef(0, F32), c(64.0))
    d = bin_(Op.SUB, x, mean)
    inv = un(Op.RSQRT, bin_(Op.ADD, bin_(Op.DIV, K.ReduceRef(1, F32), c(64.0)), c(1e-5)))
    y = bin_(Op.ADD, bin_(Op.MUL, bin_(Op.MUL, d, inv), ld("w", r0)), ld("b", r0))
    k = K.Reduce(
        "layernorm",
        (S0,),
        (64,),
        (K.Reduction(Op.SUM, x, F32), K.Reduction(Op.SUM, bin_(Op.MUL, d, d), F32)),
        (st("mean", i0, mean),),
        (st("y", i0 * 64 + r0, y),),
    )
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 64), "input")],
        [buf("y", F32, (S0, 64), "output"), buf("mean", F32, (S0,), "output")],
        [buf("w", F32, (64,), "weight"), buf("b", F32, (64,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        x = ins[0].astype(np.float64)
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return [(x - mu) / np.sqrt(var + 1e-5) * ws[0] + ws[1], mu[:, 0]]

    return listed("layernorm", prog, lambda n, g: ([rnd(g, n, 64) + 3], [rnd(g, 64), rnd(g, 64)]), ref, 1e-4, 1e-5)


def maxpool() -> Case:
    ih, iw = i2 * 2 - 1 + r0, i3 * 2 - 1 + r1
    ok = bin_(
        Op.AND,
        bin_(Op.AND, bin_(Op.GE, idx(ih), idx(0)), bin_(Op.LT, idx(ih), idx(7))),
        bin_(Op.AND, bin_(Op.GE, idx(iw), idx(0)), bin_(Op.LT, idx(iw), idx(7))),
    )
    v = K.Masked(ok, ld("x", i0 * 98 + i1 * 49 + ih * 7 + iw), -math.inf, F32)
    k = K.Reduce(
        "maxpool",
        (S0, 2, 4, 4),
        (3, 3),
        (K.Reduction(Op.RMAX, v, F32),),
        (st("y", i0 * 32 + i1 * 16 + i2 * 4 + i3, K.ReduceRef(0, F32)),),
    )
    prog = program(BATCH, [buf("x", F32, (S0, 2, 7, 7), "input")], [buf("y", F32, (S0, 2, 4, 4), "output")], [], [k])

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        import torch

        return [torch.nn.functional.max_pool2d(torch.from_numpy(ins[0]), 3, 2, 1).numpy()]

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        x = rnd(g, n, 2, 7, 7)
        x[0, 0, 3, 3] = np.nan  # NaN propagates through max pooling
        return [x], []

    return listed("maxpool", prog, make, ref)


def pool_nhwc() -> Case:
    """Max and average (padding counted) 3x3/2 pooling over channels-last input with 70 channels (a 64-lane
    chunk and a ragged 6), a 7x9 image, a relu'd bias in the window and a NaN: the C++ reduce across lanes."""
    cc, h, w, oh, ow = 70, 7, 9, 4, 5
    ih, iw = i1 * 2 - 1 + r0, i2 * 2 - 1 + r1
    ok = bin_(
        Op.AND,
        bin_(Op.AND, bin_(Op.GE, idx(ih), idx(0)), bin_(Op.LT, idx(ih), idx(h))),
        bin_(Op.AND, bin_(Op.GE, idx(iw), idx(0)), bin_(Op.LT, idx(iw), idx(w))),
    )
    x = un(Op.RELU, bin_(Op.ADD, ld("x", i0 * h * w * cc + ih * w * cc + iw * cc + i3), ld("b", i3)))
    out = i0 * oh * ow * cc + i1 * ow * cc + i2 * cc + i3
    k = K.Reduce(
        "pool_nhwc",
        (S0, oh, ow, cc),
        (3, 3),
        (K.Reduction(Op.RMAX, K.Masked(ok, x, -math.inf, F32), F32), K.Reduction(Op.SUM, K.Masked(ok, x, 0.0, F32), F32)),
        (st("mx", out, K.ReduceRef(0, F32)), st("avg", out, bin_(Op.DIV, K.ReduceRef(1, F32), c(9.0)))),
    )
    prog = program(
        BATCH,
        [buf("x", F32, (S0, h, w, cc), "input")],
        [buf("mx", F32, (S0, oh, ow, cc), "output"), buf("avg", F32, (S0, oh, ow, cc), "output")],
        [buf("b", F32, (cc,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        import torch

        x = torch.from_numpy(np.maximum(ins[0] + ws[0], 0)).permute(0, 3, 1, 2)
        mx = torch.nn.functional.max_pool2d(x, 3, 2, 1).permute(0, 2, 3, 1).numpy()
        avg = torch.nn.functional.avg_pool2d(x, 3, 2, 1).permute(0, 2, 3, 1).numpy()
        return [mx, avg]

    def make(n: int, g: np.random.Generator) -> tuple[list[Array], list[Array]]:
        x = rnd(g, n, h, w, cc)
        x[0, 3, 4, 66] = np.nan  # NaN propagates through max pooling, in the ragged chunk
        return [x], [rnd(g, cc)]

    return listed("pool_nhwc", prog, make, ref)


def matmul_bias_relu() -> Case:
    a = K.Strided("a", i0 * 1920 + i1 * 640, (40, 1), F32)
    b = K.Strided("w", i1 * 960, (1, 40), F32)  # transposed weight: B[k, n] = w[i1, n, k]
    v = un(Op.RELU, bin_(Op.ADD, K.Acc(), ld("bias", i3)))
    k = K.Matmul("bmm", (S0, 3), 16, 24, 40, a, b, (st("y", i0 * 1152 + i1 * 384 + i2 * 24 + i3, v),))
    prog = program(
        BATCH,
        [buf("a", F32, (S0, 3, 16, 40), "input")],
        [buf("y", F32, (S0, 3, 16, 24), "output")],
        [buf("w", F32, (3, 24, 40), "weight"), buf("bias", F32, (24,), "weight")],
        [k],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        acc = ins[0].astype(np.float64) @ ws[0].astype(np.float64).transpose(0, 2, 1)
        return [np.maximum(acc + ws[1], 0)]

    return listed(
        "matmul_bias_relu",
        prog,
        lambda n, g: ([rnd(g, n, 3, 16, 40)], [rnd(g, 3, 24, 40), rnd(g, 24)]),
        ref,
        1e-5,
        1e-5,
    )


def linear_gelu_rowsum() -> Case:
    m = 7 * S0
    a = K.Strided("x", 0, (300, 1), F32)
    b = K.Strided("w", 0, (1, 300), F32)
    pre = bin_(Op.ADD, K.Acc(), ld("b", i1))
    gelu = bin_(
        Op.MUL,
        bin_(Op.MUL, pre, c(0.5)),
        bin_(Op.ADD, c(1.0), un(Op.ERF, bin_(Op.MUL, pre, c(0.7071067811865476)))),
    )
    mm = K.Matmul("linear", (), m, 270, 300, a, b, (st("h", i0 * 270 + i1, pre), st("y", i0 * 270 + i1, gelu)))
    red = K.Reduce(
        "rowsum",
        (m,),
        (270,),
        (K.Reduction(Op.SUM, ld("h", i0 * 270 + r0), F32),),
        (st("s", i0, K.ReduceRef(0, F32)),),
    )
    prog = program(
        BATCH,
        [buf("x", F32, (m, 300), "input")],
        [buf("y", F32, (m, 270), "output"), buf("s", F32, (m,), "output")],
        [buf("w", F32, (270, 300), "weight"), buf("b", F32, (270,), "weight")],
        [mm, red],
        arena=[buf("h", F32, (m, 270), "arena")],
        offsets={"h": 64},
        size=64 + m * 270 * 4,
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        pre = ins[0].astype(np.float64) @ ws[0].T.astype(np.float64) + ws[1]
        erf = np.vectorize(math.erf)(pre / math.sqrt(2))
        return [0.5 * pre * (1 + erf), pre.sum(1)]

    return listed(
        "linear_gelu_rowsum",
        prog,
        lambda n, g: ([rnd(g, 7 * n, 300)], [rnd(g, 270, 300), rnd(g, 270)]),
        ref,
        1e-4,
        1e-4,
    )


ConvSpec = tuple[tuple[int, int, int], int, int, int, int, tuple[int, int], int, tuple[int, int], str]


def _conv_kernel(name: str, spec: ConvSpec) -> K.Conv:
    """spec: input (C, H, W), out channels, kernel size, stride, padding, dilation, groups, out (H, W),
    epilogue ("bias", "relu" or "none")."""
    x, o, ksz, stride, pad, dil, groups, out_hw, epi = spec
    cin, h, w = x
    oh, ow = out_hw
    xs = K.Strided(f"x_{name}", 0, (cin * h * w, h * w, w, 1), F32)
    ws = K.Strided(f"w_{name}", 0, ((cin // groups) * ksz * ksz, ksz * ksz, ksz, 1), F32)
    out = i0 * (o * oh * ow) + i1 * (oh * ow) + i2 * ow + i3
    v: K.Value = K.Acc()
    if epi == "bias":
        v = bin_(Op.MUL, bin_(Op.ADD, v, ld(f"bias_{name}", i1)), c(0.5))
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


def convs() -> Case:
    specs: dict[str, ConvSpec] = {
        "grouped": ((4, 9, 10), 6, 3, 2, 1, (1, 2), 2, (5, 4), "bias"),
        "depthwise": ((4, 8, 8), 4, 3, 1, 1, (1, 1), 4, (8, 8), "relu"),
        "pointwise": ((8, 5, 5), 3, 1, 1, 0, (1, 1), 1, (5, 5), "none"),
    }
    kernels, ins, outs, wts = [], [], [], []
    for name, spec in specs.items():
        x, o, ksz, _, _, _, g, ohw, epi = spec
        kernels.append(_conv_kernel(name, spec))
        ins.append(buf(f"x_{name}", F32, (S0, *x), "input"))
        outs.append(buf(f"y_{name}", F32, (S0, o, *ohw), "output"))
        wts.append(buf(f"w_{name}", F32, (o, x[0] // g, ksz, ksz), "weight"))
        if epi == "bias":
            wts.append(buf(f"bias_{name}", F32, (o,), "weight"))
    prog = program(BATCH, ins, outs, wts, kernels)

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

    return listed("convs", prog, make, ref, 1e-5, 1e-5)


def scan() -> Case:
    k = K.Scan("cumsum", (S0,), 50, ld("x", i0 * 50 + r0), F32, (st("y", i0 * 50 + r0, K.Prefix(F32)),))
    xi = un(Op.CAST, ld("n", i0 * 6 + r0, DType.i32), I64)
    ki = K.Scan("cumsum_i", (S0,), 6, xi, I64, (st("yi", i0 * 6 + r0, K.Prefix(I64)),))
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 50), "input"), buf("n", DType.i32, (S0, 6), "input")],
        [buf("y", F32, (S0, 50), "output"), buf("yi", I64, (S0, 6), "output")],
        [],
        [k, ki],
    )
    return listed(
        "scan",
        prog,
        lambda n, g: ([rnd(g, n, 50, lo=0.1, hi=1), g.integers(-9, 9, (n, 6)).astype(np.int32)], []),
        lambda ins, ws: [np.cumsum(ins[0].astype(np.float64), 1), np.cumsum(ins[1].astype(np.int64), 1)],
    )


def intops() -> Case:
    x, y = ld("x", i0 * 6 + i1, I64), ld("y", i1, I64)
    o = i0 * 6 + i1
    logic = bin_(Op.OR, bin_(Op.AND, bin_(Op.LT, x, c(3, I64)), bin_(Op.NE, x, y)), un(Op.NOT, bin_(Op.GT, x, c(10, I64))))
    stores = (
        st("div", o, bin_(Op.DIV, x, y)),
        st("mod", o, bin_(Op.MOD, x, y)),
        st("logic", o, logic),
        st("i32", o, bin_(Op.SUB, bin_(Op.MUL, un(Op.CAST, x, DType.i32), c(3, DType.i32)), c(7, DType.i32))),
        st("f", o, K.Where(bin_(Op.GT, x, c(0, I64)), un(Op.CAST, x, F32), c(-1.0), F32)),
        st("i8", o, un(Op.CAST, bin_(Op.MUL, x, c(13, I64)), DType.i8)),
        st("u8", o, bin_(Op.ADD, un(Op.CAST, x, DType.u8), c(200, DType.u8))),
        st("mx", o, bin_(Op.MAX, bin_(Op.MIN, x, c(7, I64)), un(Op.NEG, y))),
    )
    dts = {
        "div": I64,
        "mod": I64,
        "logic": BOOL,
        "i32": DType.i32,
        "f": F32,
        "i8": DType.i8,
        "u8": DType.u8,
        "mx": I64,
    }
    prog = program(
        BATCH,
        [buf("x", I64, (S0, 6), "input")],
        [buf(n, dt, (S0, 6), "output") for n, dt in dts.items()],
        [buf("y", I64, (6,), "weight")],
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

    return listed("intops", prog, make, ref)


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


def floatops() -> Case:
    """Every float unary and binary op in one kernel: out[k, i0, i1] = op_k(x, y)."""
    x, y = ld("x", i0 * 33 + i1), ld("y", i0 * 33 + i1)
    n = len(UNARY_REF) + len(BINARY_REF)
    stores = []
    for k, op in enumerate(UNARY_REF):
        stores.append(st("u", k * S0 * 33 + i0 * 33 + i1, un(op, x)))
    for k, op in enumerate(BINARY_REF):
        stores.append(st("u", (k + len(UNARY_REF)) * S0 * 33 + i0 * 33 + i1, bin_(op, y, x)))
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 33), "input"), buf("y", F32, (S0, 33), "input")],
        [buf("u", F32, (n, S0, 33), "output")],
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

    return listed("floatops", prog, make, ref, 2e-6, 1e-6)


def half() -> Case:
    bf, hf = DType.bf16, DType.f16
    x = ld("x", i0 * 40 + i1, bf)
    v = bin_(Op.ADD, bin_(Op.MUL, x, c(1.5, bf)), un(Op.EXP, x))
    k = K.Pointwise("half", (S0, 40), (st("y", i0 * 40 + i1, v), st("h", i0 * 40 + i1, un(Op.CAST, v, hf))))
    a = K.Strided("x", 0, (40, 1), bf)
    b = K.Strided("w", 0, (8, 1), bf)
    mm = K.Matmul("mm_bf16", (), S0, 8, 40, a, b, (st("z", i0 * 8 + i1, un(Op.CAST, K.Acc(), bf)),))
    prog = program(
        BATCH,
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

    return listed("half", prog, make, ref, 1e-2, 1e-2)


def gathers_reduce_epilogue() -> Case:
    tok = K.Load("ids", idx(i0), I64)
    e = K.Load("emb", bin_(Op.ADD, bin_(Op.MUL, tok, c(16, I64)), idx(r0)), F32)
    red = K.Reduce(
        "embed_norm",
        (S0,),
        (16,),
        (K.Reduction(Op.SUM, bin_(Op.MUL, e, e), F32),),
        (),
        (st("n", i0 * 16 + r0, bin_(Op.MUL, e, un(Op.RSQRT, K.ReduceRef(0, F32)))),),
    )
    col = K.Load("emb", bin_(Op.MUL, K.Load("ids", idx(i1), I64), c(16, I64)), F32)
    mm = K.Matmul(
        "mm_gather",
        (),
        S0,
        S0,
        16,
        K.Strided("n", 0, (16, 1), F32),
        K.Strided("n", 0, (1, 16), F32),
        (st("g", i0 * S0 + i1, bin_(Op.ADD, K.Acc(), col)),),
    )
    prog = program(
        BATCH,
        [buf("ids", I64, (S0,), "input")],
        [buf("n", F32, (S0, 16), "output"), buf("g", F32, (S0, S0), "output")],
        [buf("emb", F32, (7, 16), "weight")],
        [red, mm],
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        e = ws[0][ins[0]].astype(np.float64)
        n = e / np.sqrt((e * e).sum(1, keepdims=True))
        return [n, n @ n.T + ws[0][ins[0], 0][None, :]]

    return listed(
        "gathers_reduce_epilogue",
        prog,
        lambda n, g: ([g.integers(0, 7, n)], [rnd(g, 7, 16)]),
        ref,
        1e-5,
        1e-6,
    )


def index_math() -> Case:
    """Floor/mod index math over a symbolic size, a reduction with no outer loop, a 0-d kernel."""
    j = i0
    view = K.Pointwise("view", (3 * S0,), (st("y", j, ld("x", sympy.Mod(j, S0) * 3 + sympy.floor(j / S0))),))
    total = K.Reduce(
        "total",
        (),
        (S0, 3),
        (K.Reduction(Op.SUM, ld("x", r0 * 3 + r1), F32),),
        (st("t", 0, K.ReduceRef(0, F32)),),
    )
    scalar = K.Pointwise("scalar", (), (st("z", 0, bin_(Op.MUL, ld("t", 0), c(2.0))),))
    prog = program(
        BATCH,
        [buf("x", F32, (S0, 3), "input")],
        [buf("y", F32, (3 * S0,), "output"), buf("z", F32, (), "output")],
        [],
        [view, total, scalar],
        arena=[buf("t", F32, (), "arena")],
        offsets={"t": 0},
        size=4,
    )

    def ref(ins: list[Array], ws: list[Array]) -> list[Array]:
        return [ins[0].T.reshape(-1), np.asarray(ins[0].astype(np.float64).sum() * 2)]

    return listed("index_math", prog, lambda n, g: ([rnd(g, n, 3)], []), ref)


CPU_CASES: list[Callable[[], Case]] = [
    pointwise_cast_f64,
    masked_pad_2d,
    gather_scaled,
    softmax_rowmax,
    layernorm,
    maxpool,
    pool_nhwc,
    matmul_bias_relu,
    linear_gelu_rowsum,
    convs,
    scan,
    intops,
    floatops,
    half,
    gathers_reduce_epilogue,
    index_math,
    attention_additive,
    attention_packed_qkv,
]


CASES: list[Callable[[], Case]] = [*GPU_CASES, *CPU_CASES, linear_split_k]


def gpu_cases() -> list[Case]:
    """The cases built into GPU artifacts (tests/gpu/build_artifacts.py, tests/gpu/test_cuda_cases.py)."""
    return [f() for f in GPU_CASES]


def all_cases() -> list[Case]:
    return [f() for f in CASES]
