"""Reading an ONNX file: parse, external data, opset check, and the graph's structure (every value defined
once, every use defined, no cycle), giving the nodes in an order where every input comes first.

What it is: the checks that turn a damaged or unusual file into one clear ``CaptureError`` line instead of a
protobuf or KeyError traceback deep inside lowering.
What it is not: lowering (``importer.py``) nor the op table (``ops*.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import onnx
from aotc.errors import CaptureError, UsageError

MIN_OPSET = 13



@dataclass(frozen=True)
class Loaded:
    model: onnx.ModelProto
    order: list[onnx.NodeProto]  # topological
    opset: int  # the default domain's
    names: dict[int, str]  # id(node) -> a name for messages: its own, or "#k OpType -> first output"


def load(path: Path) -> Loaded:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"model file {str(path)!r} does not exist: pass the path of a .onnx file")
    model = onnx.ModelProto()
    data = path.read_bytes()
    try:
        model.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError; its text is the protobuf reader's
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CaptureError(
            f"{path.name} is not a readable ONNX model ({len(data)} bytes; protobuf: {why}): "
            "the file is truncated or damaged; export it again"
        ) from None
    if not model.HasField("graph"):
        raise CaptureError(f"{path.name} parses but holds no graph (truncated, or not an ONNX model): export it again")
    _load_external(model, path)
    opset = _check_opsets(model, path.name)
    if opset < MIN_OPSET:
        model, opset = _upgrade(model, opset, path.name)
    nodes = list(model.graph.node)  # one wrapper object per node: ids key the names below
    names = {id(n): (n.name or f"#{k} {n.op_type} -> {n.output[0] if n.output else '?'}") for k, n in enumerate(nodes)}
    order = _order(model.graph, nodes, names, path.name)
    return Loaded(model, order, opset, names)


def _load_external(model: onnx.ModelProto, path: Path) -> None:
    """Initializers stored beside the file (``data_location: EXTERNAL``, the > 2 GB layout)."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    external = [t for t in model.graph.initializer if uses_external_data(t)]
    if not external:
        return
    base = path.parent
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        file = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts or not file.is_file():
            raise CaptureError(
                f"{path.name}: initializer {t.name!r} keeps its data in {loc!r}, which is not a file beside the model: "
                "copy the external data file next to the .onnx file"
            )
        need = int(info.get("offset", 0)) + int(info.get("length", 0))
        if need > file.stat().st_size:
            raise CaptureError(f"{path.name}: initializer {t.name!r} reads bytes up to {need} of {loc!r}, which has "
                               f"{file.stat().st_size}: the external data file is truncated")  # fmt: skip
    try:
        load_external_data_for_model(model, str(base))
    except Exception as e:
        raise CaptureError(f"{path.name}: cannot load external data: {type(e).__name__}: {e}") from None


def _check_opsets(model: onnx.ModelProto, fname: str) -> int:
    newest = onnx.defs.onnx_opset_version()
    opset = None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            opset = imp.version
    if opset is None:
        raise CaptureError(f"{fname} imports no opset of the default ONNX domain: the file is damaged; export it again")
    if opset > newest:
        raise CaptureError(
            f"{fname} uses ONNX opset {opset}; the installed onnx {onnx.__version__} knows opsets up to {newest}: "
            f"export with opset_version <= {newest}, or upgrade onnx"
        )
    return opset


def _upgrade(model: onnx.ModelProto, opset: int, fname: str) -> tuple[onnx.ModelProto, int]:
    """Opsets below 13 are converted up with onnx's version converter (the rules here are written for 13+)."""
    try:
        from onnx import version_converter

        return version_converter.convert_version(model, MIN_OPSET), MIN_OPSET
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(
            f"{fname} uses ONNX opset {opset} and onnx's converter cannot bring it to {MIN_OPSET} ({first}): "
            f"export with opset_version >= {MIN_OPSET}"
        ) from None


def _order(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], names: dict[int, str], fname: str) -> list[onnx.NodeProto]:
    """The nodes in dependency order (ONNX requires files to be sorted; some writers do not, so sort here),
    after checking every value is defined once and every use is defined."""
    defined: dict[str, str] = {}
    for i in graph.input:
        defined[i.name] = "graph input"
    for t in graph.initializer:
        defined[t.name] = "initializer"
    for t in graph.sparse_initializer:
        defined[t.values.name] = "initializer"
    producer: dict[str, onnx.NodeProto] = {}
    for n in nodes:
        for o in n.output:
            if not o:
                continue
            if o in producer or defined.get(o) == "initializer":
                raise CaptureError(f"{fname}: value {o!r} is defined twice (by node {names[id(n)]!r} and before): the graph is malformed")
            producer[o] = n
    for n in nodes:
        for k, i in enumerate(n.input):
            if i and i not in producer and i not in defined:
                raise CaptureError(
                    f"{fname}: node {names[id(n)]!r} ({n.op_type}) reads {i!r} (input {k}), which no node, initializer or "
                    "graph input defines: a missing initializer or a dangling edge; export the model again"
                )
    for o in graph.output:
        if o.name not in producer and o.name not in defined:
            raise CaptureError(f"{fname}: graph output {o.name!r} is produced by no node: export the model again")
    # Kahn's algorithm over node -> node edges; whatever is left sits on a cycle
    deps = {id(n): {id(producer[i]) for i in n.input if i in producer} for n in nodes}
    users: dict[int, list[onnx.NodeProto]] = {id(n): [] for n in nodes}
    for n in nodes:
        for d in deps[id(n)]:
            users[d].append(n)
    waiting = {id(n): len(deps[id(n)]) for n in nodes}
    ready = deque(n for n in nodes if waiting[id(n)] == 0)
    order: list[onnx.NodeProto] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for u in users[id(n)]:
            waiting[id(u)] -= 1
            if waiting[id(u)] == 0:
                ready.append(u)
    if len(order) < len(graph.node):
        left = [n for n in nodes if waiting[id(n)] > 0]
        cycle = ", ".join(f"{names[id(n)]!r} ({n.op_type})" for n in left[:6]) + (" ..." if len(left) > 6 else "")
        raise CaptureError(f"{fname}: the graph has a cycle through nodes {cycle}: an ONNX graph must be acyclic")
    return order
