"""Build the GPU test artifacts on a machine without a GPU: cubins, manifests and test vectors.

    python tests/gpu/build_artifacts.py .aotc-cache/gpu [--sm 90]

For every case of ``programs.GPU_CASES`` and every hand-written launch-ABI kernel (one per scalar parameter type,
one that needs global scratch, launches that need cuLaunchKernelEx, one that faults on purpose) this writes
``<out>/<case>/manifest.json`` (a package manifest with one CUDA target), the members it names, and
``data.npz`` (weights, inputs and numpy reference outputs at two symbol values; bf16 arrays as uint16 bit
patterns). ``run_cases.py`` runs them on a GPU with nothing but numpy and cffi. The folder is carried to
the GPU machine; nothing is compiled there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import ensure_importable

ensure_importable(builder=True)

import programs  # noqa: E402
from aotc import schema  # noqa: E402
from aotc.schema import Arg, CudaTarget, Manifest, ModelInfo, Ref, Symbol, TensorSpec, Weights  # noqa: E402
from aotc_build import cubin  # noqa: E402
from aotc_build import kernel as K  # noqa: E402
from aotc_build.options import BuildOptions, Target  # noqa: E402
from aotc_build.symbolic import to_size  # noqa: E402

SCALAR_SRC = """import triton
import triton.language as tl


@triton.jit
def {name}(x_ptr, y_ptr, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, {expr}, mask=m)
"""

SCRATCH_SRC = """import triton
import triton.language as tl


