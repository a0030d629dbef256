"""cpp_widen.py: in a bf16 conv net on the CPU, the activations convs read and the convs' epilogues are fp32;
the tensors a matmul reads, the model's input and its output keep bf16. Checked on the plan (what each buffer
and load became) and end to end against the model in fp32, at two CPU levels."""

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
from aotc_build.codegen.cpp_pack import pack_array
from aotc_build.codegen.cpp_plan import cpu_plan
from aotc_build.ir import DType, Op
from aotc_build.options import BuildOptions, Target
from op_cases import check_bf16, random_bn
from torch import nn


class Net(nn.Module):
    """A depthwise conv straight on the input, a 1x1 with batch norm, a 3x3 with a skip connection whose sum a
    conv and a max reduction both read, and a linear head over the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
        self.pw = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), random_bn(32), nn.ReLU())
        self.c3 = nn.Conv2d(32, 32, 3, 1, 1)
        self.c4 = nn.Conv2d(32, 16, 3, 2, 1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pw(self.dw(x))
        z = self.c3(y) + y
        a = self.c4(z).mean((2, 3))
        b = torch.sigmoid(z).amax((2, 3))[:, :16]
        return self.head(a + b)


def _bf16() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net().eval().to(torch.bfloat16), torch.randn(2, 8, 20, 18).to(torch.bfloat16)


def _rounded_to_bf16(v: K.Value) -> bool:
    return any(isinstance(u, K.Unary) and u.op is Op.CAST and u.dtype is DType.bf16 for u in K.walk(v))


def test_plan_keeps_conv_activations_fp32() -> None:
    model, x = _bf16()
    _, shared, _ = compile_graph(capture_module(model, (x,), name="widen", precision="bf16"), channels_last=True)
    plan, packs = cpu_plan(shared, "x86-64-v4")
    dt = {b.name: b.dtype for b in (*plan.inputs, *plan.outputs, *plan.weights, *plan.arena)}
    convs = [k for k in plan.kernels if isinstance(k, K.Conv)]
    assert len(convs) == 4
    for k in convs:
        want = DType.bf16 if k.x.buf == plan.inputs[0].name else DType.f32
        assert k.x.dtype is want and dt[k.x.buf] is want, k.name
        assert not any(_rounded_to_bf16(st.value) for st in k.stores), f"{k.name} rounds between ops"
        assert all(dt[v.buf] is DType.f32 for st in k.stores for v in K.walk(st.value) if isinstance(v, K.Load)), k.name
    dw = next(k for k in convs if k.groups > 1)
    assert plan.labels[dw.w.buf].endswith(".f32") and dw.w.dtype is DType.f32  # the depthwise weight's copy
    # the head's input stays bf16 (the pairs kernel wants it); the output keeps the model's dtype
    (mm,) = [k for k in plan.kernels if isinstance(k, K.Matmul)]
    assert mm.a.dtype is DType.bf16 and dt[mm.b.buf] is DType.bf16 and plan.outputs[0].dtype is DType.bf16
    # the max over sigmoid(z) reads z (fp32 now) rounded to bf16, as it read it before
    z = next(k.x.buf for k in convs if k.stride == (2, 2))
    (red,) = [k for k in plan.kernels if isinstance(k, K.Reduce) and z in K.reads(k)]
    loads = [v for s in red.steps for u in K.walk(s.value) if isinstance(u, K.Unary) for v in [u.x] if isinstance(v, K.Load)]
    assert any(v.buf == z and v.dtype is DType.f32 for v in loads)
    # a copy is its weight widened, value for value
    weights = {w.name: w for w in shared.weights}
    copies = [p for p in packs if plan.labels[p.name].endswith(".f32")]
    assert copies and all(p.source in weights for p in copies)
    for p in copies:
        src = np.random.default_rng(0).standard_normal(int(weights[p.source].numel())).astype(np.float32)
        src16 = src.astype(DType.bf16.numpy())
        np.testing.assert_array_equal(pack_array(p, src16).reshape(-1), src16.astype(np.float32))


def test_plan_without_bf16_convs_is_unchanged() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 8, 20, 18)
    _, shared, _ = compile_graph(capture_module(model, (x,), name="widen32"), channels_last=True)
    plan, packs = cpu_plan(shared, "x86-64-v4")
    assert [b.dtype for b in plan.arena] == [b.dtype for b in shared.arena]
    assert not [p for p in packs if plan.labels[p.name].endswith(".f32")]


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_widened_net_matches_fp32(level: str, tmp_path: Path, aotc_cache: Path, cpu_runs: Callable[[str], None]) -> None:
    """The package within bf16's rounding of fp32. Its 3x3 conv takes Winograd with the skip connection added
    in registers (``aotc_conv_out``: it wants fp32 tensors and a bias), the depthwise conv on the NCHW input
    the generic kernel with the widened weight."""
    cpu_runs(level)
    model, x = _bf16()
    cap = capture_module(model, (x,), name="widen", precision="bf16")
    pkg, src = tmp_path / "widen.pkg", tmp_path / "src"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", level),), precision="bf16"), aotc_cache, sources_dir=src)
    text = "".join(f.read_text() for f in src.rglob("*.cpp"))
    assert "aotc_conv2d_wino<float" in text and "aotc_conv_out<float>" in text and "aotc_conv2d<float>" in text
    m = aotc.load(pkg, device="cpu")
    check_bf16(m, model, x, level)
    torch.manual_seed(1)
    check_bf16(m, model, torch.randn(2, 8, 20, 18).to(torch.bfloat16), f"{level}, a second input")
