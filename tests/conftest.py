"""Shared fixtures. Plain helpers live in affine_pkg.py: test modules import them from there, because
`conftest` is not a unique module name (tests/gpu has its own)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from affine_pkg import AFFINE_CPP, INCLUDE, B, W, affine_interface_cpp, affine_manifest, reference
from aotc.schema import Manifest
from aotc_build.package import selftest_member, weights_member, write_package
from fake_libcuda import FakeLib


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLib:
    """The stand-in libcuda (tests/fake_libcuda.py) behind the driver of ``aotc.cuda`` (the executor) and
    ``aotc.cuda_targets`` (the target choice), for this test only."""
    from aotc import cuda, cuda_targets
    from aotc.cuda_driver import Driver, new_ffi

    ffi = new_ffi()
    lib = FakeLib(ffi)
    drv = Driver(lib=lib, ffi=ffi)
    for module in (cuda, cuda_targets):
        monkeypatch.setattr(module, "driver", lambda: drv)
    lib.drv = drv  # type: ignore[attr-defined]
    return lib


@pytest.fixture(scope="session")
def compile_lib(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., bytes]:
    """Compile AFFINE_CPP (with -D defines) once per distinct define set; returns the .so bytes. It embeds
    the interface of ``manifest`` (default: the affine manifest's), as the builder embeds its plan's."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the test library")
    cache: dict[tuple, bytes] = {}
    work = tmp_path_factory.mktemp("lib")

    def build(*defines: str, manifest: Manifest | None = None) -> bytes:
        record = affine_interface_cpp(manifest)
        key = (defines, record)
        if key not in cache:
            src, out = work / f"affine{len(cache)}.cpp", work / f"affine{len(cache)}.so"
            src.write_text(AFFINE_CPP + record)
            cmd = ["g++", "-O2", "-shared", "-fPIC", "-fopenmp", f"-I{INCLUDE}", *(f"-D{d}" for d in defines)]
            subprocess.run([*cmd, str(src), "-o", str(out)], check=True)
            cache[key] = out.read_bytes()
        return cache[key]

    return build


@pytest.fixture
def make_package(tmp_path: Path, compile_lib: Callable[..., bytes]) -> Callable[..., Path]:
    """make_package(name="a.pkg", edit=None, defines=(), selftest=True, relink=False) -> path of a written
    package. ``edit(manifest, members) -> (manifest, members)`` changes either before writing; ``relink``: the
    library is rebuilt to embed the edited manifest's interface (an edit the library agrees with)."""

    def make(
        name: str = "affine.pkg",
        edit: Callable[[Manifest, dict[str, bytes]], tuple[Manifest, dict[str, bytes]]] | None = None,
        defines: tuple[str, ...] = (),
        selftest: bool = True,
        relink: bool = False,
    ) -> Path:
        m = affine_manifest()
        _, wblob = weights_member([("W", W), ("b", B)])
        members = {"weights.safetensors": wblob, "cpu/x86-64-v2/model.so": compile_lib(*defines)}
        if selftest:
            rng = np.random.default_rng(1)  # fixed, so equal calls write equal packages
            x = rng.standard_normal((5, 4)).astype(np.float32)
            scale = rng.standard_normal(5).astype(np.float32)
            y, relu = reference(x, scale)
            st, blob = selftest_member([("x", x), ("scale", scale)], [("y", y), ("relu", relu)], 1e-5, 1e-6)
            m = dataclasses.replace(m, selftest=st)
            members["selftest.safetensors"] = blob
        if edit is not None:
            m, members = edit(m, members)
        if relink:
            members["cpu/x86-64-v2/model.so"] = compile_lib(*defines, manifest=m)
        path = tmp_path / name
        write_package(path, m, members)
        return path

    return make


@pytest.fixture(scope="session")
def aotc_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compiled-kernel cache shared by the tests of one run ($AOTC_CACHE_DIR in CI)."""
    import os

    env = os.environ.get("AOTC_CACHE_DIR")
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return tmp_path_factory.mktemp("aotc-cache")


@pytest.fixture
def cpu_runs() -> Callable[[str], None]:
    """``cpu_runs(level)`` skips the test where this CPU cannot run code built for x86-64 ``level``."""
    from aotc.cpu_features import LEVELS, cpu_level

    def check(level: str) -> None:
        if LEVELS.index(cpu_level()) < LEVELS.index(level):
            pytest.skip(f"this CPU cannot run {level}")

    return check
