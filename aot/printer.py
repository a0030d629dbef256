"""The IR's text form, for golden tests and debugging. Stable: node numbers are positions in graph order
(``Graph.ids``), so the same graph prints the same text.

What it is not: a parser; nothing reads this text back.
"""

from __future__ import annotations

import dataclasses

from .ir import Graph, Node


def _dim(d: object) -> str:
    return str(d).replace(" ", "")


def _attr(n: Node) -> str:
    if n.attr is None:
        return ""
    fields = ", ".join(f"{f.name}={getattr(n.attr, f.name)!r}" for f in dataclasses.fields(n.attr))
    return f" {{{fields}}}"


def print_graph(g: Graph, sources: bool = False) -> str:
    num = g.ids()
    lines = []
    syms = ", ".join(f"{s.name}:{s.label}[{s.min}..{s.max}]" for s in g.symbols)
    lines.append(f"graph({', '.join(f'%{num[i]}' for i in g.inputs)}) symbols({syms}) {{")
    for n in g.nodes:
        shape = "x".join(_dim(d) for d in n.shape) or "scalar"
        args = ", ".join(f"%{num[i]}" for i in n.inputs)
        src = f"  # {n.source}" if sources and n.source else ""
        lines.append(f"  %{num[n]}: {n.dtype.value}[{shape}] = {n.op.name.lower()}({args}){_attr(n)}{src}")
    lines.append(f"  return {', '.join(f'%{num[o]}' for o in g.outputs)}")
    lines.append("}")
    return "\n".join(lines) + "\n"
