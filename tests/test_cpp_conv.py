"""The CPU convolution path end to end: batch-norm folded into conv weights, channels-last activations,
conv weights packed at build time for the implicit GEMM (cpp_templates/conv.h), the direct depthwise
kernel, and the NCHW fallback (grouped convs) -- each against eager torch, at two CPU levels (two panel
widths) and two batch sizes through one package with a dynamic batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aotc
import numpy as np
import pytest
import torch
from aotc_build import kernel as K
from aotc_build.build import build_captured, compile_graph
from aotc_build.capture import capture_module
from aotc_build.codegen.cpp_pack import PANEL, WINO_G, Packing, conv_panel, pack_array, pack_plan
from aotc_build.ir import DType, Op
from aotc_build.options import BuildOptions, Target
from op_cases import check_batches, check_bf16, random_bn
from torch import nn
from torch.export import Dim


class Net(nn.Module):
    """Stem over the NCHW input, an inverted residual (1x1, depthwise, 1x1 + skip), a strided and dilated
    conv with a bias and channel counts that fill no vector, a grouped conv, pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1, bias=False), random_bn(24), nn.ReLU6())
        self.expand = nn.Sequential(nn.Conv2d(24, 72, 1, bias=False), random_bn(72), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(72, 72, 3, 1, 1, groups=72, bias=False), random_bn(72), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(72, 24, 1, bias=False), random_bn(24))
        self.odd = nn.Conv2d(24, 37, 3, 2, 2, dilation=2)
        self.dw5 = nn.Conv2d(37, 37, 5, 2, 2, groups=37)
        self.grouped = nn.Conv2d(37 + 1, 20, 3, 1, 1, groups=2)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y + self.project(self.dw(self.expand(y)))
        y = torch.relu(self.odd(y))
        y = self.dw5(y)
        y = torch.cat([y, y[:, :1]], 1)
        return self.pool(self.grouped(y))


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 3, 29, 31)


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_conv_net_matches_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    model, x = _model()
    cap = capture_module(model, (x,), {"x": {0: Dim("batch", min=1, max=8)}}, name="convnet")
    pkg = tmp_path / "convnet.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    check_batches(aotc.load(pkg, device="cpu"), model, (3, 29, 31), atol=1e-5)


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_conv_net_bf16_takes_the_fp32_kernels(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    """A bf16 model's convs run the packed and depthwise kernels (weights widened at build time, activations
    as they are read), not the generic loops; the output within bf16's rounding of the same model in fp32."""
    cpu_runs(level)
    model, x = _model()
    mb, xb = model.to(torch.bfloat16), x.to(torch.bfloat16)
    cap = capture_module(mb, (xb,), name="convnet_bf16", precision="bf16")
    pkg, src = tmp_path / "convnet_bf16.pkg", tmp_path / "src"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),), precision="bf16"), aotc_cache, sources_dir=src)
    text = "".join(f.read_text() for f in src.rglob("*.cpp"))
    assert text.count("aotc_conv2d_packed<float") + text.count("aotc_conv2d_packed_pool<float") >= 4, "stem, 1x1s, odd"
    assert text.count("aotc_conv2d_dw<float>") == 2 and "aotc_conv2d<float>" in text  # the grouped conv: NCHW loops
    check_bf16(aotc.load(pkg, device="cpu"), mb, xb, level)


