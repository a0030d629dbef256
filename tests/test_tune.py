"""Tile configs and ``--tune`` without a GPU: the chooser's candidates and picks, the committed tables, the
tuner against tests/fake_libcuda.py (candidates, cache keys, cache hits, identical kernels tuned once), the
no-GPU fallback, and byte-identical builds without ``--tune``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aotc import shapes
from aotc.cuda_driver import Driver, new_ffi
from aotc.errors import IncompatiblePackage
from aotc_build import kernel as K
from aotc_build import tune
from aotc_build.codegen import triton as tg
from aotc_build.codegen.triton import configs
from aotc_build.codegen.triton.configs import Config, Shape, candidates, choose, heuristic
from aotc_build.cubin import build_cuda_target
from aotc_build.ir import DType
from aotc_build.options import BuildOptions, Target
from fake_libcuda import FakeLib

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs

SM90 = Target("cuda", "sm_90")


def f16(m: int, n: int, k: int, batch: int = 1) -> Shape:
    return Shape("matmul", "f16", m, n, k, batch)


# ---- the chooser -------------------------------------------------------------------------------------


def test_sm90_16bit_candidates_are_wgmma_shaped_and_fit_shared_memory() -> None:
    cands = candidates(f16(4096, 4096, 4096), 90)
    assert Config(128, 256, 64, 8, 3) in cands and Config(128, 128, 64, 4, 4) in cands
    assert 6 <= len(cands) <= 10
    for c in cands:
        assert c.block_m >= 64 and c.num_warps % 4 == 0 and c.block_k >= 64 and 3 <= c.num_stages <= 4
        assert c.smem(2) <= configs.SMEM[90]
    assert all(c.smem(2) <= configs.SMEM[80] for c in candidates(f16(4096, 4096, 4096), 80))


def test_small_m_gets_small_row_tiles() -> None:
    assert all(c.block_m <= 64 for c in candidates(f16(64, 4096, 1024), 90))
    assert heuristic(f16(16, 768, 768), 90).block_m == 16


def test_heuristic_fills_the_chip() -> None:
    """GPT-2 small at 1x256 tokens: the old fixed 128x128 tile made 12 tiles for 132 SMs."""
    c = heuristic(f16(256, 768, 768), 90)
    tiles = -(-256 // c.block_m) * -(-768 // c.block_n)
    assert tiles >= 66, c
    big = heuristic(f16(4096, 4096, 4096), 90)
    assert big.block_m * big.block_n >= 128 * 128 and big.num_warps in (4, 8)
    # A100's 108 SMs: also at least most of a wave
    c80 = heuristic(f16(256, 768, 768), 80)
    assert -(-256 // c80.block_m) * -(-768 // c80.block_n) >= 54


def test_fp16_and_bf16_and_bf16_precision_choose_alike() -> None:
    fp32 = BuildOptions(precision="fp32")
    assert configs.dot_mode(DType.bf16, fp32) == configs.dot_mode(DType.f16, fp32) == "f16"
    assert configs.dot_mode(DType.f32, BuildOptions(precision="bf16")) == "f16"
    assert configs.dot_mode(DType.f32, fp32) == "f32"
    assert configs.dot_mode(DType.f32, BuildOptions(precision="tf32")) == "tf32"
    for c in candidates(Shape("matmul", "tf32", 4096, 4096, 4096), 90):  # tensor-core tiles, 4-byte operands
        assert c.block_m >= 64 and c.block_k == 32 and c.smem(4) <= configs.SMEM[90]
    assert configs.dot_mode(DType.f64, fp32) == "other"
    assert candidates(Shape("matmul", "other", 64, 64, 64), 90) == [Config(16, 16, 16, 4, 1)]


def test_fp32_candidates_follow_the_units() -> None:
    """fp32 convs run as tf32x3 on tensor-core tiles from sm_80; matmuls (and convs before sm_80) as ieee FMA
    with moderate tiles."""
    for kind, sm in (("matmul", 90), ("conv", 75)):
        for c in candidates(Shape(kind, "f32", 1024, 1024, 1024), sm):
            assert c.block_k == 32 and c.block_m * c.block_n <= 128 * 128
    for c in candidates(Shape("conv", "f32", 4096, 4096, 4096), 90):
        assert c.block_m >= 64 and c.block_k == 32 and c.smem(4) <= configs.SMEM[90]


def test_fp32_dot_line_by_sm() -> None:
    from aotc_build.codegen.triton.templates.dot import dot_line

    fp32 = BuildOptions()
    assert 'input_precision="tf32x3"' in dot_line("a", "b", DType.f32, fp32, 90, "conv")
    assert 'input_precision="ieee"' in dot_line("a", "b", DType.f32, fp32, 75, "conv")
    assert 'input_precision="ieee"' in dot_line("a", "b", DType.f32, fp32, 90, "matmul")
    assert 'input_precision="tf32"' in dot_line("a", "b", DType.f32, BuildOptions(precision="tf32"), 90)


def test_table_hit_wins_over_the_heuristic(monkeypatch: pytest.MonkeyPatch) -> None:
    s = f16(256, 768, 768)
    assert choose(s, 90)[1] in ("table", "heuristic")
    monkeypatch.setattr(configs, "table", lambda sm: {s.key: Config(64, 64, 64, 4, 3)})
    assert choose(s, 90) == (Config(64, 64, 64, 4, 3), "table")
    assert choose(f16(200, 768, 768), 90) == (Config(64, 64, 64, 4, 3), "table")  # M buckets to 256
    assert choose(f16(300, 768, 768), 90)[1] == "heuristic"
    assert choose(f16(256, 768, 1024), 90)[1] == "heuristic"


def test_committed_tables_parse() -> None:
    for sm in (80, 90):
        doc = json.loads((Path(configs.__file__).parent / "tables" / f"sm_{sm}.json").read_text())
        assert doc["sm"] == sm
        configs.table.cache_clear()
        for key, c in configs.table(sm).items():
            assert key.startswith(("matmul:", "conv:", "attention", "reduce:")) and c.num_warps in (1, 2, 4, 8, 16, 32)


def test_config_is_visible_in_the_source() -> None:
    case = programs.linear_relu_bf16()
    k = case.prog.kernels[0]
    src = tg.generate(case.prog, k, BuildOptions(precision="bf16"), 90).source
    assert "# tile config: " in src and "sm_90" in src
    tuned = tg.generate(case.prog, k, BuildOptions(precision="bf16"), 90, config=Config(64, 32, 32, 4, 3, 4)).source
    assert "# tile config: 64x32x32 w4 s3 g4 (tuned, sm_90)" in tuned and "BLOCK_N: tl.constexpr" in tuned
    pw = programs.pointwise_permute().prog
    with pytest.raises(Exception, match="takes no tile config"):
        tg.generate(pw, pw.kernels[-1], BuildOptions(), 90, config=Config(16, 16, 16, 4, 1))


def test_attention_and_big_reductions_are_tunable() -> None:
    """Attention tiles and reduction rows/warps are configs too: candidates beyond the default, the default
    among them, and only reductions over a million elements or more are timed."""
    att = Shape("attention_causal", "f16", 1024, 1024, 64, 96)
    cands = candidates(att, 90)
    assert cands[0] == heuristic(att, 90) == Config(64, 64, 64, 4, 3) and len(cands) >= 5
    assert all(c.block_n <= c.block_m for c in cands)
    short = candidates(Shape("attention", "f16", 20, 20, 64, 8), 90)
    assert all(c.block_m <= 32 and c.block_n <= 32 for c in short)
    red = Shape("reduce", "f32", 8192, 8192, 1)
    assert heuristic(red, 90) == Config(1, 8192, 1, 8, 1) and len(candidates(red, 90)) >= 4
    sm = programs.softmax().prog
    assert not tg.tunable(sm, sm.kernels[0])  # a small reduction: launch-bound, not worth timing


# ---- the tuner ---------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> FakeLib:
    ffi = new_ffi()
    lib = FakeLib(ffi)
    lib.drv = Driver(lib=lib, ffi=ffi)  # type: ignore[attr-defined]
    return lib


TWO = [Config(32, 32, 32, 4, 3), Config(64, 64, 32, 4, 3)]


def two_identical_matmuls() -> K.Plan:
    prog = programs.linear_relu_bf16().prog
    k = prog.kernels[0]
    y2 = replace(prog.outputs[0], name="y2")
    k2 = replace(k, name="second", stores=tuple(replace(s, buf="y2") for s in k.stores))
    return programs.program(prog.symbols, prog.inputs, [*prog.outputs, y2], prog.weights, [k, k2])


def test_tune_picks_the_fastest_and_caches_it(fake: FakeLib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune, "candidates", lambda s, sm: TWO)
    fake.cost_ms = lambda launch: 1.0 / launch.grid[0]  # more tiles: faster
    prog = two_identical_matmuls()
    opts = BuildOptions(targets=(SM90,), precision="bf16", tune=True)
    lines: list[str] = []
    got = tune.tune_program(prog, 90, opts, tmp_path, False, drv=fake.drv, note=lines.append)  # type: ignore[attr-defined]
    assert got == {"linear_relu_bf16": TWO[0], "second": TWO[0]}
    assert len(list((tmp_path / "tune").rglob("*.json"))) == 1  # identical kernels: one job, one entry
    assert lines == ["aotc build --tune: 1 kernel shapes on Fake GPU (sm_90), 0 from the cache"]
    doc = json.loads(next((tmp_path / "tune").rglob("*.json")).read_text())
    assert doc["config"] == TWO[0].to_json() and [t[0] for t in doc["timings"]] == [str(TWO[0]), str(TWO[1])]
    tuned_launches = len(fake.launches)
    assert tuned_launches > 0

    lines.clear()
    again = tune.tune_program(prog, 90, opts, tmp_path, False, drv=fake.drv, note=lines.append)  # type: ignore[attr-defined]
    assert again == got and len(fake.launches) == tuned_launches  # a cache hit launches nothing
    assert lines[0].endswith("1 from the cache")


def test_a_candidate_that_crashes_the_timing_process_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune, "candidates", lambda s, sm: TWO)
    prog = programs.linear_relu_bf16().prog
    opts = BuildOptions(targets=(SM90,), precision="bf16", tune=True)
    (job,) = tune.jobs(prog, 90, opts, False, 132, "Fake GPU")
    compiled = tune.compile_all([job], 90, tmp_path, True)
    grids = [int(shapes.evaluate(tk.grid[0], dict(job.env))) for _, tk in job.candidates]
    assert grids[0] > grids[1]  # TWO[0]'s smaller tiles: more programs, and the fake worker dies on them

    def spawn(work: Path) -> subprocess.Popen[str]:
        with open(work.with_suffix(".err"), "w") as err:
            script = Path(__file__).parent / "fake_tune_worker.py"
            return subprocess.Popen([sys.executable, str(script), str(work), str(grids[1])], stdout=subprocess.PIPE,
                                    stderr=err, text=True)  # fmt: skip

    lines: list[str] = []
    got = tune.measure_isolated([job], compiled, 90, lines.append, spawn)
    assert got[job.key] is not None and got[job.key].config == TWO[1]
    assert [t[0] for t in got[job.key].timings] == [str(TWO[1])]
    assert len(lines) == 1 and str(TWO[0]) in lines[0] and "ILLEGAL_ADDRESS" in lines[0]


def test_like_named_buffers_of_other_programs_are_not_shared(fake: FakeLib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_table.py times many models' jobs in one Bench, and programs reuse buffer names at other sizes: a
    job must get buffers of its own sizes, not an earlier program's smaller one of the same name (on the H200,
    ResNet-50's 1x1 conv wrote its 12.8 MB output into ViT's 2.4 MB ``buf67``: CUDA_ERROR_ILLEGAL_ADDRESS)."""
    from aotc_build.cubin import Compiled, sig_kind

    monkeypatch.setattr(tune, "candidates", lambda s, sm: TWO[:1])
    opts = BuildOptions(targets=(SM90,), precision="bf16", tune=True)
    progs = [programs._linear("lin", DType.bf16, "bf16", tol=1e-2, kd=kd).prog for kd in (32, 512)]
    js = [tune.jobs(p, 90, opts, False, 132, "Fake GPU")[0] for p in progs]
    assert [b for b, _, _ in js[0].buffers] == [b for b, _, _ in js[1].buffers]  # same names: x, w, b, y
    assert {b: n for b, _, n in js[0].buffers} != {b: n for b, _, n in js[1].buffers}
    compiled = tune.compile_all(js, 90, tmp_path, True)
    found = tune.find_device(90, fake.drv)  # type: ignore[attr-defined]
    assert not isinstance(found, str)
    bench = tune.Bench(*found)
    short: set[str] = set()
    try:
        for j in js:
            c, tk = j.candidates[0]
            cc = compiled[(j.key, c)]
            assert isinstance(cc, Compiled)
            fake.params[tune.NAME] = [p.kind for p in cc.kernel("t", None, [sig_kind(p.sig) for p in tk.params]).params]
            need = {b: n for b, _, n in j.buffers}

            def check(launch: Any, tk: tg.TritonKernel = tk, need: dict[str, int] = need) -> None:
                for p, ptr in zip(tk.params, launch.args, strict=False):
                    if p.source[0] == "buffer":
                        end = next(a.ctypes.data + a.nbytes for a in fake.mem.values() if a.ctypes.data <= ptr < a.ctypes.data + a.nbytes)
                        if end - ptr < need[str(p.source[1])]:
                            short.add(f"{p.source[1]}: {end - ptr} bytes, needs {need[str(p.source[1])]}")

            fake.on_launch = check
            assert tune.bench_job(bench, j, compiled) is not None
        assert short == set()
        lines: list[str] = []  # a buffer the job did not size fails its candidate (it was a null pointer)
        unsized = replace(js[0], buffers=js[0].buffers[1:])
        assert tune.bench_job(bench, unsized, compiled, report=lambda m: lines.append(str(m))) is None
        assert lines == [f"{{'start': '{TWO[0]}'}}"]
    finally:
        bench.close()


