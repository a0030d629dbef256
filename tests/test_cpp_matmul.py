"""The CPU matmul with weights packed at build time (aot/codegen/cpp_pack.py, cpp_templates/matmul.h):
odd sizes (M, N, K no multiples of the blocks, K < KC, K = 1, N < NR, K over one KC slice, rows whose last
strip is split with the one before), a weight broadcast
over batch dimensions, each kind of epilogue (bias, activation, residual, cast), 16-bit operands, at every
CPU level this machine runs. Each packed library is checked against the kernel interpreter on the
unpacked program, and against the same program compiled without packing.
"""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import sympy
from aotc.cpu_features import cpu_flags
from aotc_build import kernel as K
from aotc_build.codegen.cpp import generate
from aotc_build.codegen.cpp_pack import PANEL, matmul_panel, pack_array, pack_plan
from aotc_build.compile import compile_cpp
from aotc_build.ir import DType, Op
from aotc_build.kernel_interp import eval_index, run_program
from aotc_build.options import BuildOptions, Target
from test_codegen_cpp import Lib

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from programs import BATCH, S0, bin_, buf, i0, i1, i2, i3, ld, program, st, un

F32, BF16 = DType.f32, DType.bf16
LEVELS = [lv for lv, flag in (("x86-64-v3", "avx2"), ("x86-64-v4", "avx512f")) if flag in cpu_flags()]


def _linear(name: str, m: sympy.Expr | int, n: int, k: int, transposed: bool, epi: str, dt: DType = F32) -> K.Plan:
    """y[m, n] = epi(x[m, k] @ W) with W stored as w[n, k] (transposed, as nn.Linear) or w[k, n]."""
    b = K.Strided("w", sympy.Integer(0), (sympy.Integer(1), sympy.Integer(k)) if transposed else (sympy.Integer(n), sympy.Integer(1)), dt)
    a = K.Strided("x", sympy.Integer(0), (sympy.Integer(k), sympy.Integer(1)), dt)
    v: K.Value = K.Acc()
    if "bias" in epi:
        v = bin_(Op.ADD, v, ld("bias", i1))
    if "relu" in epi:
        v = un(Op.RELU, v)
    if "residual" in epi:
        v = bin_(Op.ADD, v, ld("r", i0 * n + i1))
    out = BF16 if "cast" in epi else F32
    if out is not F32:
        v = un(Op.CAST, v, out)
    mm = K.Matmul(name, (), m, n, k, a, b, (st("y", i0 * n + i1, v),))
    ins = [buf("x", dt, (m, k), "input")] + ([buf("r", F32, (m, n), "input")] if "residual" in epi else [])
    ws = [buf("w", dt, (n, k) if transposed else (k, n), "weight")] + ([buf("bias", F32, (n,), "weight")] if "bias" in epi else [])
    return program(BATCH, ins, [buf("y", out, (m, n), "output")], ws, [mm])


def _batched() -> K.Plan:
    """y[s0, 2, 9, 70] = x[s0, 2, 9, 33] @ w[33, 70] + bias: one weight for every batch."""
    a = K.Strided("x", i0 * 594 + i1 * 297, (sympy.Integer(33), sympy.Integer(1)), F32)
    b = K.Strided("w", sympy.Integer(0), (sympy.Integer(70), sympy.Integer(1)), F32)
    v = bin_(Op.ADD, K.Acc(), ld("bias", i3))
    mm = K.Matmul("bmm", (S0, 2), 9, 70, 33, a, b, (st("y", i0 * 1260 + i1 * 630 + i2 * 70 + i3, v),))
    return program(BATCH, [buf("x", F32, (S0, 2, 9, 33), "input")], [buf("y", F32, (S0, 2, 9, 70), "output")],
                   [buf("w", F32, (33, 70), "weight"), buf("bias", F32, (70,), "weight")], [mm])  # fmt: skip


