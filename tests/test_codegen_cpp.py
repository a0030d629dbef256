"""Generated C++ against the kernel interpreter and plain numpy: every Program of the one case table
(tests/gpu/programs.py) is generated, compiled with g++ and run through ``aotc_run`` (cffi, no runtime
package) at each of its symbol values.

All libraries are compiled once per session, two at a time, through the content-addressed cache in
pytest's cache directory (so a rerun with unchanged code compiles nothing).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import tempfile
from pathlib import Path

import cffi
import numpy as np
import pytest
from aotc.errors import CompileError
from aotc_build import kernel as K
from aotc_build.codegen.cpp import generate
from aotc_build.codegen.cpp_pack import Packing, pack_array, pack_plan
from aotc_build.compile import CompiledLibrary, compile_cpp
from aotc_build.ir import DType
from aotc_build.kernel_interp import run_program
from aotc_build.options import BuildOptions, Target
from golden import check_golden

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from programs import BATCH, S0, Case, buf, i0, program, st  # the one case table (tests/gpu/programs.py)
from test_kernel_interp import CASES, TRIALS, assert_close, case_data, reference, trial_id

TARGET = Target("cpu", "x86-64-v4" if "avx512f" in Path("/proc/cpuinfo").read_text() else "x86-64-v3")
OPTIONS = BuildOptions(targets=(TARGET,))

ffi = cffi.FFI()
ffi.cdef("""
int32_t aotc_abi_version(void);
int32_t aotc_run(const int64_t* syms, const void* const* inputs, void* const* outputs,
                 const void* const* weights, void* arena, char* err, size_t errlen);
