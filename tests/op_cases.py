"""The op table: one small module per op family, with inputs made from a batch size, run in each precision.

Shared by the CPU tests (tests/test_ops.py) and the GPU packages (tests/gpu/make_artifacts.py). Inputs are
random, never zeros. A case may return several tensors; every one of them is compared.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class OpCase:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    dynamic: bool = True  # dim 0 of every input is one dynamic "batch" dim
    dims: Callable[[], tuple] | None = None  # other dynamic dims: torch.export dynamic_shapes, one entry per input


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor], **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_buffer(k, v)

    def forward(self, a: torch.Tensor, b: torch.Tensor | None = None, c: torch.Tensor | None = None,
                d: torch.Tensor | None = None) -> Any:  # fmt: skip
        return self.fn(self, *(x for x in (a, b, c, d) if x is not None))


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


class _MHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def random_bn(c: int) -> nn.BatchNorm2d:
    """Inference batch-norm with non-trivial running stats and affine terms (the default ones fold to identity)."""
    bn = nn.BatchNorm2d(c)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 1.5)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.2, 0.2)
    return bn


class Bottleneck(nn.Module):
    """ResNet's bottleneck after a stem: conv-bn-relu, max-pool, 1x1 / 3x3 (strided) / 1x1, projected skip."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cin, 7, 2, 3, bias=False), random_bn(cin), nn.ReLU(), nn.MaxPool2d(3, 1, 1))
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), random_bn(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), random_bn(mid), nn.ReLU(),
            nn.Conv2d(mid, cout, 1, bias=False), random_bn(cout),
        )  # fmt: skip
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), random_bn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = F.relu(self.body(x) + self.down(x))
        return torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)


def inverted_body(c_in: int, hid: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """MobileNetV2's block without its residual: 1x1 expand, depthwise 3x3, 1x1 project, each with batch norm."""
    return nn.Sequential(
        nn.Conv2d(c_in, hid, 1, bias=False), random_bn(hid), nn.ReLU6(),
        nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), random_bn(hid), nn.ReLU6(),
        nn.Conv2d(hid, c_out, 1, bias=False), random_bn(c_out),
    )  # fmt: skip


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, depthwise 3x3, ReLU6, 1x1 project, residual add."""

    def __init__(self, c: int, expand: int) -> None:
        super().__init__()
        self.body = inverted_body(c, c * expand, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def check_batches(run: Any, model: nn.Module, chw: tuple[int, ...], atol: float, batches: tuple[int, ...] = (1, 3)) -> None:
    """``run`` (a loaded package) against eager ``model`` on fresh random inputs of each batch size:
    rtol 1e-4, atol ``atol`` times the largest output."""
    for batch in batches:
        torch.manual_seed(batch)
        xb = torch.randn(batch, *chw)
        with torch.no_grad():
            want = model(xb).numpy()
        got = run(xb.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol * float(np.abs(want).max()))


def check_bf16(run: Any, model: nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], what: str) -> None:
    """``run`` (a loaded bf16 package) on ``x`` (bf16 floats; a tuple for several inputs) against ``model`` (in
    bf16) run in fp32 arithmetic on its bf16 weights: within 2e-2 of the largest output, or twice eager
    bf16's own distance from it."""
    import ml_dtypes

    xs = x if isinstance(x, tuple) else (x,)
    feeds = [t.float().numpy().astype(ml_dtypes.bfloat16) if t.is_floating_point() else t.numpy() for t in xs]
    got = np.asarray(run(*feeds), dtype=np.float64)
    with torch.no_grad():
        eager = model(*xs).double().numpy()
        wide = [t.float() if t.is_floating_point() else t for t in xs]
        ref = copy.deepcopy(model).float()(*wide).double().numpy()  # .float() is in place
    scale = np.abs(ref).max()
    err, eager_err = np.abs(got - ref).max() / scale, np.abs(eager - ref).max() / scale
    assert err < max(2e-2, 2 * eager_err), f"{what}: {err:.3g} from fp32 (eager bf16: {eager_err:.3g})"


