"""The CPU runtime end to end on the hand-built affine package: results, input checks, refusals before
dlopen, target selection, ABI checks, thread safety and the self-test."""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import subprocess
import sys
import threading
import types
from pathlib import Path

import aotc
import numpy as np
import pytest
from affine_pkg import INCLUDE, reference
from aotc import cpu
from aotc.cpu_features import LEVEL_FEATURES, cpu_flags, cpu_level
from aotc.errors import DeviceError, IncompatiblePackage, InputMismatch, PackageCorrupt, UsageError
from aotc.schema import CpuTarget, CudaTarget, TensorSpec
from test_package import flip


def inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal(n).astype(np.float32)


@pytest.fixture
def model(make_package) -> aotc.Model:
    return aotc.load(make_package(), device="cpu")


def test_runs_at_two_batch_sizes(model: aotc.Model) -> None:
    for n in (1, 17):
        x, s = inputs(n)
        y, relu = model(x, s)
        want_y, want_relu = reference(x, s)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(relu, want_relu, rtol=1e-5, atol=1e-6)
        out = model.run({"scale": s, "x": x})
        assert list(out) == ["y", "relu"] and out["y"].shape == (n, 3) and out["y"].dtype == np.float32
    assert model.device == "cpu" and model.target == "cpu:x86-64-v2"
    assert "x: float32[batch, 4]" in repr(model)


def test_keyword_and_non_contiguous_inputs(model: aotc.Model) -> None:
    x, s = inputs(8)
    xf = np.asfortranarray(x)
    s2 = np.repeat(s, 2)[::2]  # a strided view
    y, _ = model(xf, scale=s2)
    np.testing.assert_allclose(y, reference(x, s)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        (
            {"x": inputs(65)[0], "scale": inputs(65)[1]},
            r"input 'x' axis 0 \(batch\): got batch=65, outside the range \[1, 64\]",
        ),
        (
            {"x": np.zeros((0, 4), np.float32), "scale": np.zeros(0, np.float32)},
            r"got batch=0, outside the range \[1, 64\]",
        ),
        (
            {"x": inputs(3)[0], "scale": inputs(4)[1]},
            r"input 'scale' axis 0 \(batch\): got 4, but input 'x' axis 0 has batch=3",
        ),
        (
            {"x": inputs(3)[0].astype(np.float64), "scale": inputs(3)[1]},
            r"got dtype float64, expected float32.*x.astype\(numpy.float32\)",
        ),
        ({"x": inputs(3)[0].astype(">f4"), "scale": inputs(3)[1]}, r"got dtype >f4, expected float32"),
        (
            {"x": inputs(3)[0][None], "scale": inputs(3)[1]},
            r"input 'x': got rank 3 \(shape \[1, 3, 4\]\), expected rank 2: float32\[batch, 4\]",
        ),
        (
            {"x": np.zeros((3, 5), np.float32), "scale": inputs(3)[1]},
            r"input 'x' axis 1: got size 5, expected 4",
        ),
        ({"x": inputs(3)[0]}, r"missing input 'scale' \(float32\[batch\]\)"),
        (
            {"x": inputs(3)[0], "scale": inputs(3)[1], "z": 1},
            r"unknown input 'z'; this model takes \(x: float32\[batch, 4\]",
        ),
    ],
)
def test_bad_inputs_are_refused_before_running(model: aotc.Model, monkeypatch: pytest.MonkeyPatch, feeds: dict, message: str) -> None:
    ran = []
    monkeypatch.setattr(model.executor, "run", lambda *a: ran.append(a))
    with pytest.raises(InputMismatch, match=message):
        model.run(feeds)
    assert ran == []


def test_positional_argument_errors(model: aotc.Model) -> None:
    x, s = inputs(2)
    with pytest.raises(InputMismatch, match="3 positional inputs"):
        model(x, s, s)
    with pytest.raises(InputMismatch, match="both by position and by name"):
        model(x, s, x=x)


def test_expression_dimensions(make_package) -> None:
    """A third input of size 2*batch (the library ignores it): checked against the bound symbol."""

    def edit(m, members):
        return dataclasses.replace(m, inputs=(*m.inputs, TensorSpec("pair", "int64", ("2*s0",))), selftest=None), members

    model = aotc.load(make_package(edit=edit, selftest=False, relink=True))
    x, s = inputs(3)
    model(x, s, np.zeros(6, np.int64))
    with pytest.raises(InputMismatch, match=r"input 'pair' axis 0: got size 5, expected 2\*batch = 6 \(with batch=3\)"):
        model(x, s, np.zeros(5, np.int64))


