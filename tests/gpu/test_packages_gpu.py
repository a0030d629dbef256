"""Packages built on a machine without a GPU (tests/gpu/make_artifacts.py), run here on the GPU through the
runtime alone: the examples (fp32 and bf16), every op-table case and the zoo, at two batch sizes each,
against eager torch: on the build machine's CPU (<name>.ref.npz) and, where tests/gpu/cuda_refs.py has run
on this GPU machine, on CUDA with TF32 off (<name>.cuda.npz). torch is never imported by this test.

    python tests/gpu/cuda_refs.py .gpu-artifacts     # a separate process, with torch
    AOTC_GPU_ARTIFACTS=.gpu-artifacts python -m pytest -m gpu tests/gpu/test_packages_gpu.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ART = Path(os.environ.get("AOTC_GPU_ARTIFACTS", ".gpu-artifacts"))
RESULTS = os.environ.get("AOTC_GPU_RESULTS")
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
    if name.endswith(("_bf16", "_fp16")):  # the issues' bounds: examples and ops 1e-2, the zoo 2e-2
        return 2e-2 if name.startswith("zoo_") else 1e-2
    return 1e-4 if name.startswith("zoo_") else 1e-5


def _check(name: str, got: np.ndarray, want: np.ndarray, against: str) -> None:
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=f"{name} vs {against}")
        return
    tol = _tolerance(name)
    w, g = want.astype(np.float64), got.astype(np.float64)
    scale = max(float(np.abs(w).max()), 1.0)
    if RESULTS:  # the measured error, kept with the device run's results
        err = float(np.abs(g - w).max() / scale)
        with open(RESULTS, "a") as f:
            f.write(json.dumps({"package": name, "against": against, "max_err": err, "tolerance": tol}) + "\n")
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=f"{name} vs {against}")


@needs_gpu
@pytest.mark.parametrize("name", PACKAGES)
def test_package_on_gpu_matches_eager(name: str) -> None:
    import aotc

    ref = np.load(ART / f"{name}.ref.npz")
    cuda_path = ART / f"{name}.cuda.npz"
    if os.environ.get("AOTC_REQUIRE_CUDA_REFS") and not cuda_path.exists():
        pytest.fail(f"{cuda_path} is missing: run tests/gpu/cuda_refs.py {ART} first")
    cuda_ref = np.load(cuda_path) if cuda_path.exists() else None
    model = aotc.load(ART / f"{name}.pkg", device="cuda")
    k = 0
    while f"out.{k}.0" in ref:
        xs = []
        i = 0
        while f"in.{k}.{i}" in ref:
            xs.append(_array(ref[f"in.{k}.{i}"]))
            i += 1
        outs = model(*xs)
        outs = tuple(outs.values()) if isinstance(outs, dict) else outs if isinstance(outs, tuple) else (outs,)
        assert f"out.{k}.{len(outs)}" not in ref, f"{name}: the package returns fewer outputs than eager"
        for j, got in enumerate(outs):  # every output, not only the first
            want = _array(ref[f"out.{k}.{j}"])
            assert got.shape == want.shape and got.dtype == want.dtype, (name, j)
            _check(name, got, want, "eager CPU")
            if cuda_ref is not None:
                _check(name, got, cuda_ref[f"out.{k}.{j}"], "eager CUDA")
        k += 1
    assert k >= 1
    assert "torch" not in sys.modules, "the runtime must not import torch"