def _mask(b: int) -> torch.Tensor:
    return torch.rand(b, 1, 8, 8) > 0.3


def _masked_row(b: int) -> torch.Tensor:
    m = torch.rand(b, 1, 8, 10) > 0.3
    m[:, :, 2, :] = False  # a row that attends to nothing gives zeros
    return m


def _seq_dims() -> tuple:
    """q's length L and k/v's length S dynamic, as transformers' text models are exported."""
    seq, keys = torch.export.Dim("seq", min=2, max=64), torch.export.Dim("keys", min=2, max=64)
    return ({2: seq}, {2: keys}, {2: keys})


def _built_causal(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """A causal mask built by the model (as transformers' create_causal_mask does), and-ed with padding."""
    rows = torch.arange(q.shape[-2], device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(cols <= rows) & pad)


def _key_padding(b: int, s: int) -> torch.Tensor:
    """A bool key-padding mask [b, 1, 1, s]: each batch position keeps a random length of keys (at least one)
    with a few holes inside it too."""
    keep = torch.arange(s)[None, :] < torch.randint(1, s + 1, (b, 1))
    keep &= (torch.rand(b, s) > 0.1) | (torch.arange(s) == 0)
    return keep.reshape(b, 1, 1, s)


def _attn(**kw: Any) -> nn.Module:
    return Fn(lambda m, q, k, v, mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw))