def test_library_errors_become_typed_errors(model: aotc.Model) -> None:
    x, s = inputs(4)
    x[2, 1] = np.nan
    with pytest.raises(DeviceError, match="model.so failed with code 3: x contains NaN at row 2"):
        model(x, s)
    x[2, 1] = 0  # the executor is still usable
    model(x, s)


def test_corrupt_library_is_refused_before_dlopen(make_package, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_package()
    flip(path, "cpu/x86-64-v2/model.so", offset=5000)
    opened = []
    monkeypatch.setattr(cpu, "_dlopen_bytes", lambda *a: opened.append(a))  # every dlopen goes through it
    with pytest.raises(PackageCorrupt, match="model.so' has sha256"):
        aotc.load(path)
    assert opened == []


def test_corrupt_weights_are_refused_before_dlopen(make_package, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_package()
    flip(path, "weights.safetensors", offset=300)
    opened = []
    monkeypatch.setattr(cpu, "_dlopen_bytes", lambda *a: opened.append(a))
    with pytest.raises(PackageCorrupt, match="weights.safetensors' has sha256"):
        aotc.load(path)
    assert opened == []


def test_two_libraries_never_mix_up(make_package) -> None:
    """Load, drop and load again so that /proc/self/fd numbers repeat; each model keeps its own code."""
    x, s = inputs(5)
    a = aotc.load(make_package("a.pkg"))
    b = aotc.load(make_package("b.pkg", defines=("SCALE=2",), selftest=False))
    np.testing.assert_allclose(b(x, s)[0], 2 * a(x, s)[0], rtol=1e-6)
    for k in (3, 1, 4):
        del a
        gc.collect()
        a = aotc.load(make_package(f"c{k}.pkg", defines=(f"SCALE={k}",), selftest=False))
        np.testing.assert_allclose(a(x, s)[0], reference(x, s, k)[0], rtol=1e-5, atol=1e-6)


def test_abi_version_checks(make_package) -> None:
    def v2(m, members):
        return dataclasses.replace(m, targets=(dataclasses.replace(m.targets[0], abi_version=2),)), members

    with pytest.raises(IncompatiblePackage, match="C ABI version 2; this runtime speaks version 1"):
        aotc.load(make_package("v2.pkg", edit=v2))
    with pytest.raises(IncompatiblePackage, match="reports aotc ABI version 7, the manifest says 1"):
        aotc.load(make_package("v7.pkg", defines=("FAKE_ABI=7",)))


def test_glibc_requirement_is_checked_before_dlopen(make_package) -> None:
    def newer(m, members):
        return dataclasses.replace(m, targets=(dataclasses.replace(m.targets[0], min_glibc="99.0"),)), members

    with pytest.raises(IncompatiblePackage, match=r"needs glibc 99.0 or newer; this machine has \d+\.\d+: build"):
        aotc.load(make_package("glibc99.pkg", edit=newer))
    have = cpu.glibc_version()
    assert have is not None and have >= (2, 17)
    t = dataclasses.replace(_target("x86-64-v2"), min_glibc="2.36")
    cpu.check_glibc(t, have=(2, 36))
    cpu.check_glibc(dataclasses.replace(t, min_glibc=""), have=(1, 0))
    with pytest.raises(IncompatiblePackage, match="needs glibc 2.36 or newer; this machine has 2.31"):
        cpu.check_glibc(t, have=(2, 31))


def test_built_library_records_the_glibc_it_needs(tmp_path: Path, aotc_cache: Path) -> None:
    import torch
    from aotc.package import Package
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    cap = capture_module(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), (torch.randn(2, 4),))
    pkg = tmp_path / "m.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v2"),), selftest=False), aotc_cache)
    with Package(pkg) as p:
        (t,) = p.manifest.cpu_targets
    assert re.fullmatch(r"2\.\d+", t.min_glibc), t.min_glibc
    assert tuple(map(int, t.min_glibc.split("."))) <= cpu.glibc_version()


