"""Out-of-range token ids on a real GPU: device-resident ids (torch CUDA tensors, used in place) are checked by
the runtime's PTX kernel (aotc.indices) and refused as InputMismatch naming the input, the value, where it is
and the vocabulary size; in-range ids give eager's result, with and without CUDA graphs.

Needs the builder (torch + triton) and a GPU: ``python -m pytest -m gpu tests/gpu/test_token_ids_gpu.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import ensure_importable, gpu_unavailable

NO_GPU = gpu_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]


def test_device_token_ids_checked(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    ensure_importable(builder=True)
    import aotc
    from aotc.errors import InputMismatch
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(1000, 64)
            self.fc = torch.nn.Linear(64, 16)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.fc(self.emb(ids))

    torch.manual_seed(0)
    model = M().eval()
    ids = torch.randint(0, 1000, (4, 128))
    cap = capture_module(model, (ids,), name="emb")
    pkg = tmp_path / "emb.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cuda", "sm_90"),)), tmp_path / "cache")
    m = aotc.load(pkg, device="cuda")
    assert m.manifest.index_ranges and m.manifest.index_ranges[0].size == 1000
    with torch.no_grad():
        want = model(ids).numpy()
    for graphs in (True, False):
        m.executor.graphs = graphs
        for _ in range(2):
            got = m.executor.to_host(m(ids.cuda()))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        for at, value in (((1, 7), 1000), ((3, 127), -1), ((0, 0), 2**40)):
            bad = ids.clone()
            bad[at] = value
            with pytest.raises(InputMismatch) as e:
                m(bad.cuda())
            msg = str(e.value)
            assert f"input 'ids': value {value} at {list(at)} is outside [0, 1000)" in msg and "vocabulary size 1000" in msg, msg
            with pytest.raises(InputMismatch, match="vocabulary size 1000"):
                m(bad.numpy())  # the host path refuses it before the call
        got = m.executor.to_host(m(ids.cuda().to(torch.int64)))  # usable after a refusal
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
