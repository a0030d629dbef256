"""Safety on a real GPU (issue 12): one CUDA model from 8 threads, close() while calls run, out of memory
and back, and the PTX path (a package whose cubins were removed; an sm_80 package on a newer GPU).

The packages are built here, from examples/mlp.py, with the GPU hidden from the builder (as a build
machine without a GPU builds them): this machine's Triton writes PTX its driver can compile. The
stand-in versions of these tests run everywhere: tests/test_cuda_safety.py.

    python -m pytest -m gpu tests/gpu/test_safety_gpu.py -v -s
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import ensure_importable, gpu_unavailable
from threaded import calls_around_close, calls_exact

NO_GPU = gpu_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]
ROOT = Path(__file__).resolve().parents[2]


def _build(out: Path, target: str) -> Path:
    ensure_importable(builder=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-c", "from aotc.__main__ import main; main()", "build", str(ROOT / "examples" / "mlp.py"),
           "-o", str(out), "--target", target, "-q"]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _strip_cubins(src: Path, out: Path) -> Path:
    """The package with every cubin left out (the kernels keep their PTX)."""
    from aotc.package import Package
    from aotc_build.package import write_package

    with Package(src) as pkg:
        m = pkg.manifest
        targets = tuple(
            dataclasses.replace(t, kernels=tuple(dataclasses.replace(k, member=None) for k in t.kernels)) for t in m.cuda_targets
        )
        cubins = {k.member for t in m.cuda_targets for k in t.kernels}
        members = {n: pkg.read(n) for n in m.members if n not in cubins}
        write_package(out, dataclasses.replace(m, targets=targets), members)
    return out


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("safety")
    sm90 = _build(d / "mlp90.pkg", "cuda:sm_90")
    return {"sm90": sm90, "ptx90": _strip_cubins(sm90, d / "mlp90-ptx.pkg"), "sm80": _build(d / "mlp80.pkg", "cuda:sm_80")}


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, 256)).astype(np.float32) for n in (1, 8, 33, 256)]


def test_eight_threads_five_hundred_calls_each_exact(pkgs: dict[str, Path]) -> None:
    import aotc

    model = aotc.load(pkgs["sm90"], device="cuda")
    assert model.device.startswith("cuda")
    print(f"8 threads x 500 calls: {calls_exact(model, _inputs()):.2f} s")
    model.close()


def test_close_while_threads_run(pkgs: dict[str, Path]) -> None:
    """Every call either returns the exact result or is refused as closed: close() waits for the call in
    flight, never frees memory under a kernel."""
    import aotc

    model = aotc.load(pkgs["sm90"], device="cuda")
    outcomes = calls_around_close(model, _inputs()[3], wait=0.5, join=30)
    print(f"calls around close(): {outcomes}")
    assert outcomes["closed"] == 4 and outcomes["ok"] > 0, outcomes


def test_out_of_memory_then_usable(pkgs: dict[str, Path]) -> None:
    """With the GPU's memory taken, a call that needs new memory is a DeviceError naming it; once the
    memory is free again the same model runs and gives the same result."""
    import aotc
    from aotc import cuda

    model = aotc.load(pkgs["sm90"], device="cuda")
    small, big = _inputs()[0], _inputs()[3]
    want = model(big)
    model.close()
    model = aotc.load(pkgs["sm90"], device="cuda")
    model(small)  # its arena and staging are sized for batch 1
    drv = cuda.driver()
    held: list[int] = []
    size = 8 << 30
    while size >= 64 << 10:  # take every byte the driver hands out
        try:
            held.append(drv.alloc(size, "test ballast"))
        except aotc.DeviceError:
            size //= 2
    try:
        with pytest.raises(aotc.DeviceError, match="OUT_OF_MEMORY"):
            model(big)
    finally:
        for p in held:
            drv.free(p)
    assert np.array_equal(model(big), want)
    model.close()


def _same(a: np.ndarray, b: np.ndarray) -> str:
    return "bit-identical" if np.array_equal(a, b) else f"max abs diff {float(np.abs(a - b).max()):.3g}"


def test_sm90_without_cubins_runs_its_ptx(pkgs: dict[str, Path]) -> None:
    import aotc

    cubin = aotc.load(pkgs["sm90"], device="cuda")
    model = aotc.load(pkgs["ptx90"], device="cuda")
    note = model.executor.note  # type: ignore[attr-defined]
    assert note and "PTX through the driver's JIT" in note, note
    assert all(c.ok for c in model.verify())
    for x in _inputs():
        a, b = model(x), cubin(x)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        print(f"batch {x.shape[0]}: PTX path vs cubin: {_same(a, b)}")
    r = subprocess.run(
        [sys.executable, "-c", "from aotc.__main__ import main; main()", "verify", str(pkgs["ptx90"]), "--device", "cuda"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and "note: running the sm_90 PTX" in r.stderr, r.stderr


def test_sm80_package_runs_on_a_newer_gpu_through_ptx(pkgs: dict[str, Path]) -> None:
    """No sm_80 cubin runs on sm_90: its PTX (``.target sm_80``) does, as it would on any newer GPU."""
    import aotc

    model = aotc.load(pkgs["sm80"], device="cuda")
    note = model.executor.note  # type: ignore[attr-defined]
    assert note and "no cubin in the package runs on" in note, note
    assert all(c.ok for c in model.verify())
    ref = aotc.load(pkgs["sm90"], device="cuda")
    for x in _inputs():
        np.testing.assert_allclose(model(x), ref(x), rtol=1e-4, atol=1e-5)