def test_cache_key_depends_on_kernel_shape_and_sm() -> None:
    prog = programs.linear_relu_bf16().prog
    opts = BuildOptions(precision="bf16")
    a = tune.jobs(prog, 90, opts, False, 132, "H200")[0]
    assert a.key == tune.jobs(prog, 90, opts, False, 132, "H200")[0].key
    assert a.key != tune.jobs(prog, 80, opts, False, 132, "H200")[0].key
    assert a.key != tune.jobs(prog, 90, opts, False, 114, "H100 PCIe")[0].key
    other = programs.linear_relu().prog  # same shapes, fp32
    assert a.key != tune.jobs(other, 90, BuildOptions(), False, 132, "H200")[0].key
    assert [c for c, _ in a.candidates] == candidates(a.shape, 90)
    assert {b for b, _, _ in a.buffers} == {"x", "w", "b", "y"} and dict(a.env) == {"s0": 512}


def test_no_gpu_falls_back_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> Driver:
        raise IncompatiblePackage("cannot load libcuda.so.1 (not found): this machine has no NVIDIA driver; install one")

    import aotc.cuda_driver

    monkeypatch.setattr(aotc.cuda_driver, "driver", no_driver)
    lines: list[str] = []
    prog = programs.linear_relu_bf16().prog
    assert tune.tune_program(prog, 90, BuildOptions(tune=True), tmp_path, False, note=lines.append) == {}
    assert len(lines) == 1 and "no usable GPU" in lines[0] and "table/heuristic" in lines[0]