void aotc_set_num_threads(int32_t n);
""")


class Lib:
    """A compiled program loaded with cffi: ``run`` takes numpy arrays and returns the outputs. With
    ``packs`` (from ``pack_plan``), ``prog`` is the packed plan and ``run`` still takes the original
    weights: it packs them as the builder would and passes them after the others."""

    def __init__(self, prog: K.Plan, built: CompiledLibrary, workdir: Path, packs: list[Packing] | None = None) -> None:
        self.prog = prog
        self.packs = packs or []
        path = workdir / f"{built.key[:16]}.so"
        path.write_bytes(built.so_bytes)
        self.lib = ffi.dlopen(str(path))

    def run(self, ins: list[np.ndarray], ws: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        from aotc.shapes import evaluate
        from aotc_build.symbolic import to_size

        def shape(b: K.Buffer) -> tuple[int, ...]:
            return tuple(evaluate(to_size(d), env) for d in b.shape)

        ins = [np.ascontiguousarray(a, dtype=b.dtype.numpy()) for a, b in zip(ins, self.prog.inputs, strict=True)]
        by_name = {b.name: a for b, a in zip(self.prog.weights, ws, strict=False)}
        ws = [*ws, *(pack_array(p, by_name[p.source]) for p in self.packs)]
        ws = [np.ascontiguousarray(a, dtype=b.dtype.numpy()) for a, b in zip(ws, self.prog.weights, strict=True)]
        outs = [
            np.full(shape(b), 0x7B, dtype=np.uint8).view(b.dtype.numpy())
            if b.dtype.itemsize == 1
            else np.full(shape(b), np.nan if b.dtype.is_float else -7).astype(b.dtype.numpy())
            for b in self.prog.outputs
        ]
        size = evaluate(to_size(self.prog.arena_size), env)
        raw = np.full(size + 64, 0xFF, dtype=np.uint8)
        start = (-raw.ctypes.data) % 64
        arena = raw[start : start + size]
        syms = np.array([env[s.name] for s in self.prog.symbols] or [0], dtype=np.int64)
        err = ffi.new("char[]", 512)

        def ptrs(arrs: list[np.ndarray]) -> object:
            return ffi.new("void*[]", [ffi.cast("void*", a.ctypes.data) for a in arrs] or [ffi.NULL])

        rc = self.lib.aotc_run(
            ffi.cast("int64_t*", syms.ctypes.data),
            ptrs(ins),
            ptrs(outs),
            ptrs(ws),
            ffi.cast("void*", arena.ctypes.data),
            err,
            512,
        )
        if rc != 0:
            raise RuntimeError(f"aotc_run returned {rc}: {ffi.string(err).decode()}")
        return outs


def _gather_oob_prog() -> K.Program:
    row = K.Load("ids", K.Index(i0), DType.i64)
    k = K.Pointwise("gather_oob", (S0,), (st("y", i0, K.Load("table", row, DType.f32)),))
    return program(
        BATCH,
        [buf("ids", DType.i64, (S0,), "input")],
        [buf("y", DType.f32, (S0,), "output")],
        [buf("table", DType.f32, (4,), "weight")],
        [k],
    )


EXTRA = {"gather_oob": _gather_oob_prog()}


@pytest.fixture(scope="session")
def libs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Lib]:
    work = tmp_path_factory.mktemp("so")
    store = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = Path(store.mkdir("aotc-cpp")) if store is not None else work / "cache"
    # as the builder does: weight matmuls read weights packed for the target's micro-kernel
    progs = {n: pack_plan(p, TARGET.arch) for n, p in ({c.name: c.prog for c in CASES} | EXTRA).items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futs = {n: pool.submit(compile_cpp, generate(p, OPTIONS), TARGET, OPTIONS, cache) for n, (p, _) in progs.items()}
        return {n: Lib(progs[n][0], f.result(), work, progs[n][1]) for n, f in futs.items()}


@pytest.mark.parametrize("trial", TRIALS, ids=trial_id)
def test_cpp_matches_interp_and_numpy(trial: tuple[Case, dict[str, int]], libs: dict[str, Lib]) -> None:
    case, env = trial
    ins, ws = case_data(case, env)
    got = libs[case.name].run(ins, ws, env)
    oracle = run_program(case.prog, ins, ws, env)
    want = reference(case, ins, ws)
    for j, (g, o, w) in enumerate(zip(got, oracle, want, strict=True)):
        name = case.prog.outputs[j].name
        assert_close(g, o, case, f"output {j} ({name}) vs interp at {env}")
        assert_close(g, w, case, f"output {j} ({name}) vs numpy at {env}")


def test_threads_and_abi(libs: dict[str, Lib]) -> None:
    lib = libs["linear_gelu_rowsum"]
    assert lib.lib.aotc_abi_version() == 1
    case = next(c for c in CASES if c.name == "linear_gelu_rowsum")
    ins, ws = case_data(case, {"s0": 3})
    lib.lib.aotc_set_num_threads(1)
    one = lib.run(ins, ws, {"s0": 3})
    lib.lib.aotc_set_num_threads(0)
    many = lib.run(ins, ws, {"s0": 3})
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)  # tiles are independent: the thread count changes nothing


def test_gather_out_of_range_is_an_error_not_a_crash(libs: dict[str, Lib]) -> None:
    lib = libs["gather_oob"]
    table = np.arange(4, dtype=np.float32) + 1
    np.testing.assert_array_equal(lib.run([np.array([3, 0, 2])], [table], {"s0": 3})[0], [4, 1, 3])
    with pytest.raises(RuntimeError, match=r"aotc_run returned 1: kernel gather_oob: a gather index is out of"):
        lib.run([np.array([1, 4, 0])], [table], {"s0": 3})
    with pytest.raises(RuntimeError, match="out of range"):
        lib.run([np.array([-1, 0, 0])], [table], {"s0": 3})


def test_gather_checks_in_reduce_and_epilogue(libs: dict[str, Lib]) -> None:
    lib = libs["gathers_reduce_epilogue"]
    case = next(c for c in CASES if c.name == "gathers_reduce_epilogue")
    ws = case_data(case, {"s0": 4})[1]
    with pytest.raises(RuntimeError, match="kernel embed_norm: a gather index is out of range"):
        lib.run([np.array([0, 1, 7, 2])], ws, {"s0": 4})
    with pytest.raises(RuntimeError, match="kernel embed_norm: a gather index is out of range"):
        lib.run([np.array([0, -1, 6, 2])], ws, {"s0": 4})


def test_gathered_rows_are_checked_before_the_loop() -> None:
    """``emb[tok * 16 + r0]`` is range-checked once per row, before the r0 loop, which then reads the row
    with plain loads (a per-element check keeps the loop scalar)."""
    case = next(c for c in CASES if c.name == "gathers_reduce_epilogue")
    src = generate(case.prog, OPTIONS)
    body = src[src.index("aotc_k_embed_norm") : src.index("aotc_k_mm_gather")]
    assert "aotc_checked(" not in body
    assert body.index("aotc_checked_span(") < body.index("for (int64_t r0")


def test_cstring_escapes() -> None:
    from aotc_build.codegen.cpp import cstring

    assert cstring('a"b\\c\n') == '"a\\"b\\\\c\\x0a"""'


