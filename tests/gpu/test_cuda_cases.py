"""Every case of ``build_artifacts.py`` on a real GPU, each in its own process where torch cannot load.

The artifacts (cubins, target dicts, test vectors) are built on a machine without a GPU and carried:

    python tests/gpu/build_artifacts.py .aotc-cache/gpu          # build machine
    pytest -m gpu tests/gpu                                      # GPU machine (AOTC_GPU_ARTIFACTS overrides)

Where they are missing and Triton is importable, they are built here first. AOTC_GPU_RESULTS names a
file to write every case's full result to (JSON lines), for the record of a GPU run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import gpu_unavailable

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ART = Path(os.environ.get("AOTC_GPU_ARTIFACTS", ROOT / ".aotc-cache" / "gpu"))
PROGRAMS = [
    "pointwise_permute", "masked_pad", "gather", "softmax", "softmax_long", "layer_norm", "linear_relu",
    "linear_relu_bf16", "batched_matmul", "conv3x3", "conv_grouped", "cumsum", "cumsum_long",
    "two_kernels_arena", "elementwise_ops", "integer_ops",
]  # fmt: skip
LAUNCH_ABI = [f"scale_{k}" for k in ("f16", "bf16", "f32", "f64", "i1", "i8", "i32", "i64")]
LAUNCH_ABI += ["ex_cluster", "ex_pdl", "ex_coop", "tma_scratch", "fault", "refusals"]
PACKAGES = ["pkg_linear_relu", "pkg_two_kernels_arena", "pkg_layer_norm"]

NO_GPU = gpu_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]


def _run_one(name: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, str(HERE / "run_cases.py"), str(ART), name],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"case": name, "ok": False, "error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}
    return dict(json.loads(lines[-1]), stderr=p.stderr[-1000:])


@pytest.fixture(scope="session")
def results() -> dict[str, dict[str, Any]]:
    if not (ART / "index.json").exists():
        try:
            import triton  # noqa: F401
        except ImportError:
            pytest.skip(f"no GPU artifacts at {ART}: run tests/gpu/build_artifacts.py on a build machine")
        import build_artifacts

        build_artifacts.main([str(ART)])
    names = json.loads((ART / "index.json").read_text())["cases"] + ["refusals"]
    with ThreadPoolExecutor(4) as pool:
        out = {r["case"]: r for r in pool.map(_run_one, names)}
    dest = os.environ.get("AOTC_GPU_RESULTS")
    if dest:
        with open(dest, "w") as f:
            for r in out.values():
                f.write(json.dumps(r) + "\n")
    return out


def _explain(r: dict[str, Any]) -> str:
    bad = [c for c in r.get("checks", []) if not c.get("ok")]
    keep = {k: v for k, v in r.items() if k not in ("checks", "case")}
    return json.dumps({"failed_checks": bad[:6], **keep}, indent=1)[:6000]


@pytest.mark.parametrize("case", PROGRAMS + LAUNCH_ABI + PACKAGES)
def test_case(results: dict[str, dict[str, Any]], case: str) -> None:
    if case not in results:
        pytest.skip(f"{case} was not built for this SM (see index.json)")
    r = results[case]
    assert r["ok"], _explain(r)
    assert not r["torch_imported"]
