"""Every C++ template in cpp_templates/ compiles on its own with its default #defines (so each reads as real C++),
at every CPU level we target; templates with a self-test block (``#ifdef AOTC_SELFTEST_<NAME>``, the file's
last such ``#ifdef``: an earlier one is a hook of a self-test, e.g. aotc_pool_loop.h's clock for
aotc_pool.h's) are also built into a small program and run, which instantiates their templates and checks
them against a naive loop.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from aotc_build.compile import templates_dir
from aotc_build.options import CPU_LEVELS

HEADERS = sorted(p for p in templates_dir().iterdir() if p.suffix in (".h", ".cpp"))
NATIVE = "x86-64-v4" if "avx512f" in Path("/proc/cpuinfo").read_text() else "x86-64-v3"
CXX = ["g++", "-std=c++17", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{templates_dir()}"]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)


def test_headers_exist() -> None:
    names = {p.name for p in HEADERS}
    assert {"aotc_abi.h", "aotc_cpu.h", "matmul.h", "conv.h"} <= names


def test_every_template_compiles_alone_at_every_level() -> None:
    jobs = [(h, level) for h in HEADERS for level in CPU_LEVELS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda j: _run([*CXX, f"-march={j[1]}", "-fsyntax-only", "-x", "c++", str(j[0])]), jobs))
    failed = [f"{h.name} at {level}:\n{r.stderr}" for (h, level), r in zip(jobs, results, strict=True) if r.returncode]
    assert not failed, "\n".join(failed)


def test_abi_header_is_plain_c() -> None:
    r = _run(
        [
            "gcc",
            "-std=c99",
            "-Wall",
            "-Werror",
            "-fsyntax-only",
            "-x",
            "c",
            str(templates_dir() / "aotc_abi.h"),
        ]
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("header", [h for h in HEADERS if "AOTC_SELFTEST_" in h.read_text()], ids=lambda h: h.name)
def test_template_selftest(header: Path, tmp_path: Path) -> None:
    macros = re.findall(r"#ifdef (AOTC_SELFTEST_\w+)", header.read_text())
    assert macros
    exe = tmp_path / "selftest"
    # the native vector path, the AVX2 one (an AVX2-only server's, when this machine has AVX-512), the fallback
    runs: list[tuple[str, list[str]]] = [(level, []) for level in dict.fromkeys((NATIVE, "x86-64-v3", "x86-64-v2"))]
    if header.name == "matmul.h":  # the L2 budget comes from this machine's L2: also the small-L2 part's
        runs.append(("x86-64-v3", ["-DAOTC_MM_A_L2=262144", "-DAOTC_MM_B_L2=262144"]))
    for level, extra in runs:
        cmd = [*CXX, "-O2", f"-march={level}", f"-D{macros[-1]}", *extra, "-x", "c++", str(header), "-o", str(exe)]
        build = _run(cmd)
        assert build.returncode == 0, build.stderr
        run = _run([str(exe)])
        assert run.returncode == 0, f"{header.name} self-test failed at {level} {extra}: {run.stdout}{run.stderr}"
