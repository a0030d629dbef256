"""The lowering table: core ATen overload -> rule, the ``@lower`` decorator, and ``Ctx``, what a rule sees.

What it is: the registry and the helpers every rule shares (dtype mapping, promotion, axes).
What it is not: the rules themselves (``elementwise.py``, ``movement.py``, ``nn.py``) nor the driver that
walks the FX graph (``driver.py``); the driver imports the rule modules, so the table is full once
``aotc_build.lower`` is imported.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from aotc.errors import UnsupportedOp

from ..builder import Builder
from ..ir import DType, Node, Shape, as_dim

aten = torch.ops.aten

TORCH_DTYPES = {
    torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
    torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
    torch.uint8: DType.u8, torch.bool: DType.bool,
}  # fmt: skip

LowerFn = Callable[["Ctx"], Any]  # returns a Node, or a tuple of them for multi-output ops
TABLE: dict[Any, LowerFn] = {}
IGNORED = {
    aten.sym_size.int, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
    aten._assert_tensor_metadata.default, aten.sym_numel.default, aten.sym_stride.int,
    operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod, operator.neg,
    operator.eq, operator.ne, operator.ge, operator.le, operator.lt, operator.gt, operator.truediv,
}  # fmt: skip


def lower(*targets: Any) -> Callable[[LowerFn], LowerFn]:
    def reg(fn: LowerFn) -> LowerFn:
        for t in targets:
            if t in TABLE:  # two rules for one overload: the later would win silently
                raise ValueError(f"{t} has two lowering rules: {TABLE[t].__name__} and {fn.__name__}")
            TABLE[t] = fn
        return fn

    return reg


# ---- context ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    """What a rule sees for one FX node: the node, the IR values lowered so far, and a builder whose nodes
    carry this FX node's source line. The driver makes one per FX node."""

    fx: torch.fx.Node
    env: Mapping[torch.fx.Node, Any]
    b: Builder

    def arg(self, i: int, default: Any = None) -> Any:
        a = self.fx.args[i] if i < len(self.fx.args) else self.fx.kwargs.get(self._argname(i), default)
        return self.value(a)

    def kw(self, name: str, pos: int, default: Any = None) -> Any:
        if name in self.fx.kwargs:
            return self.value(self.fx.kwargs[name])
        if pos < len(self.fx.args):
            return self.value(self.fx.args[pos])
        return default

    @property
    def target(self) -> Any:
        return self.fx.target

    def kwarg(self, name: str, default: Any = None) -> Any:
        return self.fx.kwargs.get(name, default)

    def _argname(self, i: int) -> str:
        schema = getattr(self.fx.target, "_schema", None)
        return schema.arguments[i].name if schema is not None and i < len(schema.arguments) else ""

    def value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            if a in self.env:
                return self.env[a]
            return sym_value(a.meta.get("val"))
        if isinstance(a, list | tuple):
            return type(a)(self.value(x) for x in a)
        return sym_value(a)

    @property
    def out_dtype(self) -> DType:
        v = self.fx.meta["val"]
        v = v[0] if isinstance(v, list | tuple) else v
        return TORCH_DTYPES[v.dtype]

    @property
    def out_shape(self) -> Shape:
        v = self.fx.meta["val"]
        v = v[0] if isinstance(v, list | tuple) else v
        return meta_shape(v)


def sym_value(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        return as_dim(v.node.expr)
    if isinstance(v, torch.SymFloat | torch.SymBool):
        raise UnsupportedOp(f"symbolic scalar {v} is not supported (a float/bool computed from shapes)")
    return v


def meta_shape(v: Any) -> Shape:
    return tuple(as_dim(d.node.expr) if isinstance(d, torch.SymInt) else int(d) for d in v.shape)


def promote(*args: Any) -> DType:
    """torch's result type for a mix of tensors (IR nodes) and python scalars."""
    dummies: list[Any] = []
    for a in args:
        if isinstance(a, Node):
            td = next(k for k, v in TORCH_DTYPES.items() if v is a.dtype)
            dummies.append(torch.empty((1,) if a.type.rank else (), dtype=td))
        elif a is not None:
            dummies.append(a)
    out = dummies[0] if len(dummies) == 1 else torch.result_type(dummies[0], dummies[1])
    for d in dummies[2:]:
        out = torch.promote_types(out, torch.result_type(torch.empty((), dtype=out), d))
    if isinstance(out, torch.Tensor):
        out = out.dtype
    elif not isinstance(out, torch.dtype):
        out = torch.result_type(torch.tensor(out), torch.tensor(out))
    return TORCH_DTYPES[out]


def norm_axis(axis: int, rank: int) -> int:
    return axis % rank if rank else 0


def compute_dtype(dt: DType) -> DType:
    """Norms and softmax in bf16/f16 compute in fp32 and round once at the end, as torch's kernels do."""
    return DType.f32 if dt in (DType.bf16, DType.f16) else dt