PROGS = {
    "odd_bias": (_linear("odd_bias", 7 * S0, 45, 300, True, "bias"), 2e-4),  # K over one KC slice
    "small_relu": (_linear("small_relu", S0, 5, 3, False, "relu"), 2e-4),  # K < KC, N < NR, M < MR
    "residual_cast": (_linear("residual_cast", 13 * S0, 70, 129, True, "bias,residual,cast"), 1e-2),
    "bf16": (_linear("bf16", 3 * S0, 33, 260, True, "bias", BF16), 2e-2),
    "batched": (_batched(), 2e-4),
    # K = 1 and N under one vector (the panel is mostly zero padding)
    "k1_narrow": (_linear("k1_narrow", 3 * S0, 7, 1, True, "bias"), 2e-4),
    # rows 16, 80, 592: a last strip under MR / 2 rows shares with the one before (aotc_mm_strip); K over
    # two KC slices with a rest; B walked panel by panel down K (panel_outer), A packed once per block
    "skinny_rows": (_linear("skinny_rows", 16 * S0, 100, 520, True, "bias,relu"), 2e-4),
    # 129+ rows and N = 94 (two panels of 48, three of 32): the wide 8 x 3 block on AVX-512 (matmul_panel),
    # its last strip one row, its last panel ragged, K over two KC slices
    "wide_block": (_linear("wide_block", 129 * S0, 94, 300, True, "bias,residual"), 2e-4),
    # bf16 at AVX-512: the weight as bf16 pairs (matmul_bf16.h). K odd (the last pair's high half is
    # padding), W stored [k, n]; and the wide block's 48-column panels with a bf16 output
    "bf16_oddk": (_linear("bf16_oddk", 13 * S0, 70, 259, False, "bias,relu", BF16), 2e-2),
    "bf16_wide": (_linear("bf16_wide", 129 * S0, 94, 301, True, "bias,cast", BF16), 2e-2),
    # one or two rows: the GEMV kernel (aotc_mm_micro_few), several panels at once, 21 of 32 (AVX-512) or 63
    # of 16 (AVX2), K over several KC slices and odd
    "gemv": (_linear("gemv", S0, 1000, 1283, True, "bias"), 2e-4),
}
TRIALS = (1, 5, 37)  # s0


def _data(prog: K.Plan, env: dict[str, int], rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    def make(b: K.Buffer) -> np.ndarray:
        x = rng.uniform(-2, 2, tuple(int(eval_index(d, env)) for d in b.shape)).astype(np.float32)
        return x.astype(ml_dtypes.bfloat16) if b.dtype is BF16 else x

    return [make(b) for b in prog.inputs], [make(b) for b in prog.weights]


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], Lib]:
    work = tmp_path_factory.mktemp("mm")
    store = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = Path(store.mkdir("aotc-cpp")) if store is not None else work / "cache"
    jobs = [(name, level, packed) for name in PROGS for level in LEVELS for packed in (True, False)]

    def one(job: tuple[str, str, bool]) -> Lib:
        name, level, packed = job
        prog, packs = pack_plan(PROGS[name][0], level) if packed else (PROGS[name][0], [])
        target = Target("cpu", level)
        options = BuildOptions(targets=(target,))
        return Lib(prog, compile_cpp(generate(prog, options), target, options, cache), work, packs)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=True))


def test_every_weight_matmul_is_packed() -> None:
    for name, (prog, _) in PROGS.items():
        for level, default in PANEL.items():
            nr = 48 if name in ("wide_block", "bf16_wide") and level == "x86-64-v4" else default
            packed, packs = pack_plan(prog, level)
            assert len(packs) == 1 and all(isinstance(k, K.Matmul) and k.packed for k in packed.kernels), name
            assert packed.weights[-1].shape == packs[0].shape and packs[0].nr == nr, (name, level)
            assert packed.labels[packs[0].name] == f"w.packed{nr}"
            src = generate(packed, BuildOptions(targets=(Target("cpu", level),)))
            pairs = name.startswith("bf16") and level == "x86-64-v4"  # bf16 stays bf16 only at AVX-512
            assert packs[0].pairs is pairs and packed.weights[-1].dtype is (BF16 if pairs else F32), (name, level)
            call = f"aotc_matmul_packed_bf16<{nr} * 4 / AOTC_VBYTES>" if pairs else f"aotc_matmul_packed<float, {nr} * 4 / AOTC_VBYTES>"
            assert call in src, (name, level)


def test_wide_panel_rule() -> None:
    """The 48-column panel on AVX-512 for 128 rows or more at the example sizes, where its padding costs at
    most 1% more than 32 columns'; 32 otherwise, and always below AVX-512."""
    mm = _linear("t", 2 * S0, 768, 64, True, "").kernels[0]
    assert isinstance(mm, K.Matmul)
    assert matmul_panel(mm, 768, "x86-64-v4", {"s0": 64}) == 48
    assert matmul_panel(mm, 768, "x86-64-v4", {"s0": 63}) == 32  # 126 rows
    assert matmul_panel(mm, 768, "x86-64-v3", {"s0": 64}) == 16
    assert matmul_panel(mm, 2048, "x86-64-v4", {"s0": 64}) == 48  # 43 panels, 0.8% padding
    assert matmul_panel(mm, 1024, "x86-64-v4", {"s0": 64}) == 32  # 22 panels would pad 3%
    assert matmul_panel(mm, 256, "x86-64-v4", {"s0": 64}) == 32
    assert matmul_panel(mm, 768, "x86-64-v4", {}) == 32  # rows unknown


