"""Golden tests of the printed IR and fusion decisions, plus verifier and error-path checks.

Set UPDATE_GOLDEN=1 to rewrite the golden files after an intended change, then review the diff.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sympy
import torch
from aotc.errors import CaptureError, UnsupportedOp, UsageError
from aotc_build.build import compile_graph
from aotc_build.capture import capture, capture_module
from aotc_build.fusion import fuse, reshape_index, view_strides
from aotc_build.ir import DType, Graph, InputAttr, Node, Op, TensorType
from aotc_build.lower import lower_program
from aotc_build.memory import plan_memory
from aotc_build.passes import PIPELINE, rewrite
from aotc_build.printer import print_graph
from aotc_build.verify import VerifyError, verify
from golden import check_golden
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def _stages(g: Graph) -> str:
    """The graph after lowering and after each pass of PIPELINE, one header per stage."""
    out = ["# lower", print_graph(g)]
    for k, p in enumerate(PIPELINE, 1):
        g = p(g)
        verify(g, p.__name__)
        out += [f"# pass {k}: {p.__name__}", print_graph(g)]
    return "\n".join(out)


@pytest.mark.parametrize("example", ["mlp", "cnn"])
def test_printed_ir_of_every_stagecheck_golden(example: str) -> None:
    g = lower_program(capture(ROOT / "examples" / f"{example}.py"))
    verify(g, "lower")
    check_golden(f"{example}.stages.ir", _stages(g))


def _snapshot(g: Graph) -> tuple:
    """What a pass could change in place: the printout, which node objects there are, and the weight data."""
    return print_graph(g, sources=True), [id(n) for n in g.nodes], {k: (id(v), v.tobytes()) for k, v in g.weights.items()}


@pytest.mark.parametrize("example", ["cnn", "transformer"])
def test_every_stage_leaves_its_input_unchanged(example: str) -> None:
    g = lower_program(capture(ROOT / "examples" / f"{example}.py"))
    changed = []
    for p in PIPELINE:
        before = _snapshot(g)
        out = p(g)
        assert _snapshot(g) == before, f"{p.__name__} changed its input graph"
        changed.append(print_graph(out) != before[0])
        g = out
    assert any(changed), "no pass changed anything: the check above proved nothing"
    before = _snapshot(g)
    prog, _ = fuse(g)
    assert _snapshot(g) == before, "fuse changed its input graph"
    text = repr(prog)
    plan = plan_memory(prog)
    assert repr(prog) == text and plan is not prog, "plan_memory changed its input program"
    assert plan.arena_offsets.keys() == {b.name for b in prog.arena}


def test_nodes_are_immutable_and_rewrite_builds_a_new_graph() -> None:
    x = Node(Op.INPUT, (), TensorType(DType.f32, (4,)), InputAttr("x"))
    neg = Node(Op.NEG, (x,), x.type)
    exp = Node(Op.EXP, (neg,), x.type)
    g = Graph([x, neg, exp], [x], [exp], {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        neg.inputs = ()  # type: ignore[misc]
    before = print_graph(g)
    # NEG -> -(ABS): the replacement's new input is placed before it, and EXP is rebuilt over it
    out = rewrite(g, lambda n, _: Node(Op.NEG, (Node(Op.ABS, n.inputs, n.type),), n.type) if n.op is Op.NEG else None)
    assert print_graph(g) == before and g.nodes == [x, neg, exp]
    assert [n.op for n in out.nodes] == [Op.INPUT, Op.ABS, Op.NEG, Op.EXP]
    assert out.outputs[0] is out.nodes[-1] is not exp and out.nodes[-1].inputs == (out.nodes[2],)
    assert out.inputs == [x] and out.nodes[0] is x  # untouched nodes are shared, not copied


def test_fusion_decisionscheck_golden() -> None:
    cap = capture(ROOT / "examples" / "transformer.py")
    _, prog, log = compile_graph(cap)
    decisions = [line.split(" (")[0] + ": " + line.rsplit("): ", 1)[-1] for line in log]
    lines = [f"{k.name} {type(k).__name__}" for k in prog.kernels] + ["--", *decisions]
    check_golden("transformer.kernels.txt", "\n".join(lines) + "\n")
    # a pre-norm block: layer-norm, attention softmax and the residual adds fuse; no kernel per op
    assert len(prog.kernels) <= 32


def test_mlp_fuses_bias_and_activation_into_matmuls() -> None:
    cap = capture(ROOT / "examples" / "mlp.py")
    _, prog, _ = compile_graph(cap)
    assert [type(k).__name__ for k in prog.kernels] == ["Matmul", "Matmul", "Matmul"]


def test_batchnorm_folds_into_conv() -> None:
    cap = capture(ROOT / "examples" / "cnn.py")
    _, prog, _ = compile_graph(cap)
    kinds = [type(k).__name__ for k in prog.kernels]
    assert kinds.count("Conv") == 9 and len(kinds) == 12, kinds  # conv+bn+relu(+residual) are one kernel each


def test_channels_last_keeps_fusion_and_stores_nhwc() -> None:
    """A GPU build stores the activations between convs NHWC and reads conv weights as [O, kh, kw, I]; the
    kernels and every fusion decision are those of the NCHW build (the epilogues stay fused)."""
    from aotc_build import kernel as K

    cap = capture(ROOT / "examples" / "cnn.py")
    _, nchw, log = compile_graph(cap)
    _, nhwc, log_cl = compile_graph(cap, channels_last=True)
    assert log_cl == log and [type(k) for k in nhwc.kernels] == [type(k) for k in nchw.kernels]
    convs = [k for k in nhwc.kernels if isinstance(k, K.Conv)]
    for k in convs:
        assert k.w.strides[1] == 1, (k.name, k.w.strides)  # the weight's input channel is contiguous
        if k.x.buf.startswith("buf"):  # an arena activation (the graph input stays NCHW for the user)
            assert k.x.strides[1] == 1, (k.name, k.x.strides)
        for st in k.stores:
            if st.buf.startswith("buf"):
                assert st.index.coeff(K.loop_var("i", 1)) == 1, (k.name, st.index)  # channels innermost
    assert sum(k.x.buf.startswith("buf") for k in convs) == len(convs) - 1


def test_view_strides_follow_torch() -> None:
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert view_strides((s, 64, 128), (8192, 128, 1), (s * 64, 128)) == (128, 1)
    assert view_strides((4, 8), (1, 4), (32,)) is None  # a transposed tensor cannot be flattened in place
    assert view_strides((2, 12), (12, 1), (2, 3, 4)) == (12, 4, 1)


def test_reshape_index_stays_affine_for_splits() -> None:
    i0, i1, i2 = sympy.symbols("i0 i1 i2", integer=True, nonnegative=True)
    assert reshape_index((i0, i1, i2), (6, 20), (6, 4, 5), {i0: 6, i1: 4, i2: 5}) == (i0, 5 * i1 + i2)


def test_verifier_rejects_implicit_broadcast() -> None:
    a = Node(Op.INPUT, (), TensorType(DType.f32, (2, 3)))
    b = Node(Op.INPUT, (), TensorType(DType.f32, (1, 3)))
    add = Node(Op.ADD, (a, b), TensorType(DType.f32, (2, 3)))
    with pytest.raises(VerifyError, match="broadcasts are explicit"):
        verify(Graph([a, b, add], [a, b], [add], {}))


def test_unsupported_ops_are_listed_together() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.fft.fft(x).real + torch.linalg.norm(x)

    cap = capture_module(M(), (torch.randn(4, 8),))
    with pytest.raises(UnsupportedOp) as e:
        lower_program(cap)
    msg = str(e.value)
    assert "fft" in msg and "test_ir.py" in msg and "fix:" in msg


def test_data_dependent_control_flow_is_a_capture_error(tmp_path: Path) -> None:
    src = tmp_path / "branchy.py"
    src.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.sum() > 0:\n"
        "            return x * 2\n"
        "        return x\n"
        "model = M()\nexample_inputs = (torch.randn(3),)\n"
    )
    with pytest.raises(CaptureError) as e:
        capture(src)
    assert "branchy.py" in str(e.value) and "data-dependent" in str(e.value)


def test_missing_entry_is_a_usage_error(tmp_path: Path) -> None:
    src = tmp_path / "empty.py"
    src.write_text("x = 1\n")
    with pytest.raises(UsageError, match="get_model"):
        capture(src)


def test_ops_doc_is_current() -> None:
    from aotc_build.ops_doc import render

    assert (ROOT / "docs" / "ops.md").read_text() == render(), "regenerate: python -m aotc_build.ops_doc > docs/ops.md"


def test_dynamic_flag_overrides_model_dims(tmp_path: Path) -> None:
    src = tmp_path / "static.py"
    src.write_text(
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())\n"
        "example_inputs = (torch.randn(3, 8),)\n"
    )
    static = lower_program(capture(src))
    assert static.symbols == [] and static.inputs[0].shape == (3, 8)
    dyn = lower_program(capture(src, dynamic=("input:0:batch:1:64",)))
    (sym,) = dyn.symbols
    assert (sym.label, sym.min, sym.max) == ("batch", 1, 64)
    with pytest.raises(UsageError, match="no input 'x'"):
        capture(src, dynamic=("x:0:batch",))


def test_specialised_dynamic_dim_names_torchs_reason_and_fix(tmp_path: Path) -> None:
    src = tmp_path / "fixed.py"
    src.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.register_buffer('p', torch.randn(16))\n"
        "    def forward(self, x):\n"
        "        return x + self.p\n"
        "model = M()\nexample_inputs = (torch.randn(2, 16),)\n"
    )
    with pytest.raises(CaptureError) as e:
        capture(src, dynamic=("x:1:seq:2:64",))
    msg = str(e.value)
    assert "specialised" in msg and "specialized it to be a constant (16)" in msg
    assert "Suggested fixes" in msg and "seq = 16" in msg and "fix:" in msg


def test_unprovable_guard_falls_back_to_auto_dims_over_the_declared_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11 reports a violated constraint for transformers' Llama on a guard that holds over the whole
    range; capture then exports again with Dim.AUTO and keeps the declared symbols and ranges."""
    real_export = torch.export.export
    calls = []

    def first_call_fails(model, args, dynamic_shapes=None, **kw):  # type: ignore[no-untyped-def]
        calls.append(dynamic_shapes)
        if len(calls) == 1:
            raise RuntimeError("Constraints violated (seq)! min(16*s, 32*s) == 16*s")
        return real_export(model, args, dynamic_shapes=dynamic_shapes, **kw)

    monkeypatch.setattr(torch.export, "export", first_call_fails)
    model = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()

    class Attn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=False)[0]

    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
    g = lower_program(capture_module(Attn(), (torch.randn(2, 5, 16),), ({0: batch, 1: seq},)))
    assert len(calls) == 2
    assert sorted((s.label, s.min, s.max) for s in g.symbols) == [("batch", 1, 8), ("seq", 2, 64)]


