"""The ONNX front end: models written by hand with onnx.helper (standard and com.microsoft ops) and the
examples exported by both torch exporters build for the CPU and match ONNX Runtime at two batch sizes from
one package; damaged files fail with one clear line and exit code 6, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from aotc.cli import cli  # noqa: E402
from aotc_build.build import build  # noqa: E402
from aotc_build.onnx import looks_like_onnx  # noqa: E402
from aotc_build.options import BuildOptions, Target  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_util import DYNAMO, TORCHSCRIPT, compare, export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CPU = BuildOptions(targets=(Target("cpu", "x86-64-v3"),))
F = TensorProto.FLOAT


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes: list, inputs: list, outputs: list, inits: list, ms: bool = False, opset: int = 18) -> onnx.ModelProto:
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    g = helper.make_graph(nodes, "hand", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=imports, producer_name="onnx.helper")
    m.ir_version = 9
    return m


def _vision_model() -> onnx.ModelProto:
    """A small vision graph using the ops the exporters rarely write: asymmetric pads, ConvTranspose,
    Resize, Pad, AveragePool, depthwise conv, Split, Tile, Trilu, CumSum, and a Shape -> Gather -> Concat
    -> Reshape chain over the dynamic batch."""
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.3  # noqa: E731
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], name="conv_asym", pads=[0, 0, 1, 1], strides=[2, 2], kernel_shape=[3, 3]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Conv", ["r1", "wd"], ["c2"], name="depthwise", group=8, pads=[1, 1, 1, 1], dilations=[1, 1]),
        n("ConvTranspose", ["c2", "wt", "bt"], ["ct"], name="deconv", strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
        n("Resize", ["ct", "", "scales"], ["rs"], name="resize", mode="linear", coordinate_transformation_mode="half_pixel"),
        n("Resize", ["r1", "", "scales"], ["rn"], name="resize_nearest", mode="nearest"),
        n("Pad", ["rs", "pads"], ["pd"], name="pad", mode="constant"),
        n("AveragePool", ["pd"], ["ap"], name="avgpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("MaxPool", ["rn"], ["mp"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        n("Split", ["ap", "split"], ["s0", "s1"], name="split", axis=1),
        n("Mul", ["s0", "s1"], ["sm"], name="mul"),
        n("Tile", ["sm", "reps"], ["tl"], name="tile"),
        n("Trilu", ["tl"], ["tr"], name="trilu", upper=0),
        n("CumSum", ["tr", "axis3"], ["cs"], name="cumsum"),
        n("Shape", ["x"], ["shp"], name="shape"),
        n("Gather", ["shp", "zero"], ["bsz"], name="batch_size", axis=0),
        n("Unsqueeze", ["bsz", "zero1"], ["bsz1"], name="unsq"),
        n("Concat", ["bsz1", "minus1"], ["newshape"], name="concat", axis=0),
        n("Reshape", ["cs", "newshape"], ["flat"], name="flatten"),
        n("ReduceMean", ["mp", "axes23"], ["gap"], name="gap", keepdims=0),
        n("Gemm", ["gap", "wfc", "bfc"], ["logits"], name="fc", transB=1),
        n("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    inits = [
        _init("w1", r(8, 3, 3, 3)), _init("b1", r(8)), _init("wd", r(8, 1, 3, 3)), _init("wt", r(8, 4, 3, 3)), _init("bt", r(4)),
        _init("scales", np.array([1, 1, 1.5, 1.5], np.float32)), _init("pads", np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64)),
        _init("split", np.array([2, 2], np.int64)), _init("reps", np.array([1, 1, 1, 2], np.int64)),
        _init("axis3", np.array(3, np.int64)), _init("zero", np.array(0, np.int64)), _init("zero1", np.array([0], np.int64)),
        _init("minus1", np.array([-1], np.int64)), _init("axes23", np.array([2, 3], np.int64)), _init("wfc", r(5, 8)),
        _init("bfc", r(5)),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", F, ["N", 3, 16, 16])
    outs = [helper.make_tensor_value_info("flat", F, None), helper.make_tensor_value_info("probs", F, None)]
    return _model(nodes, [x], outs, inits)


def _text_model() -> onnx.ModelProto:
    """ONNX Runtime's fused transformer ops (com.microsoft), as its optimizer writes them, plus LayerNormalization,
    Gelu, Where/Cast masks and a GatherElements."""
    rng = np.random.default_rng(1)
    h, heads, vocab = 32, 4, 50
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.2  # noqa: E731
    n = helper.make_node
    ms = "com.microsoft"
    nodes = [
        n("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "g0", "b0", "mask"], ["emb", "mask_index"], name="embed", domain=ms,
          epsilon=1e-12),  # fmt: skip
        n("Attention", ["emb", "wqkv", "bqkv", "mask"], ["att"], name="attention", domain=ms, num_heads=heads),
        n("SkipLayerNormalization", ["att", "emb", "g1", "b1", "bias1"], ["ln1"], name="skip_ln", domain=ms, epsilon=1e-12),
        n("MatMul", ["ln1", "w_up"], ["up"], name="up"),
        n("FastGelu", ["up", "b_up"], ["act"], name="fast_gelu", domain=ms),
        n("FusedMatMul", ["act", "w_down_t"], ["down"], name="fused_matmul", domain=ms, transB=1, alpha=0.5),
        n("BiasGelu", ["down", "b_down"], ["bg"], name="bias_gelu", domain=ms),
        n("QuickGelu", ["bg"], ["qg"], name="quick_gelu", domain=ms),
        n("SkipSimplifiedLayerNormalization", ["qg", "ln1", "g2"], ["rms"], name="skip_rms", domain=ms, epsilon=1e-6),
        n("MultiHeadAttention", ["rms", "ln1", "ln1", "", "mask"], ["mha"], name="mha", domain=ms, num_heads=heads),
        n("LayerNormalization", ["mha", "g3", "b3"], ["ln3"], name="ln", axis=-1, epsilon=1e-5),
        n("Gelu", ["ln3"], ["out"], name="gelu", approximate="tanh"),
        n("Cast", ["mask"], ["maskb"], name="cast", to=TensorProto.BOOL),
        n("Unsqueeze", ["maskb", "axis2"], ["mask3"], name="unsq"),
        n("Where", ["mask3", "out", "neg"], ["masked"], name="where"),
        n("GatherElements", ["masked", "gidx"], ["picked"], name="gather_elements", axis=2),
    ]
    inits = [
        _init("word", r(vocab, h)), _init("pos", r(64, h)), _init("g0", 1 + r(h)), _init("b0", r(h)), _init("wqkv", r(h, 3 * h)),
        _init("bqkv", r(3 * h)), _init("g1", 1 + r(h)), _init("b1", r(h)), _init("bias1", r(h)), _init("w_up", r(h, 2 * h)),
        _init("b_up", r(2 * h)), _init("w_down_t", r(h, 2 * h)), _init("b_down", r(h)), _init("g2", 1 + r(h)), _init("g3", 1 + r(h)),
        _init("b3", r(h)), _init("axis2", np.array([2], np.int64)), _init("neg", np.array(-1.0, np.float32)),
        _init("gidx", np.tile(np.array([[[3, 0, 7, 31]]], np.int64), (1, 1, 1))),
    ]  # fmt: skip
    ins = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"]),
           helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "seq"])]  # fmt: skip
    outs = [helper.make_tensor_value_info("masked", F, None), helper.make_tensor_value_info("mask_index", TensorProto.INT32, None)]
    return _model(nodes, ins, outs, inits, ms=True, opset=20)


def test_hand_written_vision_model_matches_onnxruntime(tmp_path: Path, aotc_cache: Path) -> None:
    path = tmp_path / "vision.onnx"
    onnx.save(_vision_model(), str(path))
    pkg = tmp_path / "vision.pkg"
    build(path, pkg, CPU, cache_dir=aotc_cache)
    assert compare(pkg, path, [{"N": 1}, {"N": 3}]) <= 1e-4
    manifest = json.loads(zipfile.ZipFile(pkg).read("manifest.json"))
    assert manifest["model"]["frontend"] == "onnx"
    assert [s["label"] for s in manifest["symbols"]] == ["N"]


def test_hand_written_fused_transformer_ops_match_onnxruntime(tmp_path: Path, aotc_cache: Path) -> None:
    m = _text_model()
    # the mask gathers pick from the last axis: keep them inside the smallest sequence length tested
    path = tmp_path / "fused.onnx"
    onnx.save(m, str(path))
    pkg = tmp_path / "fused.pkg"
    build(path, pkg, CPU, cache_dir=aotc_cache)
    assert compare(pkg, path, [{"batch": 1, "seq": 8}, {"batch": 3, "seq": 13}], int_high=2) <= 1e-4


# ---- the examples, through both exporters ------------------------------------------------------------

EXAMPLES = [(ex, exp) for ex in ("mlp", "cnn", "transformer") for exp in (DYNAMO, TORCHSCRIPT)]


@pytest.mark.parametrize(("example", "exporter"), EXAMPLES, ids=[f"{a}-{b}" for a, b in EXAMPLES])
def test_example_exported_to_onnx_matches_onnxruntime(example: str, exporter: str, tmp_path: Path, aotc_cache: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"onnx_{example}", ROOT / "examples" / f"{example}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    name = next(iter(mod.dynamic_shapes))
    path = export(mod.model, mod.example_inputs, tmp_path / f"{example}.onnx", exporter, [name], {0: "batch"})
    pkg = tmp_path / f"{example}.pkg"
    build(path, pkg, CPU, cache_dir=aotc_cache)
    assert compare(pkg, path, [{"batch": 1}, {"batch": 5}], int_high=1000) <= 1e-4
    result = CliRunner().invoke(cli, ["verify", str(pkg)])  # the self-test holds ONNX Runtime's outputs
    assert result.exit_code == 0, result.output


# ---- refusals ----------------------------------------------------------------------------------------


def _tiny() -> onnx.ModelProto:
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"], name="mm"), n("Add", ["h", "b"], ["y"], name="add")]
    inits = [_init("w", np.ones((4, 3), np.float32)), _init("b", np.zeros(3, np.float32))]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 4])], [helper.make_tensor_value_info("y", F, None)], inits)


def _bad(kind: str) -> bytes:
    m = _tiny()
    if kind == "truncated":
        return m.SerializeToString()[:40]
    if kind == "opset":
        m.opset_import[0].version = 99
    elif kind == "initializer":
        del m.graph.initializer[0]
    elif kind == "cycle":
        m.graph.node[0].input[0] = "y"  # mm reads add's output, add reads mm's
    elif kind == "dangling":
        m.graph.node[1].input[1] = "nowhere"
    elif kind == "unsupported":
        m.graph.node.append(helper.make_node("NonZero", ["y"], ["nz"], name="nonzero"))
        m.graph.node.append(helper.make_node("Mystery", ["y"], ["q"], name="custom", domain="my.domain"))
        m.graph.node.append(helper.make_node("Pad", ["y", "p"], ["pp"], name="reflect_pad", mode="reflect"))
        m.graph.initializer.append(_init("p", np.zeros(4, np.int64)))
        m.graph.output.extend([helper.make_tensor_value_info(o, F, None) for o in ("q", "pp")])
    return m.SerializeToString()


BAD = {
    "truncated": "truncated or damaged",
    "opset": "opset 99",
    "initializer": "reads 'w' (input 1), which no node, initializer or graph input defines",
    "cycle": "the graph has a cycle through nodes 'mm' (MatMul), 'add' (Add)",
    "dangling": "node 'add' (Add) reads 'nowhere'",
    "unsupported": "'nonzero': NonZero",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_damaged_file_gives_one_line_and_exit_6(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(_bad(kind))
    result = CliRunner().invoke(cli, ["build", str(path), "-o", str(tmp_path / "bad.pkg"), "--target", "cpu"])
    assert result.exit_code == 6, result.output
    err = result.stderr
    assert "Traceback" not in err and BAD[kind] in err, err
    if kind == "unsupported":  # every unsupported node in one error, with its name and op type
        assert "'custom': my.domain.Mystery" in err and "'reflect_pad': Pad with mode='reflect'" in err
    else:
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "bad.pkg").exists()


def test_truncated_file_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(_bad("truncated"))
    p = subprocess.run([sys.executable, "-c", "from aotc.cli import main; main()", "build", str(path), "-o", str(tmp_path / "m.pkg")],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert p.returncode == 6 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_front_end_is_picked_by_content(tmp_path: Path) -> None:
    odd = tmp_path / "model.bin"
    odd.write_bytes(_tiny().SerializeToString())
    src = tmp_path / "model.onnx"
    src.write_text("import torch\n")
    assert looks_like_onnx(odd) and not looks_like_onnx(src) and not looks_like_onnx(ROOT / "examples" / "mlp.py")


def test_dynamic_flag_names_and_bounds_a_dimension(tmp_path: Path, aotc_cache: Path) -> None:
    m = _tiny()
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2  # a fixed batch, made dynamic by the flag
    path = tmp_path / "tiny.onnx"
    onnx.save(m, str(path))
    pkg = tmp_path / "tiny.pkg"
    build(path, pkg, BuildOptions(targets=CPU.targets, dynamic=("x:0:rows:1:16",)), cache_dir=aotc_cache)
    symbols = json.loads(zipfile.ZipFile(pkg).read("manifest.json"))["symbols"]
    assert [(s["label"], s["min"], s["max"]) for s in symbols] == [("rows", 1, 16)]
    import aotc

    model = aotc.load(pkg, device="cpu")
    np.testing.assert_allclose(model(np.ones((7, 4), np.float32)), np.full((7, 3), 4.0, np.float32))
    with pytest.raises(aotc.InputMismatch):
        model(np.ones((17, 4), np.float32))


def test_external_data_model_builds(tmp_path: Path, aotc_cache: Path) -> None:
    """The > 2 GB layout: initializers in a side file. A missing side file is one clear error."""
    m = _tiny()
    m.graph.initializer[0].CopyFrom(_init("w", np.arange(12, dtype=np.float32).reshape(4, 3) / 10))
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").is_file()
    pkg = tmp_path / "ext.pkg"
    build(path, pkg, CPU, cache_dir=aotc_cache)
    assert compare(pkg, path, [{"batch": 2}, {"batch": 9}]) <= 1e-6
    (tmp_path / "ext.weights").unlink()
    result = CliRunner().invoke(cli, ["build", str(path), "-o", str(tmp_path / "ext2.pkg")])
    assert result.exit_code == 6 and "'ext.weights'" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_old_opset_is_converted(tmp_path: Path, aotc_cache: Path) -> None:
    """Opset 11 (Softmax over flattened trailing dims, axes as attributes) goes through onnx's converter."""
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["x"], ["u"], name="unsq", axes=[1]),
        n("Softmax", ["u"], ["s"], name="softmax", axis=1),
        n("Squeeze", ["s"], ["y"], name="sq", axes=[1]),
        n("ReduceSum", ["x"], ["r"], name="rsum", axes=[1], keepdims=1),
        n("Add", ["y", "r"], ["z"], name="add"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 6])], [helper.make_tensor_value_info("z", F, None)], [], opset=11)
    m.ir_version = 6
    path = tmp_path / "old.onnx"
    onnx.save(m, str(path))
    pkg = tmp_path / "old.pkg"
    build(path, pkg, CPU, cache_dir=aotc_cache)
    assert compare(pkg, path, [{"batch": 1}, {"batch": 4}]) <= 1e-5
