"""Table-driven op tests: eager torch vs the IR interpreter, the kernel interpreter and the CPU package."""

from __future__ import annotations

import aotc
import numpy as np
import pytest
import torch
from aotc_build import interp
from aotc_build.build import build_captured, compile_graph
from aotc_build.capture import capture_module
from aotc_build.kernel_interp import run_program
from aotc_build.options import BuildOptions, Target
from op_cases import CASES, OpCase, dynamic_shapes

IDS = [c.name for c in CASES]


def _capture(case: OpCase, batch: int = 3):
    torch.manual_seed(0)
    model = case.make().eval()
    inputs = case.inputs(batch)
    return capture_module(model, inputs, dynamic_shapes(case, inputs), name=case.name), model


def _eager(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    with torch.no_grad():
        return model(*inputs).detach().numpy()


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_interpreters_match_eager(case: OpCase) -> None:
    cap, model = _capture(case)
    graph, prog, _ = compile_graph(cap)
    for batch in (2, 5) if case.dynamic else (3,):
        torch.manual_seed(batch)
        inputs = case.inputs(batch)
        want = _eager(model, inputs)
        xs = [x.numpy() for x in inputs]
        assert_close(interp.run(graph, xs)[0], want)
        env = interp.bind(graph, xs)
        weights = [graph.weights[prog.labels[w.name]] for w in prog.weights]
        assert_close(run_program(prog, xs, weights, env)[0], want)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cpu_package_matches_eager(case: OpCase, tmp_path, aotc_cache) -> None:
    cap, model = _capture(case)
    path = tmp_path / f"{case.name}.pkg"
    build_captured(cap, path, BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), aotc_cache)
    m = aotc.load(path, device="cpu")
    for batch in (2, 5) if case.dynamic else (3,):
        torch.manual_seed(batch)
        inputs = case.inputs(batch)
        got = m(*[x.numpy() for x in inputs])
        assert_close(got, _eager(model, inputs))
