"""The ONNX op table: (domain, op type) -> rule, the ``@op`` decorator, ``Static`` values and ``Ctx``, what a
rule sees.

What it is: the registry and the helpers every rule shares. A value is either an IR ``Node`` (computed at run
time) or a ``Static``: a numpy array known at build time (an initializer, a Constant, or shape arithmetic
over them). A Static of dtype ``object`` holds ints and sympy expressions: the shape of a tensor with dynamic
dimensions, carried symbolically through Shape/Gather/Concat/Reshape chains so they fold at build time.
What it is not: the rules (``ops_math.py``, ``ops_shape.py``, ``ops_nn.py``, ``ops_ms.py``) nor the driver
(``importer.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx
import sympy
from aotc.errors import UnsupportedOp

from ..builder import Builder
from ..ir import Dim, DType, Node, as_dim

ELEM_TYPES: dict[int, DType] = {
    onnx.TensorProto.FLOAT: DType.f32, onnx.TensorProto.DOUBLE: DType.f64, onnx.TensorProto.FLOAT16: DType.f16,
    onnx.TensorProto.BFLOAT16: DType.bf16, onnx.TensorProto.INT64: DType.i64, onnx.TensorProto.INT32: DType.i32,
    onnx.TensorProto.INT16: DType.i16, onnx.TensorProto.INT8: DType.i8, onnx.TensorProto.UINT8: DType.u8,
    onnx.TensorProto.BOOL: DType.bool,
}  # fmt: skip


def dtype_of(elem: int, what: str) -> DType:
    if elem not in ELEM_TYPES:
        name = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else str(elem)
        raise UnsupportedOp(f"{what} has element type {name}; aotc supports {', '.join(sorted(d.value for d in ELEM_TYPES.values()))}")
    return ELEM_TYPES[elem]


@dataclass(frozen=True, eq=False)
class Static:
    """A value known at build time. ``value`` is numeric, or ``object`` holding ints and sympy sizes."""

    value: np.ndarray
    dtype: DType
    name: str | None = None  # the initializer's name, for the weight it becomes

    @staticmethod
    def of(value: Any, dtype: DType) -> Static:
        arr = np.asarray(value, dtype=object) if _symbolic(value) else np.asarray(value)
        if arr.dtype == object:
            flat = [as_dim(v) if dtype.is_int else v for v in arr.ravel()]
            if all(isinstance(v, int | bool | float | np.generic) for v in flat):
                return Static(np.asarray(flat, dtype=dtype.numpy()).reshape(arr.shape), dtype)
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            return Static(out.reshape(arr.shape), dtype)
        return Static(arr.astype(dtype.numpy(), copy=False), dtype)

    @property
    def symbolic(self) -> bool:
        return self.value.dtype == object

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


def _symbolic(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype == object
    if isinstance(value, list | tuple):
        return any(_symbolic(v) for v in value)
    return isinstance(value, sympy.Basic)


Value = Node | Static


@dataclass(frozen=True)
class Rule:
    fn: Callable[[Ctx], Any]  # returns a Value, or a tuple of them (None for an output not computed)
    check: Callable[[onnx.NodeProto, dict[str, Any]], str | None] | None  # names an unsupported attribute value


TABLE: dict[tuple[str, str], Rule] = {}


def op(*names: str, domain: str = "", check: Callable[[onnx.NodeProto, dict[str, Any]], str | None] | None = None) -> Callable:
    def reg(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
        for n in names:
            key = (domain, n)
            if key in TABLE:
                raise ValueError(f"ONNX op {n} has two rules: {TABLE[key].fn.__name__} and {fn.__name__}")
            TABLE[key] = Rule(fn, check)
        return fn

    return reg


def attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode("utf-8", "replace") for x in v]
        out[a.name] = v
    return out


class Tensors(Protocol):
    """What a rule needs of the importer (``importer.Importer``): a value as a tensor node."""

    def tensor(self, v: Value, b: Builder) -> Node: ...


@dataclass
class Ctx:
    """What a rule sees for one ONNX node: its attributes, its input values, a builder whose nodes carry the
    node's name, and the importer (to turn Statics into tensors)."""

    node: onnx.NodeProto
    where: str  # "node 'name' (OpType)"
    ins: list[Value | None]
    b: Builder
    opset: int
    imp: Tensors
    a: dict[str, Any] = field(default_factory=dict)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.a.get(name, default)

    def has(self, i: int) -> bool:
        return i < len(self.ins) and self.ins[i] is not None

    def t(self, i: int) -> Node:
        """Input ``i`` as an IR node (a Static becomes a constant or a weight)."""
        v = self.ins[i] if i < len(self.ins) else None
        if v is None:
            raise self.fail(f"input {i} is required")
        return self.imp.tensor(v, self.b)

    def opt(self, i: int) -> Node | None:
        return self.t(i) if self.has(i) else None

    def static(self, i: int) -> Static | None:
        v = self.ins[i] if i < len(self.ins) else None
        return v if isinstance(v, Static) else None

    def all_static(self) -> bool:
        return all(v is None or isinstance(v, Static) for v in self.ins)

    def need(self, i: int, what: str) -> np.ndarray:
        """A build-time value (shape, axes, pads ...): data computed at run time cannot decide a shape."""
        s = self.static(i)
        if s is None:
            raise self.fail(f"its {what} (input {i}) is computed from run-time data; aotc needs it known at build time")
        return s.value

    def ints(self, i: int, what: str) -> list[Dim]:
        return [as_dim(v) for v in self.need(i, what).ravel().tolist()]

    def dtype(self, i: int) -> DType:
        v = self.ins[i]
        assert v is not None
        return v.dtype

    def shape(self, i: int) -> tuple[Dim, ...]:
        v = self.ins[i]
        assert v is not None
        return tuple(v.shape)

    def fail(self, msg: str) -> UnsupportedOp:
        return UnsupportedOp(f"{self.where}: {msg}")


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def static_ints(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int) for v in values)


def exact_div(a: Dim, b: int) -> Dim:
    """A size divided by a count that divides it (heads, groups, blocks): an int stays an int."""
    if isinstance(a, int):
        return a // b
    return as_dim(sympy.sympify(a) / b)