CASES = [
    OpCase("linear_relu", lambda: nn.Sequential(nn.Linear(24, 40), nn.ReLU()), lambda b: (r(b, 24),)),
    OpCase("linear_3d_gelu", lambda: nn.Sequential(nn.Linear(24, 40), nn.GELU()), lambda b: (r(b, 7, 24),)),
    OpCase("gelu_tanh_silu", lambda: Fn(lambda m, x: F.gelu(x, approximate="tanh") + F.silu(x)), lambda b: (r(b, 33),)),
    OpCase("unary_math", lambda: Fn(lambda m, x: torch.exp(-x.abs()) + torch.log(x.abs() + 1) + torch.sqrt(x.abs())
                                    + torch.rsqrt(x.abs() + 0.5) + torch.tanh(x) + torch.sigmoid(x) + torch.erf(x)
                                    + torch.sin(x) * torch.cos(x)), lambda b: (r(b, 5, 17),)),  # fmt: skip
    OpCase("leaky_relu", lambda: Fn(lambda m, x: F.leaky_relu(x) + F.leaky_relu(x, 0.2)), lambda b: (r(b, 3, 9),)),
    OpCase("hardswish_hardsigmoid_clamp", lambda: Fn(lambda m, x: F.hardswish(x) + F.hardsigmoid(x) + x.clamp(-0.5, 0.7)),
           lambda b: (r(b, 3, 9) * 4,)),  # fmt: skip
    OpCase("binary_broadcast", lambda: Fn(lambda m, x, y: (x * y - x / (y.abs() + 1)) ** 2 + torch.maximum(x, y), ),
           lambda b: (r(b, 4, 6), r(b, 1, 6))),  # fmt: skip
    # exponents eager torch computes as multiplies (codegen/cpp_values.py: pow_by_constant)
    OpCase("pow_small_exponents", lambda: Fn(lambda m, x: x.pow(2) + x.pow(3) + (x.abs() + 0.5).pow(0.5)
                                             + (x.abs() + 0.5).pow(-0.5) + (x.abs() + 0.5).pow(-1) + (x.abs() + 0.5).pow(-2)),
           lambda b: (r(b, 5, 17),)),  # fmt: skip
    OpCase("pow_reciprocal", lambda: Fn(lambda m, x: x.abs().pow(1.5) + 1 / (x.abs() + 1)), lambda b: (r(b, 12),)),
    OpCase("compare_where", lambda: Fn(lambda m, x, y: torch.where((x > y) & (x != 0.5) | (y <= -1), x, y * 2)),
           lambda b: (r(b, 6, 5), r(b, 6, 5))),  # fmt: skip
    OpCase("masked_fill", lambda: Fn(lambda m, x, mask: x.masked_fill(mask, -1e4).softmax(-1)),
           lambda b: (r(b, 2, 8, 8), _mask(b))),  # fmt: skip
    OpCase("softmax_logsoftmax", lambda: Fn(lambda m, x: x.softmax(-1) + x.log_softmax(1)), lambda b: (r(b, 6, 19),)),
    OpCase("group_norm", lambda: nn.Sequential(nn.GroupNorm(4, 12), nn.GroupNorm(3, 12, affine=False)),
           lambda b: (r(b, 12, 5, 3) * 2 + 1,)),  # fmt: skip
    OpCase("group_norm_1d", lambda: nn.GroupNorm(2, 6), lambda b: (r(b, 6, 7),)),
    OpCase("layer_norm", lambda: nn.LayerNorm(48), lambda b: (r(b, 5, 48),)),
    OpCase("rms_norm", lambda: Fn(lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * m.w,
                                  w=torch.rand(32) + 0.5), lambda b: (r(b, 4, 32),)),  # fmt: skip
    OpCase("reductions", lambda: Fn(lambda m, x: torch.cat([x.sum(1), x.mean(1), x.amax(1), x.amin(1)], -1)),
           lambda b: (r(b, 9, 11),)),  # fmt: skip
    OpCase("reduce_middle_axis", lambda: Fn(lambda m, x: x.sum(dim=(1, 3), keepdim=True) * x), lambda b: (r(b, 3, 4, 5),)),
    OpCase("mm_bmm", lambda: Fn(lambda m, x, y: torch.bmm(x, y) + x @ m.w, w=r(12, 10)), lambda b: (r(b, 6, 12), r(b, 12, 10))),
    OpCase("matmul_transposed", lambda: Fn(lambda m, x: x.transpose(-1, -2) @ x), lambda b: (r(b, 9, 7),)),
    OpCase("conv_bn_relu", lambda: nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), random_bn(8), nn.ReLU()), lambda b: (r(b, 3, 10, 10),)),
    OpCase("conv_stride_dilation", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2), lambda b: (r(b, 4, 13, 11),)),
    OpCase("conv_grouped", lambda: nn.Conv2d(8, 12, 3, padding=1, groups=4), lambda b: (r(b, 8, 9, 9),)),
    OpCase("conv_depthwise", lambda: nn.Conv2d(6, 6, 5, padding=2, groups=6), lambda b: (r(b, 6, 8, 8),)),
    OpCase("conv1x1_residual", lambda: Fn(lambda m, x: F.relu(F.conv2d(x, m.w) + x), w=r(5, 5, 1, 1)), lambda b: (r(b, 5, 6, 6),)),
    OpCase("conv1d", lambda: nn.Conv1d(4, 6, 3, padding=1), lambda b: (r(b, 4, 16),)),
    # the channels-last forms (GPU builds): channel blocks (>= 16 channels a group), 1x1 GEMMs, depthwise
    OpCase("conv_wide_stride_pad", lambda: nn.Conv2d(24, 20, 3, stride=2, padding=1, bias=False), lambda b: (r(b, 24, 9, 8),)),
    OpCase("conv1x1_stride2", lambda: nn.Conv2d(16, 32, 1, stride=2), lambda b: (r(b, 16, 7, 7),)),
    OpCase("conv_grouped_wide", lambda: nn.Conv2d(32, 32, 3, padding=2, dilation=2, groups=2), lambda b: (r(b, 32, 6, 6),)),
    OpCase("conv_depthwise_stride", lambda: nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24, bias=False),
           lambda b: (r(b, 24, 9, 9),)),  # fmt: skip
    OpCase("conv_depthwise_7x7", lambda: nn.Conv2d(16, 16, 7, padding=3, groups=16), lambda b: (r(b, 16, 8, 8),)),
    # 3x3 stride-1 convs the CPU build runs as Winograd F(4x4) (codegen/cpp_pack.py's wino_choice, conv_wino.h):
    # sizes off the 4x4 tile, a residual epilogue, channels that fill no vector, no padding
    OpCase("conv3x3_wino_residual", lambda: Fn(lambda m, x: F.relu(F.conv2d(x, m.w, m.b, padding=1) + x), w=r(20, 20, 3, 3) * 0.2,
                                               b=r(20)), lambda b: (r(b, 20, 9, 11),)),  # fmt: skip
    OpCase("conv3x3_wino_nopad", lambda: nn.Conv2d(17, 24, 3), lambda b: (r(b, 17, 10, 7),)),
    OpCase("resnet_bottleneck", lambda: Bottleneck(16, 16, 32, stride=2), lambda b: (r(b, 3, 17, 17),)),
    OpCase("mobilenet_block", lambda: InvertedResidual(16, 4), lambda b: (r(b, 16, 7, 7),)),
    OpCase("maxpool", lambda: nn.MaxPool2d(3, 2, 1), lambda b: (r(b, 3, 11, 11),)),
    OpCase("avgpool", lambda: nn.AvgPool2d(3, 2, 1), lambda b: (r(b, 3, 11, 11),)),
    OpCase("avgpool_ceil_nopad", lambda: nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False), lambda b: (r(b, 2, 7, 7),)),
    # pools over a conv's channels-last output (the C++ reduce across channel lanes): odd sizes, ceil mode,
    # channel counts off the vector width
    OpCase("conv_maxpool_ceil", lambda: nn.Sequential(nn.Conv2d(3, 20, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1, ceil_mode=True),
                                                      nn.Conv2d(20, 4, 1)), lambda b: (r(b, 3, 12, 9),)),  # fmt: skip
    OpCase("conv_avgpool_ceil", lambda: nn.Sequential(nn.Conv2d(3, 5, 3), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                                                      nn.AdaptiveAvgPool2d(1), nn.Flatten()), lambda b: (r(b, 3, 12, 11),)),  # fmt: skip
    OpCase("adaptive_avgpool", lambda: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), lambda b: (r(b, 4, 6, 6),)),
    OpCase("adaptive_avgpool_2x2", lambda: nn.AdaptiveAvgPool2d(2), lambda b: (r(b, 4, 6, 6),)),
    OpCase("embedding", lambda: nn.Embedding(50, 16), lambda b: (torch.randint(0, 50, (b, 7)),)),
    OpCase("index_negative", lambda: Fn(lambda m, x: torch.cat([x[..., [-2], :], x[..., [-1, 0], :] * 2], -2)),
           lambda b: (r(b, 2, 5, 3),)),  # fmt: skip
    OpCase("index_adjacent", lambda: Fn(lambda m, x: x[:, m.i0, m.i1] * 2, i0=torch.tensor([[3], [-1], [0], [-5]]),
                                        i1=torch.tensor([[5, -6, 2]])), lambda b: (r(b, 5, 6, 3),)),  # fmt: skip
    OpCase("index_apart", lambda: Fn(lambda m, x: x[:, m.i0, :, m.i1] + 1, i0=torch.tensor([4, -2, 0]),
                                     i1=torch.tensor([-7, 6, 3])), lambda b: (r(b, 5, 6, 7),)),  # fmt: skip
    OpCase("repeat", lambda: Fn(lambda m, x: torch.cat([x.repeat(1, 2, 3).flatten(1), x.repeat(2, 1, 1, 2).sum(0).flatten(1)], 1)),
           lambda b: (r(b, 3, 4),)),  # fmt: skip
    OpCase("vector_norm", lambda: Fn(lambda m, x: x / (torch.linalg.vector_norm(x, 2, dim=(2, 3), keepdim=True) + 1e-6)
                                     + x.norm(p=1, dim=1, keepdim=True) + torch.linalg.vector_norm(x, float("inf"), dim=-1,
                                     keepdim=True) + torch.linalg.vector_norm(x, 3.0, dim=-2, keepdim=True)),
           lambda b: (r(b, 3, 5, 6),)),  # fmt: skip
    OpCase("upsample_bilinear", lambda: Fn(lambda m, x: F.interpolate(x, size=(7, 9), mode="bilinear")
                                           + F.interpolate(x, scale_factor=1.75, mode="bilinear")[:, :, :7, :9] * 0
                                           + F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True)),
           lambda b: (r(b, 3, 4, 6),)),  # fmt: skip
    OpCase("upsample_scales", lambda: Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear").sum(1)
                                         + F.interpolate(x, scale_factor=2, mode="nearest").amax(1)
                                         + F.interpolate(x, size=(8, 12), mode="nearest").mean(1)),
           lambda b: (r(b, 3, 4, 6),)),  # fmt: skip
    OpCase("upsample_downscale", lambda: Fn(lambda m, x: F.interpolate(x, size=(3, 4), mode="bilinear")
                                            + F.interpolate(x, size=(3, 4), mode="nearest")),
           lambda b: (r(b, 2, 7, 10),)),  # fmt: skip
    OpCase("index_select", lambda: Fn(lambda m, x: torch.index_select(x, 1, m.idx), idx=torch.tensor([3, 0, 2, 2])),
           lambda b: (r(b, 5, 3),)),  # fmt: skip
    OpCase("gather", lambda: Fn(lambda m, x, i: torch.gather(x, 1, i)), lambda b: (r(b, 5, 3), torch.randint(0, 5, (b, 4, 3)))),
    OpCase("view_permute_expand", lambda: Fn(lambda m, x: x.view(x.shape[0], 3, 4).permute(2, 0, 1).expand(2, 4, -1, 3).contiguous()),
           lambda b: (r(b, 12),)),  # fmt: skip
    OpCase("slice_cat_split", lambda: Fn(lambda m, x: torch.cat([x[:, 1:4], x[:, ::2], *x.split(2, dim=1)], 1)),
           lambda b: (r(b, 6, 3),)),  # fmt: skip
    OpCase("as_strided", lambda: Fn(lambda m, x: torch.as_strided(x.contiguous(), (x.shape[0], 3, 2), (12, 1, 4), 1)),
           lambda b: (r(b, 12),)),  # fmt: skip
    # a mean far from zero: a variance taken as E[x^2] - E[x]^2 cancels badly, most of all in bf16
    OpCase("layer_norm_shifted", lambda: Fn(lambda m, x: F.layer_norm(x * 3 + 8, (16,)).softmax(-1)), lambda b: (r(b, 4, 16),)),
    OpCase("pad", lambda: Fn(lambda m, x: F.pad(x, (1, 2, 0, 1), value=0.5)), lambda b: (r(b, 3, 4),)),
    OpCase("cumsum_arange", lambda: Fn(lambda m, x: x.cumsum(1) + torch.arange(x.shape[1], dtype=torch.float32,
                                                                                 device=x.device)),
           lambda b: (r(b, 10),)),  # fmt: skip
    OpCase("int_ops", lambda: Fn(lambda m, x: ((x // 3) + (x % 5) * 2 - x.cumsum(-1)).float() * 0.5),
           lambda b: (torch.randint(-20, 20, (b, 9)),)),  # fmt: skip
    # nn.MultiheadAttention projects a sequence-first view: a linear batched over tokens (passes/linear.py)
    OpCase("multihead_attention", _MHA, lambda b: (r(b, 7, 32),)),
    OpCase("sdpa", lambda: Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v)),
           lambda b: (r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 2, 8, 16))),  # fmt: skip
    OpCase("sdpa_causal", lambda: Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
           lambda b: (r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 2, 8, 16))),  # fmt: skip
    OpCase("sdpa_mask", lambda: Fn(lambda m, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
           lambda b: (r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 2, 8, 16), _mask(b))),  # fmt: skip
    OpCase("sdpa_mask_keys", _attn, lambda b: (r(b, 2, 8, 16), r(b, 2, 10, 16), r(b, 2, 10, 16),
                                                           torch.rand(b, 1, 1, 10) > 0.3)),  # fmt: skip
    OpCase("sdpa_additive_mask", _attn, lambda b: (r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 1, 8, 8))),
    OpCase("sdpa_gqa_causal", lambda: _attn(is_causal=True, enable_gqa=True),
           lambda b: (r(b, 4, 9, 16), r(b, 2, 9, 16), r(b, 2, 9, 16))),  # fmt: skip
    OpCase("sdpa_value_dim_scale", lambda: _attn(scale=0.3),
           lambda b: (r(b, 3, 7, 16), r(b, 3, 11, 16), r(b, 3, 11, 24))),  # fmt: skip
    OpCase("sdpa_masked_row", _attn, lambda b: (r(b, 2, 8, 16), r(b, 2, 10, 16), r(b, 2, 10, 16), _masked_row(b))),
    OpCase("sdpa_causal_rect", lambda: _attn(is_causal=True), lambda b: (r(b, 2, 6, 16), r(b, 2, 9, 16), r(b, 2, 9, 16))),
    # several 32-query causal blocks and two key blocks (128 keys each); lengths not a multiple of either
    OpCase("sdpa_causal_blocks", lambda: _attn(is_causal=True),
           lambda b: (r(b, 2, 150, 16), r(b, 2, 150, 16), r(b, 2, 150, 24))),  # fmt: skip
    OpCase("sdpa_key_padding_odd", _attn,
           lambda b: (r(b, 3, 37, 16), r(b, 3, 135, 16), r(b, 3, 135, 16), _key_padding(b, 135))),  # fmt: skip
    OpCase("sdpa_built_causal_mask", lambda: Fn(_built_causal),
           lambda b: (r(b, 2, 8, 16), r(b, 2, 8, 16), r(b, 2, 8, 16), torch.rand(b, 1, 1, 8) > 0.2)),  # fmt: skip
    OpCase("sdpa_dynamic_lengths", lambda: Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
                                              .reshape(q.shape[0], q.shape[2], -1)),
           lambda b: (r(2, 2, b, 16), r(2, 2, b + 4, 16), r(2, 2, b + 4, 16)), dims=_seq_dims),  # fmt: skip
    OpCase("outputs_float_int", lambda: Fn(lambda m, x: (x.softmax(-1), *x.split([2, 3], 1), (x > 0).sum(-1), x.amax(1))),
           lambda b: (r(b, 5, 6),)),  # fmt: skip
    OpCase("static_shapes", lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh()), lambda b: (r(3, 8),), dynamic=False),
]


