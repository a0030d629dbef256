"""Packages built on a machine without a GPU (tests/gpu/make_artifacts.py), run here on the GPU through the
runtime alone: the examples (fp32 and bf16), every op-table case and the zoo, at two batch sizes each,
against eager torch references computed at build time. torch is never imported by this test.

    AOTC_GPU_ARTIFACTS=.gpu-artifacts python -m pytest -m gpu tests/gpu/test_packages_gpu.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ART = Path(os.environ.get("AOTC_GPU_ARTIFACTS", ".gpu-artifacts"))
PACKAGES = sorted(p.stem for p in ART.glob("*.pkg")) if ART.is_dir() else []


def _gpu() -> bool:
    try:
        from aotc import cuda

        return cuda.available()
    except Exception:
        return False


needs_gpu = pytest.mark.skipif(not (_gpu() and PACKAGES), reason="needs an NVIDIA GPU and built artifacts")


def _array(a: np.ndarray) -> np.ndarray:
    """np.savez stores ml_dtypes.bfloat16 as raw 2-byte voids; view them back."""
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a


def _tolerance(name: str) -> float:
    if name.endswith("_bf16"):
        return 1e-2 if name.startswith("op_") else 2e-2
    return 1e-4 if name.startswith("zoo_") else 1e-5


@needs_gpu
@pytest.mark.parametrize("name", PACKAGES)
def test_package_on_gpu_matches_eager(name: str) -> None:
    import aotc

    ref = np.load(ART / f"{name}.ref.npz")
    model = aotc.load(ART / f"{name}.pkg", device="cuda")
    k = 0
    while f"out.{k}" in ref:
        xs = []
        i = 0
        while f"in.{k}.{i}" in ref:
            xs.append(_array(ref[f"in.{k}.{i}"]))
            i += 1
        want = _array(ref[f"out.{k}"])
        got = model(*xs)
        assert got.shape == want.shape and got.dtype == want.dtype
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want)
        else:
            tol = _tolerance(name)
            w, g = want.astype(np.float64), got.astype(np.float64)
            scale = max(float(np.abs(w).max()), 1.0)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)
        k += 1
    assert k >= 1
    assert "torch" not in sys.modules, "the runtime must not import torch"
