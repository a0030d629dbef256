"""The torch calls users write, each with the core ATen ops it becomes: the "by torch call" table of
docs/ops.md.

What it is: data. Each ``Call`` names what a model's code says (``torch.nn.functional.gelu``, ``x.view``,
``torch.where``), a one-line function that uses it on a float tensor of shape (2, 8, 16), and the aten ops
that ``torch.export`` turns it into. ``tests/test_docs.py`` exports every function, checks that its ops are
the ones listed here and that the lowering table (``aot/lower/``) takes them all; and that every call in
``NOT_YET`` still fails with ``UnsupportedOp`` (so adding an op moves its row, docs/adding-an-op.md).
What it is not: the lowering table; that is ``aotc_build.lower.TABLE``, keyed by aten overload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Call:
    group: str
    call: str  # as users write it
    fn: Callable[[torch.Tensor], object]  # uses the call on x: float32[2, 8, 16]
    ops: tuple[str, ...] = ()  # aten overloads it becomes (the helpers fn adds around it are not listed)


def _w(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


CALLS: tuple[Call, ...] = (
    Call("arithmetic", "x + y, torch.add", lambda x: x + x, ("add.Tensor",)),
    Call("arithmetic", "x - y, torch.sub", lambda x: x - x, ("sub.Tensor",)),
    Call("arithmetic", "x * y, torch.mul", lambda x: x * x, ("mul.Tensor",)),
    Call("arithmetic", "x / y, torch.div", lambda x: x / 3.0, ("div.Tensor",)),
    Call("arithmetic", "x // y, torch.floor_divide", lambda x: x // 0.7, ("div.Tensor_mode",)),
    Call("arithmetic", "x % y, torch.remainder", lambda x: x % 0.7, ("remainder.Scalar",)),
    Call("arithmetic", "torch.fmod", lambda x: torch.fmod(x, 0.7), ("fmod.Scalar",)),
    Call("arithmetic", "x ** y, torch.pow", lambda x: x**2.0, ("pow.Tensor_Scalar",)),
    Call("arithmetic", "torch.abs, x.abs", torch.abs, ("abs.default",)),
    Call("arithmetic", "-x, torch.neg", lambda x: -x, ("neg.default",)),
    Call("arithmetic", "torch.exp", torch.exp, ("exp.default",)),
    Call("arithmetic", "torch.log", torch.log, ("log.default",)),
    Call("arithmetic", "torch.sqrt", torch.sqrt, ("sqrt.default",)),
    Call("arithmetic", "torch.rsqrt", torch.rsqrt, ("rsqrt.default",)),
    Call("arithmetic", "torch.reciprocal", torch.reciprocal, ("reciprocal.default",)),
    Call("arithmetic", "torch.sin, torch.cos", lambda x: torch.sin(x) + torch.cos(x), ("sin.default", "cos.default")),
    Call("arithmetic", "torch.tanh", torch.tanh, ("tanh.default",)),
    Call("arithmetic", "torch.sigmoid", torch.sigmoid, ("sigmoid.default",)),
    Call("arithmetic", "torch.erf", torch.erf, ("erf.default",)),
    Call("arithmetic", "torch.floor", torch.floor, ("floor.default",)),
    Call("arithmetic", "torch.clamp, x.clamp", lambda x: torch.clamp(x, -0.5, 0.5), ("clamp.default",)),
    Call("arithmetic", "torch.maximum, torch.minimum", lambda x: torch.maximum(x, x) + torch.minimum(x, x),
         ("maximum.default", "minimum.default")),  # fmt: skip
    Call("comparison", "x == y, x != y", lambda x: (x == 0.5) | (x != 0.2), ("eq.Scalar", "ne.Scalar", "bitwise_or.Tensor")),
    Call("comparison", "x < y, x <= y, x > y, x >= y", lambda x: (x < 0.5) & (x <= 0.2) | (x > 0.1) & (x >= 0.3),
         ("lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar", "bitwise_and.Tensor")),  # fmt: skip
    Call("comparison", "torch.logical_and, torch.logical_or, torch.logical_not",
         lambda x: torch.logical_not(torch.logical_and(x > 0, torch.logical_or(x < 1, x > 2))),
         ("logical_and.default", "logical_or.default", "logical_not.default")),  # fmt: skip
    Call("comparison", "~mask", lambda x: ~(x > 0), ("bitwise_not.default",)),
    Call("comparison", "torch.where", lambda x: torch.where(x > 0, x, x), ("where.self",)),
    Call("comparison", "x.masked_fill", lambda x: x.masked_fill(x > 0.5, -1.0), ("where.self",)),
    Call("activation", "torch.nn.functional.relu, torch.relu", F.relu, ("relu.default",)),
    Call("activation", "torch.nn.functional.gelu (also approximate='tanh')", lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"),
         ("gelu.default",)),  # fmt: skip
    Call("activation", "torch.nn.functional.silu", F.silu, ("sigmoid.default", "mul.Tensor")),
    Call("activation", "torch.nn.functional.softmax", lambda x: F.softmax(x, -1), ("_softmax.default",)),
    Call("activation", "torch.nn.functional.log_softmax", lambda x: F.log_softmax(x, -1), ("_log_softmax.default",)),
    Call("activation", "torch.nn.functional.hardswish, hardsigmoid", lambda x: F.hardswish(x) + F.hardsigmoid(x), ("clamp.default",)),
    Call("activation", "torch.nn.functional.hardtanh, relu6", lambda x: F.hardtanh(x) + F.relu6(x), ("hardtanh.default",)),
    Call("activation", "torch.nn.functional.leaky_relu", lambda x: F.leaky_relu(x, 0.2), ("leaky_relu.default",)),
    Call("activation", "torch.nn.functional.glu", lambda x: F.glu(x, -1), ("slice.Tensor", "sigmoid.default")),
    Call("normalization", "torch.nn.functional.layer_norm", lambda x: F.layer_norm(x, (16,)), ("native_layer_norm.default",)),
    Call("normalization", "torch.nn.functional.rms_norm", lambda x: F.rms_norm(x, (16,)), ("mean.dim", "rsqrt.default")),
    Call("normalization", "torch.nn.functional.group_norm", lambda x: F.group_norm(x, 4), ("native_group_norm.default",)),
    Call("normalization", "torch.nn.functional.batch_norm (eval)", lambda x: F.batch_norm(x, _w(8) * 0, _w(8)),
         ("_native_batch_norm_legit_no_training.default",)),  # fmt: skip
    Call("normalization", "torch.nn.functional.normalize", lambda x: F.normalize(x, dim=-1), ("linalg_vector_norm.default",)),
    Call("linear algebra", "torch.nn.functional.linear", lambda x: F.linear(x, _w(4, 16), _w(4)), ("addmm.default",)),
    Call("linear algebra", "x @ y, torch.matmul", lambda x: x @ x.transpose(-1, -2), ("bmm.default",)),
    Call("linear algebra", "torch.bmm", lambda x: torch.bmm(x, x.transpose(1, 2)), ("bmm.default",)),
    Call("linear algebra", "torch.mm", lambda x: torch.mm(x[0], x[0].t()), ("mm.default",)),
    Call("linear algebra", "torch.einsum", lambda x: torch.einsum("bij,bkj->bik", x, x), ("bmm.default",)),
    Call("linear algebra", "torch.nn.functional.scaled_dot_product_attention", lambda x: F.scaled_dot_product_attention(*(x[None],) * 3),
         ("scaled_dot_product_attention.default",)),  # fmt: skip
    Call("linear algebra", "torch.nn.functional.embedding", lambda x: F.embedding(x[0, 0].long().clamp(0, 4), _w(5, 3)),
         ("embedding.default",)),  # fmt: skip
    Call("convolution", "torch.nn.functional.conv2d", lambda x: F.conv2d(x[None], _w(4, 2, 3, 3)), ("convolution.default",)),
    Call("convolution", "torch.nn.functional.conv1d", lambda x: F.conv1d(x, _w(4, 8, 3)), ("convolution.default",)),
    Call("convolution", "torch.nn.functional.max_pool2d", lambda x: F.max_pool2d(x[None], 2), ("max_pool2d_with_indices.default",)),
    Call("convolution", "torch.nn.functional.avg_pool2d", lambda x: F.avg_pool2d(x[None], 2), ("avg_pool2d.default",)),
    Call("convolution", "torch.nn.functional.adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x[None], 1), ("mean.dim",)),
    Call("convolution", "torch.nn.functional.interpolate (nearest, bilinear)",
         lambda x: F.interpolate(x[None], scale_factor=2.0, mode="nearest") + F.interpolate(x[None], scale_factor=2.0, mode="bilinear"),
         ("upsample_nearest2d.vec", "upsample_bilinear2d.vec")),  # fmt: skip
    Call("convolution", "torch.nn.functional.pad (constant)", lambda x: F.pad(x, (1, 2)), ("constant_pad_nd.default",)),
    Call("reduction", "x.sum, torch.sum", lambda x: x.sum(-1), ("sum.dim_IntList",)),
    Call("reduction", "x.mean, torch.mean", lambda x: x.mean(-1), ("mean.dim",)),
    Call("reduction", "x.amax, x.amin", lambda x: x.amax(-1) + x.amin(-1), ("amax.default", "amin.default")),
    Call("reduction", "x.max(), x.min() (whole tensor)", lambda x: x.max() + x.min(), ("max.default", "min.default")),
    Call("reduction", "torch.var, x.std", lambda x: torch.var(x, -1) + x.std(-1), ("var.correction",)),
    Call("reduction", "torch.cumsum", lambda x: torch.cumsum(x, -1), ("cumsum.default",)),
    Call("reduction", "torch.all, torch.any", lambda x: torch.all(x > 0, -1) | torch.any(x > 1, -1), ("any.dim",)),
    Call("reduction", "torch.linalg.vector_norm, x.norm", lambda x: torch.linalg.vector_norm(x, dim=-1), ("linalg_vector_norm.default",)),
    Call("reduction", "torch.logsumexp", lambda x: torch.logsumexp(x, -1), ("amax.default", "exp.default", "sum.dim_IntList")),
    Call("shape", "x.view, x.reshape, x.flatten", lambda x: x.view(2, 128) + x.reshape(2, 128) + x.flatten(1), ("view.default",)),
    Call("shape", "x.permute, x.transpose, x.t, x.T", lambda x: x.permute(2, 1, 0) + x.transpose(0, 2), ("permute.default",)),
    Call("shape", "x.unsqueeze, x[None]", lambda x: x.unsqueeze(1), ("unsqueeze.default",)),
    Call("shape", "x.squeeze", lambda x: x[:, :1].squeeze(1), ("squeeze.dims",)),
    Call("shape", "x.expand, x.expand_as", lambda x: x[:, :1].expand(2, 8, 16), ("expand.default",)),
    Call("shape", "x.repeat", lambda x: x.repeat(1, 2, 1), ("repeat.default",)),
    Call("shape", "torch.cat, torch.stack", lambda x: torch.cat([x, x], 1) + torch.stack([x, x], 1).view(2, 16, 16), ("cat.default",)),
    Call("shape", "x.chunk, x.split", lambda x: x.chunk(2, -1)[0] + x.split(8, -1)[1], ("split_with_sizes.default",)),
    Call("shape", "torch.unbind", lambda x: x.unbind(0), ("squeeze.dims",)),
    Call("shape", "x[..., a:b:s], x.narrow", lambda x: x[..., 1:9:2] + x.narrow(-1, 2, 4), ("slice.Tensor",)),
    Call("shape", "x[i] (an int index)", lambda x: x[1], ("select.int",)),
    Call("shape", "x[idx] (a tensor index)", lambda x: x[torch.tensor([1, 0])], ("index.Tensor",)),
    Call("shape", "torch.gather", lambda x: torch.gather(x, -1, x.long().clamp(0, 15)), ("gather.default",)),
    Call("shape", "torch.index_select", lambda x: torch.index_select(x, 1, torch.tensor([0, 2])), ("index_select.default",)),
    Call("shape", "torch.roll", lambda x: torch.roll(x, 1, -1), ("index_select.default",)),
    Call("shape", "torch.tril, torch.triu", lambda x: torch.tril(x) + torch.triu(x), ("where.self",)),
    Call("shape", "x.contiguous, x.clone, x.detach", lambda x: x.transpose(1, 2).contiguous().clone().detach(), ("clone.default",)),
    Call("dtype", "x.to(dtype), x.float(), x.half(), x.bfloat16(), x.long(), x.type_as",
         lambda x: x.to(torch.float16).float() + x.long(), ("_to_copy.default",)),  # fmt: skip
    Call("creation", "torch.arange", lambda x: x + torch.arange(16), ("arange.start_step",)),
    Call("creation", "torch.zeros, torch.ones, torch.full", lambda x: x + torch.zeros(16) + torch.full((16,), 2.0), ("full.default",)),
    Call("creation", "torch.zeros_like, torch.ones_like, torch.full_like", lambda x: torch.zeros_like(x) + torch.full_like(x, 3.0),
         ("full_like.default",)),  # fmt: skip
    Call("creation", "x.new_zeros, x.new_ones, x.new_full", lambda x: x + x.new_zeros(16) + x.new_full((16,), 2.0), ("full.default",)),
)

# Calls users write that do not lower yet: each fails the build with UnsupportedOp naming the aten op.
NOT_YET: tuple[Call, ...] = (
    Call("arithmetic", "torch.log1p", torch.log1p),
    Call("arithmetic", "torch.ceil", torch.ceil),
    Call("arithmetic", "torch.round", torch.round),
    Call("arithmetic", "torch.sign", torch.sign),
    Call("comparison", "torch.isnan", torch.isnan),
    Call("activation", "torch.nn.functional.elu", F.elu),
    Call("activation", "torch.nn.functional.mish", F.mish),
    Call("activation", "torch.nn.functional.softplus", F.softplus),
    Call("convolution", "torch.nn.functional.conv_transpose2d", lambda x: F.conv_transpose2d(x[None], _w(2, 4, 3, 3))),
    Call("reduction", "x.argmax, x.max(dim)", lambda x: x.argmax(-1)),
    Call("reduction", "x.prod", lambda x: x.prod(-1)),
    Call("shape", "torch.flip", lambda x: torch.flip(x, (-1,))),
)