def test_other_sm_falls_back(fake: FakeLib, tmp_path: Path) -> None:
    lines: list[str] = []
    assert tune.tune_program(programs.linear_relu().prog, 80, BuildOptions(tune=True), tmp_path, False,
                             drv=fake.drv, note=lines.append) == {}  # type: ignore[attr-defined]  # fmt: skip
    assert lines == ["aotc build --tune: no sm_80 GPU among the 1 visible; using the sm_80 table/heuristic tile configs"]


def test_build_without_tune_is_deterministic_and_tune_without_gpu_matches_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import aotc.cuda_driver

    monkeypatch.setattr(aotc.cuda_driver, "driver", lambda: (_ for _ in ()).throw(IncompatiblePackage("no driver")))
    prog = programs.conv3x3().prog
    plain = BuildOptions(targets=(SM90,))
    t1, m1 = build_cuda_target(prog, SM90, plain, tmp_path / "a")
    t2, m2 = build_cuda_target(prog, SM90, plain, tmp_path / "b")
    t3, m3 = build_cuda_target(prog, SM90, replace(plain, tune=True), tmp_path / "c", tune.tune_program)
    assert m1 == m2 == m3 and t1 == t2 == t3
    src = next(v for k, v in m1.items() if k.endswith(".py")).decode()
    assert "# tile config: " in src