@triton.jit
def tma_scale(x_ptr, y_ptr, m, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    xd = tl.make_tensor_descriptor(x_ptr, shape=[m, N], strides=[N, 1], block_shape=[BM, BN])
    yd = tl.make_tensor_descriptor(y_ptr, shape=[m, N], strides=[N, 1], block_shape=[BM, BN])
    t = xd.load([pid_m * BM, pid_n * BN])
    yd.store([pid_m * BM, pid_n * BN], t * 2.0)
"""

FAULT_SRC = """import triton
import triton.language as tl


@triton.jit
def fault(y_ptr, addr, BLOCK: tl.constexpr):
    bad = addr.to(tl.pointer_type(tl.float32))
    tl.store(bad + tl.arange(0, BLOCK), tl.full([BLOCK], 1.0, tl.float32))
    tl.store(y_ptr + tl.arange(0, BLOCK), tl.full([BLOCK], 2.0, tl.float32))
"""

PACKAGED = ("linear_relu", "two_kernels_arena", "layer_norm")  # also built as whole packages for aotc.load

# kind → (Triton signature type, numpy dtype, scalar value, expression)
SCALARS: dict[str, tuple[str, str, Any, str]] = {
    "f16": ("fp16", "float16", 1.5, "x * s"),
    "bf16": ("bf16", "bfloat16", -2.5, "x * s"),
    "f32": ("fp32", "float32", 0.1, "x * s"),
    "f64": ("fp64", "float64", 1.0 / 3.0, "x * s"),
    "i1": ("i1", "int8", True, "tl.where(s, x + 1, x - 1)"),
    "i8": ("i8", "int8", -3, "x * s"),
    "i32": ("i32", "int32", 123457, "x * s"),
    "i64": ("i64", "int64", 2**40 + 3, "x * s"),
}


def _store(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, high: int | None = None) -> np.ndarray:
    dt = plan_dtype(dtype)
    if high is not None:
        return rng.integers(0, high, size=shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(-20, 20, size=shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) > 0.5
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def plan_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _spec(b: K.Buffer) -> TensorSpec:
    return TensorSpec(b.name, b.dtype.value, tuple(to_size(d) for d in b.shape))


def program_manifest(prog: K.Plan, target: CudaTarget, weights: Weights | None = None, selftest: schema.SelfTest | None = None) -> Manifest:
    """The manifest around a CUDA target built from ``prog``: its buffers as inputs, outputs and weights
    (in the order the target's pointer arguments index them), named as in ``prog``."""
    return Manifest(
        model=ModelInfo("case", "0" * 64), build={"aotc": "test"},
        symbols=tuple(Symbol(s.name, s.label, s.min, s.max) for s in prog.symbols),
        inputs=tuple(map(_spec, prog.inputs)), outputs=tuple(map(_spec, prog.outputs)),
        weights=weights or Weights("weights.safetensors", tuple(map(_spec, prog.weights))),
        targets=(target,), selftest=selftest,
    )  # fmt: skip


def _shape(t: TensorSpec, env: dict[str, int]) -> tuple[int, ...]:
    from aotc import shapes

    return tuple(shapes.evaluate(d, env) for d in t.shape)


def write_case(
    out: Path, name: str, manifest: Manifest, members: dict[str, bytes], *,
    arrays: dict[str, np.ndarray], meta: dict[str, Any],
) -> None:  # fmt: skip
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(schema.to_json(manifest))  # validated as the runtime will read it
    for member, data in members.items():
        p = d / member
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    np.savez(d / "data.npz", **{k: _store(v) for k, v in arrays.items()})
    meta = dict(meta, dtypes={k: v.dtype.name for k, v in arrays.items()})
    (d / "case.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def program_case(out: Path, case: programs.Case, sm: int, cache: Path, seed: int) -> None:
    target, members = cubin.build_cuda_target(case.prog, Target("cuda", f"sm_{sm}"), BuildOptions(precision=case.precision), cache)
    m = program_manifest(case.prog, target)
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    weights = {w.name: _rand(rng, _shape(w, {}), w.dtype) for w in m.weights.tensors}
    arrays.update({f"w:{k}": v for k, v in weights.items()})
    for i, env in enumerate(case.trials):
        inputs = {x.name: _rand(rng, _shape(x, env), x.dtype, case.int_inputs.get(x.name)) for x in m.inputs}
        ref = case.ref(inputs, weights)
        arrays.update({f"in{i}:{k}": v for k, v in inputs.items()})
        arrays.update({f"ref{i}:{k}": np.asarray(v) for k, v in ref.items()})
    meta = {"trials": case.trials, "rtol": case.rtol, "atol": case.atol, "kind": "program"}
    write_case(out, case.name, m, members, arrays=arrays, meta=meta)


def package_case(out: Path, case: programs.Case, sm: int, cache: Path, seed: int) -> None:
    """A whole package (manifest, weights, self-test, the CUDA target) for ``aotc.load`` on the GPU."""
    from aotc_build.package import selftest_member, weights_member, write_package

    target, members = cubin.build_cuda_target(case.prog, Target("cuda", f"sm_{sm}"), BuildOptions(precision=case.precision), cache)
    m = program_manifest(case.prog, target)
    rng = np.random.default_rng(seed)
    weights = [(w.name, _rand(rng, _shape(w, {}), w.dtype)) for w in m.weights.tensors]
    out_dtypes = {o.name: plan_dtype(o.dtype) for o in m.outputs}
    arrays = {}
    for i, env in enumerate(case.trials):
        inputs = {x.name: _rand(rng, _shape(x, env), x.dtype, case.int_inputs.get(x.name)) for x in m.inputs}
        ref = case.ref(inputs, dict(weights))
        arrays.update({f"in{i}:{k}": v for k, v in inputs.items()})
        arrays.update({f"ref{i}:{k}": np.asarray(v).astype(out_dtypes[k]) for k, v in ref.items()})
    wspec, blob = weights_member(weights)
    st, st_blob = selftest_member(
        [(x.name, arrays[f"in0:{x.name}"]) for x in m.inputs], [(o.name, arrays[f"ref0:{o.name}"]) for o in m.outputs],
        rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-5),
    )  # fmt: skip
    d = out / f"pkg_{case.name}"
    d.mkdir(parents=True, exist_ok=True)
    write_package(d / "model.pkg", program_manifest(case.prog, target, wspec, st), {**members, wspec.member: blob, st.member: st_blob})
    np.savez(d / "data.npz", **{k: _store(v) for k, v in arrays.items()})
    meta = {"trials": case.trials, "rtol": case.rtol, "atol": case.atol, "kind": "package",
            "dtypes": {k: v.dtype.name for k, v in arrays.items()}}  # fmt: skip
    (d / "case.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def _one_kernel_target(
    sm: int, c: cubin.Compiled, src: str, *, args: list[Arg], kinds: list[str],
    grid: tuple[Any, Any, Any], inputs: list[TensorSpec], outputs: list[TensorSpec],
    symbols: tuple[str, ...],
) -> tuple[Manifest, dict[str, bytes]]:  # fmt: skip
    """A manifest whose one CUDA target launches ``c`` once; pointer arguments index ``inputs``/``outputs``."""
    arch = f"sm_{sm}"
    k = c.kernel(f"cuda/{arch}/{c.name}.cubin", f"cuda/{arch}/{c.name}.py", kinds)
    t = CudaTarget(
        arch=arch, triton_version=c.triton_version, ptxas_version=c.ptxas_version,
        min_driver=int(c.ptxas_version.split(".")[0]) * 1000, precision="fp32", arena_bytes=0, arena=(),
        kernels=(k,), launches=(schema.Launch(c.name, grid, tuple(args)),),
    )  # fmt: skip
    m = Manifest(
        model=ModelInfo(c.name, "0" * 64), build={"aotc": "test"},
        symbols=tuple(Symbol(s, s, 0, None) for s in symbols), inputs=tuple(inputs), outputs=tuple(outputs),
        weights=Weights("weights.safetensors", ()), targets=(t,),
    )  # fmt: skip
    return m, {k.member: c.cubin, f"cuda/{arch}/{c.name}.py": src.encode()}


X, Y = Arg("ptr", buffer=Ref("input", 0)), Arg("ptr", buffer=Ref("output", 0))


def scalar_cases(out: Path, sm: int, cache: Path) -> None:
    """One kernel per scalar parameter type: ``y = x * s`` with ``s`` packed at the PTX width."""
    rng = np.random.default_rng(1)
    for kind, (sig, dtype, value, expr) in SCALARS.items():
        name = f"scale_{kind}"
        src = SCALAR_SRC.format(name=name, expr=expr)
        ptr = "*i8" if kind == "i1" else f"*{sig}"
        signature = {"x_ptr": ptr, "y_ptr": ptr, "s": sig, "n": "i32", "BLOCK": "constexpr"}
        c = cubin.compile_source(src, name, signature, {"BLOCK": 256}, sm=sm, cache_dir=cache, aligned=("x_ptr", "y_ptr"))
        xt, yt = TensorSpec("x", dtype, ("n",)), TensorSpec("y", dtype, ("n",))
        args = [X, Y, Arg(kind, value=value), Arg("i32", expr="n")]
        target, members = _one_kernel_target(
            sm,
            c,
            src,
            args=args,
            kinds=["ptr", "ptr", kind, "i32"],
            grid=("CeilDiv(n, 256)", 1, 1),
            inputs=[xt],
            outputs=[yt],
            symbols=("n",),
        )
        arrays = {}
        for i, n in enumerate((5, 1000)):
            x = _rand(rng, (n,), dtype)
            if kind == "i1":
                y = np.where(value, x + 1, x - 1).astype(np.int8)
            elif kind == "bf16":
                y = (x.astype(np.float32) * np.float32(value)).astype(x.dtype)
            else:
                y = (x * np.array(value, dtype=x.dtype)).astype(x.dtype)
            arrays[f"in{i}:x"], arrays[f"ref{i}:y"] = x, y
        meta = {"trials": [{"n": 5}, {"n": 1000}], "rtol": 0.0, "atol": 0.0, "kind": "scalar"}
        write_case(out, name, target, members, arrays=arrays, meta=meta)


def ex_cases(out: Path, sm: int, cache: Path) -> None:
    """Launches that need cuLaunchKernelEx: 2-CTA clusters, programmatic dependent launch, cooperative."""
    if sm < 90:
        return
    rng = np.random.default_rng(2)
    for name, opts in (("ex_cluster", {"num_ctas": 2}), ("ex_pdl", {"launch_pdl": True}),
                       ("ex_coop", {"launch_cooperative_grid": True})):  # fmt: skip
        src = SCALAR_SRC.format(name=name, expr="x * s")
        signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "s": "fp32", "n": "i32", "BLOCK": "constexpr"}
        c = cubin.compile_source(src, name, signature, {"BLOCK": 256}, sm=sm, cache_dir=cache,
                                 aligned=("x_ptr", "y_ptr"), extra_options=opts)  # fmt: skip
        xt, yt = TensorSpec("x", "float32", ("n",)), TensorSpec("y", "float32", ("n",))
        args = [X, Y, Arg("f32", value=3.0), Arg("i32", expr="n")]
        target, members = _one_kernel_target(
            sm,
            c,
            src,
            args=args,
            kinds=["ptr", "ptr", "f32", "i32"],
            grid=("CeilDiv(n, 256)", 1, 1),
            inputs=[xt],
            outputs=[yt],
            symbols=("n",),
        )
        arrays = {}
        for i, n in enumerate((7, 5000)):
            x = _rand(rng, (n,), "float32")
            arrays[f"in{i}:x"], arrays[f"ref{i}:y"] = x, x * np.float32(3.0)
        meta = {"trials": [{"n": 7}, {"n": 5000}], "rtol": 0.0, "atol": 0.0, "kind": "scalar",
                "compiled": {"num_ctas": c.num_ctas, "launch_pdl": c.launch_pdl,
                             "launch_cooperative_grid": c.launch_cooperative_grid}}  # fmt: skip
        write_case(out, name, target, members, arrays=arrays, meta=meta)


def scratch_case(out: Path, sm: int, cache: Path) -> None:
    """A TMA tensor-descriptor kernel: Triton gives it global scratch (descriptors are built on device)."""
    if sm < 90:
        return
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "m": "i32", "N": "constexpr", "BM": "constexpr",
                 "BN": "constexpr"}  # fmt: skip
    c = cubin.compile_source(SCRATCH_SRC, "tma_scale", signature, {"N": 64, "BM": 32, "BN": 64}, sm=sm,
                             cache_dir=cache, aligned=("x_ptr", "y_ptr"))  # fmt: skip
    assert c.global_scratch_size > 0, "expected Triton to give a TMA kernel global scratch"
    xt, yt = TensorSpec("x", "float32", ("m", 64)), TensorSpec("y", "float32", ("m", 64))
    args = [X, Y, Arg("i32", expr="m")]
    target, members = _one_kernel_target(
        sm,
        c,
        SCRATCH_SRC,
        args=args,
        kinds=["ptr", "ptr", "i32"],
        grid=("CeilDiv(m, 32)", 1, 1),
        inputs=[xt],
        outputs=[yt],
        symbols=("m",),
    )
    rng = np.random.default_rng(3)
    arrays = {}
    for i, m in enumerate((32, 96)):
        x = _rand(rng, (m, 64), "float32")
        arrays[f"in{i}:x"], arrays[f"ref{i}:y"] = x, 2 * x
    meta = {"trials": [{"m": 32}, {"m": 96}], "rtol": 0.0, "atol": 0.0, "kind": "scalar",
            "compiled": {"global_scratch_size": c.global_scratch_size}}  # fmt: skip
    write_case(out, "tma_scratch", target, members, arrays=arrays, meta=meta)