def test_cdef_matches_the_abi_header() -> None:
    header = (INCLUDE / "aotc_abi.h").read_text()

    def protos(text: str) -> set[str]:
        found = re.findall(r"^(?:int32_t|void) aotc_\w+\([^)]*\);", text, re.M | re.S)
        return {" ".join(p.split()) for p in found}

    assert protos(header) == protos(cpu.CDEF) and len(protos(cpu.CDEF)) == 4
    assert f"#define AOTC_ABI_VERSION {cpu.ABI_VERSION}" in header


def _target(level: str) -> CpuTarget:
    return CpuTarget(level, LEVEL_FEATURES[level], f"cpu/{level}/model.so", 1, 0, "g++", (), ())


def test_target_selection() -> None:
    v2, v3, v4 = (_target(f"x86-64-v{k}") for k in (2, 3, 4))
    v3_flags = frozenset(LEVEL_FEATURES["x86-64-v3"])
    assert cpu.select_target([v2, v4, v3], flags=frozenset(LEVEL_FEATURES["x86-64-v4"]), machine="x86_64") is v4
    assert cpu.select_target([v2, v4, v3], flags=v3_flags, machine="x86_64") is v3
    with pytest.raises(IncompatiblePackage, match=r"cpu:x86-64-v4 needs avx512f, .*Rebuild with --target cpu:x86-64-v3"):
        cpu.select_target([v4], flags=v3_flags, machine="x86_64")
    with pytest.raises(IncompatiblePackage, match="this machine is .*aarch64"):
        cpu.select_target([v2], flags=v3_flags, machine="aarch64")
    with pytest.raises(IncompatiblePackage, match="no CPU target"):
        cpu.select_target([], flags=v3_flags, machine="x86_64")


def test_cpu_level(tmp_path: Path) -> None:
    assert cpu_level(frozenset(LEVEL_FEATURES["x86-64-v4"]) | {"amx_tile"}) == "x86-64-v4"
    assert cpu_level(frozenset(LEVEL_FEATURES["x86-64-v3"])) == "x86-64-v3"
    assert cpu_level(frozenset({"sse2"})) == "x86-64-v2"
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    assert cpu_flags(str(tmp_path / "none")) == frozenset()
    assert cpu_level() in LEVEL_FEATURES


