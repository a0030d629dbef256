"""The Triton code generator and cross-compiler, on a machine without a GPU.

For each hand-made Program of tests/gpu/programs.py: cubins for sm_80 and sm_90 that are real CUDA ELF
files for those archs, parameter lists read from the PTX that match the launch arguments (plus Triton's
scratch pointers), grids that evaluate; the generated kernels computed by Triton's interpreter against the
numpy references; and a golden text of one generated kernel (UPDATE_GOLDEN=1 rewrites it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aotc import schema, shapes
from aotc.errors import CompileError
from aotc_build import cubin
from aotc_build.codegen import triton as tg
from aotc_build.options import BuildOptions, Target
from golden import check_golden

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import programs

CASES = {c.name: c for c in programs.all_cases()}


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("AOTC_CACHE_DIR")
    return Path(env) / "cubin" if env else tmp_path_factory.mktemp("cubins")


@pytest.mark.parametrize("sm", [80, 90])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cubins_for_sm(name: str, sm: int, cache: Path) -> None:
    case = CASES[name]
    t, members = cubin.build_cuda_target(case.prog, Target("cuda", f"sm_{sm}"), BuildOptions(precision=case.precision), cache)
    assert t.arch == f"sm_{sm}" and t.min_driver >= 12000
    for k in t.kernels:
        image = members[k.member]
        assert image[:4] == b"\x7fELF"
        assert cubin.elf_sm(image, k.ptxas_version) == sm
        assert members[k.source or ""].startswith(b"import triton")
        kinds = [p.kind for p in k.params]
        assert kinds[k.num_args :] in (["global_scratch"], ["global_scratch", "profile_scratch"])
        assert all(p.bytes == schema.PARAM_BYTES[p.kind] for p in k.params)
    for launch in t.launches:
        k = t.kernel(launch.kernel)
        assert [a.kind for a in launch.args] == [p.kind for p in k.params[: k.num_args]]
        for env in case.trials:
            grid = [shapes.evaluate(g, env) for g in launch.grid]
            assert grid[0] >= 1 and grid[1:] == [1, 1]


def test_identical_kernels_share_one_cubin(cache: Path) -> None:
    case = CASES["two_kernels_arena"]
    prog = case.prog
    prog2 = dataclasses.replace(prog, kernels=[prog.kernels[0], prog.kernels[0]])
    t, members = cubin.build_cuda_target(prog2, Target("cuda", "sm_90"), BuildOptions(), cache)
    assert len(t.kernels) == 1 and len(t.launches) == 2
    assert [x.kernel for x in t.launches] == ["scale", "scale"]


def test_same_program_same_bytes(tmp_path: Path) -> None:
    """Rule 6: no paths or timestamps in the cubins (line info is off), so two builds are identical."""
    case = CASES["softmax"]
    a = cubin.build_cuda_target(case.prog, Target("cuda", "sm_90"), BuildOptions(), tmp_path / "one")
    b = cubin.build_cuda_target(case.prog, Target("cuda", "sm_90"), BuildOptions(), tmp_path / "two")
    assert a == b


def test_ptx_params_read_from_entry() -> None:
    ptx = """.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .align 2 .b8 k_param_1[2],
	.param .f32 k_param_2,
	.param .u8 k_param_3,
	.param .u64 .ptr .global .align 1 k_param_4,
	.param .u64 .ptr .global .align 1 k_param_5
)"""
    assert cubin.ptx_params(ptx, "k") == (8, 2, 4, 1, 8, 8)
    with pytest.raises(CompileError, match="no .entry other"):
        cubin.ptx_params(ptx, "other")


def test_wrong_arch_cubin_refused() -> None:
    with pytest.raises(CompileError, match="not sm_90"):
        cubin.check_cubin(b"\x7fELF\x02" + bytes(13) + b"\xbe\x00" + bytes(29) + b"\x00\x50\x00\x00" + bytes(12), 90, "13.4", "x")


def test_compile_error_names_the_source_file(tmp_path: Path) -> None:
    src = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef bad(x):\n    tl.store(x, undefined_name)\n"
    with pytest.raises(CompileError, match=r"(?s)bad\.py \(kernel bad, sm_90\).*undefined_name"):
        cubin.compile_source(src, "bad", {"x": "*fp32"}, {}, sm=90, cache_dir=tmp_path)


def test_index_type_follows_symbol_bounds() -> None:
    assert not tg.index_is_i64(CASES["softmax"].prog)  # s0 <= 64: every buffer under 2**31 elements
    prog = CASES["softmax"].prog
    unbounded = programs.program([programs.sym("s0", 1, None)], prog.inputs, prog.outputs, prog.weights, prog.kernels)
    assert tg.index_is_i64(unbounded)
    src = tg.generate(unbounded, prog.kernels[0], BuildOptions(), 90).source
    assert "tl.program_id(0).to(tl.int64)" in src


def test_golden_softmax_source() -> None:
    case = CASES["softmax"]
    text = tg.generate(case.prog, case.prog.kernels[0], BuildOptions(), 90).source
    check_golden("triton_softmax.py.txt", text)


# ---- numerics through Triton's interpreter (CPU) --------------------------------------------------------


@pytest.fixture(scope="session")
def interpreted() -> dict[str, dict[str, Any]]:
    """Every case run by tests/triton_interpret.py (Triton's interpreter must be on before triton imports)."""
    pytest.importorskip("torch")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "triton_interpret.py"), *sorted(CASES)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["case"]] = r
    if not out:
        pytest.fail(f"triton_interpret.py printed no results (exit {p.returncode}): {p.stderr[-3000:]}")
    return out


# Cases whose Triton kernels are known to differ from the reference (strict: an unexpected pass fails).
KNOWN_GAPS: dict[str, str] = {}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[n])) if n in KNOWN_GAPS else n for n in sorted(CASES)]
)
def test_interpreted_kernels_match_reference(name: str, interpreted: dict[str, dict[str, Any]]) -> None:
    r = interpreted.get(name, {"ok": False, "error": "no result"})
    assert r["ok"], json.dumps(r, indent=1)[:4000]
