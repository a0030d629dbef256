"""Core ATen -> aotc IR: the driver that walks the exported FX graph and applies the lowering table.

Every supported overload is one rule in ``elementwise.py``, ``movement.py`` or ``nn.py``, registered with
``@lower(...)`` (``table.py``). Anything else fails the build with one ``UnsupportedOp`` listing every
missing op, its count and first source line.
What it is not: the rules; and it does not optimise (passes do).
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from typing import Any

import numpy as np
import sympy
import torch
from aotc.errors import UnsupportedOp

from ..builder import Builder, unique_name
from ..capture import Captured, finite
from ..ir import DType, Graph, InputAttr, Node, Op, Symbol, WeightAttr

# The rule modules register into TABLE with @lower as they are imported: importing them here, once, at the
# top, is what makes the table complete before any lowering runs.
from . import elementwise, movement, nn  # noqa: F401
from .table import IGNORED, TABLE, TORCH_DTYPES, Ctx, meta_shape

__all__ = ["IGNORED", "TABLE", "lower_program"]


def lower_program(cap: Captured) -> Graph:
    """The captured program as an IR graph: placeholders become INPUT/WEIGHT nodes (weights copied out of
    torch), every call goes through its rule, every node keeps the user's source line."""
    ep = cap.program
    gm = ep.graph_module
    b = Builder()  # placeholders carry no source line
    env: dict[torch.fx.Node, Any] = {}

    _check_supported(gm)

    sig = ep.graph_signature
    consts = {**ep.state_dict, **getattr(ep, "constants", {})}
    kind_by_name = {s.arg.name: s for s in sig.input_specs}
    weights: dict[str, np.ndarray] = {}
    inputs: list[Node] = []
    used_names: set[str] = set()
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        spec = kind_by_name[n.name]
        if spec.kind.name == "USER_INPUT":
            v = n.meta["val"]
            node = b.add(Op.INPUT, (), TORCH_DTYPES[v.dtype], meta_shape(v), InputAttr(n.name))
            inputs.append(node)
        else:
            target = spec.target
            t = consts[target]
            t = t.detach().contiguous()
            arr = (t.float().numpy().astype(DType.bf16.numpy()) if t.dtype is torch.bfloat16 else t.numpy()).copy()
            wname = unique_name(re.sub(r"[^A-Za-z0-9_.]", "_", target), used_names)
            weights[wname] = arr
            node = b.add(Op.WEIGHT, (), TORCH_DTYPES[t.dtype], tuple(t.shape), WeightAttr(wname))
        env[n] = node

    outputs: list[Node] = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            if n.target in IGNORED:
                continue
            if n.target is operator.getitem:
                env[n] = env[n.args[0]][n.args[1]]
                continue
            where = source_line(n)
            try:
                env[n] = TABLE[n.target](Ctx(n, env, b.at(where)))
            except UnsupportedOp as e:
                raise UnsupportedOp(f"{e}\n  at {where or 'an unknown source line'}") from None
        elif n.op == "output":
            for o in n.args[0]:
                if not isinstance(o, torch.fx.Node) or env.get(o) is None:
                    raise UnsupportedOp(f"model output {o!r} is not a tensor aotc can compute")
                outputs.append(env[o])

    return Graph(nodes=b.nodes, inputs=inputs, outputs=outputs, weights=weights, symbols=_symbols(cap, inputs))


def _symbols(cap: Captured, inputs: list[Node]) -> list[Symbol]:
    ranges = cap.program.range_constraints
    found: dict[str, Symbol] = {}
    examples = {  # each dynamic dim's value in the example inputs, which export keeps as the SymInt's hint
        str(s.node.expr): int(s.node.hint)
        for n in cap.program.graph.nodes
        if n.op == "placeholder"
        for s in getattr(n.meta.get("val"), "shape", ())
        if isinstance(s, torch.SymInt) and s.node.hint is not None
    }
    for node in inputs:
        assert isinstance(node.attr, InputAttr)
        for axis, d in enumerate(node.shape):
            if isinstance(d, sympy.Symbol) and d.name not in found:
                vr = ranges.get(d)
                lo = int(vr.lower) if vr is not None else 0
                hi_raw = vr.upper if vr is not None else None
                hi = finite(hi_raw)  # torch's int_oo says is_finite and fails int()
                # the user's declared range wins: an export retried with Dim.AUTO reports min 2 for min=1 dims
                label, declared_lo, declared_hi = cap.dims.get((node.attr.name, axis), (f"{node.attr.name}.shape[{axis}]", lo, hi))
                lo, hi = declared_lo, hi if declared_hi is None else declared_hi
                found[d.name] = Symbol(d.name, label, max(lo, 0), hi, examples.get(d.name))
    for node in inputs:
        for d in node.shape:
            if not isinstance(d, int):
                for s in d.free_symbols:
                    if s.name not in found:
                        raise UnsupportedOp(
                            f"input {node.attr.name!r} has a dimension {d} that is not a plain dynamic dim"  # type: ignore[union-attr]
                        )
    return sorted(found.values(), key=lambda s: s.name)


def _check_supported(gm: torch.fx.GraphModule) -> None:
    missing: Counter[str] = Counter()
    first: dict[str, str | None] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target in IGNORED or n.target is operator.getitem:
            continue
        if n.target not in TABLE:
            name = str(n.target)
            missing[name] += 1
            first.setdefault(name, source_line(n))
    if missing:
        where = {op: first[op] or "an unknown source line" for op in missing}
        lines = [f"  {_USER_NAME.get(op, op)} (x{k}), first at {where[op]}" for op, k in sorted(missing.items())]
        hints = [f"\n  fix: {_HINTS[op]}" for op in sorted(missing) if op in _HINTS]
        raise UnsupportedOp(
            "the model uses ops aotc cannot lower yet:\n" + "\n".join(lines) + "".join(hints)
            + "\n  fix: rewrite those lines with supported ops (see docs/ops.md), or file an issue naming the op"
        )  # fmt: skip


# aten ops that users never wrote by that name: say what they wrote, and what to write instead
_USER_NAME = {"aten._local_scalar_dense.default": ".item() (aten._local_scalar_dense)"}
_HINTS = {
    "aten._local_scalar_dense.default": "keep the value a tensor (e.g. `x * x.max()` rather than `x * x.max().item()`): "
    "a package cannot turn a tensor into a Python number mid-graph",
}


def source_line(fx: torch.fx.Node) -> str | None:
    trace = fx.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    user = [f for f in frames if "/torch/" not in f[0] and "/transformers/" not in f[0]] or frames
    if not user:
        return None

    def fmt(f: tuple[str, str, str, str]) -> str:
        return f"{f[0].rsplit('/', 1)[-1]}:{f[1]} in {f[2]}: {f[3].strip()}"

    # the library line that made the op (transformers' code, say), when it is not the user's own
    inner = [f for f in frames if "/torch/" not in f[0]]
    via = f" (inside {fmt(inner[-1])})" if inner and inner[-1] != user[-1] else ""
    return fmt(user[-1]) + via
