"""Helpers for the ONNX front-end tests: export a torch module with either exporter, build the file with
aotc for the CPU, and compare the package with ONNX Runtime on the same random inputs."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch

DYNAMO, TORCHSCRIPT = "dynamo", "torchscript"


def export(model: torch.nn.Module, args: tuple, path: Path, exporter: str, names: list[str], dims: dict[int, str]) -> Path:
    """``dims``: axis -> name of the dynamic dimensions every input shares (batch, and seq for text)."""
    quiet = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        warnings.simplefilter("ignore")
        if exporter == DYNAMO:
            ranges = {"batch": (1, 8), "seq": (2, 64)}
            shapes = {n: {a: torch.export.Dim(d, min=ranges[d][0], max=ranges[d][1]) for a, d in dims.items()} for n in names}
            torch.onnx.export(model, args, str(path), dynamo=True, dynamic_shapes=shapes, input_names=names, opset_version=18)
        else:
            axes = {n: dict(dims) for n in names}
            torch.onnx.export(model, args, str(path), dynamo=False, dynamic_axes=axes, input_names=names, opset_version=17)
    return path


def compare(pkg: Path, onnx_path: Path, shapes: list[dict[str, int]], int_high: int = 100) -> float:
    """Run the package and ONNX Runtime on the same random inputs at each binding of the named dynamic dims;
    returns the worst error relative to each output's largest magnitude."""
    import aotc
    import onnxruntime as ort

    model = aotc.load(pkg, device="cpu")
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for k, dims in enumerate(shapes):
        rng = np.random.default_rng(k)
        feeds: dict[str, np.ndarray] = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else dims[d] for d in i.shape]
            if "int" in i.type:
                feeds[i.name] = rng.integers(0, int_high, shape).astype(np.int64 if "int64" in i.type else np.int32)
            else:
                feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        want = sess.run(None, feeds)
        out = model(*feeds.values())  # the package keeps the file's input order
        got = list(out) if isinstance(out, tuple) else [out]
        assert len(got) == len(want)
        for out_k, w in zip(got, want, strict=True):
            g = np.asarray(out_k)
            assert g.shape == w.shape, (g.shape, w.shape)
            scale = max(float(np.abs(w).max()), 1e-6)
            worst = max(worst, float(np.abs(g.astype(np.float64) - w).max()) / scale)
    return worst