def dynamic_shapes(case: OpCase, inputs: tuple[torch.Tensor, ...]) -> tuple | None:
    if not case.dynamic:
        return None
    if case.dims is not None:
        return case.dims()
    batch = torch.export.Dim("batch", min=1, max=16)
    return tuple({0: batch} for _ in inputs)


# Each case runs in each of these (BuildOptions.precision); fp16 follows bf16's code paths, so it runs on the
# cases that exercise each kind of kernel (matmul, conv, norms, softmax, attention, pointwise, reductions).
PRECISIONS = ("fp32", "bf16")
FP16_CASES = ("linear_3d_gelu", "unary_math", "layer_norm", "rms_norm", "softmax_logsoftmax", "reductions", "mm_bmm",
              "conv_bn_relu", "conv_depthwise", "maxpool", "sdpa_causal", "sdpa_mask", "cumsum_arange")  # fmt: skip


def precisions(case: OpCase) -> tuple[str, ...]:
    """A bf16 build casts floating inputs, weights and buffers; a case with none of them (integer math only)
    would build the same model again, so it runs in fp32 alone."""
    torch.manual_seed(0)
    model = case.make()
    tensors = [*case.inputs(2), *model.parameters(), *model.buffers()]
    if not any(t.is_floating_point() for t in tensors):
        return PRECISIONS[:1]
    return (*PRECISIONS, "fp16") if case.name in FP16_CASES else PRECISIONS