def fault_case(out: Path, sm: int, cache: Path) -> None:
    """A kernel that stores through a bad address: the runtime must raise, then refuse further work."""
    signature = {"y_ptr": "*fp32", "addr": "i64", "BLOCK": "constexpr"}
    c = cubin.compile_source(FAULT_SRC, "fault", signature, {"BLOCK": 32}, sm=sm, cache_dir=cache)
    yt = TensorSpec("y", "float32", (32,))
    args = [Y, Arg("i64", value=16)]
    target, members = _one_kernel_target(
        sm, c, FAULT_SRC, args=args, kinds=["ptr", "i64"], grid=(1, 1, 1), inputs=[], outputs=[yt], symbols=()
    )
    write_case(out, "fault", target, members, arrays={}, meta={"trials": [{}], "kind": "fault"})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--cache", type=Path, default=None, help="cubin cache (default: <out>/../cubin-cache)")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    cache = a.cache or a.out.parent / "cubin-cache"
    a.out.mkdir(parents=True, exist_ok=True)
    names = []
    for i, case in enumerate(programs.gpu_cases()):
        if a.only is None or case.name in a.only:
            program_case(a.out, case, a.sm, cache, seed=100 + i)
            names.append(case.name)
    if a.only is None:
        for i, case in enumerate(programs.gpu_cases()):
            if case.name in PACKAGED:
                package_case(a.out, case, a.sm, cache, seed=200 + i)
        scalar_cases(a.out, a.sm, cache)
        ex_cases(a.out, a.sm, cache)
        scratch_case(a.out, a.sm, cache)
        fault_case(a.out, a.sm, cache)
    cases = sorted(p.name for p in a.out.iterdir() if (p / "case.json").exists())
    index = {"sm": a.sm, "triton": cubin.triton_version(), "ptxas": cubin.ptxas_version(a.sm), "cases": cases}
    (a.out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(cases)} cases for sm_{a.sm} to {a.out}")


if __name__ == "__main__":
    main()
