"""The fused inverted-residual block (cpp_templates/conv_dw.h) on MobileNetV2's small images: 14x14 and 7x7,
and odd sizes (13x12, 7x6), where the 1x1 convs run in unpadded strips (a last short or overlapping one) and
the stride-2 depthwise takes its own row kernel (conv_depthwise.h). Against eager torch over fresh random
batches, at both CPU levels, on one thread (the image split in strips of rows) and two (in slices of hidden
channels). Every block here is large enough to fuse (its expanded tensor over cpp_block.MIN_BYTES)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aotc
import pytest
import torch
from aotc_build.build import build_captured, compile_graph
from aotc_build.capture import capture_module
from aotc_build.codegen.cpp_block import find_blocks
from aotc_build.codegen.cpp_pack import pack_plan
from aotc_build.options import BuildOptions, Target
from op_cases import check_batches, inverted_body
from torch import nn
from torch.export import Dim


class Small(nn.Module):
    """A stride-2 stem, then a residual block at stride 1, a stride-2 one (the image halves), a residual one
    on the small image and a last one without a residual (more output channels than input)."""

    def __init__(self, c: int, hid: int, c2: int, hid2: int, c3: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU6())
        self.a, self.b = inverted_body(c, hid, c, 1), inverted_body(c, hid, c2, 2)
        self.c, self.d = inverted_body(c2, hid2, c2, 1), inverted_body(c2, hid2, c3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.a(x)
        x = self.b(x)
        x = x + self.c(x)
        return self.d(x)


# name -> (model arguments, input C x H x W): 14x14 -> 7x7, and 13x12 -> 7x6 with channel counts that fill
# no vector
SHAPES = {
    "even": ((32, 192, 48, 672, 80), (3, 28, 28)),
    "odd": ((24, 240, 40, 784, 56), (3, 25, 23)),
}


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    args, chw = SHAPES[name]
    torch.manual_seed(0)
    return Small(*args).eval(), chw


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_small_blocks_fuse(name: str) -> None:
    model, chw = _model(name)
    _, plan, _ = compile_graph(capture_module(model, (torch.randn(1, *chw),), name="small"), channels_last=True)
    packed, _ = pack_plan(plan, "x86-64-v4")
    assert [d.stride for _, d, _ in find_blocks(packed).values()] == [(1, 1), (2, 2), (1, 1), (1, 1)]


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_small_blocks_match_eager(name: str, level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    model, chw = _model(name)
    cap = capture_module(model, (torch.randn(2, *chw),), {"x": {0: Dim("batch", min=1, max=4)}}, name="small")
    pkg = tmp_path / "small.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    for threads in (1, 2):
        check_batches(aotc.load(pkg, device="cpu", num_threads=threads), model, chw, atol=1e-5)