def test_resnet_bf16_pool_winograd_packed(tmp_path: Path, aotc_cache: Path) -> None:
    """examples/cnn.py in bf16: its NCHW stem conv (bf16 input converted as read) with the max-pool fused after
    it (conv_pool.h, the pool's rounding to bf16 after the max), its 3x3 stride-1 convs as Winograd
    (conv_wino.h) and its strided ones packed; within bf16's rounding of fp32."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cnn_example", Path(__file__).parents[1] / "examples" / "cnn.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(1)
    mb, xb = mod.model.to(torch.bfloat16), torch.randn(2, 3, 64, 64).to(torch.bfloat16)
    cap = capture_module(mb, (xb,), name="cnn_bf16", precision="bf16")
    pkg, src = tmp_path / "cnn_bf16.pkg", tmp_path / "src"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v3"),), precision="bf16"), aotc_cache, sources_dir=src)
    text = "".join(f.read_text() for f in src.rglob("*.cpp"))
    assert "aotc_conv2d_packed_pool<float" in text and "aotc_conv2d_wino<float" in text and "aotc_conv2d<" not in text
    check_bf16(aotc.load(pkg, device="cpu"), mb, xb, "examples/cnn.py")


class Stems(nn.Module):
    """Convs whose epilogue is a clamp and whose channels are whole weight panels (32: two on AVX2, one on
    AVX-512), so that the row kernel or Winograd's output transform writes their outputs from the registers
    (conv.h's aotc_conv_out): a MobileNetV2 stem over the NCHW input, a 3x3 at stride 1 with a folded
    batch-norm and ReLU (Winograd), another with a skip connection before the ReLU (Winograd adds it), a
    strided 3x3 with a bias and ReLU, a strided 1x1 with none (its output channels-last for the mean after
    it: the graph's NCHW output itself goes through tiles)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), random_bn(32), nn.ReLU6())
        self.wino = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1, bias=False), random_bn(32), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1, bias=False), random_bn(32))
        self.down = nn.Sequential(nn.Conv2d(32, 32, 3, 2, 1), nn.ReLU())
        self.skip = nn.Conv2d(32, 64, 1, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.wino(self.stem(x))
        return self.skip(self.down(torch.relu(self.block(y) + y))).mean((2, 3))


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_register_epilogue_convs_match_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    torch.manual_seed(0)
    model, x = Stems().eval(), torch.randn(2, 3, 41, 37)
    cap = capture_module(model, (x,), {"x": {0: Dim("batch", min=1, max=8)}}, name="stems")
    pkg, src = tmp_path / "stems.pkg", tmp_path / "src"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache, sources_dir=src)
    text = "".join(f.read_text() for f in src.rglob("*.cpp"))
    assert text.count("aotc_conv_out<float>{") == 5, "every conv should write its output from the registers"
    assert text.count("aotc_conv2d_wino<") == 2
    check_batches(aotc.load(pkg, device="cpu"), model, (3, 41, 37), atol=1e-5)


def test_batch_norm_folds_into_conv_weights() -> None:
    model, x = _model()
    graph, plan, _ = compile_graph(capture_module(model, (x,), name="convnet"), channels_last=True)
    assert not any(n.op in (Op.MUL, Op.RSQRT) for n in graph.nodes)  # the scale went into the weights
    convs = [k for k in plan.kernels if isinstance(k, K.Conv)]
    assert len(convs) == 7
    packed, packs = pack_plan(plan, "x86-64-v4")
    kinds = [(k.groups, k.packed) for k in packed.kernels if isinstance(k, K.Conv)]
    assert kinds == [(1, True), (1, True), (72, False), (1, True), (1, True), (37, False), (2, False)]
    assert {p.nr for p in packs} == {PANEL["x86-64-v4"]}  # more than one vector of output channels: two
    assert {p.nr for p in pack_plan(plan, "x86-64-v3")[1]} == {PANEL["x86-64-v3"]}
    narrow = [k for k in convs if k.c_out <= 24]
    assert {conv_panel(k, "x86-64-v4") for k in narrow} == {32} and conv_panel(convs[0], "x86-64-v2") == 8


