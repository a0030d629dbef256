"""The aotc IR: one typed op set, tensor types with symbolic shapes, nodes and graphs.

What it is: the level between core ATen and kernels. Every op here has its meaning defined by the numpy
reference interpreter (``interp.py``) and its typing rules checked by ``verify.py``.
What it is not: a kernel language. Loops, indexing and fusion live in ``kernel.py`` / ``fusion.py``.

Note: broadcasting and dtype promotion are explicit. Elementwise ops take operands of one shape and one
dtype; lowering inserts RESHAPE/EXPAND and CAST nodes, so every later stage sees plain elementwise maps.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import sympy
from aotc.schema import ITEMSIZE

# int or a sympy expression (sympy ships no type stubs, so mypy sees Any either way)
Dim: TypeAlias = Any
Shape: TypeAlias = tuple[Any, ...]


class DType(enum.Enum):
    """Element types; the value is the name the package manifest uses."""

    f32 = "float32"
    f64 = "float64"
    f16 = "float16"
    bf16 = "bfloat16"
    i64 = "int64"
    i32 = "int32"
    i16 = "int16"
    i8 = "int8"
    u8 = "uint8"
    bool = "bool"

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.value]  # the package format's table, keyed by the manifest name

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.f32, DType.f64, DType.f16, DType.bf16)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.i64, DType.i32, DType.i16, DType.i8, DType.u8)

    def numpy(self) -> np.dtype:
        if self is DType.bf16:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.value)


class Op(enum.Enum):
    # sources
    INPUT = enum.auto()
    WEIGHT = enum.auto()
    FULL = enum.auto()  # a constant-filled tensor of the node's type
    ARANGE = enum.auto()  # 1-D: start + i * step
    # unary elementwise
    NEG = enum.auto()
    ABS = enum.auto()
    EXP = enum.auto()
    LOG = enum.auto()
    SQRT = enum.auto()
    RSQRT = enum.auto()
    TANH = enum.auto()
    SIGMOID = enum.auto()
    ERF = enum.auto()
    SIN = enum.auto()
    COS = enum.auto()
    RELU = enum.auto()
    RECIP = enum.auto()
    FLOOR = enum.auto()
    NOT = enum.auto()
    CAST = enum.auto()  # to the node's dtype
    # binary elementwise
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()  # true division for floats, floor division for ints
    MOD = enum.auto()  # Python (floor) remainder
    MAX = enum.auto()
    MIN = enum.auto()
    POW = enum.auto()
    EQ = enum.auto()
    NE = enum.auto()
    LT = enum.auto()
    LE = enum.auto()
    GT = enum.auto()
    GE = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    # ternary elementwise
    WHERE = enum.auto()
    # reductions over ``axes``
    SUM = enum.auto()
    RMAX = enum.auto()
    RMIN = enum.auto()
    CUMSUM = enum.auto()
    # movement
    RESHAPE = enum.auto()
    PERMUTE = enum.auto()
    EXPAND = enum.auto()
    SLICE = enum.auto()
    AS_STRIDED = enum.auto()  # element i of a flat (1-d) input at offset + sum(i_d * stride_d)
    CAT = enum.auto()
    PAD = enum.auto()
    INDEX_SELECT = enum.auto()
    GATHER = enum.auto()  # torch.gather: index has the output's shape
    # library ops: templates with fused epilogues
    MATMUL = enum.auto()  # [..., M, K] @ [..., K, N], batch dims already equal
    CONV2D = enum.auto()
    POOL2D = enum.auto()
    ATTENTION = enum.auto()  # softmax(q @ k^T * scale + mask) @ v per head, never holding the L x S scores


class Family:
    """Op families as plain sets."""

    SOURCE = frozenset({Op.INPUT, Op.WEIGHT, Op.FULL, Op.ARANGE})
    UNARY = frozenset({
        Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIGMOID, Op.ERF,
        Op.SIN, Op.COS, Op.RELU, Op.RECIP, Op.FLOOR, Op.NOT, Op.CAST,
    })  # fmt: skip
    BINARY = frozenset({
        Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MOD, Op.MAX, Op.MIN, Op.POW,
        Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR,
    })  # fmt: skip
    COMPARE = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
    LOGICAL = frozenset({Op.AND, Op.OR, Op.NOT})
    FLOAT_ONLY = frozenset({
        Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS, Op.RECIP, Op.POW,
    })  # fmt: skip
    ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
    REDUCE = frozenset({Op.SUM, Op.RMAX, Op.RMIN})
    VIEW = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.AS_STRIDED})
    MOVEMENT = VIEW | {Op.CAT, Op.PAD, Op.INDEX_SELECT, Op.GATHER}
    LIBRARY = frozenset({Op.MATMUL, Op.CONV2D, Op.POOL2D, Op.CUMSUM, Op.ATTENTION})


# ---- attributes: one small frozen dataclass per op kind --------------------------------------------


@dataclass(frozen=True)
class InputAttr:
    name: str


@dataclass(frozen=True)
class WeightAttr:
    name: str


@dataclass(frozen=True)
class FullAttr:
    value: float | int | bool | sympy.Expr  # a sympy value is a symbolic size (e.g. a mean's count)


@dataclass(frozen=True)
class ArangeAttr:
    start: float | int
    step: float | int


@dataclass(frozen=True)
class ReduceAttr:
    axes: tuple[int, ...]
    keepdim: bool


@dataclass(frozen=True)
class AxisAttr:
    axis: int


@dataclass(frozen=True)
class PermuteAttr:
    perm: tuple[int, ...]


@dataclass(frozen=True)
class SliceAttr:
    axis: int
    start: Dim
    step: int


@dataclass(frozen=True)
class StridedAttr:
    strides: tuple[Dim, ...]
    offset: Dim


@dataclass(frozen=True)
class PadAttr:
    pads: tuple[tuple[int, int], ...]  # (before, after) per dim; negative crops
    value: float | int


@dataclass(frozen=True)
class ConvAttr:
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


@dataclass(frozen=True)
class PoolAttr:
    kind: str  # "max" | "avg"
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool
    divisor: int | None = None


@dataclass(frozen=True)
class AttentionAttr:
    """Inputs q [B..., Hq, L, E], k [B..., Hk, S, E], v [B..., Hk, S, Ev] and, unless ``mask`` is "none", a
    mask of shape [B..., Hq, L, S] ("bool": True attends; "add": added to the scaled scores, q's dtype).
    Query head h reads kv head h // (Hq / Hk). ``causal``: row i attends to keys j <= i (top-left aligned,
    torch's is_causal). A row that attends to nothing gives zeros."""

    scale: float
    causal: bool
    mask: str  # "none" | "bool" | "add"


Attr = (
    InputAttr | WeightAttr | FullAttr | ArangeAttr | ReduceAttr | AxisAttr | PermuteAttr | SliceAttr | StridedAttr
    | PadAttr | ConvAttr | PoolAttr | AttentionAttr | None
)  # fmt: skip


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: Shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def numel(self) -> Dim:
        n: Dim = 1
        for d in self.shape:
            n = n * d
        return n


@dataclass(frozen=True, eq=False)
class Node:
    """One value of the graph: immutable, compared by identity (``is``), so two equal-looking nodes stay two
    values. A node has no number of its own; its graph numbers it by position (``Graph.ids``)."""

    op: Op
    inputs: tuple[Node, ...]
    type: TensorType
    attr: Attr = None
    source: str | None = None  # the user's source line this came from, for error messages

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> Shape:
        return self.type.shape

    def __repr__(self) -> str:
        shape = "x".join(str(d).replace(" ", "") for d in self.shape) or "scalar"
        return f"{self.op.name}:{self.dtype.value}[{shape}]"


@dataclass(frozen=True)
class Symbol:
    """A dynamic dimension: its sympy symbol, user-facing name and inclusive range."""

    name: str  # the sympy symbol's name, used in size expressions
    label: str  # the name the user gave (torch.export.Dim name)
    min: int
    max: int | None
    example: int | None = None  # its value in the example inputs: the size tile configs are chosen for


@dataclass(frozen=True, eq=False)
class Graph:
    """Nodes in topological order. ``weights`` holds the constant data for WEIGHT nodes.

    Passes build a new Graph rather than change this one; node numbers are positions in ``nodes``.
    """

    nodes: list[Node]
    inputs: list[Node]
    outputs: list[Node]
    weights: dict[str, np.ndarray]
    symbols: list[Symbol] = field(default_factory=list)

    def ids(self) -> dict[Node, int]:
        """Each node's number: its position, so the same graph always prints and names the same way."""
        return {n: k for k, n in enumerate(self.nodes)}

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n)
        return out


def dims_equal(a: Dim, b: Dim) -> bool:
    """Whether two dims are provably equal (ints, or sympy expressions that expand to the same thing)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def shapes_equal(a: Shape, b: Shape) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b, strict=True))


def as_dim(d: object) -> Dim:
    """Normalise a dim: sympy integers become ints, so concrete shapes stay plain."""
    if isinstance(d, int):
        return d
    e = sympy.sympify(d)
    if e.is_Integer:
        return int(e)
    return e
