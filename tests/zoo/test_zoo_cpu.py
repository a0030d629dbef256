"""Zoo on the CPU: one package per model serves two batch sizes (and two sequence lengths for text
models); outputs through the runtime match eager torch (fp32, relative error <= 1e-4). Text models also
run with a padding mask, the path real tokenizer batches take."""

from __future__ import annotations

from pathlib import Path

import aotc
import numpy as np
import pytest
import torch
from aotc_build.build import build_captured
from aotc_build.capture import capture_module
from aotc_build.options import BuildOptions, Target

from .models import ZOO, FirstOutput, WithMask, ZooModel, dynamic_shapes, inputs, padded_dynamic_shapes, padded_inputs

pytest.importorskip("transformers")


@pytest.mark.parametrize("z", ZOO, ids=[z.name for z in ZOO])
def test_zoo_model_matches_eager(z: ZooModel, tmp_path: Path, aotc_cache: Path) -> None:
    torch.manual_seed(0)
    model = FirstOutput(z.make().eval())
    cap = capture_module(model, inputs(z, 2), dynamic_shapes(z), name=z.name)
    pkg = tmp_path / f"{z.name}.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), aotc_cache)
    m = aotc.load(pkg, device="cpu")
    shapes = [(1, 7), (3, 24)] if z.text else [(1, 0), (4, 0)]
    for batch, seq in shapes:
        torch.manual_seed(batch)
        xs = inputs(z, batch, seq)
        with torch.no_grad():
            want = model(*xs).numpy()
        got = m(*[x.numpy() for x in xs])
        scale = max(float(np.abs(want).max()), 1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("z", [z for z in ZOO if z.text], ids=[z.name for z in ZOO if z.text])
def test_zoo_model_with_padding_mask_matches_eager(z: ZooModel, tmp_path: Path, aotc_cache: Path) -> None:
    torch.manual_seed(0)
    model = WithMask(z.make().eval())
    cap = capture_module(model, padded_inputs(3, 16), padded_dynamic_shapes(), name=f"{z.name}_masked")
    pkg = tmp_path / f"{z.name}_masked.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), aotc_cache)
    m = aotc.load(pkg, device="cpu")
    for batch, seq in [(2, 5), (4, 24)]:
        torch.manual_seed(batch)
        ids, mask = padded_inputs(batch, seq)
        assert int(mask.sum()) < batch * seq  # some rows really are padded
        with torch.no_grad():
            want = model(ids, mask).numpy()
        got = m(ids.numpy(), mask.numpy())
        scale = max(float(np.abs(want).max()), 1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
