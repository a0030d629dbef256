"""Steady-state latency of Programs on a GPU through ``aotc.cuda``, with and without CUDA-graph replay.

    python benchmarks/gpu_latency.py build .aotc-cache/gpu-bench          # build machine (no GPU needed)
    python benchmarks/gpu_latency.py run .aotc-cache/gpu-bench --json results.json   # GPU machine

``build`` cross-compiles the benchmark Programs (MLP 1024-4096-4096-1024 in bf16 and fp32, and a chain of
50 small pointwise kernels that is launch-bound) for sm_90. ``run`` makes random weights from a seed (so
nothing large travels), checks each output once against a float64 numpy reference, then times ``run()``
per call (median of many, after warm-up) in four modes: host arrays or device arrays in and out, plain
launches or one CUDA graph. Where torch with CUDA is importable, eager torch on the same weights is timed
too, for a ratio within the same run. Prints a table and writes JSON with device, versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from _paths import ensure_importable  # noqa: E402

BATCH = 64
CHAIN = 50


# ---- build side (aotc_build, sympy, triton) -----------------------------------------------------------


def programs() -> dict[str, Any]:
    import sympy
    from aotc_build import kernel as K
    from aotc_build.ir import DType, Op, Symbol

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    i0, i1 = K.loop_vars("i", 2)
    sym = Symbol("s0", "batch", 1, 256)

    def mlp(dt: DType) -> K.Plan:
        dims = [1024, 4096, 4096, 1024]
        x = K.Buffer("x", dt, (s0, dims[0]), "input")
        y = K.Buffer("y", dt, (s0, dims[-1]), "output")
        ws = [K.Buffer(f"w{j}", dt, (dims[j], dims[j + 1]), "weight") for j in range(3)]
        bs = [K.Buffer(f"b{j}", dt, (dims[j + 1],), "weight") for j in range(3)]
        hs = [K.Buffer(f"h{j}", dt, (s0, dims[j + 1]), "arena") for j in range(2)]
        kernels, src = [], "x"
        for j in range(3):
            dst = "y" if j == 2 else f"h{j}"
            bias = K.Load(f"b{j}", K.Index(i1), dt)
            v: K.Value = K.Binary(Op.ADD, K.Acc(), bias if dt is DType.f32 else K.Unary(Op.CAST, bias, DType.f32), DType.f32)
            if j < 2:
                v = K.Unary(Op.RELU, v, DType.f32)
            if dt is not DType.f32:
                v = K.Unary(Op.CAST, v, dt)
            kernels.append(K.Matmul(
                f"linear{j}", (), s0, dims[j + 1], dims[j],
                K.Strided(src, sympy.Integer(0), (dims[j], 1), dt),
                K.Strided(f"w{j}", sympy.Integer(0), (dims[j + 1], 1), dt),
                (K.Store(dst, i0 * dims[j + 1] + i1, v),),
            ))  # fmt: skip
            src = dst
        return K.Plan([sym], [x], [y], [*ws, *bs], hs, kernels, {}, {"h0": 0, "h1": 4096 * dt.itemsize * s0}, 2 * 4096 * dt.itemsize * s0)

    def chain() -> K.Plan:
        f32 = DType.f32
        x = K.Buffer("x", f32, (s0, 1024), "input")
        y = K.Buffer("y", f32, (s0, 1024), "output")
        tmp = [K.Buffer(f"t{j}", f32, (s0, 1024), "arena") for j in range(2)]
        kernels = []
        for j in range(CHAIN):
            src = "x" if j == 0 else f"t{(j - 1) % 2}"
            dst = "y" if j == CHAIN - 1 else f"t{j % 2}"
            v = K.Binary(Op.ADD, K.Binary(Op.MUL, K.Load(src, K.Index(i0 * 1024 + i1), f32), K.Const(1.0001, f32), f32),
                         K.Const(0.5, f32), f32)  # fmt: skip
            kernels.append(K.Pointwise(f"step{j}", (s0, 1024), (K.Store(dst, i0 * 1024 + i1, v),)))
        return K.Plan([sym], [x], [y], [], tmp, kernels, {}, {"t0": 0, "t1": 4096 * s0}, 8192 * s0)

    return {
        "mlp_bf16": (mlp(DType.bf16), "bf16"),
        "mlp_fp32": (mlp(DType.f32), "fp32"),
        "chain50": (chain(), "fp32"),
    }


def build(out: Path, sm: int) -> None:
    ensure_importable(builder=True)
    from aotc import schema
    from aotc_build import cubin
    from aotc_build.options import BuildOptions, Target
    from build_artifacts import program_manifest

    for name, (prog, precision) in programs().items():
        t0 = time.perf_counter()
        t, members = cubin.build_cuda_target(
            prog, Target("cuda", f"sm_{sm}"), BuildOptions(precision=precision), out.parent / "cubin-cache"
        )
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.json").write_text(schema.to_json(program_manifest(prog, t)))
        for m, data in members.items():
            (d / m).parent.mkdir(parents=True, exist_ok=True)
            (d / m).write_bytes(data)
        print(f"built {name}: {len(t.kernels)} cubins for {len(t.launches)} launches "
              f"in {time.perf_counter() - t0:.1f}s")  # fmt: skip


# ---- run side (numpy, cffi, libcuda; torch only for the eager comparison) -------------------------------


def _weights(m: Any, np_dtype: Any) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for w in m.weights.tensors:
        shape = tuple(int(d) for d in w.shape)
        scale = 1.0 / np.sqrt(shape[0]) if len(shape) == 2 else 0.1
        out.append((rng.standard_normal(shape) * scale).astype(np.float32).astype(np_dtype(w.dtype)))
    return out


def _reference(name: str, x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    if name == "chain50":
        y = x.astype(np.float64)
        for _ in range(CHAIN):
            y = y * 1.0001 + 0.5
        return y
    h = x.astype(np.float64)
    ws, bs = weights[:3], weights[3:]
    for j in range(3):
        h = h @ ws[j].astype(np.float64) + bs[j].astype(np.float64)
        if j < 2:
            h = np.maximum(h, 0)
    return h


def _time(fn: Any, iters: int, warmup: int = 20) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return {"median_ms": statistics.median(ts), "p10_ms": ts[len(ts) // 10], "p90_ms": ts[9 * len(ts) // 10]}


def _torch_eager(name: str, x: np.ndarray, weights: list[np.ndarray], iters: int) -> dict[str, float] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = torch.bfloat16 if name == "mlp_bf16" else torch.float32

    def t(a: np.ndarray) -> Any:
        return torch.from_numpy(a.astype(np.float32)).to("cuda", dt)

    xt = t(x)
    if name == "chain50":

        def fn() -> Any:
            y = xt
            for _ in range(CHAIN):
                y = y * 1.0001 + 0.5
            torch.cuda.synchronize()
            return y
    else:
        ws, bs = [t(w) for w in weights[:3]], [t(b) for b in weights[3:]]

        def fn() -> Any:
            with torch.no_grad():
                h = xt
                for j in range(3):
                    h = h @ ws[j] + bs[j]
                    if j < 2:
                        h = torch.relu(h)
            torch.cuda.synchronize()
            return h

    return _time(fn, iters)


def run(art: Path, iters: int, json_path: Path | None) -> list[dict[str, Any]]:
    ensure_importable()
    from aotc import cuda

    info = cuda.device_info()
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    from aotc import schema

    for d in sorted(p for p in art.iterdir() if (p / "manifest.json").exists()):
        m = schema.from_json((d / "manifest.json").read_text())
        t = m.cuda_targets[0]
        meta = {"triton_build": t.triton_version, "ptxas": t.ptxas_version, "arch": t.arch}
        rows.append(_bench(cuda, d, m, iters))
    _print(rows, info)
    if json_path is not None:
        torch_version = None
        if "torch" in sys.modules:
            torch_version = str(sys.modules["torch"].__version__)
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": info, **meta, "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch_version, "iters": iters, "results": rows,
        }  # fmt: skip
        json_path.write_text(json.dumps(doc, indent=1))
    return rows


def _bench(cuda: Any, d: Path, m: Any, iters: int) -> dict[str, Any]:
    name = d.name
    weights = _weights(m, cuda.np_dtype)
    ex = cuda.CudaExecutor(m, m.cuda_targets[0], lambda member: (d / member).read_bytes(), weights)
    dt = cuda.np_dtype(m.inputs[0].dtype)
    x = np.random.default_rng(1).standard_normal((BATCH, 1024)).astype(np.float32).astype(dt)
    env = {"s0": BATCH}  # every program here has one symbol, the batch
    (y,) = ex.run([x], env, graph=False)
    ref = _reference(name, x, weights)
    err = float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))
    dx = ex.to_device(x)
    dy = ex.empty(tuple(y.shape), m.outputs[0].dtype)
    row: dict[str, Any] = {"program": name, "batch": BATCH, "launches": len(m.cuda_targets[0].launches), "rel_err": err}
    row["host_plain"] = _time(lambda: ex.run([x], env, graph=False), iters)
    row["host_graph"] = _time(lambda: ex.run([x], env, graph=True), iters)
    row["device_plain"] = _time(lambda: ex.run([dx], env, outputs=[dy], graph=False), iters)
    row["device_graph"] = _time(lambda: ex.run([dx], env, outputs=[dy], graph=True), iters)
    row["graph_error"] = ex.graph_error
    row["torch_eager"] = _torch_eager(name, x, weights, iters)
    ex.close()
    return row


def _print(rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    print(f"\n{info['name']} ({info['arch']}, driver {info['driver_version']}), median ms per run() call")
    cols = ("launch", "host", "host+cg", "dev", "dev+cg", "torch")
    head = f"{'program':<10} " + " ".join(f"{c:>8}" for c in cols) + f" {'rel_err':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        te = r["torch_eager"]["median_ms"] if r["torch_eager"] else float("nan")
        print(f"{r['program']:<10} {r['launches']:>8} {r['host_plain']['median_ms']:>8.3f} "
              f"{r['host_graph']['median_ms']:>8.3f} {r['device_plain']['median_ms']:>8.3f} "
              f"{r['device_graph']['median_ms']:>8.3f} {te:>8.3f} {r['rel_err']:>9.2e}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out", type=Path)
    b.add_argument("--sm", type=int, default=90)
    r = sub.add_parser("run")
    r.add_argument("artifacts", type=Path)
    r.add_argument("--iters", type=int, default=200)
    r.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.sm)
    else:
        run(a.artifacts, a.iters, a.json)


if __name__ == "__main__":
    main()