def test_fallback_keeps_a_real_specialisation_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.ones(16)

    with pytest.raises(CaptureError, match="specialized it to be a constant"):
        capture_module(Fixed(), (torch.randn(2, 16),), ({1: torch.export.Dim("seq", min=2, max=64)},))


def test_output_names_follow_the_output_pytree(tmp_path: Path, aotc_cache: Path) -> None:
    from aotc.package import Package
    from aotc_build.build import build_captured
    from aotc_build.options import BuildOptions, Target

    class Dict(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict:
            return {"logits": x * 2, "aux": (x + 1, x.sum(-1))}

    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple:
            return x * 2, x - 1

    cap = capture_module(Dict(), (torch.randn(2, 3),))
    assert cap.output_names == ["logits", "aux.0", "aux.1"]
    assert capture_module(Pair(), (torch.randn(2, 3),)).output_names == ["output0", "output1"]
    pkg = tmp_path / "d.pkg"
    build_captured(cap, pkg, BuildOptions(targets=(Target("cpu", "x86-64-v2"),)), aotc_cache)
    with Package(pkg) as p:
        assert [t.name for t in p.manifest.outputs] == ["logits", "aux.0", "aux.1"]
        assert p.manifest.selftest is not None and list(p.manifest.selftest.outputs) == [
            "output.logits", "output.aux.0", "output.aux.1"]  # fmt: skip


def test_dynamic_shapes_of_the_wrong_structure_say_how_to_fix_them() -> None:
    class Two(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    batch = torch.export.Dim("batch", min=1, max=8)
    with pytest.raises(CaptureError) as e:
        capture_module(Two(), (torch.randn(2, 3), torch.randn(2, 3)), ({0: batch},))
    msg = str(e.value)
    assert "dynamic_shapes does not match the model's inputs" in msg and "one entry per forward() argument" in msg