def test_pack_array_conv_layout() -> None:
    """Packed conv weight: panel p, row k = (kh * KW + kw) * C + c, column o % NR = W[o, c, kh, kw]."""
    rng = np.random.default_rng(0)
    o, c, kh, kw, nr = 5, 3, 2, 3, 4
    w = rng.standard_normal((o, kh, kw, c)).astype(np.float32)  # stored [O, kh, kw, C] (passes/layout.py)
    p = Packing("w_packed", "w", 0, 0, kh * kw * c, kh * kw * c, o, nr, ((kh, kw * c), (kw, c), (c, 1)))
    got = pack_array(p, w)
    assert got.shape == (2, kh * kw * c, nr)
    for oo in range(o):
        for cc in range(c):
            for a in range(kh):
                for b in range(kw):
                    assert got[oo // nr, (a * kw + b) * c + cc, oo % nr] == w[oo, a, b, cc]
    assert not got[1, :, 1:].any()  # zero past O


class DepthwiseNet(nn.Module):
    """Depthwise forms of conv.h's direct kernel, random weights: channels that fill no vector, stride 2,
    dilation, no padding, a 7x7 (runtime kernel width), rows narrower than a register block, and a
    channel multiplier (groups = C, 2C outputs: the general path)."""

    def __init__(self) -> None:
        super().__init__()
        self.s1 = nn.Conv2d(37, 37, 3, 1, 1, groups=37)
        self.s2 = nn.Conv2d(37, 37, 3, 2, 1, groups=37, bias=False)
        self.dil = nn.Conv2d(37, 37, 3, 1, 2, dilation=2, groups=37)
        self.mult = nn.Conv2d(37, 74, 3, 1, 1, groups=37)
        self.k7 = nn.Conv2d(74, 74, 7, 1, 3, groups=74)
        self.narrow = nn.Conv2d(32, 32, 3, 1, 0, groups=32)
        self.narrow_s2 = nn.Conv2d(32, 32, 3, 2, 1, groups=32)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.clamp(self.s1(x), 0, 6) + x
        y = self.k7(self.mult(self.dil(self.s2(y))))
        return y, self.narrow_s2(self.narrow(z))


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_depthwise_forms_match_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    torch.manual_seed(0)
    model = DepthwiseNet().eval()
    x, z = torch.randn(2, 37, 13, 27), torch.randn(2, 32, 9, 5)
    pkg = tmp_path / "dwnet.pkg"
    build_captured(capture_module(model, (x, z), name="dwnet"), pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    with torch.no_grad():
        want = [t.numpy() for t in model(x, z)]
    got = aotc.load(pkg, device="cpu")(x.numpy(), z.numpy())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(np.abs(w).max()))


class PoolNet(nn.Module):
    """Max-pools after convs, each fused into its conv (codegen/cpp_pool.py, conv_pool.h): a stem over the
    NCHW input (conv, batch-norm, ReLU, 3x3/2 pool padded 1, odd sizes), a strided conv with a bias and 20
    output channels (a padded panel) under a 2x2/2 pool, and one too narrow for the row kernel (the
    fallback). (A 3x3 stride-1 conv of 16 channels would take Winograd instead, and its pool stay apart.)"""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), random_bn(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.mid = nn.Sequential(nn.Conv2d(16, 20, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.narrow = nn.Sequential(nn.Conv2d(20, 8, 3, 1, 1), nn.MaxPool2d(3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.narrow(self.mid(self.stem(x)))


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_pools_fused_into_convs_match_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    from aotc_build.codegen.cpp_pool import fuse_pools, monotone

    cpu_runs(level)
    torch.manual_seed(0)
    model, x = PoolNet().eval(), torch.randn(2, 3, 45, 61)
    cap = capture_module(model, (x,), {"x": {0: Dim("batch", min=1, max=8)}}, name="poolnet")
    _, plan, _ = compile_graph(cap, channels_last=True)
    fused = fuse_pools(pack_plan(plan, level)[0])
    assert [type(k).__name__ for k in fused.kernels] == ["Conv"] * 3
    # bias + ReLU, bias + ReLU, nothing: each applied after the pool (conv_pool.h's MONO)
    assert all(isinstance(k, K.Conv) and k.pool is not None and monotone(k.pool.pre) for k in fused.kernels)
    pkg = tmp_path / "poolnet.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    m = aotc.load(pkg, device="cpu")
    for batch in (1, 3):
        torch.manual_seed(batch)
        xb = torch.randn(batch, 3, 45, 61)
        xb[0, 0, 5, 7] = float("nan")  # NaN wins its windows, as in eager
        with torch.no_grad():
            want = model(xb).numpy()
        got = m(xb.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.nanmax(np.abs(want))), equal_nan=True)


def test_monotone_pre() -> None:
    """cpp_pool.monotone: only what never decreases in Acc moves after the pool."""
    from aotc_build.codegen.cpp_pool import monotone

    f32, acc = DType.f32, K.Acc()

    def c(v: float) -> K.Const:
        return K.Const(v, f32)

    assert monotone(K.Unary(Op.RELU, K.Binary(Op.ADD, acc, K.Load("b", K.Index(K.loop_var("i", 1), DType.i64), f32), f32), f32))
    assert monotone(K.Binary(Op.MIN, K.Binary(Op.MAX, K.Binary(Op.MUL, c(2.0), acc, f32), c(0.0), f32), c(6.0), f32))
    assert not monotone(K.Binary(Op.MUL, acc, c(-1.0), f32))
    assert not monotone(K.Binary(Op.SUB, c(1.0), acc, f32))
    assert not monotone(K.Binary(Op.MUL, acc, K.Load("w", K.Index(K.loop_var("i", 1), DType.i64), f32), f32))
    assert not monotone(K.Unary(Op.NEG, acc, f32))


class WinoNet(nn.Module):
    """3x3 stride-1 convs that take Winograd (cpp_pack.py's wino_choice, conv_wino.h): F(4x4) with batch-norm
    and ReLU over sizes off the tile (13 x 11), a residual block's second conv (bias, residual add, ReLU),
    channels that fill no vector (20 -> 37), no padding, and F(2x2) (128 channels over 6x6 outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(16, 20, 3, 1, 1, bias=False), random_bn(20), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(20, 20, 3, 1, 1, bias=False), random_bn(20))
        self.c = nn.Conv2d(20, 37, 3, 1, 0)
        self.d = nn.Conv2d(37, 128, 1)
        self.e = nn.Conv2d(128, 128, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y = torch.relu(self.b(y) + y)
        y = torch.nn.functional.max_pool2d(self.c(y), 2)  # 11 x 9 -> 5 x 4
        return self.e(torch.relu(self.d(torch.nn.functional.pad(y, (1, 1, 0, 1)))))  # 6 x 6


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_winograd_convs_match_eager(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    cpu_runs(level)
    torch.manual_seed(0)
    model, x = WinoNet().eval(), torch.randn(2, 16, 13, 11)
    cap = capture_module(model, (x,), {"x": {0: Dim("batch", min=1, max=8)}}, name="winonet")
    _, plan, _ = compile_graph(cap, channels_last=True)
    packed, _ = pack_plan(plan, level)
    tiles = [k.wino for k in packed.kernels if isinstance(k, K.Conv) and k.kernel == (3, 3)]
    assert tiles == [4, 4, 4, 2]
    pkg = tmp_path / "winonet.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),)), aotc_cache)
    check_batches(aotc.load(pkg, device="cpu"), model, (16, 13, 11), atol=2e-6)


def test_pack_array_winograd_layout() -> None:
    """Winograd weight: panel p, row k = pos * C + c, column o % NR = (G W[o, c] G^T)[pos // A, pos % A]."""
    rng = np.random.default_rng(0)
    o, c, nr = 5, 3, 4
    w = rng.standard_normal((o, 3, 3, c)).astype(np.float32)  # stored [O, kh, kw, C] (passes/layout.py)
    for m in (2, 4):
        a = m + 2
        p = Packing("w_packed", "w", 0, 0, 9 * c, 9 * c, o, nr, ((3, 3 * c), (3, c), (c, 1)), m)
        got = pack_array(p, w)
        assert got.shape == (2, a * a * c, nr)
        g = WINO_G[m]
        for oo in range(o):
            for cc in range(c):
                u = g @ w[oo, :, :, cc].astype(np.float64) @ g.T
                np.testing.assert_allclose(got[oo // nr, cc::c, oo % nr], u.reshape(-1), rtol=1e-6, atol=1e-6)
        assert not got[1, :, 1:].any()  # zero past O


def test_no_winograd_keeps_the_direct_convs(tmp_path: Path, aotc_cache: Path) -> None:
    """`aotc build --no-winograd`: the CNN example's 3x3 convs (Winograd by default) take the direct kernel."""
    from aotc.cli import cli
    from click.testing import CliRunner

    example = Path(__file__).resolve().parents[1] / "examples" / "cnn.py"
    counts = {}
    for flag in ([], ["--no-winograd"]):
        src, pkg = tmp_path / f"src{len(flag)}", tmp_path / f"cnn{len(flag)}.pkg"
        r = CliRunner().invoke(cli, ["build", str(example), "-o", str(pkg), "--keep-sources", str(src), "-q", *flag])
        assert r.exit_code == 0, r.output
        text = "".join(p.read_text() for p in sorted(src.rglob("*.cpp")))
        counts[bool(flag)] = text.count("aotc_conv2d_wino<")
        assert all(c.ok for c in aotc.load(pkg, device="cpu").verify())
    assert counts[False] > 0 and counts[True] == 0
