"""Device arrays from torch in and out of ``aotc.cuda`` without copies (``__cuda_array_interface__``, DLPack).

Runs in the pytest process (it needs torch, which the runtime itself never imports), on artifacts from
``build_artifacts.py``; skipped without a GPU, without torch's CUDA build, or without the artifacts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import gpu_unavailable
from aotc.errors import InputMismatch

NO_GPU = gpu_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]
ROOT = Path(__file__).resolve().parents[2]
ART = Path(os.environ.get("AOTC_GPU_ARTIFACTS", ROOT / ".aotc-cache" / "gpu"))


class DLPackOnly:
    """Hides every interface of a tensor but DLPack."""

    def __init__(self, t: Any) -> None:
        self._t = t
        self.shape = tuple(t.shape)
        self.dtype = t.dtype

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._t.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def _executor(case: str) -> tuple[Any, Any]:
    from aotc import cuda, schema

    d = ART / case
    if not (d / "manifest.json").exists():
        pytest.skip(f"no artifacts for {case} at {ART}")
    m = schema.from_json((d / "manifest.json").read_text())
    meta = json.loads((d / "case.json").read_text())
    with np.load(d / "data.npz") as z:
        ws = []
        for w in m.weights.tensors:
            a = z[f"w:{w.name}"]
            ws.append(a.view(cuda.np_dtype(w.dtype)) if meta["dtypes"][f"w:{w.name}"] == "bfloat16" else a)
    return cuda.CudaExecutor(m, m.cuda_targets[0], lambda name: (d / name).read_bytes(), ws), m


def _env(m: Any, *shapes: tuple[int, ...]) -> dict[str, int]:
    """The symbol values the input shapes give (each symbol is a plain dimension of some input)."""
    names = {s.name for s in m.symbols}
    return {d: int(n) for spec, shape in zip(m.inputs, shapes, strict=True) for d, n in zip(spec.shape, shape, strict=True) if d in names}


def _torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


@pytest.mark.parametrize("via", ["cai", "dlpack"])
def test_linear_relu_with_torch_tensors(via: str) -> None:
    torch = _torch()
    ex, m = _executor("linear_relu")
    w, b = (torch.from_numpy(np.array(a)).cuda() for a in (ex_weights(m, 0), ex_weights(m, 1)))
    x = torch.randn(37, 96, device="cuda")
    y = torch.full((37, 80), float("nan"), device="cuda")
    xs, ys = (x, y) if via == "cai" else (DLPackOnly(x), DLPackOnly(y))
    (out,) = ex.run([xs], _env(m, tuple(x.shape)), outputs=[ys])
    assert out is ys
    torch.cuda.synchronize()
    ref = torch.relu(x.double() @ w.double() + b.double())
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


def ex_weights(m: Any, i: int) -> np.ndarray:
    with np.load(ART / "linear_relu" / "data.npz") as z:
        return z[f"w:{m.weights.tensors[i].name}"]


def test_bf16_through_dlpack() -> None:
    torch = _torch()
    ex, m = _executor("linear_relu_bf16")
    x = torch.randn(9, 96, device="cuda").to(torch.bfloat16)
    (y,) = ex.run([DLPackOnly(x)], _env(m, tuple(x.shape)), device_outputs=True)
    host = y.numpy()
    assert host.shape == (9, 80) and np.isfinite(host.astype(np.float32)).all()


def test_non_contiguous_refused() -> None:
    torch = _torch()
    ex, m = _executor("linear_relu")
    x = torch.randn(96, 37, device="cuda").t()
    with pytest.raises(InputMismatch, match="C-contiguous"):
        ex.run([x], _env(m, tuple(x.shape)))
