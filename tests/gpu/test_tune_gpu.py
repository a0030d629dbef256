"""``aotc build --tune`` on a real GPU: the tuner benchmarks candidates with the runtime's launcher, caches
the winners, and the package built with them (split-K included) computes what eager torch computes.

Needs the builder (torch + triton) and a GPU: run on the H200 host with ``pytest -m gpu tests/gpu/test_tune_gpu.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import ensure_importable, gpu_unavailable

NO_GPU = gpu_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_tuned_mlp_matches_eager(tmp_path: Path, precision: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    ensure_importable(builder=True)
    import aotc
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).eval()
    x = torch.randn(64, 1024)
    cap = capture_module(model, (x,), precision=precision, name="mlp")
    opts = BuildOptions(targets=(Target("cuda", "sm_90"),), precision=precision, tune=True)
    pkg = tmp_path / "mlp.pkg"
    build_captured(cap, pkg, opts, tmp_path / "cache")
    entries = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "tune").rglob("*.json")]
    assert entries and all(e["ms"] > 0 and len(e["timings"]) >= 2 for e in entries)
    for e in entries:
        print(e["shape"], e["config"], e["timings"][:3])
    m = aotc.load(pkg, device="cuda")
    checks = m.verify()  # the self-test: the example input against the eager output recorded at build time
    assert checks and all(c.ok for c in checks), checks
    kernels = m.manifest.targets[0].kernels
    assert any(k.name.endswith("_sum") for k in kernels)  # the 64x1024x4096 layer ran split-K
