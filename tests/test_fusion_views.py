"""Views that only permute or reshape a buffer cost no kernel: fusion reads through their composed strides
(``Buffers.strided``), also when a view on the way has no strides of its own (nn.MultiheadAttention's head
split), and the reads compute what eager torch computes (the kernel interpreter, fp32)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sympy
import torch
from aotc_build import kernel as K
from aotc_build.build import compile_graph
from aotc_build.capture import capture_module
from aotc_build.kernel_interp import run_program
from torch import nn


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor], **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self, x)


class MHA(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def fused(model: nn.Module, x: torch.Tensor, dynamic: bool = False) -> tuple[K.Plan, Callable[[torch.Tensor], np.ndarray]]:
    """The fused program of ``model`` and a function running it through the kernel interpreter."""
    shapes = ({0: torch.export.Dim("batch", min=1, max=16)},) if dynamic else None
    cap = capture_module(model.eval(), (x,), shapes)
    graph, plan, _ = compile_graph(cap)

    def run(x: torch.Tensor) -> np.ndarray:
        env = {s.name: int(x.shape[0]) for s in plan.symbols}
        ws = [graph.weights[plan.labels[w.name]] for w in plan.weights]
        return run_program(plan, [x.numpy()], ws, env)[0]

    return plan, run


def check(model: nn.Module, run: Callable[[torch.Tensor], np.ndarray], x: torch.Tensor) -> None:
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(run(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic_batch"])
def test_multihead_attention_reads_q_k_v_from_the_projection(dynamic: bool) -> None:
    """proj.view(L, B * H, E).transpose(0, 1).view(B, H, L, E) merges batch and head, which have no common
    stride, then splits them again: the whole chain is affine, so no copy kernel per q, k and v."""
    torch.manual_seed(0)
    model = MHA()
    plan, run = fused(model, torch.randn(3, 10, 64), dynamic)
    # the last kernel copies the sequence-first result into the batch-first output
    assert [type(k).__name__ for k in plan.kernels] == ["Matmul", "Attention", "Matmul", "Pointwise"]
    proj, attn, _, _ = plan.kernels
    assert isinstance(attn, K.Attention)
    assert {op.buf for op in attn.operands} == K.writes(proj)
    assert [op.strides for op in attn.operands] == [(192, 1)] * 3  # rows of the packed [B * L, 3 * 64] projection
    for batch in (3, 5) if dynamic else (3,):
        check(model, run, torch.randn(batch, 10, 64))


def test_pointwise_reads_through_the_composed_strides() -> None:
    """The same head split read by a pointwise kernel: one load with an affine index (no floor or mod)."""

    def heads(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        p = (x @ m.w).transpose(0, 1)  # [L, B, D]: what nn.MultiheadAttention projects
        return p.reshape(n, b * 4, d // 4).transpose(0, 1).reshape(b, 4, n, d // 4) * 2.0

    torch.manual_seed(0)
    model = Fn(heads, w=torch.randn(32, 32))
    plan, run = fused(model, torch.randn(3, 6, 32))
    assert [type(k).__name__ for k in plan.kernels] == ["Matmul", "Pointwise"]
    (store,) = plan.kernels[1].stores
    loads = [v for v in K.walk(store.value) if isinstance(v, K.Load)]
    assert len(loads) == 1 and isinstance(loads[0].index, K.Index)
    assert not loads[0].index.expr.has(sympy.floor, sympy.Mod)
    check(model, run, torch.randn(3, 6, 32))


def test_a_view_that_is_not_affine_still_copies() -> None:
    """A transposed tensor flattened (x.transpose(1, 2).reshape(B, 12)) has no strides: the matmul operand
    is a copy kernel, as before."""
    torch.manual_seed(0)
    model = Fn(lambda m, x: x.transpose(1, 2).reshape(x.shape[0], 12) @ m.w, w=torch.randn(12, 5))
    plan, run = fused(model, torch.randn(4, 3, 4))
    assert [type(k).__name__ for k in plan.kernels] == ["Pointwise", "Matmul"]
    check(model, run, torch.randn(4, 3, 4))


class FFN(nn.Module):
    """BERT's feed-forward over [B, L, H]: nn.Linear is a [B * L, H] matmul whose bias and GELU apply to [B, L, 4H]."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Blocks(nn.Module):
    """Two MobileNetV2-style stages: a block without a skip, then one with: the first block's output is
    read by the next conv and by the residual add."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.ReLU6(), nn.Conv2d(2 * c, c, 1))
        self.b = nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.ReLU6(), nn.Conv2d(2 * c, c, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return y + self.b(y)


def test_linear_epilogue_over_reshaped_rows() -> None:
    """The FFN's bias and GELU run in the up-projection's epilogue (no pointwise kernel between the two
    matmuls), stored through [B * L, 4H] -> [B, L, 4H]."""
    torch.manual_seed(0)
    model, x = FFN(), torch.randn(2, 5, 16)
    plan, run = fused(model, x)
    assert [type(k).__name__ for k in plan.kernels] == ["Matmul", "Matmul"]
    check(model, run, x)


def test_conv_bias_and_skip_stay_in_the_conv() -> None:
    """A project conv's bias and the residual add stay in its epilogue: every kernel is a conv."""
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(1, 8, 5, 6)
    plan, run = fused(model, x)
    assert all(isinstance(k, K.Conv) for k in plan.kernels), [type(k).__name__ for k in plan.kernels]
    check(model, run, x)
