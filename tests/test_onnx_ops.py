"""Table-driven ONNX op tests: each case is a one-node model (inputs with a dynamic first dimension), imported
into the IR and evaluated by the IR's numpy reference interpreter, against ONNX Runtime. No compiler runs:
this checks each rule's meaning; tests/test_onnx.py checks compiled packages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from aotc_build.interp import run  # noqa: E402
from aotc_build.onnx import import_onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

I64 = np.int64

# (id, op type, float input shapes, constant inputs (name -> array, "" for an absent input), attributes[, opset])
CASES: list[tuple[Any, ...]] = [
    ("relu", "Relu", [(3, 4)], {}, {}),
    ("leaky", "LeakyRelu", [(3, 4)], {}, {"alpha": 0.2}),
    ("prelu", "PRelu", [(3, 4)], {"slope": np.array([0.1, 0.2, 0.3, 0.4], np.float32)}, {}),
    ("elu", "Elu", [(3, 4)], {}, {"alpha": 0.7}),
    ("selu", "Selu", [(3, 4)], {}, {}),
    ("softplus", "Softplus", [(3, 4)], {}, {}),
    ("softsign", "Softsign", [(3, 4)], {}, {}),
    ("mish", "Mish", [(3, 4)], {}, {}),
    ("hardsigmoid", "HardSigmoid", [(3, 4)], {}, {"alpha": 0.3, "beta": 0.4}),
    ("hardswish", "HardSwish", [(3, 4)], {}, {}),
    ("gelu_tanh", "Gelu", [(3, 4)], {}, {"approximate": "tanh"}, 20),
    ("sign", "Sign", [(3, 4)], {}, {}),
    ("ceil", "Ceil", [(3, 4)], {}, {}),
    ("clip", "Clip", [(3, 4)], {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}, {}),
    ("pow", "Pow", [(3, 4)], {"e": np.array(2.0, np.float32)}, {}),
    ("pow_abs", "Pow", [(3, 4)], {"e": np.array([1.0, 2.0, 3.0, 0.5], np.float32)}, {}),
    ("mod_fmod", "Mod", [(3, 4)], {"d": np.array([0.7, -0.9, 1.3, -2.0], np.float32)}, {"fmod": 1}),
    ("max3", "Max", [(3, 4), (1, 4)], {"c": np.array(0.1, np.float32)}, {}),
    ("mean2", "Mean", [(3, 4), (3, 1)], {}, {}),
    ("sum2", "Sum", [(3, 4), (3, 4)], {}, {}),
    ("isnan", "IsNaN", [(3, 4)], {}, {}),
    ("softmax0", "Softmax", [(3, 4, 5)], {}, {"axis": 1}),
    ("logsoftmax", "LogSoftmax", [(3, 4)], {}, {"axis": -1}),
    ("reduce_l1", "ReduceL1", [(3, 4, 5)], {"axes": np.array([1, 2], I64)}, {"keepdims": 0}),
    ("reduce_l2", "ReduceL2", [(3, 4, 5)], {"axes": np.array([-1], I64)}, {}),
    ("reduce_sumsq", "ReduceSumSquare", [(3, 4, 5)], {"axes": np.array([1], I64)}, {}),
    ("reduce_lse", "ReduceLogSumExp", [(3, 4, 5)], {"axes": np.array([2], I64)}, {"keepdims": 0}),
    ("reduce_max", "ReduceMax", [(3, 4, 5)], {"axes": np.array([1], I64)}, {}),
    ("reduce_min_all", "ReduceMin", [(3, 4, 5)], {}, {"keepdims": 1}),
    ("argmax", "ArgMax", [(3, 4, 5)], {}, {"axis": 2, "keepdims": 0}),
    ("argmin", "ArgMin", [(3, 4, 5)], {}, {"axis": 1}),
    ("matmul_1d", "MatMul", [(3, 4, 5)], {"v": np.linspace(-1, 1, 5).astype(np.float32)}, {}),
    ("gemm_trans", "Gemm", [(3, 4)], {"b": np.ones((5, 4), np.float32) * 0.1, "c": np.arange(5, dtype=np.float32)},
     {"transB": 1, "alpha": 0.5, "beta": 2.0}),  # fmt: skip
    ("conv1d", "Conv", [(2, 3, 9)], {"w": np.linspace(-1, 1, 30).astype(np.float32).reshape(5, 3, 2)}, {"strides": [2], "pads": [1, 0]}),
    ("conv_same", "Conv", [(2, 4, 7, 7)], {"w": np.linspace(-1, 1, 72).astype(np.float32).reshape(2, 4, 3, 3)},
     {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),  # fmt: skip
    ("conv_dilated_groups", "Conv", [(2, 4, 9, 9)], {"w": np.linspace(-1, 1, 72).astype(np.float32).reshape(4, 2, 3, 3)},
     {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),  # fmt: skip
    ("conv_transpose", "ConvTranspose", [(2, 4, 5, 5)], {"w": np.linspace(-1, 1, 96).astype(np.float32).reshape(4, 3, 2, 4)},
     {"strides": [2, 3], "pads": [0, 1, 1, 0], "dilations": [1, 2]}),  # fmt: skip
    ("conv_transpose_groups", "ConvTranspose", [(2, 4, 5, 5)], {"w": np.linspace(-1, 1, 72).astype(np.float32).reshape(4, 2, 3, 3)},
     {"group": 2, "strides": [2, 2], "output_padding": [1, 1]}),  # fmt: skip
    ("maxpool_ceil", "MaxPool", [(2, 3, 8, 8)], {}, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("maxpool_dilated", "MaxPool", [(2, 3, 9, 9)], {}, {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ("avgpool_excl", "AveragePool", [(2, 3, 8, 8)], {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("avgpool_1d", "AveragePool", [(2, 3, 8)], {}, {"kernel_shape": [2], "strides": [2]}),
    ("global_max", "GlobalMaxPool", [(2, 3, 5, 5)], {}, {}),
    ("batchnorm", "BatchNormalization", [(2, 3, 4, 4)], {"s": np.array([1, 2, 3], np.float32), "b": np.array([0.1, 0.2, 0.3], np.float32),
     "m": np.array([0.5, -0.5, 0.0], np.float32), "v": np.array([1.0, 0.5, 2.0], np.float32)}, {}),  # fmt: skip
    ("instancenorm", "InstanceNormalization", [(2, 3, 4, 4)],
     {"s": np.array([1, 2, 3], np.float32), "b": np.array([0.1, 0.2, 0.3], np.float32)}, {}),  # fmt: skip
    ("groupnorm", "GroupNormalization", [(2, 4, 3, 3)], {"s": np.array([1, 2, 3, 4], np.float32), "b": np.array([0, 1, 2, 3], np.float32)},
     {"num_groups": 2}, 21),  # fmt: skip
    ("layernorm_axis1", "LayerNormalization", [(2, 3, 4)], {"s": np.ones((3, 4), np.float32) * 1.5}, {"axis": 1}),
    ("resize_nearest_asym", "Resize", [(1, 2, 3, 4)], {"roi": "", "scales": np.array([1, 1, 2, 2], np.float32)},
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),  # fmt: skip
    ("resize_linear_align", "Resize", [(1, 2, 3, 4)], {"roi": "", "scales": "", "sizes": np.array([5, 7], I64)},
     {"mode": "linear", "coordinate_transformation_mode": "align_corners", "axes": [2, 3]}),  # fmt: skip
    ("resize_linear_down", "Resize", [(1, 2, 6, 8)], {"roi": "", "scales": np.array([1, 1, 0.5, 0.75], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),  # fmt: skip
    ("depth_to_space", "DepthToSpace", [(2, 8, 3, 3)], {}, {"blocksize": 2, "mode": "CRD"}),
    ("depth_to_space_dcr", "DepthToSpace", [(2, 8, 3, 3)], {}, {"blocksize": 2}),
    ("space_to_depth", "SpaceToDepth", [(2, 2, 4, 6)], {}, {"blocksize": 2}),
    ("gather_nd", "GatherND", [(3, 4, 5)], {"i": np.array([[0, 1], [1, 3], [1, -1]], I64)}, {}),
    ("gather_neg", "Gather", [(3, 4, 5)], {"i": np.array([[0, -1], [2, 1]], I64)}, {"axis": 1}),
    ("slice_steps", "Slice", [(3, 10, 6)], {"s": np.array([1, -5], I64), "e": np.array([9, 1000], I64), "a": np.array([1, 2], I64),
     "st": np.array([3, 1], I64)}, {}),  # fmt: skip
    ("pad_axes", "Pad", [(3, 4, 5)], {"p": np.array([1, 2, 0, 3], I64), "v": np.array(1.5, np.float32), "a": np.array([1, 2], I64)}, {}),
    ("tile", "Tile", [(3, 2)], {"r": np.array([2, 3], I64)}, {}),
    ("expand_bidir", "Expand", [(3, 1, 4)], {"s": np.array([2, 1, 5, 1], I64)}, {}),
    ("trilu_upper_k", "Trilu", [(3, 4, 5)], {"k": np.array(1, I64)}, {}),
    ("cumsum_excl", "CumSum", [(3, 4)], {"a": np.array(1, I64)}, {"exclusive": 1}),
    ("split_eq", "Split", [(3, 6)], {}, {"axis": 1, "num_outputs": 3}, 18),
    ("flatten", "Flatten", [(3, 2, 4)], {}, {"axis": 2}),
    ("transpose", "Transpose", [(3, 2, 4)], {}, {"perm": [2, 0, 1]}),
    ("where", "Where", [(3, 4), (3, 4)], {}, {}),  # cond made from the first input below
]


def _model(case: tuple[Any, ...]) -> onnx.ModelProto:
    name, op, shapes, consts, attrs = case[:5]
    opset = case[5] if len(case) > 5 else 18
    inputs, names, inits, nodes = [], [], [], []
    for k, shape in enumerate(shapes):
        n = f"x{k}"
        inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", *shape[1:]]))
        names.append(n)
    if op == "Where":
        nodes.append(helper.make_node("Greater", ["x0", "x1"], ["cond"]))
        names = ["cond", "x0", "x1"]
    for cname, arr in consts.items():
        if isinstance(arr, str):
            names.append("")
            continue
        inits.append(numpy_helper.from_array(arr, cname))
        names.append(cname)
    outs = [f"y{k}" for k in range(3 if op == "Split" else 1)]
    nodes.append(helper.make_node(op, names, outs, name=name, **attrs))
    g = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_onnx_op_matches_onnxruntime(case: tuple[Any, ...], tmp_path: Path) -> None:
    path = tmp_path / "op.onnx"
    m = _model(case)
    for o in m.graph.output:  # let ORT infer the output types
        o.ClearField("type")
    onnx.save(m, str(path))
    imp = import_onnx(path)
    rng = np.random.default_rng(0)
    for batch in (2, 3):
        feeds = {f"x{k}": rng.standard_normal((batch, *s[1:])).astype(np.float32) for k, s in enumerate(case[2])}
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        got = run(imp.graph, [feeds[n] for n in imp.input_names])
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_docs_list_every_onnx_op() -> None:
    """docs/onnx.md names every op the table has a rule for (and so stays the list users read)."""
    from aotc_build.onnx.importer import TABLE

    text = (Path(__file__).resolve().parent.parent / "docs" / "onnx.md").read_text()
    missing = sorted(f"{d}.{o}" if d else o for d, o in TABLE if f"{o}," not in text and f"{o}\n" not in text)
    assert not missing, f"docs/onnx.md does not list {missing}"
    assert f"{sum(1 for d, _ in TABLE if not d)} ops" in text and f"{sum(1 for d, _ in TABLE if d)} ops" in text
