"""The fused inverted-residual block on CPUs (cpp_templates/conv_dw.h, aot/codegen/cpp_block.py): expand 1x1
-> depthwise -> project 1x1 run as one function keeping the expanded rows in cache, against eager torch at
two CPU levels (AVX2 and AVX-512 panels) and two batch sizes; which chains fuse and which stay three calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import aotc
import numpy as np
import pytest
import torch
from aotc_build import kernel as K
from aotc_build.build import build_captured, compile_graph
from aotc_build.capture import capture_module
from aotc_build.codegen import cpp
from aotc_build.codegen.cpp_block import find_blocks
from aotc_build.codegen.cpp_pack import pack_plan
from aotc_build.options import BuildOptions, Target
from op_cases import check_batches, check_bf16, inverted_body
from torch import nn
from torch.export import Dim


class Net(nn.Module):
    """A stem (channels-last activations from here on), three blocks large enough to fuse (hidden tensors
    over cpp_block.MIN_BYTES): a residual one at stride 1, a strided one with channel counts that fill no
    vector over an odd-sized image, and one whose expanded tensor is read twice (kept as three kernels); then
    a small block that stays unfused."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU())
        self.res = inverted_body(16, 96, 16, 1)
        self.s2 = inverted_body(16, 78, 13, 2)
        self.expand = nn.Sequential(nn.Conv2d(13, 120, 1), nn.ReLU6())
        self.dw = nn.Conv2d(120, 120, 3, 1, 1, groups=120)
        self.small = inverted_body(13, 24, 8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = x + self.res(x)
        y = self.s2(y)
        e = self.expand(y)
        y = self.dw(e) + e
        return self.small(y[:, :13])


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 3, 47, 45)


def test_which_chains_fuse() -> None:
    model, x = _model()
    _, plan, _ = compile_graph(capture_module(model, (x,), name="blocknet"), channels_last=True)
    packed, _ = pack_plan(plan, "x86-64-v4")
    blocks = find_blocks(packed)
    assert [(e.c_in, d.stride, p.c_out) for e, d, p in blocks.values()] == [(16, (1, 1), 16), (16, (2, 2), 13)]
    src = cpp.generate(packed, BuildOptions(targets=(Target("cpu", "x86-64-v4"),)))
    assert src.count("aotc_conv_block<") == 2 and '#include "conv_dw.h"' in src
    # both projections (bias and a skip connection; bias alone) written by the template from its registers,
    # the residual one with the block's input as its residual
    outs = [ln for ln in src.splitlines() if "aotc_conv_out<float> aotc_epi_p" in ln]
    assert len(outs) == 2 and outs[0].count(",") == outs[1].count(",") + 1, outs
    convs = [k for k in packed.kernels if isinstance(k, K.Conv)]
    assert src.count("aotc_conv2d_packed<") + src.count("aotc_conv2d_dw<") == len(convs) - 6 and len(convs) == 12


def test_no_block_over_its_own_input() -> None:
    """The memory plan may give the block's output the bytes of its input (dead after the expand when the
    kernels run apart); fused, the input is read until the last row is written, so that chain stays apart."""
    model, x = _model()
    _, plan, _ = compile_graph(capture_module(model, (x,), name="blocknet"), channels_last=True)
    packed, _ = pack_plan(plan, "x86-64-v4")
    first, (e, _, p) = next(iter(find_blocks(packed).items()))
    offsets = dict(packed.arena_offsets)
    offsets[p.stores[0].buf] = offsets[e.x.buf]
    assert first not in find_blocks(replace(packed, arena_offsets=offsets))


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_block_net_matches_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    model, x = _model()
    cap = capture_module(model, (x,), {"x": {0: Dim("batch", min=1, max=4)}}, name="blocknet")
    pkg = tmp_path / "blocknet.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    for threads in (1, 2):
        check_batches(aotc.load(pkg, device="cpu", num_threads=threads), model, (3, 47, 45), atol=1e-5)


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_block_net_bf16(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    """In bf16 the same two chains fuse (conv_dw.h's bf16 overload: the input converted, the depthwise weight
    widened, the rows fp32), and the output stays within bf16's rounding of the model in fp32."""
    cpu_runs(level)
    model, x = _model()
    mb, xb = model.to(torch.bfloat16), x.to(torch.bfloat16)
    cap = capture_module(mb, (xb,), name="blocknet_bf16", precision="bf16")
    pkg, src = tmp_path / "blocknet_bf16.pkg", tmp_path / "src"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),), precision="bf16"), aotc_cache, sources_dir=src)
    assert "".join(f.read_text() for f in src.rglob("*.cpp")).count("aotc_conv_block<") == 2
    check_bf16(aotc.load(pkg, device="cpu"), mb, xb, level)


class Chain(nn.Module):
    """MobileNetV2's pattern: a residual block, then a strided one whose input nothing reads after it (so a
    plan by the kernels' own reads frees it after the expand and may give it to the block's output), then
    another residual one."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU6())
        self.a = inverted_body(16, 96, 16, 1)
        self.b = inverted_body(16, 96, 24, 2)
        self.c = inverted_body(24, 144, 24, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.a(x)
        x = self.b(x)
        return x + self.c(x)


def test_plan_keeps_a_block_input_alive(tmp_path: Path, aotc_cache: Path) -> None:
    """The memory plan keeps a block's input until its project has run, so every chain fuses (MobileNetV2's
    fourth block stayed three kernels when its output took its input's bytes), and the result holds."""
    from aotc.cpu_features import cpu_level

    if cpu_level() in ("x86-64", "x86-64-v2"):
        pytest.skip("this CPU cannot run x86-64-v3")
    torch.manual_seed(0)
    model, x = Chain().eval(), torch.randn(1, 3, 64, 64)
    cap = capture_module(model, (x,), name="chain")
    _, plan, _ = compile_graph(cap, channels_last=True)
    packed, _ = pack_plan(plan, "x86-64-v3")
    assert sorted(find_blocks(packed)) == [1, 4, 7]
    pkg = tmp_path / "chain.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), aotc_cache)
    with torch.no_grad():
        want = model(x).numpy()
    for threads in (1, 2):
        got = aotc.load(pkg, device="cpu", num_threads=threads)(x.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