def test_masked_body_is_scoped() -> None:
    src = generate(next(c for c in CASES if c.name == "masked_pad_2d").prog, OPTIONS)
    body = src[src.index("aotc_k_pad") :]
    load = body.index("p_x[")
    assert body.rindex("if (", 0, load) > body.rindex("for (", 0, load), "the masked load must sit inside its if"


def test_pool_over_channels_runs_across_lanes() -> None:
    """A pool over channels-last input reduces with the channels innermost (one accumulator array per step);
    a pool over NCHW and a row reduction keep the window innermost."""
    src = generate(next(c for c in CASES if c.name == "pool_nhwc").prog, OPTIONS)
    assert "float aotc_acc0[64];" in src and "float aotc_acc1[64];" in src
    for name in ("maxpool", "softmax_rowmax"):
        assert "aotc_acc0[" not in generate(next(c for c in CASES if c.name == name).prog, OPTIONS), name


def test_generate_is_deterministic_and_build_is_byte_identical(tmp_path: Path) -> None:
    prog = next(c for c in CASES if c.name == "softmax_rowmax").prog
    src = generate(prog, OPTIONS)
    assert src == generate(prog, OPTIONS)
    a = compile_cpp(src, TARGET, OPTIONS, None)
    b = compile_cpp(src, TARGET, OPTIONS, None)
    assert a.so_bytes == b.so_bytes
    assert a.command == b.command and "-ffp-contract=off" in a.flags
    assert any("gomp" in n for n in a.needed) and not any("stdc++" in n for n in a.needed)
    assert a.min_glibc == "" or a.min_glibc.startswith("2.")  # "" when no libc symbol is used
    # the cache returns the same bytes without compiling
    c1 = compile_cpp(src, TARGET, OPTIONS, tmp_path)
    c2 = compile_cpp(src, TARGET, OPTIONS, tmp_path)
    assert c1.so_bytes == c2.so_bytes == a.so_bytes and len(list((tmp_path / "cpp").iterdir())) == 1


def test_compile_error_names_source_and_command() -> None:
    with pytest.raises(CompileError) as e:
        compile_cpp('#include "aotc_abi.h"\nint broken( {\n', TARGET, OPTIONS, None)
    msg = str(e.value)
    assert "model.cpp" in msg and "g++" in msg and "-march=" in msg and "error" in msg
    src = msg.split("kept at ", 1)[1].split("\n", 1)[0]
    assert Path(src).is_file()


def test_symbolic_sizes_print_in_signatures() -> None:
    src = generate(next(c for c in CASES if c.name == "linear_gelu_rowsum").prog, OPTIONS)
    assert "const int64_t s0 = syms[0];" in src
    assert "static_cast<char*>(arena) + 64" in src
    assert "const int64_t aotc_M = (7 * s0);" in src


def test_tempdir_build_paths_do_not_leak(tmp_path: Path) -> None:
    prog = next(c for c in CASES if c.name == "scan").prog
    so = compile_cpp(generate(prog, OPTIONS), TARGET, OPTIONS, None).so_bytes
    assert tempfile.gettempdir().encode() not in so


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_lower_cpu_levels(level: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The templates' narrower vector paths (SSE, AVX2) compute the same thing."""
    target = Target("cpu", level)
    store = getattr(request.config, "cache", None)
    cache = Path(store.mkdir("aotc-cpp")) if store is not None else tmp_path
    names = ("convs", "half", "matmul_bias_relu", "linear_gelu_rowsum")
    cases = [c for c in CASES if c.name in names]
    packed = [pack_plan(c.prog, level) for c in cases]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(lambda p: compile_cpp(generate(p[0], OPTIONS), target, OPTIONS, cache), packed))
    assert all(f"-march={level}" in b.command for b in built)
    for case, lib, (prog, packs) in zip(cases, built, packed, strict=True):
        ins, ws = case_data(case, {"s0": 3})
        got = Lib(prog, lib, tmp_path, packs).run(ins, ws, {"s0": 3})
        for j, (g, o) in enumerate(zip(got, run_program(case.prog, ins, ws, {"s0": 3}), strict=True)):
            assert_close(g, o, case, f"output {j} at {level}")


GOLDEN = {"masked_pad": "masked_pad_2d", "softmax": "softmax_rowmax", "matmul_bias_relu": "matmul_bias_relu"}  # file -> case


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_generated_code_golden(name: str) -> None:
    """The generated C++ for a few small programs, as text (rerun with UPDATE_GOLDEN=1 when a change is
    intended, and read the diff: it is the review of a codegen change)."""
    text = generate(next(c for c in CASES if c.name == GOLDEN[name]).prog, OPTIONS)
    check_golden(f"cpp_{name}.cpp", text)
