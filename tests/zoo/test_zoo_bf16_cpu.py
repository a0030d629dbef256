"""Zoo models in bf16 on this machine's CPU (``cpu:native``: the VDPBF16PS matmuls where it has
AVX512_BF16, fp32 kernels on widened weights elsewhere; a conv net's activations in fp32, cpp_widen.py):
within bf16's rounding of the same model in fp32, as close as eager bf16 is or closer. A few models that
cover the paths: a ResNet (pool, Winograd, skips), ConvNeXt (7x7 depthwise, layer norm, an MLP reading conv
output), BERT (attention, the pairs matmuls). MobileNetV2's blocks: tests/test_cpp_block.py."""

from __future__ import annotations

from pathlib import Path

import aotc
import pytest
import torch
from aotc_build.build import build_captured
from aotc_build.capture import capture_module
from aotc_build.options import BuildOptions, parse_target
from op_cases import check_bf16

from .models import ZOO, FirstOutput, ZooModel, inputs

pytest.importorskip("transformers")
PICKED = [z for z in ZOO if z.name in ("resnet", "convnext", "bert")]


@pytest.mark.parametrize("z", PICKED, ids=[z.name for z in PICKED])
def test_zoo_model_bf16_near_fp32(z: ZooModel, tmp_path: Path, aotc_cache: Path) -> None:
    torch.manual_seed(0)
    model = FirstOutput(z.make().eval()).to(torch.bfloat16)
    xs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs(z, 2))
    cap = capture_module(model, xs, name=z.name, precision="bf16")
    pkg = tmp_path / f"{z.name}.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(parse_target("cpu:native"),), precision="bf16"), aotc_cache)
    check_bf16(aotc.load(pkg, device="cpu"), model, xs, z.name)
