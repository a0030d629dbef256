"""The ONNX front end: a .onnx file -> aotc IR, for ``aotc build model.onnx``.

What it is: ``looks_like_onnx`` (the build picks its front end by file content) and ``import_onnx``, which
reads and checks the file (``reader.py``), lowers it through the op table (``importer.py``, ``ops_*.py``)
and makes the self-test's example inputs and reference outputs (``reference.py``: ONNX Runtime when it is
installed, else onnx's own reference evaluator), so the package proves it computes what the file computes.
What it is not: a second back end. Everything after the IR graph (passes, fusion, codegen, packaging) is
the PyTorch path's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ir import Graph
from .detect import looks_like_onnx

__all__ = ["Imported", "import_onnx", "looks_like_onnx"]

FRONTEND = "onnx"


@dataclass
class Imported:
    graph: Graph
    name: str
    source_sha256: str
    input_names: list[str]  # the file's names, in graph.inputs order
    output_names: list[str]  # the package's names, in graph.outputs order
    path: Path
    relabel: dict[tuple[str, int], str]  # (input, axis) the file fixes but --dynamic made dynamic: their labels
    versions: dict[str, str]  # onnx, the file's opset and producer, for the manifest's build record

    def reference(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Example inputs at each dynamic dimension's example size, and the file's outputs for them."""
        from .reference import example_inputs, run_reference

        xs = example_inputs(self.graph, self.path)
        return xs, run_reference(self.path, dict(zip(self.input_names, xs, strict=True)), self.relabel)


def import_onnx(path: Path, dynamic: tuple[str, ...] = (), precision: str = "fp32") -> Imported:
    from aotc.errors import UsageError

    from .importer import lower_model
    from .reader import load

    if precision not in ("fp32", "tf32"):
        raise UsageError(f"--precision {precision} is not supported for ONNX models yet: build with fp32 (or tf32)")
    path = Path(path)
    loaded = load(path)
    low = lower_model(loaded, path.name, dynamic)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    import onnx

    m = loaded.model
    versions = {"onnx": onnx.__version__, "onnx_opset": str(loaded.opset)}
    if m.producer_name:
        versions["onnx_producer"] = f"{m.producer_name} {m.producer_version}".strip()
    return Imported(low.graph, path.stem, digest, low.input_names, low.output_names, path, low.relabel, versions)