def test_tuned_config_reaches_the_package(fake: FakeLib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune, "candidates", lambda s, sm: TWO)
    fake.cost_ms = lambda launch: float(launch.grid[0])  # fewer tiles: faster
    prog = programs.linear_relu_bf16().prog

    def tuner(*args: Any) -> dict[str, Config]:
        return tune.tune_program(*args, drv=fake.drv)  # type: ignore[attr-defined]

    t, members = build_cuda_target(prog, SM90, BuildOptions(targets=(SM90,), precision="bf16", tune=True), tmp_path, tuner)
    src = next(v for k, v in members.items() if k.endswith(".py")).decode()
    assert "# tile config: 64x64x32 w4 s3 g8 (tuned, sm_90)" in src


def test_tiles_are_chosen_at_the_example_size_of_a_dynamic_dim() -> None:
    """A build for batch 1..4096 run at batch 256 (the example) must not get tiles for 1024 rows."""
    import torch
    from aotc_build.build import compile_graph
    from aotc_build.capture import capture_module
    from aotc_build.codegen.triton.templates import matmul

    lin = torch.nn.Linear(768, 768)
    cap = capture_module(lin, (torch.randn(256, 768),), ({0: torch.export.Dim("batch", min=1, max=4096)},), precision="bf16")
    _, plan, _ = compile_graph(cap)
    assert [s.example for s in plan.symbols] == [256]
    k = next(k for k in plan.kernels if isinstance(k, K.Matmul))
    assert matmul.shape(plan, k, BuildOptions(precision="bf16")) == Shape("matmul", "f16", 256, 768, 768)


