"""The builder's driver: model.py -> package, every stage in order, nothing hidden.

capture -> lower -> passes (verified) -> fuse -> plan memory -> per target: codegen + compile
-> package (weights, libraries/cubins, self-test, manifest)
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from aotc import __version__
from aotc.cpu_features import LEVEL_FEATURES
from aotc.errors import UnsupportedOp
from aotc.schema import CpuTarget, CudaTarget, Manifest, ModelInfo, Symbol, TensorSpec, interface_text

from . import kernel as K
from .capture import Captured, capture
from .codegen.cpp_pack import Packing, pack_array, packed_only, without
from .codegen.cpp_plan import cpu_plan
from .fusion import fuse
from .index_ranges import index_ranges
from .ir import DType, Graph
from .lower import lower_program
from .memory import plan_memory
from .options import BuildOptions, Target
from .package import selftest_member, weights_member, write_package
from .passes import run_pipeline
from .progress import Progress
from .symbolic import to_size
from .verify import verify

log = logging.getLogger("aotc.build")

TOLERANCE = {DType.f32: (1e-4, 1e-5), DType.f64: (1e-6, 1e-8), DType.bf16: (2e-2, 2e-2), DType.f16: (1e-2, 1e-2)}


@dataclass
class BuildReport:
    path: Path
    kernels: int
    weights_bytes: int
    targets: list[str]
    fusion_log: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage, in pipeline order

    def timing(self) -> str:
        total = sum(self.seconds.values())
        return f"{total:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items())


@contextlib.contextmanager
def _stage(seconds: dict[str, float], name: str, progress: Progress | None = None, detail: str = "") -> Iterator[None]:
    if progress is not None:
        progress.stage(name, detail)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0


def compile_graph(
    cap: Captured, seconds: dict[str, float] | None = None, channels_last: bool = False, progress: Progress | None = None
) -> tuple[Graph, K.Plan, list[str]]:
    """Everything up to the kernel program (``seconds`` collects stage times). ``channels_last``: activations
    between convolutions stored NHWC, what the GPU conv kernels want (``passes/layout.py``)."""
    seconds = {} if seconds is None else seconds
    with _stage(seconds, "lower", progress):
        graph = lower_program(cap)
    return compile_lowered(graph, seconds, channels_last, progress)


def compile_lowered(
    graph: Graph, seconds: dict[str, float] | None = None, channels_last: bool = False, progress: Progress | None = None
) -> tuple[Graph, K.Plan, list[str]]:
    """An IR graph from any front end (torch.export, ONNX) -> the kernel program: the shared back half."""
    seconds = {} if seconds is None else seconds
    with _stage(seconds, "lower"):
        verify(graph, "lower")
    with _stage(seconds, "passes", progress):
        graph = run_pipeline(graph, verify)
    with _stage(seconds, "fuse", progress):
        prog, fusion_log = fuse(graph, channels_last)
        plan = plan_memory(prog)
    return graph, plan, fusion_log


def _spec(name: str, dtype: DType, shape: tuple) -> TensorSpec:
    return TensorSpec(name, dtype.value, tuple(to_size(d) for d in shape))


def _cpu_target(
    prog: K.Plan, packs: list[Packing], target: Target, options: BuildOptions, cache_dir: Path, weights: dict[str, np.ndarray],
    sources_dir: Path | None = None,
) -> tuple[CpuTarget, dict[str, bytes]]:  # fmt: skip
    """A CPU target from its plan with packed weights (``cpu_plan``); ``weights``: values by label."""
    from .codegen import cpp
    from .compile import compile_cpp

    # What the code is built for, from the plan it is generated from; the runtime refuses a manifest that says otherwise.
    interface = interface_text(
        target.arch,
        ((s.name, s.min, s.max) for s in prog.symbols),
        ((b.dtype.value, tuple(to_size(d) for d in b.shape)) for b in prog.inputs),
        ((b.dtype.value, tuple(to_size(d) for d in b.shape)) for b in prog.outputs),
        ((b.dtype.value, tuple(to_size(d) for d in b.shape)) for b in prog.weights),
        to_size(prog.arena_size),
    )
    source = cpp.generate(prog, options, interface)
    if sources_dir is not None:  # --keep-sources: the generated C++ for reading
        (sources_dir / "cpu" / target.arch).mkdir(parents=True, exist_ok=True)
        (sources_dir / "cpu" / target.arch / "model.cpp").write_text(source)
    lib = compile_cpp(source, target, options, cache_dir)
    member = f"cpu/{target.arch}/model.so"
    members = {member: lib.so_bytes}
    packed = None
    if packs:
        named = [(prog.labels[p.name], pack_array(p, weights[prog.labels[p.source]])) for p in packs]
        packed, members[f"cpu/{target.arch}/packed.safetensors"] = weights_member(named, f"cpu/{target.arch}/packed.safetensors")
    spec = CpuTarget(
        level=target.arch, features=tuple(LEVEL_FEATURES[target.arch]), library=member, abi_version=1,
        arena_bytes=to_size(prog.arena_size), compiler=lib.compiler_version, flags=tuple(lib.flags),
        kernels=tuple(k.name for k in prog.kernels), min_glibc=lib.min_glibc, packed=packed,
    )  # fmt: skip
    return spec, members


def _cuda_target(
    prog: K.Plan, target: Target, options: BuildOptions, cache_dir: Path, progress: Progress | None = None
) -> tuple[CudaTarget, dict[str, bytes]]:
    from .cubin import build_cuda_target
    from .tune import tune_program

    on_done = progress.kernels if progress is not None else None
    return build_cuda_target(prog, target, options, cache_dir, tune_program if options.tune else None, on_done=on_done)


def _versions(options: BuildOptions) -> dict[str, str]:
    import subprocess

    out = {"aotc": __version__, "torch": torch.__version__.split("+")[0], "python": platform.python_version()}
    if any(t.kind == "cuda" for t in options.targets):
        import triton

        out["triton"] = triton.__version__
    if any(t.kind == "cpu" for t in options.targets):
        first = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=False).stdout.splitlines()
        out["gcc"] = first[0] if first else "unknown"
    # The options that shaped the package (never paths or dates: the same input gives the same bytes)
    out["options"] = " ".join(
        [f"--target {t}" for t in options.targets] + [f"--precision {options.precision}"]
        + [f"--dynamic {d}" for d in options.dynamic] + (["--no-selftest"] if not options.selftest else [])
        + (["--tune"] if options.tune else [])
    )  # fmt: skip
    return out


def _selftest(cap: Captured, prog: K.Program) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    with torch.no_grad():
        eager = cap.model(*cap.example_inputs)
    leaves = [x for x in pytree.tree_leaves(eager) if isinstance(x, torch.Tensor)]
    if len(leaves) != len(prog.outputs):
        raise UnsupportedOp(f"the model returns {len(leaves)} tensors but export produced {len(prog.outputs)} outputs")
    ins = [(prog.labels[b.name], _numpy(x)) for b, x in zip(prog.inputs, cap.example_inputs, strict=True)]
    outs = [(name, _numpy(x)) for name, x in zip(_output_names(cap, prog), leaves, strict=True)]
    return ins, outs


def _output_names(cap: Captured, prog: K.Program) -> list[str]:
    if len(cap.output_names) == len(prog.outputs):
        return cap.output_names
    return [prog.labels[b.name] for b in prog.outputs]


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    if t.dtype is torch.bfloat16:
        return t.float().numpy().astype(DType.bf16.numpy())
    return t.numpy().copy()


def build(
    model_path: Path,
    out_path: Path,
    options: BuildOptions,
    entry: str | None = None,
    inputs_entry: str | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    sources_dir: Path | None = None,
) -> BuildReport:
    """Build a model file: a model.py through torch.export, or an ONNX file (picked by content, not name).
    ``progress`` is told each stage and kernel count; ``sources_dir`` receives the generated C++ and Triton."""
    from .onnx import looks_like_onnx

    seconds: dict[str, float] = {}
    if looks_like_onnx(Path(model_path)):
        from .onnx import import_onnx

        with _stage(seconds, "import", progress, "(ONNX)"):
            imp = import_onnx(Path(model_path), options.dynamic, options.precision)
        source = Source(imp.name, imp.source_sha256, "onnx", imp.output_names, lambda prog: _onnx_selftest(imp, prog), imp.versions)
        graph, prog, fusion_log = compile_lowered(imp.graph, seconds, True, progress)
        return _build_program(graph, prog, fusion_log, source, out_path, options, cache_dir, seconds, progress, sources_dir)
    with _stage(seconds, "capture", progress, "(torch.export)"):
        cap = capture(Path(model_path), entry, inputs_entry, options.dynamic, options.precision)
    return build_captured(cap, out_path, options, cache_dir, seconds, progress, sources_dir)


def _onnx_selftest(imp: Any, prog: K.Program) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    xs, ys = imp.reference()
    ins = [(prog.labels[b.name], x) for b, x in zip(prog.inputs, xs, strict=True)]
    return ins, list(zip(imp.output_names, ys, strict=True))


@dataclass(frozen=True)
class Source:
    """What the shared back half needs from a front end: names for the manifest and the self-test's oracle."""

    name: str
    sha256: str
    frontend: str  # "torch.export" | "onnx", recorded in the manifest
    output_names: list[str]
    selftest: Callable[[K.Program], tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]]
    versions: dict[str, str] = field(default_factory=dict)  # the front end's own, for the manifest's build record
    returns: str = "tuple"  # ModelInfo.returns: "dict" when the model returned its outputs by name


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "aotc"


