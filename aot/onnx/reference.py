"""The ONNX self-test's oracle: example inputs for an imported graph and the file's own outputs for them.

What it is: random inputs at each dynamic dimension's example size (integer inputs that index a table stay
inside it), run through ONNX Runtime when it is installed, else through ``onnx.reference``, which defines
the standard ops in numpy. Neither is aotc's lowering, so the self-test checks the import as well as the
kernels.
What it is not: a runtime dependency; packages never run this.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from aotc.errors import CaptureError

from ..interp import size
from ..ir import DType, Graph, InputAttr, Node, Op


def _index_bound(graph: Graph, x: Node) -> int:
    """The largest exclusive bound an integer input may take: the smallest table it indexes (looked for
    through casts and reshapes), else 2 (masks and flags)."""
    users: dict[Node, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    bound: int | None = None
    todo, seen = [x], {x}
    while todo:
        n = todo.pop()
        for u in users.get(n, []):
            if u.op in (Op.CAST, Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.SLICE, Op.WHERE) and u not in seen:
                seen.add(u)
                todo.append(u)
            elif u.op in (Op.INDEX_SELECT, Op.GATHER) and u.inputs[0] is not n:
                axis = u.attr.axis  # type: ignore[union-attr]
                d = u.inputs[0].shape[axis]
                if isinstance(d, int):
                    bound = d if bound is None else min(bound, d)
    return bound if bound is not None else 2


def example_inputs(graph: Graph, path: Path) -> list[np.ndarray]:
    env = {s.name: int(s.example if s.example is not None else max(s.min, 1)) for s in graph.symbols}
    rng = np.random.default_rng(0)
    out = []
    for x in graph.inputs:
        assert isinstance(x.attr, InputAttr)
        shape = tuple(size(d, env) for d in x.shape)
        if x.dtype.is_float:
            arr = rng.standard_normal(shape).astype(x.dtype.numpy())
        elif x.dtype is DType.bool:
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            arr = rng.integers(0, _index_bound(graph, x), shape).astype(x.dtype.numpy())
        out.append(arr)
    return out


def run_reference(path: Path, feeds: dict[str, np.ndarray], relabel: dict[tuple[str, int], str] | None = None) -> list[np.ndarray]:
    """The file's outputs for ``feeds``; ``relabel``: fixed input sizes to free first (``--dynamic`` made them
    dynamic, and the example inputs may differ from the file's size)."""
    model: str | bytes = str(path)
    if relabel:
        import onnx

        proto = onnx.load(str(path))
        for inp in proto.graph.input:
            for k, d in enumerate(inp.type.tensor_type.shape.dim):
                if (inp.name, k) in relabel:
                    d.Clear()
                    d.dim_param = relabel[(inp.name, k)]
        model = proto.SerializeToString()
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in sess.run(None, feeds)]
    try:
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]
    except Exception as e:
        raise CaptureError(
            f"{path.name}: onnx's reference evaluator cannot run the model for the self-test ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}): install onnxruntime, or build with --no-selftest"
        ) from None