# ---- split-K -----------------------------------------------------------------------------------------


def test_split_factor_only_for_skinny_long_k() -> None:
    from aotc_build.codegen.triton.splitk import split_factor

    assert split_factor(f16(64, 1024, 4096), 90) > 1  # the MLP's last layer at 64 rows: 32 tiles for 132 SMs
    assert split_factor(f16(4096, 4096, 4096), 90) == 1
    assert split_factor(f16(64, 1024, 4096, batch=12), 90) == 1
    assert split_factor(f16(64, 1024, 4000), 90) == 1  # K not a multiple of the slices' 64-column steps
    assert split_factor(Shape("conv", "f16", 64, 1024, 4096), 90) == 1
    assert split_factor(f16(64, 1024, 4096), 75) == 1


def test_cuda_target_splits_a_skinny_matmul(tmp_path: Path) -> None:
    import torch
    from aotc_build.build import compile_graph
    from aotc_build.capture import capture_module

    cap = capture_module(torch.nn.Linear(4096, 1024), (torch.randn(64, 4096),), precision="bf16")
    _, plan, _ = compile_graph(cap)
    assert sum(isinstance(k, K.Matmul) for k in plan.kernels) == 1
    t, members = build_cuda_target(plan, SM90, BuildOptions(targets=(SM90,), precision="bf16"), tmp_path)
    assert len(t.launches) == len(plan.kernels) + 1 and t.launches[-1].kernel.endswith("_sum")
    assert any(s.name.endswith("_partials") for s in t.arena)
    src = next(v for k, v in members.items() if k.endswith(".py") and "tile config" in v.decode()).decode()
    assert "BLOCK_K" in src