def build_captured(
    cap: Captured, out_path: Path, options: BuildOptions, cache_dir: Path | None = None, seconds: dict[str, float] | None = None,
    progress: Progress | None = None, sources_dir: Path | None = None,
) -> BuildReport:  # fmt: skip
    seconds = {} if seconds is None else seconds
    # Note: one program serves every target. NHWC activations between convs are what the GPU's conv kernels
    # and the C++ channels-last convs (cpp_templates/conv.h) both want.
    graph, prog, fusion_log = compile_graph(cap, seconds, channels_last=True, progress=progress)
    names = _output_names(cap, prog)
    returns = cap.returns if names == cap.output_names else "tuple"
    source = Source(cap.name, cap.source_sha256, "torch.export", names, lambda p: _selftest(cap, p), returns=returns)
    return _build_program(graph, prog, fusion_log, source, out_path, options, cache_dir, seconds, progress, sources_dir)


def _build_program(
    graph: Graph, prog: K.Plan, fusion_log: list[str], source: Source, out_path: Path, options: BuildOptions,
    cache_dir: Path | None, seconds: dict[str, float], progress: Progress | None = None, sources_dir: Path | None = None,
) -> BuildReport:  # fmt: skip
    cache_dir = cache_dir or default_cache_dir()
    for line in fusion_log:
        log.info("fusion: %s", line)

    # Weights packed per CPU level; with CPU targets only, a weight only packed matmuls read stays out.
    cpu_plans = {t: cpu_plan(prog, t.arch, options.winograd) for t in options.targets if t.kind == "cpu"}
    dropped = set() if any(t.kind == "cuda" for t in options.targets) else packed_only(list(cpu_plans.values()))
    cpu_plans = {t: (without(p, dropped), packs) for t, (p, packs) in cpu_plans.items()}
    shared = [w for w in prog.weights if w.name not in dropped]
    with _stage(seconds, "weights", progress):
        weights, blob = weights_member([(prog.labels[w.name], graph.weights[prog.labels[w.name]]) for w in shared])
    members: dict[str, bytes] = {weights.member: blob}
    targets: list[CpuTarget | CudaTarget] = []
    for t in options.targets:
        detail = f"(g++, {len(prog.kernels)} kernels)" if t.kind == "cpu" else f"(triton, {len(prog.kernels)} kernels)"
        with _stage(seconds, str(t), progress, detail):
            if t.kind == "cpu":
                spec, mem = _cpu_target(*cpu_plans[t], t, options, cache_dir, graph.weights, sources_dir)
            else:
                spec, mem = _cuda_target(prog, t, options, cache_dir, progress)
                if sources_dir is not None:  # the Triton source of each kernel is a member beside its cubin
                    for name, data in mem.items():
                        if name.endswith(".py"):
                            (sources_dir / name).parent.mkdir(parents=True, exist_ok=True)
                            (sources_dir / name).write_bytes(data)
        targets.append(spec)
        members.update(mem)

    selftest = None
    if options.selftest:
        with _stage(seconds, "selftest", progress, "(reference outputs)"):
            ins, outs = source.selftest(prog)
            rtol, atol = TOLERANCE.get(prog.outputs[0].dtype, (1e-4, 1e-5)) if prog.outputs else (1e-4, 1e-5)
            if options.precision == "tf32":  # TF32 keeps 10 mantissa bits in every GPU matmul
                rtol, atol = max(rtol, 1e-2), max(atol, 1e-2)
            selftest, st_blob = selftest_member(ins, outs, rtol, atol)
            members[selftest.member] = st_blob

    input_specs = tuple(_spec(prog.labels[b.name], b.dtype, b.shape) for b in prog.inputs)
    input_names = {t.name for t in input_specs}
    manifest = Manifest(
        model=ModelInfo(source.name, source.sha256, source.frontend, source.returns),
        build={**_versions(options), **source.versions},
        symbols=tuple(Symbol(s.name, s.label, s.min, s.max) for s in prog.symbols),
        inputs=input_specs,
        outputs=tuple(_spec(name, b.dtype, b.shape) for name, b in zip(source.output_names, prog.outputs, strict=True)),
        weights=weights,
        targets=tuple(targets),
        selftest=selftest,
        index_ranges=tuple(r for r in index_ranges(graph) if r.input in input_names),
    )
    with _stage(seconds, "write", progress):
        write_package(out_path, manifest, members)
    report = BuildReport(Path(out_path), len(prog.kernels), len(blob), [str(t) for t in options.targets], fusion_log, seconds)
    log.info("built %s in %s", out_path, report.timing())
    return report
