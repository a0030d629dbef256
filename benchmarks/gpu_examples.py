"""Steady-state GPU latency of packages, with and without CUDA-graph replay, next to eager torch.

    python benchmarks/gpu_examples.py ARTIFACT_DIR OUT.json            # aotc rows (no torch imported)
    python benchmarks/gpu_examples.py ARTIFACT_DIR OUT.json --torch    # adds eager torch rows (separate run)

Prints a table and writes JSON (device, driver, versions, date, medians over repeats). Inputs live on
the device, so rows measure launches + kernels, not PCIe copies. Compare ratios within one run only.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from bench_timing import median_ms

ROOT = Path(__file__).resolve().parents[1]
CASES = [("mlp", 64), ("cnn", 8), ("transformer", 8)]
WARMUP, CALLS, REPEATS = 20, 200, 5



def _median_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return median_ms(fn, repeats=REPEATS, calls=CALLS, warmup=WARMUP)


def _inputs(name: str, batch: int, bf16: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "transformer":
        return [rng.integers(0, 1000, (batch, 64)).astype(np.int64)]
    shape = {"mlp": (batch, 256), "cnn": (batch, 3, 32, 32)}[name]
    x = rng.standard_normal(shape, dtype=np.float32)
    if bf16:
        import ml_dtypes

        x = x.astype(ml_dtypes.bfloat16)
    return [x]


def aotc_rows(art: Path) -> list[dict]:
    import aotc
    from aotc import cuda

    rows = []
    for name, batch in CASES:
        for precision in ("fp32", "bf16"):
            pkg = art / f"example_{name}_{precision}.pkg"
            if not pkg.exists():
                continue
            t0 = time.perf_counter()
            model = aotc.load(pkg, device="cuda")
            load_ms = (time.perf_counter() - t0) * 1e3
            ex = model.executor  # the CudaExecutor
            host = _inputs(name, batch, precision == "bf16")
            xs = [ex.to_device(x) for x in host]
            env = model.bind([x.shape for x in host])
            row = {"model": name, "precision": precision, "batch": batch, "load_ms": round(load_ms, 2)}
            row["plain_ms"] = _median_ms(lambda ex=ex, xs=xs, env=env: ex.run(xs, env, device_outputs=True, graph=False))
            row["graph_ms"] = _median_ms(lambda ex=ex, xs=xs, env=env: ex.run(xs, env, device_outputs=True, graph=True))
            row["numpy_io_graph_ms"] = _median_ms(lambda model=model, host=host: model(*host))
            row["kernels"] = len(ex.cuda.kernels)
            rows.append(row)
            print(f"{name:12s} {precision:5s} b={batch:<3d} plain {row['plain_ms']:.3f} ms  graph {row['graph_ms']:.3f} ms"
                  f"  numpy-io {row['numpy_io_graph_ms']:.3f} ms  load {load_ms:.1f} ms", flush=True)
    info = cuda.device_info()
    return rows, info


def torch_rows() -> list[dict]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name, batch in CASES:
        spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for precision, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            m = mod.model.to("cuda", dt).eval()
            xs = [torch.from_numpy(x.astype(np.float32) if x.dtype.kind == "V" or str(x.dtype) == "bfloat16" else x).cuda()
                  for x in _inputs(name, batch, False)]
            xs = [x.to(dt) if x.is_floating_point() else x for x in xs]

            def call(m=m, xs=xs) -> None:  # type: ignore[no-untyped-def]
                with torch.no_grad():
                    m(*xs)
                torch.cuda.synchronize()

            ms = _median_ms(call)
            rows.append({"model": name, "precision": precision, "batch": batch, "torch_eager_ms": ms})
            print(f"{name:12s} {precision:5s} b={batch:<3d} torch eager {ms:.3f} ms", flush=True)
    return rows, {"torch": torch.__version__}


def main() -> None:
    art, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows, info = torch_rows() if "--torch" in sys.argv else aotc_rows(art)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(), "device": info,
        "method": f"median of {REPEATS} repeats x {CALLS} calls after {WARMUP} warm-ups; device-resident inputs",
        "rows": rows,
    }  # fmt: skip
    out.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