def test_pack_array_layout() -> None:
    prog, packs = pack_plan(_linear("t", 4, 5, 3, True, ""), "x86-64-v3")
    w = np.arange(15, dtype=np.float32).reshape(5, 3)  # w[n, k]: B[k, n] = w[n, k]
    got = pack_array(packs[0], w)
    assert got.shape == (1, 3, 16)
    np.testing.assert_array_equal(got[0, :, :5], w.T)
    assert not got[0, :, 5:].any()  # zero past N


def test_pack_array_pairs_layout() -> None:
    """bf16 pairs: [panels][ceil(K / 2)][NR][2], B[k, n] at [n // NR][k // 2][n % NR][k % 2], zero past K and N."""
    prog, packs = pack_plan(_linear("t", 4, 35, 5, True, "", BF16), "x86-64-v4")
    w = (np.arange(35 * 5, dtype=np.float32).reshape(35, 5) - 80).astype(ml_dtypes.bfloat16)  # w[n, k]
    got = pack_array(packs[0], w)
    assert packs[0].pairs and got.dtype == ml_dtypes.bfloat16 and got.shape == (2, 3, 32, 2) == packs[0].shape
    for n in range(64):
        for k in range(6):
            want = w[n, k] if n < 35 and k < 5 else 0
            assert got[n // 32, k // 2, n % 32, k % 2] == want, (n, k)


@pytest.mark.skipif(not LEVELS, reason="needs AVX2")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", sorted(PROGS))
def test_packed_matmul_matches_interp(name: str, level: str, built: dict[tuple[str, str, bool], Lib]) -> None:
    prog, tol = PROGS[name]
    rng = np.random.default_rng(0)
    for s0 in TRIALS:
        env = {"s0": s0}
        ins, ws = _data(prog, env, rng)
        want = run_program(prog, ins, ws, env)
        got = built[(name, level, True)].run(ins, ws, env)
        plain = built[(name, level, False)].run(ins, ws, env)
        for g, p, w in zip(got, plain, want, strict=True):
            g64, p64, w64 = (np.asarray(x, dtype=np.float64) for x in (g, p, w))
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol, err_msg=f"{name} at {level}, s0={s0}")
            np.testing.assert_allclose(g64, p64, rtol=tol, atol=tol, err_msg=f"{name} packed vs not at {level}")


@pytest.mark.skipif(not LEVELS, reason="needs AVX2")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["gemv", "bf16_oddk"])
def test_rows_do_not_depend_on_the_batch(name: str, level: str, built: dict[tuple[str, str, bool], Lib]) -> None:
    """A row's output is the same bit for bit alone, in twos and in a batch of 5 x rows: the server batches
    requests and promises each the lone call's answer (a GEMV kernel that split K into partial sums broke it)."""
    prog, _ = PROGS[name]
    rows = int(eval_index(prog.inputs[0].shape[0], {"s0": 5}))
    per = rows // 5
    ins, ws = _data(prog, {"s0": 5}, np.random.default_rng(1))
    lib = built[(name, level, True)]
    (whole,) = lib.run(ins, ws, {"s0": 5})
    for r0 in range(0, rows, per):
        (one,) = lib.run([ins[0][r0 : r0 + per]], ws, {"s0": 1})
        np.testing.assert_array_equal(one, whole[r0 : r0 + per], err_msg=f"{name} rows {r0}.. alone at {level}")
    if per == 1:
        (two,) = lib.run([ins[0][1:3]], ws, {"s0": 2})
        np.testing.assert_array_equal(two, whole[1:3], err_msg=f"{name} rows 1-2 as a pair at {level}")


# A wide A: few rows, K large (37 and 111 rows x 6000: one row block whose packed A is past AOTC_MM_A_L2 on
# either level, so tasks keep AOTC_MM_PANELS_BIG_A panels), K no multiple of KC, N ragged. Checked against
# torch in float64 (the interpreter is slow at this K).
WIDE = _linear("wide_a", 37 * S0, 200, 6000, True, "bias")


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Lib]:
    work = tmp_path_factory.mktemp("wide")

    def one(level: str) -> Lib:
        prog, packs = pack_plan(WIDE, level)
        target = Target("cpu", level)
        options = BuildOptions(targets=(target,))
        return Lib(prog, compile_cpp(generate(prog, options), target, options, work / "cache"), work, packs)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(LEVELS, pool.map(one, LEVELS), strict=True))


