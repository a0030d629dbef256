"""The examples end to end: build each one, then verify and run it in a virtual environment that has only
the runtime installed (`pip install .`; torch not importable), at two batch sizes and one out of range."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from aotc_build.build import build
from aotc_build.options import BuildOptions, Target

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"mlp": (4, 17), "cnn": (1, 6), "transformer": (3, 5)}  # two batch sizes inside each range


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with `pip install .` only: the runtime and its four dependencies, no torch, no triton."""
    venv = tmp_path_factory.mktemp("runtime-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(ROOT)], check=True)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True, check=False)
    assert probe.returncode != 0, "torch must not be importable in the runtime-only venv"
    return venv


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(mod, batch: int) -> list[torch.Tensor]:
    out = []
    for x in mod.example_inputs:
        shape = (batch, *x.shape[1:])
        out.append(torch.randint(0, 1000, shape) if not x.is_floating_point() else torch.randn(shape))
    return out


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_in_runtime_only_venv(name: str, tmp_path: Path, runtime_venv: Path, aotc_cache: Path) -> None:
    pkg = tmp_path / f"{name}.pkg"
    build(ROOT / "examples" / f"{name}.py", pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), cache_dir=aotc_cache)
    aotc = str(runtime_venv / "bin" / "aotc")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    verify = subprocess.run([aotc, "verify", str(pkg)], capture_output=True, text=True, env=env, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    mod = _load_example(name)
    names = list(mod.dynamic_shapes)
    for batch in EXAMPLES[name]:
        torch.manual_seed(batch)
        xs = _inputs(mod, batch)
        args = []
        for n, x in zip(names, xs, strict=True):
            np.save(tmp_path / f"{n}.npy", x.numpy())
            args += ["--input", f"{n}={tmp_path / f'{n}.npy'}"]
        out = tmp_path / "out.npz"
        run = subprocess.run([aotc, "run", str(pkg), *args, "--output", str(out)], capture_output=True, text=True,
                             env=env, check=False)  # fmt: skip
        assert run.returncode == 0, run.stderr
        got = np.load(out)["output0"]
        with torch.no_grad():
            want = mod.model(*xs).numpy()
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)

    # a batch outside the declared range is refused with the input-mismatch exit code and a clear message
    limit = mod.dynamic_shapes[names[0]][0].max
    big = _inputs(mod, limit + 1)
    np.save(tmp_path / "big.npy", big[0].numpy())
    run = subprocess.run([aotc, "run", str(pkg), "--input", f"{names[0]}={tmp_path / 'big.npy'}"], capture_output=True,
                         text=True, env=env, check=False)  # fmt: skip
    assert run.returncode == 5, run.stderr
    assert "batch" in run.stderr and str(limit) in run.stderr


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_builds_real_cubins_for_sm80_and_sm90(name: str, tmp_path: Path, aotc_cache: Path) -> None:
    """On this GPU-less machine: one package with both archs, each kernel a CUDA ELF (e_machine 190) whose
    flags name the arch it was listed under; the manifest reader accepts both targets."""
    import struct

    from aotc.package import Package
    from aotc_build.cubin import elf_sm

    pkg = tmp_path / f"{name}.pkg"
    targets = (Target("cuda", "sm_80"), Target("cuda", "sm_90"))
    build(ROOT / "examples" / f"{name}.py", pkg, BuildOptions(targets=targets, selftest=False), cache_dir=aotc_cache)
    with Package(pkg) as p:
        cudas = p.manifest.cuda_targets
        assert sorted(t.arch for t in cudas) == ["sm_80", "sm_90"]
        for t in cudas:
            assert t.kernels and t.launches
            for k in t.kernels:
                image = p.read(k.member)  # hash-checked
                assert image[:4] == b"\x7fELF" and struct.unpack_from("<H", image, 18)[0] == 190, k.member
                assert f"sm_{elf_sm(image, k.ptxas_version)}" == t.arch, k.member
                assert k.ptx is not None and f".target {t.arch}" in p.read(k.ptx).decode(), k.ptx  # sm_90a for sm_90