def test_threads_and_concurrent_calls(make_package) -> None:
    model = aotc.load(make_package(), num_threads=2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for n in (1, 9, 64, 33):
                x, s = inputs(n, seed)
                np.testing.assert_allclose(model(x, s)[0], reference(x, s)[0], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # reported below: threads do not raise into pytest
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with pytest.raises(UsageError, match="num_threads"):
        aotc.load(make_package("n.pkg"), num_threads=-1)


def test_eight_threads_five_hundred_calls_each_exact(make_package) -> None:
    """One model, 8 threads x 500 calls with shapes that change under it: every result equal, bit for bit,
    to the single-threaded one (the executor serialises calls on one arena), and close() waits for a call
    in flight instead of unloading code under it."""
    model = aotc.load(make_package(), num_threads=2)
    cases = [inputs(n, seed) for seed, n in enumerate((1, 7, 17, 64))]
    want = [model(x, s) for x, s in cases]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(500):
                j = (i + k) % len(cases)
                got = model(*cases[j])
                if not all(np.array_equal(g, w) for g, w in zip(got, want[j], strict=True)):
                    raise AssertionError(f"thread {k} call {i}: differs from the single-threaded result")
        except BaseException as e:  # reported below: threads do not raise into pytest
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    model.close()
    with pytest.raises(UsageError, match="closed"):
        model(*cases[0])


def test_verify(make_package, model: aotc.Model) -> None:
    checks = model.verify()
    assert [c.name for c in checks] == ["y", "relu"] and all(c.ok for c in checks)
    assert all(c.max_abs < 1e-5 for c in checks)
    wrong = aotc.load(make_package("wrong.pkg", defines=("SCALE=2",)))
    checks = wrong.verify()
    assert not checks[0].ok and checks[0].max_rel == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(UsageError, match="no self-test"):
        aotc.load(make_package("none.pkg", selftest=False)).verify()


def test_unknown_device(make_package) -> None:
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        aotc.load(make_package(), device="tpu")


def _with_cuda_target(m, members):
    t = CudaTarget("sm_90", "3.6.0", "12.8", 12080, "fp32", 0, (), (), ())
    return dataclasses.replace(m, targets=(*m.targets, t)), members


def test_cuda_requests(make_package, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(IncompatiblePackage, match="no CUDA target .*cpu:x86-64-v2"):
        aotc.load(make_package(), device="cuda")
    path = make_package("cuda.pkg", edit=_with_cuda_target)
    monkeypatch.setitem(sys.modules, "aotc.cuda", None)  # as if the module were missing: import fails
    with pytest.raises(IncompatiblePackage, match="cannot run CUDA targets"):
        aotc.load(path, device="cuda")
    model = aotc.load(path)  # auto: falls back to the CPU target and says why
    assert model.device == "cpu" and "cannot run CUDA targets" in (model.fallback or "")
    monkeypatch.setattr(cpu, "cpu_flags", frozenset)  # a CPU with no flags at all
    with pytest.raises(IncompatiblePackage, match="no CPU target .* and the CUDA targets cannot run either"):
        aotc.load(path)


def test_cuda_handoff(make_package, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_package("cuda.pkg", edit=_with_cuda_target)
    calls = []

    def no_gpu(package, device):
        calls.append((package.manifest.cuda_targets, device))
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "aotc.cuda", types.SimpleNamespace(open_executor=no_gpu))
    with pytest.raises(IncompatiblePackage, match="install the NVIDIA driver"):
        aotc.load(path, device="cuda:1")
    assert calls[0][0][0].arch == "sm_90" and calls[0][1] == "cuda:1"
    assert aotc.load(path).device == "cpu"


def test_close_unloads_the_library(make_package) -> None:
    def mapped() -> int:
        with open("/proc/self/maps") as f:
            return sum("memfd:" in line for line in f)

    gc.collect()
    before = mapped()
    path = make_package()
    with aotc.load(path) as model:
        assert mapped() > before
        model(*inputs(2))
    assert mapped() == before
    with pytest.raises(UsageError, match="closed"):
        model(*inputs(2))
    for _ in range(3):  # dropped models are unloaded too
        aotc.load(path)(*inputs(2))
        gc.collect()
    assert mapped() == before


def test_thread_pool_counts_agree_and_unload_joins_workers(tmp_path: Path, aotc_cache: Path) -> None:
    """A built library's loops (matmul, pointwise, reduction: all big enough to go parallel) give the same
    bits on one thread, on a fixed 2 or 3 (more than this machine's cores), and adaptive; unloading the
    library ends its worker threads (they live in its code)."""
    import torch
    from aotc.package import Package
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(torch.nn.functional.gelu(self.fc(x)), dim=-1)

    torch.manual_seed(0)
    cap = capture_module(Net().eval(), (torch.randn(512, 256),))
    pkg = tmp_path / "m.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v2"),), selftest=False), aotc_cache)
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    gc.collect()
    before = tasks()
    outs = []
    for threads, fixed in ((1, False), (2, True), (3, True), (None, False)):
        p = Package(pkg)
        ex = cpu.CpuExecutor(p, cpu.select_target(p.manifest.cpu_targets), num_threads=threads, fixed_threads=fixed)
        model = aotc.Model(p, ex)
        outs += [np.asarray(model(x)) for _ in range(3)]
        if threads == 3:
            assert tasks() == before + 2  # the caller works too: two workers
        model.close()
        assert tasks() == before
    # Set after loading: the count changes from the next call on, the same bits at every count.
    p = Package(pkg)
    ex = cpu.CpuExecutor(p, cpu.select_target(p.manifest.cpu_targets))
    model = aotc.Model(p, ex)
    assert ex.num_threads is None
    for threads, fixed in ((1, False), (3, True), (2, False), (None, False)):
        ex.set_threads(threads, fixed_threads=fixed)
        assert ex.num_threads == threads
        outs += [np.asarray(model(x)) for _ in range(2)]
    # With another process keeping a core busy: a worker is descheduled now and then, its chunks are taken
    # by the others, and the result is still the same bits.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for threads, fixed in ((3, True), (2, True), (None, False)):
            ex.set_threads(threads, fixed_threads=fixed)
            outs += [np.asarray(model(x)) for _ in range(5)]
    finally:
        busy.kill()
        busy.wait()
    with pytest.raises(UsageError, match="num_threads"):
        ex.set_threads(-2)
    model.close()
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    with pytest.raises(UsageError, match="fixed_threads"):
        p = Package(pkg)
        cpu.CpuExecutor(p, cpu.select_target(p.manifest.cpu_targets), fixed_threads=True)
