"""ONNX graph -> aotc IR: graph inputs become INPUT nodes with dynamic dimensions, initializers become
weights, every node goes through its rule in the table.

Unsupported ops and attribute values are collected over the whole graph first and reported in one
``UnsupportedOp`` that names each node and op type. Shape arithmetic runs on ``Static`` values (numpy,
with sympy sizes for dynamic dimensions), so a Shape -> Gather -> Concat -> Reshape chain becomes one
RESHAPE with a symbolic target shape and no run-time work.
What it is not: reading or checking the file (``reader.py``), the rules (``ops_*.py``), or anything after
the IR: passes, fusion, codegen and packaging are the PyTorch path's, unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
from aotc.errors import UnsupportedOp, UsageError
from onnx import numpy_helper

from ..builder import Builder, unique_name
from ..ir import AxisAttr, DType, Graph, InputAttr, Node, Op, Symbol, WeightAttr
from . import ops_math, ops_ms, ops_nn, ops_shape  # noqa: F401  (the rule modules fill TABLE as they import)
from .reader import Loaded
from .table import TABLE, Ctx, Static, Value, attrs, dtype_of

DEFAULT_EXAMPLE = 8  # a dynamic dimension's size in the self-test and for tile choices, unless its range says less


@dataclass(frozen=True)
class DimSpec:
    label: str
    min: int
    max: int | None


def parse_dynamic(specs: tuple[str, ...], names: list[str]) -> dict[tuple[str, int], DimSpec]:
    """``--dynamic input:axis:label[:min:max]`` -> (input, axis) -> its label and range."""
    out: dict[tuple[str, int], DimSpec] = {}
    for s in specs:
        parts = s.split(":")
        if len(parts) not in (3, 5) or not parts[1].isdigit() or (len(parts) == 5 and not (parts[3].isdigit() and parts[4].isdigit())):
            raise UsageError(f"--dynamic {s!r}: expected INPUT:AXIS:LABEL or INPUT:AXIS:LABEL:MIN:MAX")
        if parts[0] not in names:
            raise UsageError(f"--dynamic {s!r}: the model has no input {parts[0]!r} (inputs: {', '.join(names)})")
        lo, hi = (int(parts[3]), int(parts[4])) if len(parts) == 5 else (1, None)
        out[(parts[0], int(parts[1]))] = DimSpec(parts[2], lo, hi)
    return out


def clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name) or "_"


@dataclass
class Importer:
    """The state of one import: values by ONNX name, weights, symbols."""

    fname: str
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    # id(Static) -> (it, its node), so a weight is stored once; holding the Static keeps its id from reuse
    _made: dict[int, tuple[Static, Node]] = field(default_factory=dict)

    def tensor(self, v: Value, b: Builder) -> Node:
        if isinstance(v, Node):
            return v
        if id(v) in self._made:
            return self._made[id(v)][1]
        node = self._materialize(v, b)
        self._made[id(v)] = (v, node)
        return node

    def _materialize(self, s: Static, b: Builder) -> Node:
        arr = s.value
        if s.symbolic:  # sizes: one FULL per element (symbolic values allowed for ints), then CAT
            dt = s.dtype if s.dtype.is_int else DType.i64
            parts = [b.reshape(b.full(v if isinstance(v, int) else sympy.sympify(v), dt, ()), (1,)) for v in arr.ravel()]
            flat = parts[0] if len(parts) == 1 else b.add(Op.CAT, parts, dt, (len(parts),), _axis0())
            return b.cast(b.reshape(flat, arr.shape), s.dtype)
        first = arr.ravel()[0] if arr.size else 0
        if arr.size <= 1 or (np.isfinite(arr.astype(np.float64)).all() and bool((arr == first).all())):
            if arr.size and not np.isfinite(float(first)):
                return self._weight(s, b)
            return b.full(first.item() if hasattr(first, "item") else first, s.dtype, arr.shape)
        return self._weight(s, b)

    def _weight(self, s: Static, b: Builder) -> Node:
        name = clean(s.name or "const")
        base, k = name, 1
        while name in self.weights:
            name, k = f"{base}_{k}", k + 1
        self.weights[name] = np.ascontiguousarray(s.value)
        return b.add(Op.WEIGHT, (), s.dtype, s.value.shape, WeightAttr(name))


def _axis0() -> AxisAttr:
    return AxisAttr(0)


@dataclass
class Lowered:
    graph: Graph
    input_names: list[str]  # the ONNX names, in the order of graph.inputs
    output_names: list[str]  # the package's names (cleaned, unique)
    relabel: dict[tuple[str, int], str]  # fixed sizes in the file that --dynamic made dynamic


def lower_model(loaded: Loaded, fname: str, dynamic: tuple[str, ...] = ()) -> Lowered:
    g = loaded.model.graph
    inits: dict[str, Static] = {}
    for t in g.initializer:
        inits[t.name] = Static(np.asarray(numpy_helper.to_array(t)), dtype_of(t.data_type, f"initializer {t.name!r}"), t.name)
    for st in g.sparse_initializer:
        raise UnsupportedOp(f"{fname}: sparse initializer {st.values.name!r} is not supported: store it dense")
    _check_supported(loaded, fname)

    real_inputs = [i for i in g.input if i.name not in inits]
    overrides = parse_dynamic(dynamic, [i.name for i in real_inputs])
    b = Builder()
    env: dict[str, Value] = dict(inits)
    symbols: dict[str, Symbol] = {}
    inputs: list[Node] = []
    used: set[str] = set()
    for inp in real_inputs:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOp(f"{fname}: graph input {inp.name!r} is not a tensor (sequences and maps are not supported)")
        dt = dtype_of(tt.elem_type, f"graph input {inp.name!r}")
        if not tt.HasField("shape"):
            raise UnsupportedOp(f"{fname}: graph input {inp.name!r} has no shape (not even a rank): export it with shapes")
        shape: list[Any] = []
        for axis, d in enumerate(tt.shape.dim):
            spec = overrides.get((inp.name, axis))
            if spec is None and d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
                continue
            named = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{inp.name}.shape[{axis}]"
            label = spec.label if spec is not None else named
            sym = symbols.get(label)
            if sym is None:
                lo, hi = (spec.min, spec.max) if spec is not None else (1, None)
                want = int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else DEFAULT_EXAMPLE  # the file's size
                example = min(max(lo, want), hi) if hi is not None else max(lo, want)
                sym = symbols[label] = Symbol(f"s{len(symbols)}", label, lo, hi, example)
            elif spec is not None and (spec.min, spec.max) != (sym.min, sym.max):
                lo, hi = max(sym.min, spec.min), spec.max if sym.max is None else sym.max if spec.max is None else min(sym.max, spec.max)
                example = min(max(lo, DEFAULT_EXAMPLE), hi) if hi is not None else max(lo, DEFAULT_EXAMPLE)
                sym = symbols[label] = Symbol(sym.name, label, lo, hi, example)
            shape.append(sympy.Symbol(sym.name, integer=True, positive=True))
        name = unique_name(clean(inp.name), used)
        node = b.add(Op.INPUT, (), dt, tuple(shape), InputAttr(name))
        inputs.append(node)
        env[inp.name] = node

    imp = Importer(fname)
    for n in loaded.order:
        where = f"node {loaded.names[id(n)]!r} ({n.op_type})"
        ins: list[Value | None] = []
        for i in n.input:
            ins.append(env[i] if i else None)
        rule = TABLE[(_domain(n.domain), n.op_type)]
        c = Ctx(n, where, ins, b.at(where), loaded.opset, imp, attrs(n))
        try:
            out = rule.fn(c)
        except UnsupportedOp as e:
            raise UnsupportedOp(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
        outs = out if isinstance(out, tuple) else (out,)
        for k, name in enumerate(n.output):
            if not name:
                continue
            if k >= len(outs) or outs[k] is None:
                raise UnsupportedOp(f"{where}: output {k} ({name!r}) is not supported")
            v = outs[k]
            if isinstance(v, Static) and v.name is None:  # a folded constant: its weight is named after its value
                v = Static(v.value, v.dtype, name)
            env[name] = v

    outputs: list[Node] = []
    out_names: list[str] = []
    used_out: set[str] = set(used)
    out_b = b.at("graph outputs")
    for o in g.output:
        v = env[o.name]
        node = imp.tensor(v, out_b)
        if node.op is Op.INPUT or node in outputs:  # an output is its own buffer
            node = out_b.add(Op.ADD, (node, out_b.full(0, node.dtype, node.shape)), node.dtype, node.shape)
        outputs.append(node)
        out_names.append(unique_name(clean(o.name), used_out))
    weights = dict(imp.weights)
    graph = Graph(nodes=b.nodes, inputs=inputs, outputs=outputs, weights=weights,
                  symbols=sorted(symbols.values(), key=lambda s: int(s.name[1:])))  # fmt: skip
    fixed = {(i.name, k) for i in real_inputs for k, d in enumerate(i.type.tensor_type.shape.dim) if d.HasField("dim_value")}
    relabel = {key: spec.label for key, spec in overrides.items() if key in fixed}
    return Lowered(graph, [i.name for i in real_inputs], out_names, relabel)


def _domain(d: str) -> str:
    return "" if d == "ai.onnx" else d


def _check_supported(loaded: Loaded, fname: str) -> None:
    """Every node whose op or attribute values have no rule, in one error."""
    problems: list[str] = []
    for n in loaded.order:
        name = loaded.names[id(n)]
        dom = _domain(n.domain)
        rule = TABLE.get((dom, n.op_type))
        label = f"{dom}.{n.op_type}" if dom else n.op_type
        if rule is None:
            problems.append(f"  {name!r}: {label}")
            continue
        if rule.check is not None:
            why = rule.check(n, attrs(n))
            if why:
                problems.append(f"  {name!r}: {label} with {why}")
    if problems:
        shown = problems[:60] + ([f"  ... and {len(problems) - 60} more"] if len(problems) > 60 else [])
        raise UnsupportedOp(
            f"{fname} uses ONNX ops aotc cannot lower ({len(problems)} nodes):\n" + "\n".join(shown)
            + "\n  fix: re-export without them (see docs/onnx.md for the supported ops), or file an issue naming the op"
        )  # fmt: skip