def _at_threads(lib: Lib, n: int, ins: list[np.ndarray], ws: list[np.ndarray], env: dict[str, int]) -> np.ndarray:
    lib.lib.aotc_set_num_threads(-n)  # exactly n threads, whatever the policy would choose
    try:
        return lib.run(ins, ws, env)[0]
    finally:
        lib.lib.aotc_set_num_threads(0)


@pytest.mark.skipif(not LEVELS, reason="needs AVX2")
@pytest.mark.parametrize("level", LEVELS)
def test_wide_a_matches_torch(level: str, wide: dict[str, Lib]) -> None:
    import torch

    rng = np.random.default_rng(2)
    for s0 in (1, 3):
        env = {"s0": s0}
        ins, ws = _data(WIDE, env, rng)
        x, w, bias = (torch.from_numpy(a).double() for a in (ins[0], *ws))
        want = torch.addmm(bias, x, w.T).numpy()
        got = _at_threads(wide[level], 2, ins, ws, env).astype(np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        # each output one fp32 sum down all of K: 2.6e-6 here (torch's fp32 addmm, blocked sums: 4e-7)
        assert err < 1e-5, f"wide_a at {level}, s0={s0}: relative error {err:.2e}"


@pytest.mark.skipif(not LEVELS, reason="needs AVX2")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["wide_a", "odd_bias", "skinny_rows", "batched", "wide_block", "bf16_wide"])
def test_thread_count_changes_nothing(name: str, level: str, built: dict[tuple[str, str, bool], Lib], wide: dict[str, Lib]) -> None:
    """Every output bit alike on 1, 2 and 3 threads: tiles and tasks follow the thread count, the order of
    each output's sum does not."""
    lib, prog = (wide[level], WIDE) if name == "wide_a" else (built[(name, level, True)], PROGS[name][0])
    env = {"s0": 3 if name == "wide_a" else 37}
    ins, ws = _data(prog, env, np.random.default_rng(1))
    one = _at_threads(lib, 1, ins, ws, env)
    for n in (2, 3):
        np.testing.assert_array_equal(one, _at_threads(lib, n, ins, ws, env), err_msg=f"{name} at {level}, {n} threads")


def test_manifest_carries_packed_weights() -> None:
    import dataclasses

    from affine_pkg import affine_manifest
    from aotc.errors import PackageCorrupt
    from aotc.schema import TensorSpec, Weights, from_json, to_json

    m = affine_manifest()
    packed = Weights("cpu/x86-64-v2/packed.safetensors", (TensorSpec("w.packed8", "float32", (1, 4, 8)),))
    cpu = dataclasses.replace(m.targets[0], packed=packed)
    m2 = dataclasses.replace(m, targets=(cpu,), members={})
    assert from_json(to_json(m2)) == m2 and packed.member in m2.referenced_members()
    for bad in (Weights("../packed.safetensors", packed.tensors), Weights(packed.member, packed.tensors * 2)):
        with pytest.raises(PackageCorrupt, match="packed"):
            to_json(dataclasses.replace(m2, targets=(dataclasses.replace(cpu, packed=bad),)))


def test_packed_matmul_golden() -> None:
    """The generated call of the packed matmul, as text (UPDATE_GOLDEN=1 to accept an intended change)."""
    from golden import check_golden

    prog, _ = pack_plan(PROGS["odd_bias"][0], "x86-64-v4")
    check_golden("cpp_matmul_packed.cpp", generate(prog, BuildOptions(targets=(Target("cpu", "x86-64-v4"),))))


def test_cpu_only_package_leaves_out_packed_originals() -> None:
    from aotc_build.codegen.cpp_pack import packed_only, without

    v3, v4 = pack_plan(PROGS["odd_bias"][0], "x86-64-v3"), pack_plan(PROGS["odd_bias"][0], "x86-64-v4")
    assert packed_only([v3, v4]) == {"w"}  # read by no target's kernels: only through packed copies
    assert [w.name for w in without(v4[0], {"w"}).weights] == ["bias", "w_packed"]
    with pytest.raises(AssertionError):
        without(PROGS["odd_bias"][0], {"w"})  # the unpacked plan still reads it
