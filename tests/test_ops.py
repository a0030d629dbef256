"""Table-driven op tests: every case of tests/op_cases.py in every precision the builder offers, each output
of eager torch (in that precision) against the IR interpreter, the kernel interpreter and the CPU package,
and the package against the IR interpreter too.

One capture and one package per case and precision, shared by the tests of this module: capture is most of
the cost, and the kernels themselves come from the shared compile cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aotc
import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from aotc_build import interp
from aotc_build.build import build_captured, compile_graph
from aotc_build.capture import Captured, capture_module
from aotc_build.ir import Graph
from aotc_build.kernel import Plan
from aotc_build.kernel_interp import run_program
from aotc_build.options import BuildOptions, Target
from op_cases import CASES, PRECISIONS, OpCase, dynamic_shapes, precisions

# Relative to max(|want|, 1). bf16 keeps 8 mantissa bits and fused kernels round fewer intermediates than
# eager torch does (one rounding per op), so their results differ by a few bf16 ulps: 1e-2, as on the GPU.
# fp16 keeps 11 mantissa bits: a few ulps are ~2e-3.
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
assert set(PRECISIONS) <= set(TOLERANCE)

PARAMS = [pytest.param(c, p, id=f"{c.name}-{p}") for c in CASES for p in precisions(c)]


@dataclass
class Built:
    cap: Captured
    graph: Graph
    prog: Plan
    package: Path
    prog_nhwc: Plan  # what a GPU build fuses: activations between convs stored channels-last


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, aotc_cache: Path) -> Callable[[OpCase, str], Built]:
    """Capture, lower and package each (case, precision) once for both tests below."""
    done: dict[tuple[str, str], Built] = {}
    out = tmp_path_factory.mktemp("ops")

    def get(case: OpCase, precision: str) -> Built:
        key = (case.name, precision)
        if key not in done:
            torch.manual_seed(0)
            inputs = case.inputs(3)
            cap = capture_module(case.make().eval(), inputs, dynamic_shapes(case, inputs), name=case.name, precision=precision)
            graph, prog, _ = compile_graph(cap)
            _, prog_nhwc, _ = compile_graph(cap, channels_last=True)
            path = out / f"{case.name}-{precision}.pkg"
            build_captured(cap, path, BuildOptions(targets=(Target("cpu", "x86-64-v3"),), precision=precision), aotc_cache)
            done[key] = Built(cap, graph, prog, path, prog_nhwc)
        return done[key]

    return get


def _batches(case: OpCase) -> list[tuple[torch.Tensor, ...]]:
    """Fresh fp32 inputs at two batch sizes (one for a static case); _eager casts them to the build's dtypes."""
    out = []
    for batch in (2, 5) if case.dynamic else (3,):
        torch.manual_seed(batch)
        out.append(case.inputs(batch))
    return out


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype is torch.bfloat16:  # numpy has no bf16: go through fp32, which holds every bf16 value exactly
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def _eager(b: Built, inputs: tuple[torch.Tensor, ...]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The inputs as the package takes them, and every output of the captured (cast) model."""
    model, example = b.cap.model, b.cap.example_inputs
    xs = tuple(x.to(e.dtype) for x, e in zip(inputs, example, strict=True))
    with torch.no_grad():
        outs = [y for y in pytree.tree_leaves(model(*xs)) if isinstance(y, torch.Tensor)]
    return [_numpy(x) for x in xs], [_numpy(y) for y in outs]


def assert_close(got: list[np.ndarray], want: list[np.ndarray], precision: str, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    rtol = TOLERANCE[precision]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        msg = f"{what}, output {i}"
        assert g.shape == w.shape and g.dtype == w.dtype, (msg, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=msg)
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        scale = max(float(np.abs(w64).max()), 1.0)
        np.testing.assert_allclose(g64, w64, rtol=rtol, atol=rtol * scale, err_msg=msg)


@pytest.mark.parametrize(("case", "precision"), PARAMS)
def test_interpreters_match_eager(case: OpCase, precision: str, built: Callable[[OpCase, str], Built]) -> None:
    b = built(case, precision)
    weights = [b.graph.weights[b.prog.labels[w.name]] for w in b.prog.weights]
    for inputs in _batches(case):
        xs, want = _eager(b, inputs)
        assert_close(interp.run(b.graph, xs), want, precision, "IR interpreter vs eager")
        got = run_program(b.prog, xs, weights, interp.bind(b.graph, xs))
        assert_close(got, want, precision, "kernel interpreter vs eager")
        if b.prog_nhwc is not b.prog:
            got = run_program(b.prog_nhwc, xs, weights, interp.bind(b.graph, xs))
            assert_close(got, want, precision, "kernel interpreter (channels-last) vs eager")


@pytest.mark.parametrize(("case", "precision"), PARAMS)
def test_cpu_package_matches_eager(case: OpCase, precision: str, built: Callable[[OpCase, str], Built]) -> None:
    b = built(case, precision)
    m = aotc.load(b.package, device="cpu")
    for inputs in _batches(case):
        xs, want = _eager(b, inputs)
        got = m(*xs)
        got = list(got) if isinstance(got, tuple) else [got]
        assert_close(got, want, precision, "CPU package vs eager")
        assert_close(got, interp.run(b.graph, xs), precision, "CPU package vs IR interpreter")
